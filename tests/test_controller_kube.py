"""controller.kube: writes are counted per reconcile, not only for the shared client."""

from __future__ import annotations

import asyncio

from meshplan.controller.kube import Credentials, Kube, count_writes


class _Response:
    status = 200
    reason = "OK"

    async def text(self) -> str:
        return "{}"

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


class _Session:
    def request(self, method, url, data=None, headers=None):
        return _Response()

    async def close(self):
        pass


def test_concurrent_reconciles_count_only_their_own_writes():
    async def main():
        kube = Kube.__new__(Kube)
        kube.creds, kube._session, kube.writes = Credentials("http://x", False, {}), _Session(), 0

        async def reconcile(n_writes: int) -> int:
            mine = count_writes()
            for _ in range(n_writes):
                await kube.request("PATCH", "/p", body={})
                await asyncio.sleep(0)            # let the other reconcile interleave
            await asyncio.gather(kube.request("GET", "/g"), kube.request("DELETE", "/d"))   # child tasks count too
            return mine.n

        counts = await asyncio.gather(reconcile(3), reconcile(7))
        return counts, kube.writes

    counts, total = asyncio.run(main())
    assert counts == [4, 8]
    assert total == 12
