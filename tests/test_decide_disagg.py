"""controller.decide_disagg: a disaggregated deployment's reconcile decisions, pure (issue 19, step 2).

A small simulated world (pods created, released, made ready, deleted as the outcome says) on the hgx-h200-ib
fleet: DeepSeek-R1 with prefill TP8 x1 and decode TP8 x1.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timezone

import pytest

from meshplan.api.models import LLMDeployment
from meshplan.controller.decide import Inputs
from meshplan.controller.decide_disagg import DisaggInputs, DisaggTarget, decide_disagg, role_groups
from meshplan.planner.disagg import disagg_plan_for_spec
from meshplan.planner.fleet import load_fleet
from meshplan.render.inference_pool import LABEL_SERVING_REVISION, LABEL_SERVING_ROLE, selects
from meshplan.render.options import options_from_spec
from meshplan.render.pipeline import product_for_gpu
from tests.test_disagg_api import FLEET, r1

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def target(manifest: dict, pool_crd: bool = True) -> DisaggTarget:
    topo = load_fleet(FLEET)
    spec = LLMDeployment.from_manifest(manifest).spec
    dplan = disagg_plan_for_spec(spec, topo, mode="enabled")
    serving, network, pods = options_from_spec(spec)
    product, per_node = product_for_gpu(topo, dplan.choice.decode.gpu)
    return DisaggTarget(dplan, serving, network, pods, product, per_node, "registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0", pool_crd)


class World:
    def __init__(self, t: DisaggTarget):
        self.t, self.pods, self.status, self.pool, self.routers = t, {}, {}, None, {}
        self.topology = load_fleet(FLEET)
        self.decode, self.prefill = 1, None          # decode groups (spec.replicas), prefill (role_targets)

    def run(self, ready: bool = True):
        inp = DisaggInputs(Inputs(name="r1", namespace="ns", uid="u1", generation=1, desired_replicas=self.decode,
                                  topology=self.topology, pods=list(self.pods.values()), services=[],
                                  previous_status=self.status, now=NOW), self.t, list(self.routers.values()),
                           prefill_replicas=self.prefill)
        out = decide_disagg(inp)
        for d, _ in out.apply:
            if d["kind"] == "Pod":
                self.pods[d["metadata"]["name"]] = copy.deepcopy(d)
            elif d["kind"] == "InferencePool":
                self.pool = d
            else:
                self.routers[(d["kind"], d["metadata"]["name"])] = d
        for group in out.release:
            for p in group:
                self.pods[p["metadata"]["name"]] = copy.deepcopy(p)
        for _, kind, name, _ in out.delete:
            if kind == "Pod":
                self.pods.pop(name, None)
        self.status = out.status
        if ready:
            for p in self.pods.values():
                if not p["spec"].get("schedulingGates"):
                    p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        return out

    def selected(self) -> set[tuple[str, str]]:
        """(role, revision) of the pods the pool selects."""
        if self.pool is None:
            return set()
        sel = self.pool["spec"]["selector"]["matchLabels"]
        return {(p["metadata"]["labels"][LABEL_SERVING_ROLE], p["metadata"]["labels"][LABEL_SERVING_REVISION])
                for p in self.pods.values() if selects(sel, p["metadata"]["labels"])}


def cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_reaches_available_with_one_prefill_and_one_decode_group_and_a_pool_of_that_revision():
    w = World(target(r1()))
    out = w.run()
    names = sorted(w.pods)
    assert names == ["r1-decode-r0-0", "r1-prefill-r0-0"]
    assert all(p["spec"]["schedulingGates"] == [] for p in w.pods.values())       # released whole
    assert cond(w.status, "Available")["status"] == "False" and w.pool is None
    kinds = sorted(d["kind"] for d, _ in out.apply if d["kind"] != "Pod")
    assert kinds == ["Deployment", "Role", "RoleBinding", "Service", "Service", "Service", "ServiceAccount"]
    w.run()
    assert cond(w.status, "Available")["status"] == "True"
    assert cond(w.status, "Routed")["reason"] == "PoolServesRevision"
    rev = w.status["disaggregation"]["servedRevision"]
    assert w.selected() == {("prefill", rev), ("decode", rev)}
    assert w.pool["metadata"]["ownerReferences"][0]["uid"] == "u1"
    for p in w.pods.values():
        assert p["metadata"]["labels"]["meshplan.dev/deployment"] == "r1"
        assert p["metadata"]["ownerReferences"][0]["name"] == "r1"
    args = {p["metadata"]["labels"][LABEL_SERVING_ROLE]: " ".join(p["spec"]["containers"][0]["args"])
            for p in w.pods.values()}
    assert "kv_producer" in args["prefill"] and "kv_consumer" in args["decode"]
    assert w.status["disaggregation"]["label"] == "P1×TP8 + D1×TP8"


def test_a_rollout_never_selects_a_prefill_and_a_decode_pod_of_different_revisions():
    w = World(target(r1()))
    for _ in range(3):
        w.run()
    old = w.status["disaggregation"]["servedRevision"]
    m = r1()
    m["spec"]["engine"]["env"] = [{"name": "MY_FLAG", "value": "1"}]     # another plan hash for both roles
    w.t = target(m)
    seen = []
    for _ in range(8):
        w.run()
        sel = w.selected()
        seen.append(sel)
        assert len({rev for _, rev in sel}) <= 1, sel
        assert {r for r, _ in sel} in ({"prefill", "decode"}, set()) or len(sel) <= 2
    new = w.status["disaggregation"]["servedRevision"]
    assert new != old
    assert w.selected() == {("prefill", new), ("decode", new)}
    assert {p["metadata"]["labels"][LABEL_SERVING_REVISION] for p in w.pods.values()} == {new}   # drained
    assert cond(w.status, "Available")["status"] == "True"
    # capacity never dropped: every step selected one whole unit (there is room to surge on 4 nodes)
    assert all(len(s) == 2 for s in seen), seen


def test_a_released_group_that_lost_its_pod_is_recreated_whole():
    w = World(target(r1()))
    w.run()
    w.run()
    pod = next(n for n in w.pods if "decode" in n)
    w.pods[pod]["status"] = {"phase": "Failed"}
    out = w.run(ready=False)
    assert ("v1", "Pod", pod) in [(a, k, n) for a, k, n, _ in out.delete]
    assert cond(w.status, "Degraded")["status"] == "True"
    w.run()
    w.run()
    assert pod in w.pods and cond(w.status, "Available")["status"] == "True"


def test_without_the_inferencepool_crd_the_groups_deploy_and_a_condition_names_the_crd():
    w = World(target(r1(), pool_crd=False))
    w.run()
    w.run()
    assert sorted(w.pods) == ["r1-decode-r0-0", "r1-prefill-r0-0"] and w.pool is None
    c = cond(w.status, "Routed")
    assert c["status"] == "False" and c["reason"] == "InferencePoolCRDMissing"
    assert "inferencepools.inference.networking.k8s.io" in c["message"]
    assert cond(w.status, "Available")["status"] == "True"


def test_role_groups_split_by_role_label():
    w = World(target(r1()))
    w.run()
    g = role_groups(list(w.pods.values()))
    assert sorted(g["prefill"]) == [0] and sorted(g["decode"]) == [0]


# ------------------------------------------------------------------ per-role counts (role_targets)


def _roles(w: World) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"prefill": [], "decode": []}
    for n, p in sorted(w.pods.items()):
        out[p["metadata"]["labels"][LABEL_SERVING_ROLE]].append(n)
    return out


def test_each_role_scales_to_its_own_count_and_the_other_role_is_not_touched():
    w = World(target(r1()))
    w.run(), w.run()
    assert cond(w.status, "Available")["status"] == "True"
    decode_pods = {n: p["metadata"].get("uid") for n, p in w.pods.items() if "decode" in n}
    w.prefill = 2                                     # the autoscaler's prefill decision: one more prefill group
    out = w.run()
    assert _roles(w) == {"prefill": ["r1-prefill-r0-0", "r1-prefill-r1-0"], "decode": ["r1-decode-r0-0"]}
    assert not out.delete and cond(w.status, "Progressing")["reason"] == "CreatingReplicas"
    w.run()
    d = w.status["disaggregation"]
    assert d["prefill"]["desiredReplicas"] == 2 and d["prefill"]["readyReplicas"] == 2
    assert d["decode"]["desiredReplicas"] == 1 and d["decode"]["readyReplicas"] == 1
    # the scale subresource's fields count decode groups
    assert (w.status["replicas"], w.status["readyReplicas"], w.status["desiredReplicas"]) == (1, 1, 1)
    assert cond(w.status, "Available")["status"] == "True"
    assert cond(w.status, "Progressing")["reason"] == "Complete"
    w.decode = 2                                      # then decode: prefill stays at 2
    w.run(), w.run()
    assert _roles(w) == {"prefill": ["r1-prefill-r0-0", "r1-prefill-r1-0"],
                         "decode": ["r1-decode-r0-0", "r1-decode-r1-0"]}
    assert (w.status["replicas"], w.status["readyReplicas"]) == (2, 2)
    w.prefill, w.decode = 1, 2                        # prefill down: only its extra group goes
    out = w.run()
    assert sorted(n for _, kind, n, _ in out.delete if kind == "Pod") == ["r1-prefill-r1-0"]
    w.run()
    assert _roles(w) == {"prefill": ["r1-prefill-r0-0"], "decode": ["r1-decode-r0-0", "r1-decode-r1-0"]}
    assert "r1-decode-r0-0" in decode_pods and cond(w.status, "Available")["status"] == "True"


def test_a_role_target_that_does_not_fit_waits_as_a_condition_and_deletes_nothing():
    w = World(target(r1()))
    w.run(), w.run()
    w.prefill = 40                                    # far beyond the fleet: nothing running is deleted
    out = w.run()
    assert not [n for _, kind, n, _ in out.delete if kind == "Pod"]
    placed = cond(w.status, "Placed")
    assert placed["status"] == "False" and placed["reason"] == "InsufficientCapacity", placed
    assert cond(w.status, "Available")["status"] == "True"
    assert "r1-prefill-r0-0" in w.pods and "r1-decode-r0-0" in w.pods


def test_role_targets_count_decode_groups_and_prefill_follows_or_the_autoscaler_decides():
    from types import SimpleNamespace

    from meshplan.controller.decide_disagg import role_targets

    plan = SimpleNamespace(choice=SimpleNamespace(prefill_workers=2, decode_workers=1))
    m = r1()
    m["spec"]["replicas"] = 3
    m["spec"]["gpus"]["maxGpus"] = 256
    spec = LLMDeployment.from_manifest(m).spec
    t = role_targets(spec, {}, plan)
    assert tuple(t) == (6, 3) and "ceil(3 x 2 / 1) = 6" in t.why
    # an autoscaler's status is ignored while autoscaling is off
    assert tuple(role_targets(spec, {"autoscaling": {"toReplicas": 1, "roles": {"prefill": {"toReplicas": 1}}}},
                              plan)) == (6, 3)
    m["spec"]["replicas"] = 0
    assert tuple(role_targets(LLMDeployment.from_manifest(m).spec, {}, plan)) == (0, 0)
    m["spec"]["replicas"] = 1
    m["spec"]["slo"] = {"ttftMs": 2000, "itlMs": 50}
    m["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    spec = LLMDeployment.from_manifest(m).spec
    assert tuple(role_targets(spec, {}, plan)) == (2, 1)                          # no decision yet: follows
    st = {"autoscaling": {"toReplicas": 2, "roles": {"prefill": {"toReplicas": 3}, "decode": {"toReplicas": 2}}}}
    t = role_targets(spec, st, plan)
    assert tuple(t) == (3, 2) and "the autoscaler's last decision, 3" in t.why
    st["autoscaling"]["roles"]["prefill"]["toReplicas"] = 9                       # bounds [2, 8] beside 2 decode
    t = role_targets(spec, st, plan)
    assert tuple(t) == (8, 2) and "clamped into the P:D bounds [2, 8]" in t.why
    st["autoscaling"]["toReplicas"] = 9                                           # decode within maxReplicas 4
    assert tuple(role_targets(spec, st, plan)) == (9, 4)
    st["autoscaling"]["roles"]["prefill"]["toReplicas"] = True                    # not a count: follows
    assert tuple(role_targets(spec, st, plan)) == (8, 4)
