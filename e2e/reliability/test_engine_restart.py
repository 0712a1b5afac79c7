"""An engine container restart is treated like a lost pod: the whole replica group is recreated (issue #15).

Rendered pods carry `restartPolicy: Never`, so a crashed engine leaves its pod Failed; a pod whose
container restarted in place anyway (`restartCount` > 0: a pod rendered with `Always` by an older
operator, still running until the roll replaces it) counts as lost too. The kwok pods run nothing, so
the test fakes what the kubelet would write: the status subresource of one worker is patched, (a) with
`restartCount: 1` while Running (a restart under `Always`), (b) with phase Failed and the container
terminated (a crash under `Never`). Either way the leader of that group is deleted with it, the group
comes back whole, the other group is untouched, and no group is half-running longer than one reconcile.

One GB200 NVLink domain of 4 trays x 4 GPUs (its own kwok fleet); TP8 x 2 replicas: two groups of a
leader and a worker.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from . import kit
from .conftest import rel_namespace

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-rst-*"
HALF_RUNNING_GRACE_S = 5.0


@pytest.fixture(scope="module")
def op(cluster, request):
    yield from kit.serve_module(cluster, request, GLOB)


@pytest.fixture
def ns(cluster, op, request):
    name = rel_namespace(cluster, request, "mprel-rst")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def _uids(cluster, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in kit.pods(cluster, ns)
            if not p["metadata"].get("deletionTimestamp")}


def _patch_status(cluster, ns: str, name: str, status: dict) -> None:
    cluster.kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))


def _restarted_in_place(pod: dict) -> dict:
    statuses = copy.deepcopy(pod["status"].get("containerStatuses") or [])
    assert statuses, f"kwok wrote no containerStatuses for {pod['metadata']['name']}"
    for cs in statuses:
        cs["restartCount"] = 1
        cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error",
                                          "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}}
    return {"containerStatuses": statuses}


def _crashed(pod: dict) -> dict:
    statuses = copy.deepcopy(pod["status"].get("containerStatuses") or [])
    for cs in statuses:
        cs["ready"] = False
        cs["state"] = {"terminated": {"exitCode": 1, "reason": "Error",
                                      "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}}
    return {"phase": "Failed", "containerStatuses": statuses,
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}]}


def _is_available(cluster, ns: str) -> bool:
    o = kit.get(cluster, ns, "llmd", "rst")
    return bool(o) and kit.cond(o, "Available").get("status") == "True" and \
        o["status"].get("readyReplicas") == 2


def _recreated_whole(cluster, ns: str, group: str, before: dict[str, str], other: str, what: str) -> float:
    """Wait until both pods of `group` are new and the deployment is Available; the `other` group's pods
    keep their uids; never half-running longer than the grace. Returns seconds until the leader went."""
    t0 = time.monotonic()
    leader_gone_s = None
    half_since = None
    deadline = t0 + 90
    while time.monotonic() < deadline:
        pods = kit.pods(cluster, ns)
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        if leader_gone_s is None and now.get(f"rst-{group}-0") != before[f"rst-{group}-0"]:
            leader_gone_s = time.monotonic() - t0
        half = kit.half_running(pods)
        if half:
            half_since = half_since or time.monotonic()
            assert time.monotonic() - half_since <= HALF_RUNNING_GRACE_S, f"{what}: half-running {half}"
        else:
            half_since = None
        for rank in (0, 1):
            assert now.get(f"rst-{other}-{rank}", before[f"rst-{other}-{rank}"]) == before[f"rst-{other}-{rank}"], \
                f"{what}: the healthy group {other} was touched"
        fresh = all(now.get(f"rst-{group}-{r}") not in (None, before[f"rst-{group}-{r}"]) for r in (0, 1))
        if fresh and _is_available(cluster, ns):
            assert leader_gone_s is not None
            return leader_gone_s
        time.sleep(0.3)
    raise AssertionError(f"{what}: group {group} not recreated whole within 90 s: {_uids(cluster, ns)}")


def test_engine_container_restart_recreates_the_whole_group(cluster, ns, rel_fleet):
    fleet = rel_fleet([kit.gb200_group("rel-rst-a", 4, "rel-rst-a.0")], name="rel-rst")
    kit.apply(cluster, ns, kit.pinned("rst", fleet.name, kit.GB200, tensor=8, replicas=2, max_gpus=16))
    kit.available(cluster, ns, "rst", timeout_s=120)
    pods = kit.pods(cluster, ns)
    assert len(pods) == 4 and {p["spec"]["restartPolicy"] for p in pods} == {"Never"}

    # (a) restart in place (restartCount 1, still Running and Ready)
    before = _uids(cluster, ns)
    _patch_status(cluster, ns, "rst-r0-1", _restarted_in_place(kit.get(cluster, ns, "pod", "rst-r0-1")))
    a_s = _recreated_whole(cluster, ns, "r0", before, "r1", "restartCount")
    events = [e for e in kit.events(cluster, ns, "rst") if e.get("reason") == "ReplicaRestarted"]
    assert any("engine container of rst-r0-1 restarted" in e.get("message", "") for e in events), events

    # (b) the engine exits under restartPolicy Never: the pod is Failed
    before = _uids(cluster, ns)
    _patch_status(cluster, ns, "rst-r1-1", _crashed(kit.get(cluster, ns, "pod", "rst-r1-1")))
    b_s = _recreated_whole(cluster, ns, "r1", before, "r0", "Failed")
    print(f"engine restart: leader of the group deleted {a_s:.1f}s after restartCount 1, "
          f"{b_s:.1f}s after phase Failed; both groups whole and Available again")
