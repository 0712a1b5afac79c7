"""controller.autoscaling_roles: the autoscaler loop's per-role evaluation of a disaggregated deployment.

The decision itself is tested in test_autoscale_roles.py; here the pieces the loop adds (per-role queries,
configuration, capacities, status document, conditions, events) and one evaluation against a fake API server
and a fake Prometheus that answers per role label (the loop against a real control plane and Prometheus:
e2e/test_autoscale_roles_e2e.py).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from meshplan.api.models import LLMDeployment, LLMDeploymentStatus
from meshplan.autoscale.policy import AutoscaleConfigError
from meshplan.autoscale.snapshot import MetricsSnapshot
from meshplan.controller import autoscaling_roles as ar
from meshplan.planner.disagg import disagg_plan_for_spec
from meshplan.planner.fleet import load_fleet
from tests.test_disagg_api import FLEET, r1


def manifest(**autoscaling) -> dict:
    m = r1()
    m["metadata"] = {"name": "r1", "namespace": "ns", "uid": "u1"}
    m["spec"]["slo"] = {"ttftMs": 2000, "itlMs": 50}
    m["spec"]["gpus"]["maxGpus"] = 48
    m["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "upWindowSeconds": 10,
                                "downWindowSeconds": 30, "cooldownSeconds": 0, **autoscaling}
    return m


def spec_and_plan(m: dict | None = None):
    spec = LLMDeployment.from_manifest(m or manifest()).spec
    return spec, disagg_plan_for_spec(spec, load_fleet(FLEET), mode="enabled")


def test_each_role_is_queried_on_its_own_pods_with_its_own_signals():
    spec, _ = spec_and_plan()
    pre, dec = (ar.role_queries(spec, "ns", "r1", r) for r in ("prefill", "decode"))
    for q, role in ((pre, "prefill"), (dec, "decode")):
        for text in (q.ttft_s, q.request_rate_per_s, q.queue_depth, q.running):
            assert f'{ar.ROLE_LABEL}="{role}"' in text and 'namespace="ns"' in text
            assert 'meshplan_dev_deployment="r1"' in text
    assert "vllm:time_to_first_token_seconds_bucket" in pre.ttft_s
    assert pre.kv_usage is None                                      # a prefill pod's KV pool empties per hand-off
    assert "vllm:kv_cache_usage_perc" in dec.kv_usage and f'{ar.ROLE_LABEL}="decode"' in dec.kv_usage
    assert "vllm:inter_token_latency_seconds_bucket" in dec.itl_s
    with pytest.raises(Exception, match="not one of prefill, decode"):
        ar.role_queries(spec, "ns", "r1", "router")


def test_the_configuration_splits_the_slo_and_derives_the_prefill_bounds_from_the_ratio():
    spec, dplan = spec_and_plan()
    cfg = ar.roles_config(spec, dplan.choice)
    assert cfg.plan_ratio == (2, 1)                                  # the plan: P2×TP8 + D1×TP8
    assert cfg.prefill.ttft_target_s == 2.0 and cfg.prefill.itl_target_s is None
    assert cfg.decode.itl_target_s == 0.05 and cfg.decode.ttft_target_s is None
    assert cfg.decode.kv_high_watermark == 0.9 and cfg.prefill.kv_high_watermark is None
    assert (cfg.decode.min_replicas, cfg.decode.max_replicas) == (1, 3)
    # P:D bounds [1, 4] around 2:1: at least ceil(1 x 1) = 1 prefill, at most floor(4 x 3) = 12
    assert (cfg.prefill.min_replicas, cfg.prefill.max_replicas) == (1, 12)
    m = manifest()
    m["spec"]["slo"] = {"ttftMs": 2000}
    s2 = LLMDeployment.from_manifest(m).spec
    with pytest.raises(AutoscaleConfigError, match="spec.slo.itlMs"):
        ar.roles_config(s2, dplan.choice)


def _pod(name: str, role: str, replica: int, node: str, gpus: int = 8) -> dict:
    return {"metadata": {"name": name, "labels": {"meshplan.dev/deployment": "r1", "meshplan.dev/replica": str(replica),
                                                  "meshplan.dev/rank": "0", "meshplan.dev/serving-role": role,
                                                  "meshplan.dev/serving-revision": "rev"},
                         "annotations": {"meshplan.dev/assigned-node": node}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_capacities_come_from_the_plan_and_the_gpus_free_beside_the_running_groups():
    spec, dplan = spec_and_plan()
    topo = load_fleet(FLEET)
    nodes = sorted({n for d in topo.domains for n in d.nodes})
    free0 = topo.free_gpus
    caps = ar.role_capacities(dplan.choice, spec, topo, [])
    assert caps["prefill"].additional_replicas_that_fit == free0 // 8 == caps["decode"].additional_replicas_that_fit
    assert caps["prefill"].requests_per_s_at_slo > 0 and caps["prefill"].concurrency_at_slo is None
    assert caps["decode"].requests_per_s_at_slo > 0 and caps["decode"].concurrency_at_slo > 0
    pods = [_pod("r1-prefill-r0-0", "prefill", 0, nodes[0]), _pod("r1-decode-r0-0", "decode", 0, nodes[1])]
    caps = ar.role_capacities(dplan.choice, spec, topo, pods, {"prefill": 1, "decode": 1})
    assert caps["decode"].additional_replicas_that_fit == (free0 - 16) // 8
    assert caps["decode"].ready_replicas == 1


class FakeKube:
    def __init__(self, body: dict, pods: list):
        self.body, self.pods, self.patches = body, pods, []

    async def list(self, *_a, **_k):
        return copy.deepcopy(self.pods)

    async def patch_status(self, _av, _k, _ns, _n, patch):
        self.patches.append(copy.deepcopy(patch))
        st = self.body.setdefault("status", {})
        st.update(patch)


class FakeSource:
    """Prometheus per role: answers each role's queries (told apart by the role matcher) with its snapshot."""

    def __init__(self):
        self.snaps: dict[str, MetricsSnapshot] = {}
        self.asked: list[str] = []

    async def fetch_async(self, queries, now):
        role = "prefill" if f'{ar.ROLE_LABEL}="prefill"' in queries.ttft_s else "decode"
        self.asked.append(role)
        return self.snaps[role]


def fake_autoscaler(body: dict, dplan, pods: list):
    events: list[tuple] = []
    enq: list = []
    clock = {"t": 1_800_000_000.0}
    src = FakeSource()

    async def event(_body, *ev):
        events.append(ev)

    topo = load_fleet(FLEET)
    rec = SimpleNamespace(kube=FakeKube(body, pods), world=SimpleNamespace(topology_without=lambda ns, n: topo),
                          autoscaler_conditions={}, _event=event, disagg_plans={"u1": ("k", dplan)})
    a = SimpleNamespace(reconciler=rec, role_states={}, conditions={}, clock=lambda: clock["t"],
                        allowed_endpoints=lambda: {"default": "http://prom:9090"}, _source=lambda url, name=None: src,
                        enqueue=enq.append)
    return a, src, events, enq, clock


def test_one_evaluation_scales_the_prefill_groups_on_their_ttft_and_leaves_decode_alone():
    m = manifest()
    spec, dplan = spec_and_plan(m)
    topo = load_fleet(FLEET)
    nodes = sorted({n for d in topo.domains for n in d.nodes})
    pods = [_pod("r1-prefill-r0-0", "prefill", 0, nodes[0]), _pod("r1-prefill-r1-0", "prefill", 1, nodes[0]),
            _pod("r1-decode-r0-0", "decode", 0, nodes[1])]
    body = copy.deepcopy(m)
    a, src, events, enq, clock = fake_autoscaler(body, dplan, pods)
    assert ar.disaggregated_plan(a.reconciler, "u1") is dplan
    # prefill: TTFT 2x its 2 s target; decode: ITL and KV usage well inside theirs
    src.snaps["prefill"] = MetricsSnapshot(ok=True, ttft_s=4.0, itl_s=None, request_rate_per_s=0.5, queue_depth=4,
                                           running=1, sample_age_s=1)
    src.snaps["decode"] = MetricsSnapshot(ok=True, itl_s=0.03, request_rate_per_s=0.5, queue_depth=0, running=4,
                                          kv_usage=0.3, sample_age_s=1)
    d1 = asyncio.run(ar.evaluate(a, body, spec, dplan))
    assert sorted(src.asked) == ["decode", "prefill"]
    assert (d1.prefill.desired_replicas, d1.decode.desired_replicas) == (2, 1)      # the up window starts
    clock["t"] += 11
    d2 = asyncio.run(ar.evaluate(a, body, spec, dplan))
    assert (d2.prefill.desired_replicas, d2.decode.desired_replicas) == (3, 1), d2.prefill.message
    auto = body["status"]["autoscaling"]
    assert auto["roles"]["prefill"]["toReplicas"] == 3 and auto["roles"]["decode"]["toReplicas"] == 1
    assert auto["toReplicas"] == 1 and auto["roles"]["ratio"] == "3:1"
    assert auto["roles"]["decode"]["kvCacheUsage"] == 0.3 and "kvCacheUsage" not in auto["roles"]["prefill"]
    LLMDeploymentStatus.model_validate(body["status"])                          # the schema's fields
    assert [(e[1], e[2].split(" because")[0]) for e in events] == [("ScaledUp", "prefill groups scaled from 2 to 3")]
    assert ("ns", "r1") in enq
    # the reconciler now drives 2 prefill + 1 decode
    from meshplan.controller.decide_disagg import role_targets

    assert tuple(role_targets(spec, body["status"], dplan)) == (3, 1)
    conds = {c[0]: c for c in a.reconciler.autoscaler_conditions[("ns", "r1")]}
    assert conds["ScalingActive"][1] == "True" and "prefill:" in conds["ScalingActive"][3] \
        and "decode:" in conds["ScalingActive"][3]
    # a restarted operator resumes from status: the same counts, the prefill role's cooldown kept
    st = ar.roles_state_from_status(body["status"]["autoscaling"], {"prefill": 3, "decode": 1}, clock["t"])
    assert st.prefill.desired_replicas == 3 and st.prefill.last_change_at is not None
    assert st.decode.last_change_at is None


def test_decode_scales_on_kv_pressure_and_prefill_stays():
    m = manifest()
    spec, dplan = spec_and_plan(m)
    body = copy.deepcopy(m)
    nodes = sorted({n for d in load_fleet(FLEET).domains for n in d.nodes})
    pods = [_pod("r1-prefill-r0-0", "prefill", 0, nodes[0]), _pod("r1-prefill-r1-0", "prefill", 1, nodes[0]),
            _pod("r1-decode-r0-0", "decode", 0, nodes[1])]
    a, src, events, _, clock = fake_autoscaler(body, dplan, pods)
    src.snaps["prefill"] = MetricsSnapshot(ok=True, ttft_s=0.5, request_rate_per_s=0.5, queue_depth=0, running=1,
                                           sample_age_s=1)
    src.snaps["decode"] = MetricsSnapshot(ok=True, itl_s=0.03, request_rate_per_s=0.5, queue_depth=0, running=4,
                                          kv_usage=0.97, sample_age_s=1)
    asyncio.run(ar.evaluate(a, body, spec, dplan))
    clock["t"] += 11
    d = asyncio.run(ar.evaluate(a, body, spec, dplan))
    assert (d.prefill.desired_replicas, d.decode.desired_replicas) == (2, 2), d.decode.message
    assert [(e[1], e[2].split(" because")[0]) for e in events] == [("ScaledUp", "decode groups scaled from 1 to 2")]
    assert body["status"]["autoscaling"]["toReplicas"] == 2


def test_a_bad_spec_holds_both_roles_and_says_why_per_role():
    m = manifest()
    spec, dplan = spec_and_plan(m)
    m2 = copy.deepcopy(m)
    m2["spec"]["slo"] = {"itlMs": 50}
    spec2 = LLMDeployment.from_manifest(m2).spec
    body = copy.deepcopy(m2)
    a, src, events, _, _ = fake_autoscaler(body, dplan, [])
    d = asyncio.run(ar.evaluate(a, body, spec2, dplan))
    assert not src.asked and not events
    assert (d.prefill.desired_replicas, d.decode.desired_replicas) == (2, 1)
    conds = {c[0]: c for c in ar.combined_conditions(d)}
    assert conds["ScalingActive"][1:3] == ("False", "InvalidAutoscaling")
    assert "prefill: " in conds["ScalingActive"][3] and "decode: " in conds["ScalingActive"][3]
    assert "spec.slo.ttftMs" in conds["ScalingActive"][3]


def test_status_is_not_rewritten_while_nothing_changes():
    now = datetime(2027, 1, 1, tzinfo=timezone.utc)
    doc = {"toReplicas": 1, "fromReplicas": 1, "metricsHealthy": True, "reason": "Stable: x",
           "lastDecisionTime": "2027-01-01T00:00:00Z",
           "roles": {"ratio": "1:1", "prefill": {"toReplicas": 1, "fromReplicas": 1, "metricsHealthy": True,
                                                 "reason": "Stable: a", "lastDecisionTime": "2027-01-01T00:00:00Z"},
                     "decode": {"toReplicas": 1, "fromReplicas": 1, "metricsHealthy": True, "reason": "Stable: b",
                                "lastDecisionTime": "2027-01-01T00:00:00Z"}}}
    assert not ar.needs_write(doc, copy.deepcopy(doc), now)
    moved = copy.deepcopy(doc)
    moved["roles"]["prefill"]["toReplicas"] = 2
    moved["roles"]["ratio"] = "2:1"
    assert ar.needs_write(doc, moved, now)
    held = copy.deepcopy(doc)
    held["roles"]["decode"]["metricsHealthy"] = False
    assert ar.needs_write(doc, held, now)
