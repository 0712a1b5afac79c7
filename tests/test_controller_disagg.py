"""The reconciler's disaggregated path (issue 19, step 2) against the fake API server of
test_controller_refusals: a `spec.serving.disaggregation: enabled` DeepSeek-R1 gets prefill and decode groups,
the endpoint picker and its RBAC, status.disaggregation, and (no InferencePool CRD in this fake) Routed=False
naming the CRD; an aggregated manifest goes through `decide` as before (no role labels, no disaggregation status).
The same against a real API server with the CRD: e2e/test_disagg.py."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from meshplan.controller.reconcile import Reconciler, World
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.render.inference_pool import LABEL_SERVING_ROLE
from meshplan.topology import node_info
from tests.test_controller_refusals import FakeApiServer, _manifest
from tests.test_disagg_api import r1


def _reconciler(body: dict, fleet: str) -> tuple[FakeApiServer, Reconciler]:
    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet(fleet))]
    api = FakeApiServer(body)
    return api, Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: 1000.0,
                           clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))


def _cond(body: dict, type_: str) -> dict:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


def test_a_disaggregated_spec_gets_role_groups_the_picker_and_a_condition_without_the_pool_crd():
    m = r1()
    m["metadata"].update(name="r1", namespace="ns", uid="u-1", generation=1)
    api, rec = _reconciler(m, "hgx-h200-ib")
    asyncio.run(rec.reconcile("ns", "r1"))
    pods = {n: o for (k, n), o in api.objects.items() if k == "Pod"}
    assert sorted(pods) == ["r1-decode-r0-0", "r1-prefill-r0-0"]
    assert {o["metadata"]["labels"][LABEL_SERVING_ROLE] for o in pods.values()} == {"prefill", "decode"}
    assert all(o["spec"]["schedulingGates"] == [] for o in pods.values())         # released in the same reconcile
    kinds = {k for k, _ in api.objects}
    assert {"Deployment", "ServiceAccount", "Role", "RoleBinding"} <= kinds and "InferencePool" not in kinds
    st = api.body["status"]
    assert st["disaggregation"]["label"] == "P1×TP8 + D1×TP8" and st["disaggregation"]["mode"] == "enabled"
    routed = _cond(api.body, "Routed")
    assert routed["status"] == "False" and routed["reason"] == "InferencePoolCRDMissing"
    assert "inferencepools.inference.networking.k8s.io" in routed["message"]
    assert any(e["reason"] == "InferencePoolCRDMissing" for e in api.events)


def test_an_aggregated_spec_is_reconciled_as_before():
    m = _manifest()
    api, rec = _reconciler(m, "hgx-h100")
    asyncio.run(rec.reconcile("ns", "llama"))
    pods = [o for (k, _), o in api.objects.items() if k == "Pod"]
    assert pods and all(LABEL_SERVING_ROLE not in o["metadata"]["labels"] for o in pods)
    assert sorted(o["metadata"]["name"] for o in pods) == ["llama-r0-0"]
    assert "disaggregation" not in api.body["status"]
    assert {k for k, _ in api.objects} == {"Pod", "Service"}


def test_switching_a_running_deployment_between_serving_modes_changes_nothing_and_says_why():
    """disabled after enabled: decide.py would read r1-prefill-r0-0 and r1-decode-r0-0 as one replica group (both
    index 0) and delete one; instead nothing changes and the condition names the field. The other way round
    (aggregated pods, then enabled) keeps the aggregated group."""
    m = r1()
    m["metadata"].update(name="r1", namespace="ns", uid="u-1", generation=1)
    api, rec = _reconciler(m, "hgx-h200-ib")
    asyncio.run(rec.reconcile("ns", "r1"))
    before = {n: o["metadata"].get("uid") for (k, n), o in api.objects.items() if k == "Pod"}
    assert sorted(before) == ["r1-decode-r0-0", "r1-prefill-r0-0"]
    api.body["spec"].pop("serving")
    api.body["metadata"]["generation"] = 2
    asyncio.run(rec.reconcile("ns", "r1"))
    after = {n: o["metadata"].get("uid") for (k, n), o in api.objects.items() if k == "Pod"}
    assert after == before
    msgs = [c for c in api.body["status"]["conditions"] if c.get("reason") == "ServingModeChange"]
    assert msgs and "spec.serving.disaggregation" in msgs[0]["message"] and "r1-prefill-r0-0" in msgs[0]["message"]

    agg = _manifest()
    api2, rec2 = _reconciler(agg, "hgx-h100")
    asyncio.run(rec2.reconcile("ns", "llama"))
    pods = {n for (k, n), _ in api2.objects.items() if k == "Pod"}
    api2.body["spec"]["serving"] = {"disaggregation": "enabled", "router": {"image": "registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0"}}
    api2.body["metadata"]["generation"] = 2
    asyncio.run(rec2.reconcile("ns", "llama"))
    assert {n for (k, n), _ in api2.objects.items() if k == "Pod"} == pods
    assert not {k for k, _ in api2.objects} & {"Deployment", "Role", "RoleBinding"}


def _cordonable_r1():
    """The R1 disaggregated deployment on a private copy of hgx-h200-ib, and `cordon(node)` for that copy."""
    import copy

    m = r1()
    m["metadata"].update(name="r1", namespace="ns", uid="u-1", generation=1)
    nodes = [copy.deepcopy(n) for n in fleet_nodes(load_fleet("hgx-h200-ib"))]
    infos = [node_info(n, ready_if_unknown=True) for n in nodes]
    api = FakeApiServer(m)
    rec = Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: 1000.0,
                     clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))

    def cordon(node: str) -> None:
        for n in nodes:
            if n["metadata"]["name"] == node:
                n.setdefault("spec", {})["unschedulable"] = True
        infos[:] = [node_info(n, ready_if_unknown=True) for n in nodes]
    return api, rec, cordon


def test_a_group_on_a_cordoned_node_is_replaced_make_before_break():
    """A ready decode group whose node is cordoned keeps serving (still selected, still counted) while a
    replacement is created on another node; it is deleted only once the replacement is ready (ReplicaMoved)."""
    api, rec, cordon = _cordonable_r1()

    def ready_all():
        for (k, _), o in api.objects.items():
            if k == "Pod":
                o.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]
                o["status"]["phase"] = "Running"

    def pods():
        return {n: o for (k, n), o in api.objects.items() if k == "Pod"}

    asyncio.run(rec.reconcile("ns", "r1"))
    ready_all()
    asyncio.run(rec.reconcile("ns", "r1"))
    assert _cond(api.body, "Available")["status"] == "True"
    decode0 = pods()["r1-decode-r0-0"]
    node = decode0["metadata"]["annotations"]["meshplan.dev/assigned-node"]
    cordon(node)
    asyncio.run(rec.reconcile("ns", "r1"))
    p = pods()
    assert "r1-decode-r0-0" in p, "the group on the cordoned node is never deleted before its replacement is ready"
    assert "r1-decode-r1-0" in p, sorted(p)
    assert p["r1-decode-r1-0"]["metadata"]["annotations"]["meshplan.dev/assigned-node"] != node
    prog = _cond(api.body, "Progressing")
    assert prog["reason"] == "MovingReplicas" and "decode replica 0" in prog["message"], prog
    assert _cond(api.body, "Available")["status"] == "True"            # the moving group still serves
    assert {r["index"] for r in api.body["status"]["placement"] if r["role"] == "decode"} == {0, 1}
    asyncio.run(rec.reconcile("ns", "r1"))                             # not ready yet: nothing more happens
    assert "r1-decode-r0-0" in pods()
    ready_all()
    asyncio.run(rec.reconcile("ns", "r1"))
    p = pods()
    assert "r1-decode-r0-0" not in p and "r1-decode-r1-0" in p and "r1-prefill-r0-0" in p, sorted(p)
    assert any(e["reason"] == "ReplicaMoved" for e in api.events), [e["reason"] for e in api.events]
    assert _cond(api.body, "Available")["status"] == "True"
    assert api.body["status"]["readyReplicas"] == 1


def test_a_group_not_ready_on_a_cordoned_node_is_placed_again_whole():
    """A decode group that is not ready yet serves nobody: when its node is cordoned it is deleted whole
    (ReplicaReplaced) and created again on a node that holds it."""
    api, rec, cordon = _cordonable_r1()
    asyncio.run(rec.reconcile("ns", "r1"))
    node = api.objects[("Pod", "r1-decode-r0-0")]["metadata"]["annotations"]["meshplan.dev/assigned-node"]
    cordon(node)
    asyncio.run(rec.reconcile("ns", "r1"))
    assert ("Pod", "r1-decode-r0-0") not in api.objects
    assert ("Pod", "r1-prefill-r0-0") in api.objects                      # the other role is untouched
    assert any(e["reason"] == "ReplicaReplaced" for e in api.events), [e["reason"] for e in api.events]
    asyncio.run(rec.reconcile("ns", "r1"))
    again = api.objects[("Pod", "r1-decode-r0-0")]
    assert again["metadata"]["annotations"]["meshplan.dev/assigned-node"] != node
