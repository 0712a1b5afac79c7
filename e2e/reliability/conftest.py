"""Fixtures of the reliability suite (see kit.py for why each module has its own fleet and operator).

- `rel_fleet(groups)`: a factory of private kwok GPU fleets for one test, deleted after it.
- `rel_ns`: a namespace matching the module's operator glob, emptied and deleted after the test.
- `full_only`: skips unless MESHPLAN_RELIABILITY_FULL=1 (the slow scenarios; CI runs the rest).
"""

from __future__ import annotations

import hashlib

import pytest

from . import kit


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/reliability/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.reliability)


def _tag(request) -> str:
    return hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]


@pytest.fixture
def rel_fleet(cluster, request):
    made: list[kit.Fleet] = []

    def make(groups, name: str | None = None) -> kit.Fleet:
        f = kit.Fleet(cluster, name or f"rel-{_tag(request)}-{len(made)}", groups)
        made.append(f)
        f.add()
        return f

    yield make
    for f in made:
        f.delete()


def rel_namespace(cluster, request, prefix: str):
    """A namespace `<prefix>-<test>-<hash>`; everything in it deleted afterwards."""
    import uuid

    # a random part: on a reused cluster the previous run's namespace may still be terminating
    ns = kit.namespace(cluster, prefix, f"{request.node.name[5:28]}-{_tag(request)[:4]}{uuid.uuid4().hex[:4]}")
    return ns


@pytest.fixture
def full_only():
    if not kit.FULL:
        pytest.skip("slow scenario: set MESHPLAN_RELIABILITY_FULL=1 (see docs/reliability.md)")
