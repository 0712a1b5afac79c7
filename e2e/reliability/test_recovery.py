"""Reliability scenarios 1-4 and 8: idempotence, a killed operator, changes while it is down, drift, GC.

One operator per module, scoped to `mprel-rec-*`, on a private fleet of two
GB200 NVLink domains (4 trays x 4 GPUs each) and two H100 nodes. Deployments
are pinned TP8 layouts: on GB200 a replica is one group of two pods (a leader
and a worker) inside one NVLink domain, so "half a group" is observable.
"""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest

from . import kit
from .conftest import rel_namespace

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-rec-*"


@pytest.fixture(scope="module")
def fleet(cluster):
    kit.ensure_crd(cluster)
    f = kit.Fleet(cluster, "rel-rec", [kit.gb200_group("rel-rec-a", 4, "rel-rec-a.0"),
                                       kit.gb200_group("rel-rec-b", 4, "rel-rec-b.0"),
                                       kit.h100_group("rel-rec-h", 2)])
    f.add()
    yield f
    f.delete()


@pytest.fixture(scope="module")
def op(cluster, fleet, request):
    o = kit.operator(cluster, GLOB)
    kit.start(o)
    failed = request.session.testsfailed
    yield o
    o.stop()
    if request.session.testsfailed > failed:
        print(f"\n----- operator log (tail) -----\n{o.tail(120)}")


@pytest.fixture
def ns(cluster, op, request):
    if not op.alive():          # a test that killed it and failed before restarting
        kit.start(op)
    name = rel_namespace(cluster, request, "mprel-rec")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def gb(name: str, replicas: int) -> dict:
    return kit.pinned(name, "rel-rec", kit.GB200, tensor=8, replicas=replicas, max_gpus=8 * max(replicas, 1))


def h100(name: str, replicas: int) -> dict:
    return kit.pinned(name, "rel-rec", kit.H100, tensor=8, replicas=replicas, max_gpus=8 * max(replicas, 1))


def uids(pods: list[dict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def check_groups(cluster, ns: str, name: str, replicas: int) -> None:
    """Exactly `replicas` complete groups of 2 pods, each inside one NVLink domain, all owned by `name`."""
    obj = kit.get(cluster, ns, "llmd", name)
    pods = [p for p in kit.pods(cluster, ns) if p["metadata"]["labels"]["meshplan.dev/deployment"] == name]
    g = kit.groups(pods, name)
    assert len(g) == replicas, sorted(g)
    for key, members in g.items():
        assert len(members) == 2, (key, [p["metadata"]["name"] for p in members])
        assert {p["metadata"]["ownerReferences"][0]["uid"] for p in members} == {obj["metadata"]["uid"]}
        cliques = {kit.node(cluster, p["spec"]["nodeName"])["metadata"]["labels"]["nvidia.com/gpu.clique"]
                   for p in members}
        assert len(cliques) == 1, (key, cliques)


# ----------------------------------------------------------------------------- 1 idempotence


def test_unchanged_world_gets_zero_writes_across_resyncs_and_a_restart(cluster, ns, op):
    """Scenario 1. test_operator checks resourceVersions over one resync; here the operator's own
    reconcile counter proves reconciles did happen meanwhile, no Events are posted, and a restarted
    operator (kopf resume) writes nothing either."""
    kit.apply(cluster, ns, gb("idem", 2))
    kit.available(cluster, ns, "idem")
    time.sleep(3)
    before, events_before, n0 = kit.versions(cluster, ns), len(kit.events(cluster, ns)), kit.reconciles(op)
    # the resync loop re-queues an object not reconciled within resync_s: one every 1-2 periods
    kit.wait(lambda: kit.reconciles(op) - n0 >= 2, 5 * op.resync_s, "two more reconciles")
    assert kit.versions(cluster, ns) == before
    assert len(kit.events(cluster, ns)) == events_before
    op.stop()
    kit.start(op)
    kit.wait(lambda: kit.reconciles(op) >= 2, 30, "reconciles after the restart")
    time.sleep(op.resync_s + 2)
    after = kit.versions(cluster, ns)
    changed = {k: (before[k], after.get(k)) for k in before if after.get(k) != before[k]}
    assert not changed, f"a restart of the operator wrote to {changed}"
    assert len(kit.events(cluster, ns)) == events_before


# ----------------------------------------------------------------------------- 2 killed mid-reconcile


def test_operator_killed_between_creating_groups_finishes_without_duplicates(cluster, ns, op):
    """Scenario 2: SIGKILL as soon as the first pod of a 4-group deployment exists."""
    from kubernetes import client, watch

    core = client.CoreV1Api(cluster.api_client())
    seen: dict[str, int] = {}
    stop = threading.Event()

    def killer():
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=60):
            if ev["type"] == "ADDED":
                kit.kill9(op)
                seen["at_kill"] = len(core.list_namespaced_pod(ns).items)
                w.stop()
            if stop.is_set():
                w.stop()

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    kit.apply(cluster, ns, gb("gang", 4))
    t.join(60)
    stop.set()
    assert not op.alive(), "the operator was not killed"
    time.sleep(2)
    left = kit.pods(cluster, ns)
    # what the dead operator left: a gated, partial state (the all-or-nothing gate must hold it)
    assert not kit.half_running(left), kit.half_running(left)
    before = uids(left)
    kit.start(op)
    kit.available(cluster, ns, "gang", timeout_s=120)
    check_groups(cluster, ns, "gang", 4)
    pods = kit.pods(cluster, ns)
    assert len(pods) == 8, [p["metadata"]["name"] for p in pods]
    kept = sum(1 for n, u in uids(pods).items() if before.get(n) == u)
    print(f"scenario 2: pods when killed={seen.get('at_kill')} left after kill={len(before)} "
          f"kept after restart={kept} final={len(pods)}")
    assert seen.get("at_kill", 0) < 8, "the kill came after every pod existed: not mid-reconcile"


# ----------------------------------------------------------------------------- 3 changes while down


def test_changes_and_deletions_while_down_are_handled_on_return(cluster, ns, op):
    """Scenario 3: scale twice (only the last value counts), delete one, create one, delete a pod."""
    kit.apply(cluster, ns, h100("keep", 2))
    kit.apply(cluster, ns, gb("doomed", 1))
    kit.available(cluster, ns, "keep")
    kit.available(cluster, ns, "doomed")
    op.stop()
    kit.apply(cluster, ns, h100("keep", 3))
    kit.apply(cluster, ns, h100("keep", 1))
    t0 = time.monotonic()
    cluster.kubectl("delete", "llmd", "doomed", "-n", ns, "--timeout=20s")     # no finalizer: no operator needed
    delete_s = time.monotonic() - t0
    kit.apply(cluster, ns, gb("born", 1))
    victim = next(p["metadata"]["name"] for p in kit.pods(cluster, ns)
                  if p["metadata"]["labels"]["meshplan.dev/deployment"] == "keep")
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
    kit.start(op)
    t1 = time.monotonic()
    most = 0
    while time.monotonic() - t1 < 90:
        pods = kit.pods(cluster, ns)
        most = max(most, len(kit.groups(pods, "keep")))
        k, b = kit.get(cluster, ns, "llmd", "keep"), kit.get(cluster, ns, "llmd", "born")
        done = all(o and kit.cond(o, "Available").get("status") == "True"
                   and o["status"].get("observedGeneration") == o["metadata"]["generation"] for o in (k, b))
        if done and len(kit.groups(pods, "keep")) == 1 and not kit.groups(pods, "doomed"):
            break
        time.sleep(0.3)
    recover_s = time.monotonic() - t1
    assert kit.get(cluster, ns, "llmd", "keep")["status"]["readyReplicas"] == 1
    assert not kit.groups(kit.pods(cluster, ns), "doomed"), "children of a deleted deployment left"
    assert most <= 2, f"'keep' grew to {most} groups: an intermediate spec (3) was acted on"
    check_groups(cluster, ns, "born", 1)
    print(f"scenario 3: delete without operator {delete_s:.1f}s; all handled {recover_s:.1f}s after restart")


# ----------------------------------------------------------------------------- 4 drift


def test_group_losing_a_member_is_restarted_whole_and_other_drift_is_undone(cluster, ns, op):
    """Scenario 4, beyond test_operator's drift test: a lost worker restarts its whole group (the
    leader too, never half-running); a whole group deleted, a headless Service deleted, the client
    Service's port and a pod's explain annotation edited, and a pod deleted while the operator is
    down all come back."""
    kit.apply(cluster, ns, gb("drift", 2))
    kit.available(cluster, ns, "drift")
    leader0 = kit.get(cluster, ns, "pod", "drift-r0-0")
    explain = leader0["metadata"]["annotations"]["meshplan.dev/explain"]
    svc = kit.get(cluster, ns, "service", "drift")
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", "drift-r0-1", "-n", ns, "--wait=false")
    kit.wait(lambda: (p := kit.get(cluster, ns, "pod", "drift-r0-0")) is None
             or p["metadata"]["uid"] != leader0["metadata"]["uid"] or p["metadata"].get("deletionTimestamp"),
             30, "leader of the broken group restarted too")
    restart_s = time.monotonic() - t0
    cluster.kubectl("delete", "pod", "drift-r1-0", "drift-r1-1", "-n", ns, "--wait=false")
    cluster.kubectl("delete", "service", "drift-r1", "-n", ns, "--wait=false")
    port = svc["spec"]["ports"][0]
    cluster.kubectl("patch", "service", "drift", "-n", ns, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/ports/0/port", "value": int(port["port"]) + 1}]))
    kit.wait(lambda: kit.available(cluster, ns, "drift", timeout_s=90), 5, "Available again")
    cluster.kubectl("annotate", "pod", "drift-r0-0", "-n", ns, "meshplan.dev/explain=edited", "--overwrite")
    kit.wait(lambda: (kit.get(cluster, ns, "pod", "drift-r0-0") or {}).get("metadata", {}).get(
        "annotations", {}).get("meshplan.dev/explain") == explain, 30, "explain annotation restored")
    kit.wait(lambda: kit.get(cluster, ns, "service", "drift-r1"), 30, "headless Service back")
    kit.wait(lambda: kit.get(cluster, ns, "service", "drift")["spec"]["ports"][0]["port"] == port["port"],
             30, "client Service port restored")
    check_groups(cluster, ns, "drift", 2)
    # drift while the operator is down
    op.stop()
    gone = kit.get(cluster, ns, "pod", "drift-r1-1")["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "drift-r1-1", "-n", ns, "--wait=true")
    kit.start(op)
    kit.wait(lambda: (p := kit.get(cluster, ns, "pod", "drift-r1-1")) and p["metadata"]["uid"] != gone, 60,
             "pod deleted while the operator was down recreated")
    kit.available(cluster, ns, "drift", timeout_s=90)
    check_groups(cluster, ns, "drift", 2)
    print(f"scenario 4: whole-group restart began {restart_s:.1f}s after a worker was deleted")


# ----------------------------------------------------------------------------- 8 delete and GC


def test_delete_while_operator_down_and_namespace_delete_leave_nothing(cluster, op, fleet, request):
    """Scenario 8 (the chart's uninstall with live LLMDeployments is e2e/test_chart.py's
    test_uninstall_with_live_llmdeployments_leaves_nothing_behind): no finalizer, so deleting works
    with the operator down and the children go by ownerReferences; a namespace with running
    deployments is deleted completely (nothing stuck Terminating)."""
    ns = rel_namespace(cluster, request, "mprel-rec")
    kit.apply(cluster, ns, gb("a", 1))
    kit.apply(cluster, ns, h100("b", 1))
    kit.available(cluster, ns, "a")
    kit.available(cluster, ns, "b")
    op.stop()
    try:
        t0 = time.monotonic()
        cluster.kubectl("delete", "llmd", "a", "-n", ns, "--timeout=20s")
        kit.wait(lambda: not kit.groups(kit.pods(cluster, ns), "a"), 60, "children of a garbage-collected")
        kit.wait(lambda: not json.loads(cluster.kubectl("get", "services", "-n", ns, "-l",
                                                        "meshplan.dev/deployment=a", "-o", "json").stdout)["items"],
                 60, "Services of a garbage-collected")
        gc_s = time.monotonic() - t0
    finally:
        kit.start(op)
    t1 = time.monotonic()
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    kit.wait(lambda: cluster.kubectl("get", "namespace", ns, check=False).returncode != 0, 120,
             f"namespace {ns} gone")
    ns_s = time.monotonic() - t1
    print(f"scenario 8: GC with the operator down {gc_s:.1f}s; namespace with a live deployment gone in {ns_s:.1f}s")
