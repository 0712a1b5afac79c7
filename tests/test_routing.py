"""The router in front of a deployment (issue 19): controller.routing.decide_router (pure) and the reconciler
wiring, against the fake API server of test_controller_refusals (with the InferencePool CRD "installed" where a
test says so; it runs nothing, so pods are marked Ready by the test, as the kubelet would). The engine routers'
argv against their own parsers: tests/conformance (test_vllm, test_sglang, test_trtllm)."""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timezone

import pytest

from meshplan.api.models import LLMDeployment
from meshplan.api.policy import DEFAULT_ALLOWED_IMAGES, EnginePolicy, policy_problems
from meshplan.controller.reconcile import Reconciler, World
from meshplan.controller.routing import RouterInputs, decide_router, is_router_object
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines.base import Disaggregation
from meshplan.render.engine_router import endpoint, router_name
from meshplan.render.inference_pool import LABEL_SERVING_REVISION, LABEL_SERVING_ROLE, epp_name, pool_name
from meshplan.render.workloads import LABEL_DEPLOYMENT, LABEL_ROLE
from meshplan.topology import node_info
from tests.test_controller_refusals import FakeApiServer, _manifest
from tests.test_disagg_api import r1

IMAGE = "registry.example.com/routers/vllm-router:0.1.17"


class PoolApiServer(FakeApiServer):
    """The fake API server with the Gateway API Inference Extension's CRDs installed."""

    async def crd_exists(self, name):
        return name == "inferencepools.inference.networking.k8s.io"


def _reconciler(body: dict, fleet: str, api_cls=PoolApiServer) -> tuple[FakeApiServer, Reconciler]:
    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet(fleet))]
    api = api_cls(body)
    policy = EnginePolicy(allowed_images={**DEFAULT_ALLOWED_IMAGES, "router": (
        *DEFAULT_ALLOWED_IMAGES["router"], "registry.example.com/routers/*")})
    return api, Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: 1000.0,
                           clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc), engine_policy=policy)


def _cond(body: dict, type_: str) -> dict:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


def _ready_all_pods(api: FakeApiServer) -> None:
    for (k, _), o in api.objects.items():
        if k == "Pod":
            o.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]
            o["status"]["phase"] = "Running"


def _pd(kind: str = "engine", engine: str = "vllm") -> dict:
    m = r1()
    m["metadata"].update(name="r1", namespace="ns", uid="u-1", generation=1)
    m["spec"]["engine"] = {"kind": engine}
    m["spec"]["serving"]["router"] = {"kind": kind, "image": IMAGE}
    return m


# ----------------------------------------------------------------------------- the API


def test_the_router_kind_defaults_to_the_inference_pool_and_engine_needs_disaggregation():
    m = _pd("engine")
    assert LLMDeployment.from_manifest(m).spec.serving.router.kind == "engine"
    m2 = _pd("engine")
    del m2["spec"]["serving"]["router"]["kind"]
    assert LLMDeployment.from_manifest(m2).spec.serving.router.kind == "inferencePool"
    agg = _manifest()
    agg["spec"]["serving"] = {"router": {"kind": "engine", "image": IMAGE}}
    with pytest.raises(ValueError, match="router.kind engine is the engine's prefill/decode router"):
        LLMDeployment.from_manifest(agg)
    agg["spec"]["serving"] = {"router": {"kind": "inferencePool"}}
    with pytest.raises(ValueError, match="spec.serving.router.image is required"):
        LLMDeployment.from_manifest(agg)
    agg["spec"]["serving"] = {"router": {"image": IMAGE}}           # an aggregated pool: allowed
    assert LLMDeployment.from_manifest(agg).spec.serving.router.kind == "inferencePool"


def test_the_router_image_is_under_the_admins_policy_and_an_engine_image_may_carry_its_router():
    default = EnginePolicy()
    m = _pd("engine", engine="sglang")
    spec = LLMDeployment.from_manifest(m).spec
    assert any("allowedImages.router" in p and "one allowed for sglang also does" in p
               for p in policy_problems(spec, default))
    m["spec"]["serving"]["router"]["image"] = "docker.io/lmsysorg/sglang:v0.5.23-cu129"
    spec = LLMDeployment.from_manifest(m).spec
    assert default.allowed_images["sglang"] and not policy_problems(spec, default)
    m["spec"]["serving"]["router"]["kind"] = "inferencePool"      # a picker is not the engine's: the router list only
    spec = LLMDeployment.from_manifest(m).spec
    assert any("allowedImages.router" in p for p in policy_problems(spec, default))


# ----------------------------------------------------------------------------- decide_router (pure)


def _inp(**kw) -> RouterInputs:
    base = dict(name="r1", namespace="ns", uid="u-1", engine="vllm", kind="engine", image=IMAGE, port=8000,
                pool_crd=True, disaggregated=True, serve="abc", served_units=1, revision="abc",
                prefill=["r1-prefill-r0-0.r1-prefill-r0.ns.svc:8000"], decode=["r1-decode-r0-0.r1-decode-r0.ns.svc:8000"],
                disagg=Disaggregation("decode"))
    base.update(kw)
    return RouterInputs(**base)


def test_the_engine_router_lists_the_served_leaders_and_rolls_without_a_gap():
    out = decide_router(_inp())
    dep, svc = (o for o, _ in out.apply)
    assert dep["kind"] == "Deployment" and dep["metadata"]["name"] == router_name("r1") == svc["metadata"]["name"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == IMAGE and c["command"] == ["vllm-router"]
    args = c["args"]
    assert args[args.index("--prefill") + 1] == "http://r1-prefill-r0-0.r1-prefill-r0.ns.svc:8000"
    assert args[args.index("--decode") + 1] == "http://r1-decode-r0-0.r1-decode-r0.ns.svc:8000"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert all(is_router_object(o) for o, _ in out.apply)
    assert out.condition[:3] == ("Routed", True, "EngineRouterServesRevision") and "abc" in out.condition[3]
    assert out.delete == []


@pytest.mark.parametrize("engine,command", [("sglang", ["python3", "-m", "sglang_router.launch_router"]),
                                            ("trtllm", ["/bin/sh", "-c"])])
def test_each_engine_gets_its_own_router(engine, command):
    out = decide_router(_inp(engine=engine))
    assert out.apply[0][0]["spec"]["template"]["spec"]["containers"][0]["command"] == command


def test_no_served_revision_no_engine_router_and_a_live_one_is_left_alone():
    live = decide_router(_inp()).apply[0][0]
    live = {**live, "metadata": {**live["metadata"], "uid": "uid-router"}}
    out = decide_router(_inp(serve=None, prefill=[], decode=[], live=[live]))
    assert out.apply == [] and out.delete == []
    assert out.condition[:3] == ("Routed", False, "NoRevisionReady")


def test_switching_kinds_deletes_the_other_kinds_objects_only():
    pool_side = decide_router(_inp(kind="inferencePool"))
    kinds = sorted(o["kind"] for o, _ in pool_side.apply)
    assert kinds == ["Deployment", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"], kinds
    pool = next(o for o, _ in pool_side.apply if o["kind"] == "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"][LABEL_SERVING_REVISION] == "abc"
    live = [{**o, "metadata": {**o["metadata"], "uid": f"u-{o['kind']}"}} for o, _ in pool_side.apply]
    engine_pod_svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": epp_name("r1"), "uid": "x",
                                                                            "labels": {LABEL_DEPLOYMENT: "r1"}}}
    out = decide_router(_inp(kind="engine", live=live))
    gone = sorted((k, n) for _, k, n, _ in out.delete)
    assert gone == sorted((o["kind"], o["metadata"]["name"]) for o in live), gone
    # a Service of that name that is not a router object (no router component label) is never deleted
    out = decide_router(_inp(kind="engine", live=[engine_pod_svc]))
    assert out.delete == []
    # and back: the engine router goes
    eng = [{**o, "metadata": {**o["metadata"], "uid": "u"}} for o, _ in decide_router(_inp()).apply]
    back = decide_router(_inp(kind="inferencePool", live=eng))
    assert sorted((k, n) for _, k, n, _ in back.delete) == [("Deployment", router_name("r1")),
                                                           ("Service", router_name("r1"))]


def test_an_aggregated_pool_selects_every_leader_and_no_revision():
    out = decide_router(_inp(kind="inferencePool", disaggregated=False, serve=None, revision="", prefill=[],
                             decode=[]))
    pool = next(o for o, _ in out.apply if o["kind"] == "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == {LABEL_DEPLOYMENT: "r1", LABEL_ROLE: "leader"}
    assert out.condition[:3] == ("Routed", True, "PoolSelectsReplicas")
    nocrd = decide_router(_inp(kind="inferencePool", disaggregated=False, serve=None, pool_crd=False))
    assert "InferencePool" not in {o["kind"] for o, _ in nocrd.apply}
    assert nocrd.condition[:3] == ("Routed", False, "InferencePoolCRDMissing") and "replicas are" in nocrd.condition[3]


def test_no_router_asked_deletes_what_is_left_and_says_so():
    live = [{**o, "metadata": {**o["metadata"], "uid": "u"}}
            for o, _ in decide_router(_inp(kind="inferencePool", disaggregated=False)).apply]
    out = decide_router(_inp(kind=None, disaggregated=False, live=live))
    assert len(out.delete) == len(live) and out.apply == []
    assert out.condition[:3] == ("Routed", False, "NoRouter")
    assert decide_router(_inp(kind=None, disaggregated=False)).condition is None


def test_a_leader_without_a_subdomain_has_no_endpoint():
    assert endpoint({"metadata": {"name": "p"}, "spec": {"subdomain": "s"}}, "ns", 8000) == "p.s.ns.svc:8000"
    assert endpoint({"metadata": {"name": "p"}, "spec": {}}, "ns", 8000) is None


# ----------------------------------------------------------------------------- the reconciler


def test_a_disaggregated_deployment_with_the_engine_router_routes_once_a_unit_is_ready():
    api, rec = _reconciler(_pd("engine"), "hgx-h200-ib")
    asyncio.run(rec.reconcile("ns", "r1"))
    assert ("Deployment", router_name("r1")) not in api.objects            # nothing ready, nothing to route to
    routed = _cond(api.body, "Routed")
    assert routed["status"] == "False" and routed["reason"] == "NoRevisionReady"
    assert not any(k == "InferencePool" or n == epp_name("r1") for k, n in api.objects)
    _ready_all_pods(api)
    asyncio.run(rec.reconcile("ns", "r1"))
    dep = api.objects[("Deployment", router_name("r1"))]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    pods = {o["metadata"]["labels"][LABEL_SERVING_ROLE]: o for (k, _), o in api.objects.items() if k == "Pod"}
    assert args[args.index("--prefill") + 1] == "http://" + endpoint(pods["prefill"], "ns", 8000)
    assert args[args.index("--decode") + 1] == "http://" + endpoint(pods["decode"], "ns", 8000)
    assert ("Service", router_name("r1")) in api.objects
    routed = _cond(api.body, "Routed")
    assert routed["status"] == "True" and routed["reason"] == "EngineRouterServesRevision", routed
    assert api.body["status"]["disaggregation"]["servedRevision"] in routed["message"]
    # switched to the InferencePool: the engine router goes, the picker and the pool come
    api.bodies["r1"]["spec"]["serving"]["router"]["kind"] = "inferencePool"
    api.bodies["r1"]["metadata"]["generation"] = 2
    asyncio.run(rec.reconcile("ns", "r1"))
    assert ("Deployment", router_name("r1")) not in api.objects and ("Service", router_name("r1")) not in api.objects
    assert ("InferencePool", pool_name("r1")) in api.objects and ("Deployment", epp_name("r1")) in api.objects
    assert sorted(n for (k, n) in api.objects if k == "Pod") == ["r1-decode-r0-0", "r1-prefill-r0-0"]   # untouched


def test_an_aggregated_deployment_gets_a_pool_when_asked_and_loses_it_when_not():
    m = _manifest()
    m["spec"]["serving"] = {"router": {"image": "registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0"}}
    api, rec = _reconciler(m, "hgx-h100")
    asyncio.run(rec.reconcile("ns", "llama"))
    pool = api.objects[("InferencePool", pool_name("llama"))]
    assert pool["spec"]["selector"]["matchLabels"] == {LABEL_DEPLOYMENT: "llama", LABEL_ROLE: "leader"}
    leaders = [o for (k, _), o in api.objects.items() if k == "Pod" and o["metadata"]["labels"].get(LABEL_ROLE) == "leader"]
    assert leaders, "the pool selects the replicas' leaders"
    assert ("Service", epp_name("llama")) in api.objects and ("Deployment", epp_name("llama")) in api.objects
    routed = _cond(api.body, "Routed")
    assert routed["status"] == "True" and routed["reason"] == "PoolSelectsReplicas", routed
    # a second reconcile keeps the picker's Service (the aggregated path does not take it for a stale group's)
    asyncio.run(rec.reconcile("ns", "llama"))
    assert ("Service", epp_name("llama")) in api.objects
    pods_before = sorted(n for (k, n) in api.objects if k == "Pod")
    # the router removed from the spec: its objects go, the replicas stay
    spec = copy.deepcopy(api.bodies["llama"]["spec"])
    spec.pop("serving")
    api.bodies["llama"]["spec"] = spec
    api.bodies["llama"]["metadata"]["generation"] = 2
    asyncio.run(rec.reconcile("ns", "llama"))
    left = {(k, n) for (k, n) in api.objects if n in (epp_name("llama"), pool_name("llama"))}
    assert left == set(), left
    assert sorted(n for (k, n) in api.objects if k == "Pod") == pods_before
    assert _cond(api.body, "Routed")["reason"] == "NoRouter"


def test_status_placement_of_a_disaggregated_deployment_lists_each_role_group():
    api, rec = _reconciler(_pd("inferencePool"), "hgx-h200-ib")
    asyncio.run(rec.reconcile("ns", "r1"))
    rows = api.body["status"]["placement"]
    assert [(r["role"], r["index"]) for r in rows] == [("prefill", 0), ("decode", 0)], rows
    pods = {o["metadata"]["labels"][LABEL_SERVING_ROLE]: o for (k, _), o in api.objects.items() if k == "Pod"}
    for r in rows:
        p = pods[r["role"]]
        assert r["nodes"] == [p["metadata"]["annotations"]["meshplan.dev/assigned-node"]]
        assert r["gpus"] == 8 and r["ready"] is False
        assert r["revision"] == p["metadata"]["labels"][LABEL_SERVING_REVISION]
    _ready_all_pods(api)
    asyncio.run(rec.reconcile("ns", "r1"))
    assert all(r["ready"] for r in api.body["status"]["placement"]), api.body["status"]["placement"]
    from meshplan.api.models import LLMDeploymentStatus

    LLMDeploymentStatus.model_validate(api.body["status"])        # the status document the CRD describes
