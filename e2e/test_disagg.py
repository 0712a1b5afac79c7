"""Prefill/decode disaggregation on a real control plane (issue 19 'Done when', first item).

A DeepSeek-R1 deployment with `spec.serving.disaggregation: enabled`, pinned to TP8 (the planner then pairs one
prefill TP8 group with one decode TP8 group, P:D 1:1, KV over InfiniBand), on a private kwok fleet of HGX H200
nodes advertising `rdma/ib` as operator/meshplan/fleets/hgx-h200-ib.yaml does (6 nodes; an earlier session saw, in
2 of 5 runs with 4 nodes, 8 GPUs still counted as used when the rollout test started right after the first test's
namespace was dropped; re-run on 4d41a78 with 4 nodes, the first two tests passed 8 runs of 8, and a probe that
drops a served namespace holding a TP8 group and at once places 16 GPUs on a 16-GPU fleet passed 4 rounds of 4, so
the cause was not found and is not reproduced), reaches Available with a prefill and a
decode gang; its InferencePool (the Gateway API Inference Extension v1.6.0 CRDs from the machine cache, as
e2e/test_inference_pool_crd.py installs them) selects exactly the served revision's pods; a spec change that changes
the plan hash rolls out, and at every poll the pods the pool's selector matches never hold a prefill pod of one
revision beside a decode pod of another, and the served capacity (one ready prefill + one ready decode pod) never
drops (the fleet has room to surge: 16 GPUs serve, 32 are free).

Two more: with `spec.serving.router.kind: engine` (SGLang's own PD router instead of a pool) the router's argv names
the served revision's ready prefill and decode leaders, and through a rollout every poll finds it naming pods of
one revision only; and an aggregated deployment that sets `spec.serving.router` gets an InferencePool selecting
its replica leaders, which goes (with its picker) when the field is removed, the replicas untouched.

kwok runs no containers: what is checked is what the operator creates, how the groups are gated and released,
and what the pool selects. The operator runs with the Helm chart's RBAC (e2e/chart_credentials.py).
"""

from __future__ import annotations

import time

import pytest

from e2e.reliability import kit
from e2e.test_inference_pool_crd import gie_crds  # noqa: F401 - the fixture that installs the GIE CRDs
from meshplan.render.inference_pool import LABEL_SERVING_REVISION, LABEL_SERVING_ROLE, selects

pytestmark = [pytest.mark.e2e]
GLOB = "mpdisagg-*"
H200 = "NVIDIA-H200"
EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.6.0"


@pytest.fixture(scope="module")
def fleet(cluster):
    kit.ensure_crd(cluster)
    f = kit.Fleet(cluster, "rel-disagg", [kit.h200_ib_group("rel-disagg-a", 6)])
    f.add()
    yield f
    f.delete()


@pytest.fixture(scope="module")
def op(cluster, gie_crds, fleet, request):
    yield from kit.serve_module(cluster, request, GLOB)


@pytest.fixture
def ns(cluster, op, request):
    import uuid

    name = kit.namespace(cluster, "mpdisagg", f"{request.node.name[5:30]}-{uuid.uuid4().hex[:6]}")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def r1(name: str) -> dict:
    m = kit.pinned(name, "rel-disagg", H200, tensor=8, replicas=1, max_gpus=16)
    m["spec"]["model"] = {"name": "deepseek-r1", "weights": {"uri": "hf://deepseek-ai/DeepSeek-R1"}}
    m["spec"]["precision"] = {"weights": "fp8", "kvCache": "fp8"}
    m["spec"]["engine"] = {"kind": "vllm"}
    m["spec"]["parallelism"] = {"tensor": 8, "expert": 1, "pipeline": 1}
    m["spec"]["serving"] = {"disaggregation": "enabled", "router": {"image": EPP_IMAGE}}
    return m


def _ready(p: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (p.get("status") or {}).get("conditions") or [])


def selected(cluster, ns: str, name: str) -> list[tuple[str, str, bool]]:
    """(role, revision, ready) of the pods the deployment's InferencePool selects now."""
    pool = kit.get(cluster, ns, "inferencepools.inference.networking.k8s.io", f"{name}-pool")
    if pool is None:
        return []
    sel = pool["spec"]["selector"]["matchLabels"]
    return [(p["metadata"]["labels"].get(LABEL_SERVING_ROLE, ""), p["metadata"]["labels"].get(LABEL_SERVING_REVISION, ""),
             _ready(p))
            for p in kit.pods(cluster, ns) if selects(sel, p["metadata"].get("labels") or {})
            and not p["metadata"].get("deletionTimestamp")]


def available(cluster, ns: str, name: str, timeout_s: float = 150) -> dict:
    return kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", name)) and kit.cond(o, "Available").get("status") == "True"
                    and (o.get("status") or {}).get("disaggregation", {}).get("servedRevision") and o,
                    timeout_s, f"{name} Available")


def test_r1_disaggregated_reaches_available_with_prefill_and_decode_gangs_and_its_pool(cluster, ns):
    name = "r1-pd"
    kit.apply(cluster, ns, r1(name))
    obj = available(cluster, ns, name)
    d = obj["status"]["disaggregation"]
    assert d["disaggregated"] is True and d["label"] == "P1×TP8 + D1×TP8" and d["ratio"] == "1:1", d
    assert d["prefill"]["layout"] == "TP8" and d["decode"]["layout"] == "TP8"
    pods = [p for p in kit.pods(cluster, ns) if p["metadata"]["labels"].get("meshplan.dev/deployment") == name
            and LABEL_SERVING_ROLE in p["metadata"]["labels"]]
    roles = sorted(p["metadata"]["labels"][LABEL_SERVING_ROLE] for p in pods)
    assert roles == ["decode", "prefill"], [p["metadata"]["name"] for p in pods]
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-decode-r0-0", f"{name}-prefill-r0-0"]
    for p in pods:
        assert not p["spec"].get("schedulingGates"), p["metadata"]["name"]       # released
        assert p["spec"]["nodeName"].startswith("rel-disagg-a")
        c = p["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        args = " ".join(c.get("args") or [])
        role = p["metadata"]["labels"][LABEL_SERVING_ROLE]
        assert ("kv_producer" if role == "prefill" else "kv_consumer") in args, args
    rev = d["servedRevision"]
    assert {p["metadata"]["labels"][LABEL_SERVING_REVISION] for p in pods} == {rev}
    rows = kit.wait(lambda: [r for r in (kit.get(cluster, ns, "llmd", name)["status"].get("placement") or [])
                             if r.get("ready")] or None, 30, "status.placement ready rows")
    by_role = {r["role"]: r for r in rows}
    assert sorted(by_role) == ["decode", "prefill"] and all(r["revision"] == rev for r in rows), rows
    assert {r["nodes"][0] for r in rows} == {p["spec"]["nodeName"] for p in pods}, rows
    sel = selected(cluster, ns, name)
    assert sorted((r, v) for r, v, _ in sel) == [("decode", rev), ("prefill", rev)], sel
    pool = kit.get(cluster, ns, "inferencepools.inference.networking.k8s.io", f"{name}-pool")
    assert pool["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert pool["spec"]["endpointPickerRef"]["name"] == f"{name}-epp"
    epp = kit.get(cluster, ns, "deployment", f"{name}-epp")
    assert epp["spec"]["template"]["spec"]["containers"][0]["image"] == EPP_IMAGE
    for kind in ("serviceaccount", "role", "rolebinding", "service"):
        assert kit.get(cluster, ns, kind, f"{name}-epp") is not None, kind
    assert kit.cond(obj, "Routed")["status"] == "True"
    out = cluster.kubectl("get", "llmd", name, "-n", ns).stdout
    assert "P1×TP8 + D1×TP8" in out, out


def _snapshot(cluster, ns: str, name: str) -> tuple[list[tuple[str, str, bool]], set[str], dict]:
    """One read (one kubectl call, so that polls are frequent): (role, revision, ready) of the pods the pool
    selects, the revisions of the deployment's role pods, and the LLMDeployment."""
    import json

    items = json.loads(cluster.kubectl("get", f"pods,inferencepools.inference.networking.k8s.io,llmd", "-n", ns,
                                       "-o", "json").stdout)["items"]
    pods = [o for o in items if o["kind"] == "Pod" and not o["metadata"].get("deletionTimestamp")]
    pool = next((o for o in items if o["kind"] == "InferencePool" and o["metadata"]["name"] == f"{name}-pool"), None)
    obj = next((o for o in items if o["kind"] == "LLMDeployment" and o["metadata"]["name"] == name), {})
    sel = pool["spec"]["selector"]["matchLabels"] if pool else None
    chosen = [(p["metadata"]["labels"].get(LABEL_SERVING_ROLE, ""), p["metadata"]["labels"].get(LABEL_SERVING_REVISION, ""),
               _ready(p)) for p in pods if sel and selects(sel, p["metadata"].get("labels") or {})]
    revs = {p["metadata"]["labels"].get(LABEL_SERVING_REVISION) for p in pods
            if LABEL_SERVING_ROLE in (p["metadata"].get("labels") or {})}
    return chosen, revs, obj


def test_a_rollout_never_pairs_a_prefill_and_a_decode_pod_of_different_revisions(cluster, ns):
    name = "r1-roll"
    kit.apply(cluster, ns, r1(name))
    old = available(cluster, ns, name)["status"]["disaggregation"]["servedRevision"]
    m = r1(name)
    m["spec"]["engine"]["env"] = [{"name": "ROLLOUT_MARK", "value": "2"}]     # a new plan hash for both roles
    kit.apply(cluster, ns, m)
    steps, revisions, both = 0, set(), 0
    deadline = time.monotonic() + 150
    served = None
    while time.monotonic() < deadline:
        sel, live_revs, o = _snapshot(cluster, ns, name)
        steps += 1
        revs = {v for _, v, _ in sel}
        revisions |= revs
        both += len(live_revs) > 1
        assert len(revs) <= 1, f"the pool selects pods of revisions {sorted(revs)}: {sel}"
        ready_roles = {r for r, _, ok in sel if ok}
        assert ready_roles == {"prefill", "decode"}, f"served capacity dropped (room to surge): {sel}"
        served = ((o or {}).get("status") or {}).get("disaggregation", {}).get("servedRevision")
        if served and served != old and live_revs == {served} and kit.cond(o, "Available").get("status") == "True":
            break
    else:
        conds = [(c["type"], c["status"], c["reason"], c["message"][:300])
                 for c in ((o or {}).get("status") or {}).get("conditions") or []]
        evs = [(e.get("reason"), (e.get("message") or "")[:300]) for e in kit.events(cluster, ns, name)][-12:]
        raise AssertionError(f"rollout did not finish: revisions seen {revisions}, live {live_revs}; "
                             f"conditions {conds}; events {evs}")
    assert revisions == {old, served}, revisions
    print(f"rollout {old} -> {served}: {steps} polls ({both} with both revisions' pods alive), the pool never "
          "mixed revisions and always had a ready prefill and decode pod")


SGLANG_IMAGE = "docker.io/lmsysorg/sglang:v0.5.23-cu129"    # allowed for sglang by the chart's default policy


def _router_endpoints(cluster, ns: str, name: str) -> list[str] | None:
    """The server URLs the engine router's Deployment lists (--prefill/--decode values), None when absent."""
    from meshplan.render.engine_router import router_name

    dep = kit.get(cluster, ns, "deployment", router_name(name))
    if dep is None:
        return None
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return [args[i + 1] for i, a in enumerate(args) if a in ("--prefill", "--decode")]


def test_the_engines_own_router_fronts_only_the_served_revision_through_a_rollout(cluster, ns):
    """spec.serving.router.kind engine (clusters without a gateway): SGLang's PD router as a Deployment, its argv
    listing the served revision's ready prefill and decode leaders; through a rollout, every poll finds the router
    naming pods of one revision only, both roles, and never a pod that is gone."""
    from meshplan.render.engine_router import router_name

    name = "r1-eng"
    m = r1(name)
    m["spec"]["engine"] = {"kind": "sglang"}
    m["spec"]["serving"] = {"disaggregation": "enabled", "router": {"kind": "engine", "image": SGLANG_IMAGE}}
    kit.apply(cluster, ns, m)
    obj = available(cluster, ns, name)
    rev = obj["status"]["disaggregation"]["servedRevision"]
    urls = kit.wait(lambda: _router_endpoints(cluster, ns, name), 60, "the engine router")
    pods = {p["metadata"]["name"]: p for p in kit.pods(cluster, ns)}
    hosts = [u.removeprefix("http://").split(".")[0] for u in urls]
    assert sorted(pods[h]["metadata"]["labels"][LABEL_SERVING_ROLE] for h in hosts) == ["decode", "prefill"], urls
    assert {pods[h]["metadata"]["labels"][LABEL_SERVING_REVISION] for h in hosts} == {rev}
    dep = kit.get(cluster, ns, "deployment", router_name(name))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == SGLANG_IMAGE and c["command"] == ["python3", "-m", "sglang_router.launch_router"]
    assert "--pd-disaggregation" in c["args"]
    assert dep["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert kit.get(cluster, ns, "service", router_name(name)) is not None
    routed = kit.cond(kit.get(cluster, ns, "llmd", name), "Routed")
    assert routed["status"] == "True" and routed["reason"] == "EngineRouterServesRevision", routed
    assert kit.get(cluster, ns, "inferencepools.inference.networking.k8s.io", f"{name}-pool") is None
    assert kit.get(cluster, ns, "deployment", f"{name}-epp") is None

    m["spec"]["engine"]["env"] = [{"name": "ROLLOUT_MARK", "value": "2"}]
    kit.apply(cluster, ns, m)
    deadline, seen = time.monotonic() + 150, set()
    while time.monotonic() < deadline:
        urls = _router_endpoints(cluster, ns, name) or []
        o = kit.get(cluster, ns, "llmd", name) or {}
        live = {p["metadata"]["name"]: p for p in kit.pods(cluster, ns) if not p["metadata"].get("deletionTimestamp")}
        hosts = [u.removeprefix("http://").split(".")[0] for u in urls]
        revs = {live[h]["metadata"]["labels"][LABEL_SERVING_REVISION] for h in hosts if h in live}
        assert len(revs) <= 1, f"the router names pods of revisions {sorted(revs)}: {urls}"
        seen |= revs
        served = ((o.get("status") or {}).get("disaggregation") or {}).get("servedRevision")
        if served and served != rev and revs == {served} and all(h in live for h in hosts):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the router did not move to the new revision: seen {seen}, urls {urls}")
    # no third revision was ever named (the old one is at the polls before the switch when a poll lands there: the
    # kwok rollout can switch within a second of the apply, and a 'the old one was seen' check would be a poll race)
    assert served in seen and seen <= {rev, served}, (seen, rev, served)


def test_an_aggregated_deployment_gets_an_inference_pool_when_it_asks(cluster, ns):
    """Issue 19: 'Aggregated deployments get an InferencePool too when asked': spec.serving.router on an
    aggregated (disaggregation disabled) deployment; the pool selects every replica leader, with no revision; the
    router removed from the spec, the pool and picker go and the replicas stay."""
    name = "llama-pool"
    m = kit.pinned(name, "rel-disagg", H200, tensor=8, replicas=2, max_gpus=16)
    m["spec"]["serving"] = {"router": {"image": EPP_IMAGE}}
    kit.apply(cluster, ns, m)
    kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", name)) and (o.get("status") or {}).get("readyReplicas") == 2,
             120, f"{name} 2 replicas ready")
    pool = kit.wait(lambda: kit.get(cluster, ns, "inferencepools.inference.networking.k8s.io", f"{name}-pool"), 30,
                    "the aggregated pool")
    sel = pool["spec"]["selector"]["matchLabels"]
    assert LABEL_SERVING_REVISION not in sel, sel
    chosen = sorted(p["metadata"]["name"] for p in kit.pods(cluster, ns) if selects(sel, p["metadata"].get("labels") or {}))
    assert chosen == [f"{name}-r0-0", f"{name}-r1-0"], chosen
    routed = kit.cond(kit.get(cluster, ns, "llmd", name), "Routed")
    assert routed["status"] == "True" and routed["reason"] == "PoolSelectsReplicas", routed
    epp = kit.get(cluster, ns, "service", f"{name}-epp")
    assert epp is not None
    time.sleep(3)            # reconciles go on: the aggregated path must not take the picker's Service for a group's
    assert kit.get(cluster, ns, "service", f"{name}-epp")["metadata"]["uid"] == epp["metadata"]["uid"]
    uids = {p["metadata"]["uid"] for p in kit.pods(cluster, ns) if p["metadata"]["name"].startswith(f"{name}-r")}
    m["spec"].pop("serving")
    kit.apply(cluster, ns, m)
    kit.wait(lambda: kit.get(cluster, ns, "inferencepools.inference.networking.k8s.io", f"{name}-pool") is None
             and kit.get(cluster, ns, "deployment", f"{name}-epp") is None, 60, "the pool and picker gone")
    assert {p["metadata"]["uid"] for p in kit.pods(cluster, ns) if p["metadata"]["name"].startswith(f"{name}-r")} == uids


def _decode_timeline(events: list[tuple[float, dict]]) -> list[tuple[float, dict[str, bool]]]:
    """From a pod watch's events, the decode pods alive (not deleted, no deletionTimestamp) after each event, each
    with whether it is Ready: [(arrival, {pod name: ready})]."""
    live: dict[str, bool] = {}
    out = []
    for t, ev in events:
        p = ev.get("object") or {}
        md = p.get("metadata") or {}
        if md.get("labels", {}).get(LABEL_SERVING_ROLE) != "decode":
            continue
        if ev.get("type") == "DELETED" or md.get("deletionTimestamp"):
            live.pop(md["name"], None)
        else:
            live[md["name"]] = _ready(p)
        out.append((t, dict(live)))
    return out


def test_a_group_on_a_cordoned_node_moves_make_before_break(cluster, ns):
    """A ready decode group whose node is cordoned keeps serving while a replacement is created elsewhere, and is
    deleted only once the replacement is ready: at every poll the pool selects a ready decode pod, and in every
    pod version the API server sent (a `kubectl get --watch`, which a poll can miss: in one CI run the replacement
    and the old group stood together for 0.7 s, between two polls) a ready decode pod is alive, and the old one
    goes only while its replacement is alive and Ready."""
    name = "r1-move"
    kit.apply(cluster, ns, r1(name))
    available(cluster, ns, name)
    decode = next(p for p in kit.pods(cluster, ns) if p["metadata"]["labels"].get(LABEL_SERVING_ROLE) == "decode")
    node, old = decode["spec"]["nodeName"], decode["metadata"]["name"]
    watch = kit.Watch(cluster, ns, "pods", events=True).start()
    try:
        kit.wait(lambda: any(ev["object"]["metadata"]["name"] == old for _, ev in watch.snapshot()), 30,
                 "the pod watch listing the decode pod")
    except AssertionError as e:
        watch.stop()
        raise AssertionError(f"{e}; {len(watch.snapshot())} watch items; kubectl stderr: {watch.stderr()[-2000:]!r}")
    cluster.kubectl("cordon", node)
    try:
        deadline, live = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            sel, _, o = _snapshot(cluster, ns, name)
            ready_decode = [1 for r, _, ok in sel if r == "decode" and ok]
            assert ready_decode, f"no ready decode pod selected during the move: {sel}"
            live = [p for p in kit.pods(cluster, ns) if not p["metadata"].get("deletionTimestamp")
                    and p["metadata"]["labels"].get(LABEL_SERVING_ROLE) == "decode"]
            if old not in {p["metadata"]["name"] for p in live} and live \
                    and all(p["spec"].get("nodeName") != node for p in live):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the decode group did not move off {node}: {[(p['metadata']['name'], p['spec'].get('nodeName')) for p in live]}")
        time.sleep(1)                                    # the watch's last events arrive
        timeline = _decode_timeline(watch.snapshot())
        assert timeline and old in timeline[0][1], timeline[:3]
        assert all(any(ready.values()) for _, ready in timeline), \
            f"a moment with no ready decode pod alive: {next(s for _, s in timeline if not any(s.values()))}"
        gone = next((i for i, (_, s) in enumerate(timeline) if old not in s), None)
        assert gone is not None, f"the pod watch never saw {old} go: {timeline[-3:]}"
        before = timeline[gone - 1][1]
        assert any(ok for n, ok in before.items() if n != old), \
            f"the old group was deleted before its replacement was alive and Ready: decode pods just before: {before}"
        assert any(ev.get("reason") == "ReplicaMoved" for ev in kit.events(cluster, ns, name))
    finally:
        watch.stop()
        cluster.kubectl("uncordon", node)
