"""The controller's small pure helpers: conditions, status patches, apply comparison, plan cache key, replicas."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import yaml

from meshplan.api.models import LLMDeployment
from meshplan.controller.apply import is_subset, needs_apply
from meshplan.controller.reconcile import desired_replicas, plan_key
from meshplan.controller.status import condition, conditions, status_patch, transitioned
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.topology import build_topology

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _spec(**changes):
    m = yaml.safe_load(open("examples/llama-3.1-70b-hgx-h100.yaml"))
    for k, v in changes.items():
        m["spec"][k] = v
    return LLMDeployment.from_manifest(m).spec


def test_transition_time_kept_while_status_holds_and_moves_when_it_changes():
    c1 = condition([], "Available", True, "ReplicasReady", "2 of 2", 3, T0)
    later = T0 + timedelta(minutes=5)
    c2 = condition([c1], "Available", True, "ReplicasReady", "2 of 2 (again)", 4, later)
    assert c2["lastTransitionTime"] == c1["lastTransitionTime"]
    assert c2["observedGeneration"] == 4 and c2["message"] == "2 of 2 (again)"
    c3 = condition([c2], "Available", False, "ReplicasNotReady", "1 of 2", 4, later)
    assert c3["lastTransitionTime"] != c1["lastTransitionTime"]
    assert transitioned([c2], c3) and not transitioned([c1], c2)


def test_conditions_come_in_a_fixed_order():
    out = conditions([], [("Degraded", False, "AsPlanned", ""), ("Planned", True, "PlanChosen", "")], 1, T0)
    assert [c["type"] for c in out] == ["Planned", "Degraded"]


def test_status_patch_touches_only_owned_keys_and_clears_removed_ones():
    live = {"plan": {"layout": "TP8"}, "autoscaling": {"toReplicas": 3}, "readyReplicas": 1}
    desired = {"readyReplicas": 2}
    assert status_patch(live, desired, ("plan", "readyReplicas")) == {"plan": None, "readyReplicas": 2}
    assert status_patch(live, {"plan": {"layout": "TP8"}, "readyReplicas": 1}, ("plan", "readyReplicas")) is None


def test_subset_comparison_ignores_server_added_fields_but_not_our_values():
    desired = {"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 8000}], "schedulingGates": []}}
    live = {"metadata": {"labels": {"a": "1", "b": "2"}, "uid": "x"},
            "spec": {"ports": [{"port": 8000, "protocol": "TCP"}], "clusterIP": "None"}}
    assert is_subset(desired, live)
    live["metadata"]["labels"]["a"] = "edited"
    assert not is_subset(desired, live)
    gated = {"spec": {"schedulingGates": [{"name": "meshplan.dev/gang"}]}}
    assert not is_subset({"spec": {"schedulingGates": []}}, gated)
    assert needs_apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}}, None)


def test_items_admission_adds_to_a_pod_are_not_drift():
    ours = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    desired = {"spec": {"tolerations": [ours],
                        "containers": [{"name": "engine", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
                        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}
    # what the API server stores after DefaultTolerationSeconds and ServiceAccount admission
    token = {"name": "kube-api-access-x7k2p", "projected": {"sources": []}}
    live = {"spec": {
        "tolerations": [ours,
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
        "containers": [{"name": "engine", "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
        "volumes": [desired["spec"]["volumes"][0], token]}}
    assert is_subset(desired, live)
    # anything else extra, or one of ours missing, is still a difference
    live["spec"]["tolerations"].append({"key": "user", "operator": "Exists", "effect": "NoSchedule"})
    assert not is_subset(desired, live)
    del live["spec"]["tolerations"][-1]
    live["spec"]["tolerations"].pop(0)
    assert not is_subset(desired, live)
    # an explicit empty list still asks for removal of what is there
    assert not is_subset({"spec": {"schedulingGates": []}}, {"spec": {"schedulingGates": [{"name": "g"}]}})
    assert is_subset({"spec": {"volumes": []}}, {"spec": {"volumes": [token]}})


def test_desired_replicas_follow_spec_then_autoscaler_within_bounds():
    fixed = _spec(autoscaling={"enabled": False}, replicas=3)
    assert desired_replicas(fixed, {"autoscaling": {"toReplicas": 7}}) == 3
    auto = _spec(replicas=2)          # example: autoscaling enabled, min 1, max 8
    assert desired_replicas(auto, None) == 2
    assert desired_replicas(auto, {"autoscaling": {"toReplicas": 5}}) == 5
    assert desired_replicas(auto, {"autoscaling": {"toReplicas": 50}}) == 8


def test_plan_key_ignores_replicas_but_not_the_model_or_the_fleet_shape():
    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), ready_if_unknown=True)
    base = plan_key(_spec(), topo)
    assert plan_key(_spec(replicas=5), topo) == base
    assert plan_key(_spec(model={"name": "llama-3.1-8b"}), topo) != base
    nodes = fleet_nodes(load_fleet("hgx-h100"))
    nodes[0].setdefault("spec", {})["unschedulable"] = True
    assert plan_key(_spec(), build_topology(nodes, ready_if_unknown=True)) != base
    # nodes that start advertising an RDMA resource form a network block: wide EP becomes possible, replan
    rdma = fleet_nodes(load_fleet("hgx-h100"))
    for n in rdma:
        n["status"]["allocatable"]["rdma/ib"] = "8"
    assert plan_key(_spec(), build_topology(rdma, ready_if_unknown=True)) != base


def test_foreign_usage_counts_only_gpu_pods_outside_the_served_namespaces():
    from meshplan.controller.reconcile import ForeignUsage

    def pod(ns, node, gpus, phase="Running"):
        return {"metadata": {"namespace": ns, "name": "p"}, "spec": {"nodeName": node, "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": phase}}

    f = ForeignUsage(("mp-op-*", "team-a"))
    f.update([pod("mp-op-x", "n1", 8), pod("team-a", "n1", 2), pod("other", "n2", 4), pod("other", "n3", 0),
              pod("done", "n4", 8, phase="Succeeded")])
    assert f.by_node == [("n2", 4)]


def test_autoscaler_conditions_are_merged_and_capacity_limits_win():
    from meshplan.controller.status import merge_values

    ours = [("Placed", True, "AllReplicasPlaced", ""), ("ScalingLimited", False, "WithinCapacity", "")]
    theirs = (("ScalingActive", True, "MetricsHealthy", "ttft ratio 0.7"), ("ScalingLimited", True, "MaxReplicas", "8"))
    merged = {v[0]: v for v in merge_values(ours, theirs)}
    assert merged["ScalingActive"][2] == "MetricsHealthy"
    assert merged["ScalingLimited"][2] == "MaxReplicas"
    ours[1] = ("ScalingLimited", True, "InsufficientCapacity", "")
    assert {v[0]: v for v in merge_values(ours, theirs)}["ScalingLimited"][2] == "InsufficientCapacity"
    out = conditions([], merge_values(ours, theirs), 1, T0)
    assert [c["type"] for c in out] == ["Placed", "ScalingLimited", "ScalingActive"]


def test_stored_plan_round_trips_and_is_used_only_for_the_same_inputs():
    from meshplan.controller.reconcile import plan_from_annotation, plan_to_annotation
    from meshplan.planner import plan_for_spec

    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), ready_if_unknown=True)
    spec = _spec()
    plan = plan_for_spec(spec, topo)
    key = plan_key(spec, topo)
    value = plan_to_annotation(key, plan)
    back = plan_from_annotation(value, key)
    assert back.choice == plan.choice and back.alternatives == plan.alternatives[:3]
    assert plan_from_annotation(value, plan_key(_spec(model={"name": "llama-3.1-8b"}), topo)) is None
    assert plan_from_annotation("{not json", key) is None


def _pinned_spec():
    return _spec(parallelism={"tensor": 4}, gpus={"maxGpus": 4, "products": ["h100_sxm"]}, replicas=1,
                 workload={"inputTokens": 1024, "outputTokens": 256, "requestRate": 1, "maxContext": 8192},
                 slo={"ttftMs": 30000, "itlMs": 60, "percentile": 99})


def test_an_edited_plan_annotation_is_not_believed():
    """Issue 17 finding 5: an edited meshplan.dev/plan (TP8 on 8 GPUs, the spec pins tensor 4 and
    maxGpus 4, its own text as the message) was used after a restart. The key can be recomputed by
    anyone, so the edit keeps it; the plan is checked against the pins, the budget and the planner."""
    import dataclasses
    import json

    from meshplan.controller.reconcile import (
        PLAN_ANNOTATION,
        Reconciler,
        World,
        plan_to_annotation,
        verify_stored_plan,
    )
    from meshplan.planner import plan_for_spec

    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), ready_if_unknown=True)
    spec = _pinned_spec()
    honest = plan_for_spec(spec, topo)
    assert honest.choice.layout.tp == 4 and verify_stored_plan(honest, spec, topo) == []
    key = plan_key(spec, topo)

    tp8 = dataclasses.replace(honest.choice, layout=dataclasses.replace(honest.choice.layout, tp=8))
    edited = dataclasses.replace(honest, choice=tp8, reason="EDITED: trust me, TP8 on 8 GPUs")
    problems = verify_stored_plan(edited, spec, topo)
    assert any("spec.parallelism.tensor is 4" in p for p in problems), problems
    assert any("spec.gpus.maxGpus is 4" in p for p in problems), problems

    # the pins hold but the numbers are made up: the planner does not produce that candidate
    faked = dataclasses.replace(honest.choice, prediction=dataclasses.replace(honest.choice.prediction,
                                                                               ttft_ms=1.0))
    assert "the planner" in verify_stored_plan(dataclasses.replace(honest, choice=faked), spec, topo)[0]

    rec = Reconciler(kube=None, world=World())
    plan = rec._plan("uid-1", spec, topo, plan_to_annotation(key, edited))
    assert plan.choice.layout.tp == 4 and "EDITED" not in plan.reason
    assert "ignored" in rec.plan_notes["uid-1"] and "uid-1" in rec.plans_moved
    # the event is reported once, not at every reconcile
    rec.plans.clear()
    rec.plan_notes.clear()
    rec._plan("uid-1", spec, topo, plan_to_annotation(key, edited))
    assert "uid-1" not in rec.plan_notes

    # an honest annotation is used; its message is the operator's own (status), never the annotation's text
    rec2 = Reconciler(kube=None, world=World())
    tampered_text = dataclasses.replace(honest, reason="EDITED message")
    status_plan = {"tp": 4, "ep": honest.choice.layout.ep, "pp": honest.choice.layout.pp,
                   "chunkSize": honest.choice.chunk_size, "maxNumSeqs": honest.choice.max_num_seqs,
                   "weightsDtype": honest.choice.weight_dtype, "kvCacheDtype": honest.choice.kv_dtype,
                   "gpuProduct": honest.choice.gpu, "reason": honest.reason}
    kept = rec2._plan("uid-2", spec, topo, plan_to_annotation(key, tampered_text), status_plan)
    assert kept.choice == honest.choice and kept.reason == honest.reason and not rec2.plan_notes
    kept3 = Reconciler(kube=None, world=World())._plan("uid-3", spec, topo, plan_to_annotation(key, tampered_text))
    assert kept3.choice == honest.choice and "EDITED" not in kept3.reason and "re-checked" in kept3.reason
    assert PLAN_ANNOTATION == "meshplan.dev/plan" and json.loads(plan_to_annotation(key, honest))["key"] == key


def test_a_full_fleet_does_not_hide_the_real_reason_a_spec_is_infeasible():
    """Issue 17 finding 10: with every GPU taken, a spec infeasible for another reason (here an SLO
    no layout meets) was reported as "the fleet  has no free GPUs" (empty fleet name)."""
    from meshplan.controller.reconcile import Reconciler, World
    from meshplan.topology import node_info

    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet("hgx-h100"))]
    full = [("other", "squatter", i.name, i.gpus) for i in infos]
    world = World(nodes=lambda: infos, usage=lambda: full)
    rec = Reconciler(kube=None, world=world)
    m = yaml.safe_load(open("examples/llama-3.1-70b-hgx-h100.yaml"))
    m["metadata"].update(namespace="ns", uid="u-9", generation=1)
    m["spec"]["slo"] = {"ttftMs": 1, "itlMs": 1, "percentile": 99}          # no layout meets 1 ms
    out = rec._decide(m, world.topology_without("ns", m["metadata"]["name"]), [], [], [])
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "NoFeasiblePlan"), planned
    assert "no free GPUs" not in planned["message"] and "SLO" in planned["message"], planned["message"]
    assert "  " not in planned["message"]
    # the same spec with a reachable SLO on the full fleet: a capacity problem, with the numbers
    m["spec"]["slo"] = {"ttftMs": 30000, "itlMs": 60, "percentile": 99}
    out = rec._decide(m, world.topology_without("ns", m["metadata"]["name"]), [], [], [])
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "InsufficientCapacity" and "only 0 are free" in planned["message"], planned


def test_a_restored_plan_keeps_the_planners_sentence_from_status_search_reason():
    """After a restart the verified stored plan keeps the sentence the operator wrote: status.plan.searchReason
    (the planner's), not status.plan.reason (which describes what is deployed) nor a made-up one. Without it
    the restart rewrote status.plan (e2e test_operator_restart_keeps_running_replicas_and_their_plan)."""
    from types import SimpleNamespace

    from meshplan.controller.reconcile import restored_reason

    layout = SimpleNamespace(tp=2, ep=1, pp=1, label=lambda *a: "TP2")
    choice = SimpleNamespace(layout=layout, chunk_size=256, max_num_seqs=27, weight_dtype="fp8", kv_dtype="fp8",
                             gpu="h100_sxm")
    plan = SimpleNamespace(choice=choice)
    prev = {"tp": 2, "ep": 1, "pp": 1, "chunkSize": 256, "maxNumSeqs": 27, "weightsDtype": "fp8",
            "kvCacheDtype": "fp8", "gpuProduct": "NVIDIA-H100-80GB-HBM3", "reason": "running TP2 x 2 replica(s) = 4 GPUs",
            "searchReason": "maxThroughput: TP2 x DP2 (4 GPUs) ..."}
    assert restored_reason(plan, prev) == "maxThroughput: TP2 x DP2 (4 GPUs) ..."
    older = {k: v for k, v in prev.items() if k != "searchReason"} | {"reason": "maxThroughput: older sentence"}
    assert restored_reason(plan, older) == "maxThroughput: older sentence"
    assert "earlier run of the operator" in restored_reason(plan, {**prev, "tp": 4})
