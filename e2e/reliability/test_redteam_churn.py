"""Red-team churn cases (issue 17, findings 9 and 11): topology churn and an API server restart.

A tenant (e2e/reliability/tenant.py: may only manage LLMDeployments) creates the deployments; the
operator runs as the chart's ServiceAccount, scoped to `mprel-churn-*`, with a 30 s resync (the
issue's setting), so a reaction within seconds is the node watch's, not the resync's. Each test has
its own kwok GPU fleet. While the world changes, a sampler thread reads the pods and the canary every
~0.5 s and records the fewest ready replica groups of the deployment under test and whether the
canary (a deployment on other nodes) was ever not Available.

Figures are printed (`-s`) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from . import kit
from .conftest import rel_namespace
from .tenant import as_tenant, make_tenant, tenant_can

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-churn-*"
CLIQUE = "nvidia.com/gpu.clique"
REACTION_LIMIT_S = 10.0        # the issue measured 54-58 s with the same 30 s resync


@pytest.fixture(scope="module")
def op(cluster, request):
    kit.ensure_crd(cluster)
    o = kit.start(kit.operator(cluster, GLOB, resync_s=30.0))
    failed = request.session.testsfailed
    yield o
    o.stop()
    if request.session.testsfailed > failed:
        print(f"\n----- operator log (tail) -----\n{o.tail(150)}")


@pytest.fixture
def ns(cluster, op, request):
    name = rel_namespace(cluster, request, "mprel-churn")
    make_tenant(cluster, name)
    assert tenant_can(cluster, name, "create", "llmdeployments")
    assert not tenant_can(cluster, name, "create", "pods")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def tenant_apply(cluster, ns: str, manifest: dict) -> None:
    r = as_tenant(cluster, ns, "apply", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr


def _pod_ready(p: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (p.get("status") or {}).get("conditions") or ())


def ready_groups(pods: list[dict], name: str) -> int:
    return sum(1 for members in kit.groups(pods, name).values()
               if len(members) == kit.group_size(members[0]) and all(_pod_ready(p) for p in members))


class Sampler(threading.Thread):
    """Samples every ~0.5 s: ready groups of `name`, new pods (uids not in `known`), canary Available."""

    def __init__(self, cluster, ns: str, name: str, canary: str | None, t0: float, known: set[str]):
        super().__init__(daemon=True)
        self.cluster, self.ns, self.name, self.canary, self.t0, self.known = cluster, ns, name, canary, t0, known
        self.min_ready: int | None = None
        self.first_new_s: float | None = None
        self.canary_down = 0
        self.samples = 0
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                pods = kit.pods(self.cluster, self.ns)
                r = ready_groups(pods, self.name)
                self.min_ready = r if self.min_ready is None else min(self.min_ready, r)
                mine = [p for p in pods if p["metadata"]["labels"].get("meshplan.dev/deployment") == self.name]
                if self.first_new_s is None and any(p["metadata"]["uid"] not in self.known for p in mine):
                    self.first_new_s = time.monotonic() - self.t0
                if self.canary:
                    o = kit.get(self.cluster, self.ns, "llmd", self.canary)
                    if kit.cond(o, "Available").get("status") != "True":
                        self.canary_down += 1
                self.samples += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.error = repr(exc)
            self._halt.wait(0.5)

    def stop(self) -> "Sampler":
        self._halt.set()
        self.join(10)
        return self


def _uids(cluster, ns: str, name: str) -> set[str]:
    return {p["metadata"]["uid"] for p in kit.pods(cluster, ns)
            if p["metadata"]["labels"].get("meshplan.dev/deployment") == name}


def _nodes_of(cluster, ns: str, name: str) -> dict[str, set[str]]:
    return {k: {p["spec"].get("nodeName") for p in v} for k, v in kit.groups(kit.pods(cluster, ns), name).items()}


def _settled(cluster, ns: str, name: str, away_from: str, replicas: int = 1):
    """`replicas` complete ready groups, none on `away_from`, each in one NVLink domain, Available."""
    g = _nodes_of(cluster, ns, name)
    if len(g) != replicas or any(away_from in nodes or None in nodes for nodes in g.values()):
        return None
    for nodes in g.values():
        if len({(kit.node(cluster, n)["metadata"]["labels"].get(CLIQUE) or n) for n in nodes}) != 1:
            return None
    o = kit.get(cluster, ns, "llmd", name)
    return o if kit.cond(o, "Available").get("status") == "True" and ready_groups(
        kit.pods(cluster, ns), name) == replicas else None


def _churn(cluster, ns: str, name: str, canary: str, change, away_from: str, what: str, op=None) -> dict:
    known = _uids(cluster, ns, name)
    t0 = time.monotonic()
    s = Sampler(cluster, ns, name, canary, t0, known)
    s.start()
    try:
        change()
        kit.wait(lambda: _settled(cluster, ns, name, away_from), 120, f"{name} moved off {away_from}")
        settled_s = time.monotonic() - t0
    finally:
        s.stop()
    assert s.error is None, s.error
    # kubectl takes ~0.5-1 s per sample here and the move settles in ~2 s: a sample or two fall inside
    # it (the unit tests in tests/test_churn.py check every round of the decision).
    assert s.samples >= 1, s.samples
    # the operator's log with the failure: the module's teardown print lands in a passing test's capture
    assert s.first_new_s is not None and s.first_new_s <= REACTION_LIMIT_S, \
        f"{what}: replacement created after {s.first_new_s}s (limit {REACTION_LIMIT_S}s)" + \
        (f"\n----- operator log (tail) -----\n{op.tail(80)}" if op is not None else "")
    assert s.min_ready is not None and s.min_ready >= 1, f"{what}: ready groups dropped to {s.min_ready}"
    assert s.canary_down == 0, f"{what}: the canary was not Available in {s.canary_down} sample(s)"
    reasons = [e["reason"] for e in kit.events(cluster, ns, name)]
    assert "ReplicaMoving" in reasons and "ReplicaMoved" in reasons, reasons
    # The reconcile that removes the old group still reports it (Degraded=True/ReplicaMisplaced, true at
    # that moment); the next one, on the deletion's pod events, clears it.
    kit.wait(lambda: kit.cond(kit.get(cluster, ns, "llmd", name), "Degraded").get("status") == "False", 20,
             f"{name} Degraded=False once the old group is gone")
    print(f"{what}: replacement created {s.first_new_s:.1f}s after the change, settled (old group removed, "
          f"Available) after {settled_s:.1f}s; ready groups never below {s.min_ready} ({s.samples} samples); "
          f"canary Available in every sample")
    return {"reaction_s": s.first_new_s, "settled_s": settled_s, "min_ready": s.min_ready}


def test_clique_relabel_is_acted_on_within_seconds_and_make_before_break(cluster, op, ns, rel_fleet):
    """One tray of the group's NVLink domain is relabelled into another `nvidia.com/gpu.clique`: the
    group now spans two domains. A spare domain exists: the replacement is created within seconds
    and ready before the old group is removed."""
    fn = "rel-churn-lbl"
    fleet = rel_fleet([kit.gb200_group(f"{fn}-d0", 2, f"{fn}-d0.0"), kit.gb200_group(f"{fn}-d1", 2, f"{fn}-d1.0"),
                       kit.h100_group(f"{fn}-h", 1)], name=fn)
    tenant_apply(cluster, ns, kit.pinned("mv", fleet.name, kit.GB200, tensor=8, replicas=1, max_gpus=8))
    tenant_apply(cluster, ns, kit.pinned("canary", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "mv")
    kit.available(cluster, ns, "canary")
    (nodes,) = _nodes_of(cluster, ns, "mv").values()
    tray = sorted(nodes)[0]
    _churn(cluster, ns, "mv", "canary",
           lambda: cluster.kubectl("label", "node", tray, f"{CLIQUE}={fn}-x.0", "--overwrite"),
           tray, "clique relabel", op)


def test_allocatable_drop_is_acted_on_within_seconds_and_make_before_break(cluster, op, ns, rel_fleet):
    """The node of a TP8 group reports 4 allocatable GPUs instead of 8 (a GPU fell off the bus): the
    group is replaced on a spare node within seconds, the old one removed once the new one is ready."""
    fn = "rel-churn-alloc"
    fleet = rel_fleet([kit.h100_group(f"{fn}-h", 3)], name=fn)
    tenant_apply(cluster, ns, kit.pinned("mv", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "mv")
    tenant_apply(cluster, ns, kit.pinned("canary", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "canary")
    ((node,),) = _nodes_of(cluster, ns, "mv").values()
    patch = json.dumps({"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}})
    _churn(cluster, ns, "mv", "canary",
           lambda: cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch),
           node, "allocatable 8 -> 4", op)
    alloc = kit.node(cluster, node)["status"]["allocatable"]["nvidia.com/gpu"]
    assert alloc == "4", f"the node's allocatable was reset to {alloc} meanwhile: the scenario did not hold"


def test_no_room_keeps_serving_and_the_incumbent_keeps_its_domain_after_a_revert(cluster, ns, rel_fleet):
    """One GB200 domain, held by `inc`; a newcomer `new` waits for it. A tray is relabelled away: no
    room for a replacement, so `inc` keeps serving (Placed=False/NoRoomToReplace, nothing deleted)
    and `new` gets nothing. The label is reverted: `inc` is placed as before and `new` still waits
    (the issue: the waiting deployment took the domain and the original stayed unplaced)."""
    fn = "rel-churn-inc"
    fleet = rel_fleet([kit.gb200_group(f"{fn}-d0", 2, f"{fn}-d0.0"), kit.h100_group(f"{fn}-h", 1)], name=fn)
    tenant_apply(cluster, ns, kit.pinned("inc", fleet.name, kit.GB200, tensor=8, replicas=1, max_gpus=8))
    tenant_apply(cluster, ns, kit.pinned("canary", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "inc")
    kit.available(cluster, ns, "canary")
    assert (kit.get(cluster, ns, "llmd", "inc")["status"].get("servingSince"))
    tenant_apply(cluster, ns, kit.pinned("new", fleet.name, kit.GB200, tensor=8, replicas=1, max_gpus=8))
    kit.wait(lambda: kit.cond(kit.get(cluster, ns, "llmd", "new"), "Placed").get("status") == "False"
             or kit.cond(kit.get(cluster, ns, "llmd", "new"), "Planned").get("status") == "False", 60,
             "the newcomer waiting")
    known = _uids(cluster, ns, "inc")
    (nodes,) = _nodes_of(cluster, ns, "inc").values()
    tray = sorted(nodes)[0]
    t0 = time.monotonic()
    s = Sampler(cluster, ns, "inc", "canary", t0, known)
    s.start()
    try:
        cluster.kubectl("label", "node", tray, f"{CLIQUE}={fn}-x.0", "--overwrite")
        obj = kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", "inc"))
                       and kit.cond(o, "Placed").get("reason") == "NoRoomToReplace" and o, 60, "NoRoomToReplace")
        reported_s = time.monotonic() - t0
        msg = kit.cond(obj, "Placed")["message"]
        time.sleep(3)
        assert _uids(cluster, ns, "inc") == known, "a group was deleted although no replacement had room"
        assert not [p for p in kit.pods(cluster, ns) if p["metadata"]["labels"].get("meshplan.dev/deployment") == "new"]
        t1 = time.monotonic()
        cluster.kubectl("label", "node", tray, f"{CLIQUE}={fn}-d0.0", "--overwrite")
        kit.wait(lambda: kit.cond(kit.get(cluster, ns, "llmd", "inc"), "Placed").get("status") == "True", 60,
                 "inc placed again after the revert")
        revert_s = time.monotonic() - t1
        time.sleep(5)            # the newcomer's next reconciles (waiting pace 10 s, node watch at once)
    finally:
        s.stop()
    assert s.error is None, s.error
    assert _uids(cluster, ns, "inc") == known, "the incumbent's group was replaced"
    assert not [p for p in kit.pods(cluster, ns) if p["metadata"]["labels"].get("meshplan.dev/deployment") == "new"]
    assert s.min_ready == 1 and s.canary_down == 0, (s.min_ready, s.canary_down)
    assert "replica 0" in msg and "free GPUs per NVLink domain" in msg, msg
    assert kit.cond(kit.get(cluster, ns, "llmd", "inc"), "Available").get("status") == "True"
    print(f"no room: NoRoomToReplace {reported_s:.1f}s after the relabel ('{msg[:140]}...'); revert acted on "
          f"in {revert_s:.1f}s; incumbent served throughout (ready groups never below {s.min_ready}, "
          f"{s.samples} samples), the newcomer got no pod, canary Available in every sample")


def test_api_server_restart_the_supervisor_restarts_what_exits(cluster, ns, rel_fleet, full_only):
    """The API server is stopped for 10 s and started again. Every control-plane component is running
    afterwards (the supervisor restarts the kube-scheduler when it exits), the canary's pods are the
    same and it is Available, and a deployment created afterwards is scheduled and Available.

    Behind `full_only`: it restarts the API server of the session's shared cluster (every later
    module would run on a just-restarted control plane) and takes ~40 s plus teardown."""
    if not cluster.supervisor_status()["alive"]:
        pytest.skip("the dev cluster runs without its supervisor (started by an older `meshplan dev-cluster up`)")
    fn = "rel-churn-api"
    fleet = rel_fleet([kit.h100_group(f"{fn}-h", 2)], name=fn)
    tenant_apply(cluster, ns, kit.pinned("canary", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "canary")
    canary_uids = _uids(cluster, ns, "canary")
    expected = set(cluster.state()["pids"])
    before = {k: v.get("restarts", 0) for k, v in cluster.supervisor_status()["components"].items()}
    cluster.stop("kube-apiserver")
    time.sleep(10)
    t0 = time.monotonic()
    cluster.start("kube-apiserver", timeout=30)
    kit.wait(lambda: cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0, 60,
             "API server ready")
    api_s = time.monotonic() - t0
    kit.wait(lambda: set(cluster.running()) == expected, 60, f"every component running ({expected})")
    # The scheduler's exit after an API server restart ("Scheduler cache is corrupted", issue 17 #11) does
    # not happen on every restart: make it happen (SIGKILL, not a held stop) and time the supervisor.
    sched = cluster.state()["pids"]["kube-scheduler"]
    os.killpg(sched, signal.SIGKILL)
    t1 = time.monotonic()
    kit.wait(lambda: (p := cluster.running().get("kube-scheduler")) and p != sched, 30, "kube-scheduler restarted")
    sched_s = time.monotonic() - t1
    tenant_apply(cluster, ns, kit.pinned("after", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8))
    kit.available(cluster, ns, "after", timeout_s=90)
    after_s = time.monotonic() - t0
    assert kit.cond(kit.get(cluster, ns, "llmd", "canary"), "Available").get("status") == "True"
    assert _uids(cluster, ns, "canary") == canary_uids, "the canary's pods were replaced"
    comps = cluster.supervisor_status()["components"]
    restarted = {k: v.get("restarts", 0) - before.get(k, 0) for k, v in comps.items()
                 if v.get("restarts", 0) > before.get(k, 0)}
    assert restarted.get("kube-scheduler", 0) >= 1, comps
    print(f"API server restart: stopped 10 s; ready {api_s:.1f}s after its start; the killed kube-scheduler "
          f"back {sched_s:.1f}s after SIGKILL; a new deployment Available "
          f"{after_s:.1f}s after the API server's start; restarted by the supervisor: {restarted} "
          f"({ {k: comps[k].get('lastExit', '')[:160] for k in restarted} }); canary unchanged and Available")
