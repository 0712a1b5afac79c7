"""The autoscaling loop's own logic (meshplan.controller.autoscaling), without a cluster.

The policy itself is tested in test_autoscale_policy.py; the loop against the
real API server and Prometheus in e2e/test_autoscale.py. Here: the spec ->
policy configuration mapping, the scoped queries, the planner's per-replica
capacity, the capacity input built from the real planner and placement on a
built-in fleet, the status document and when it is written, and the events.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from meshplan.api.models import LLMDeployment
from meshplan.autoscale.policy import (
    AutoscaleConfig,
    AutoscaleConfigError,
    AutoscaleState,
    ReplicaCapacity,
    decide,
)
from meshplan.autoscale.snapshot import MetricsSnapshot
from meshplan.controller import autoscaling as asc
from meshplan.controller.decide import Inputs, target_for
from meshplan.controller.decide import decide as reconcile_decide
from meshplan.controller.reconcile import Reconciler, World
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.topology import build_topology, node_info

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def manifest(**autoscaling) -> dict:
    return {
        "apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1", "generation": 1},
        "spec": {
            "model": {"name": "llama-3.1-70b"}, "precision": {"weights": "fp8"}, "engine": {"kind": "vllm"},
            "workload": {"inputTokens": 1024, "outputTokens": 1024},
            "slo": {"ttftMs": 1000, "itlMs": 25, "percentile": 95},
            "objective": "maxThroughput",
            "parallelism": {"tensor": 8, "pipeline": 2},
            "gpus": {"products": ["NVIDIA-H100-80GB-HBM3"], "maxGpus": 256,
                     "nodeSelector": {"meshplan.dev/fleet": "hgx-h100"}},
            "replicas": 1,
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 6, "upWindowSeconds": 20,
                            "downWindowSeconds": 40, "cooldownSeconds": 30, "downThreshold": 0.7, **autoscaling},
        },
    }


def spec_of(m: dict):
    return LLMDeployment.from_manifest(m).spec


# ----------------------------------------------------------------------------- cadence


@pytest.mark.parametrize("up_window_s, interval_s, window_s",
                         [(10, 2.5, 30), (60, 15, 120), (3600, 15, 120), (2, 1, 30), (30, 7.5, 60)])
def test_interval_is_a_quarter_of_the_up_window_and_rate_window_twice_it_within_bounds(up_window_s, interval_s,
                                                                                       window_s):
    assert asc.evaluation_interval_s(up_window_s) == interval_s
    assert asc.rate_window_s(up_window_s) == window_s
    # an up window always spans at least 4 evaluations when it is long enough to
    if up_window_s >= 4 * asc.MIN_INTERVAL_S and up_window_s <= 4 * asc.MAX_INTERVAL_S:
        assert up_window_s / asc.evaluation_interval_s(up_window_s) == pytest.approx(4)


# ----------------------------------------------------------------------------- spec -> config, queries


def test_config_follows_the_spec():
    cfg = asc.config_from_spec(spec_of(manifest(maxStepUp=3, maxStepDown=2, upThreshold=1.2)))
    assert (cfg.min_replicas, cfg.max_replicas) == (1, 6)
    assert (cfg.ttft_target_s, cfg.itl_target_s, cfg.percentile) == (1.0, 0.025, 95.0)
    assert (cfg.up_window_s, cfg.down_window_s, cfg.cooldown_s) == (20, 40, 30)
    assert (cfg.up_threshold, cfg.down_threshold, cfg.max_step_up, cfg.max_step_down) == (1.2, 0.7, 3, 2)
    # the initial burst assumption: the policy's default unless the spec sets it (0 turns it off)
    assert cfg.initial_burst_rise == AutoscaleConfig.__dataclass_fields__["initial_burst_rise"].default == 1.5
    assert asc.config_from_spec(spec_of(manifest(initialBurstHeadroom=0))).initial_burst_rise == 0.0
    assert asc.config_from_spec(spec_of(manifest(initialBurstHeadroom=0.5))).initial_burst_rise == 0.5


def test_initial_burst_headroom_out_of_range_is_rejected_naming_the_field():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="initialBurstHeadroom"):
        spec_of(manifest(initialBurstHeadroom=5))


def test_max_gpus_caps_max_replicas_but_never_below_min():
    m = manifest(maxReplicas=10, minReplicas=2)
    m["spec"]["gpus"]["maxGpus"] = 64
    assert asc.config_from_spec(spec_of(m), gpus_per_replica=16).max_replicas == 4       # 64 / 16
    assert asc.config_from_spec(spec_of(m), gpus_per_replica=48).max_replicas == 2       # 1 by GPUs, min 2
    assert asc.config_from_spec(spec_of(m)).max_replicas == 10                           # replica size unknown


def test_reading_speed_target_becomes_the_itl_target_and_no_latency_target_is_refused():
    m = manifest()
    m["spec"]["slo"] = {"minTokensPerSecondPerUser": 50}
    cfg = asc.config_from_spec(spec_of(m))
    assert cfg.itl_target_s == pytest.approx(0.020) and cfg.ttft_target_s is None
    spec = spec_of(manifest())
    with pytest.raises(AutoscaleConfigError, match="spec.slo"):
        asc.config_from_spec(SimpleNamespace(autoscaling=spec.autoscaling, slo=None, replicas=1, gpus=spec.gpus))


def test_queries_are_scoped_to_the_deployment_and_use_the_overrides():
    m = manifest(metrics={"ttftHistogram": "my:ttft_seconds_bucket", "requestsWaiting": "my:queue"})
    q = asc.queries_for(spec_of(m), "team-a", "chat")
    for text in q.as_dict().values():
        assert 'namespace="team-a"' in text and 'meshplan_dev_deployment="chat"' in text
    assert "my:ttft_seconds_bucket" in q.ttft_s and "vllm:time_to_first_token" not in q.ttft_s
    assert "my:queue" in q.queue_depth
    assert "vllm:inter_token_latency_seconds_bucket" in q.itl_s        # not overridden: the engine's name
    assert "histogram_quantile(0.95," in q.ttft_s and "[40s]" in q.ttft_s   # p95, 2 x 20 s window


def test_every_signal_can_be_renamed_in_the_spec_including_the_request_counter():
    m = manifest(metrics={"ttftHistogram": "a:ttft", "itlHistogram": "a:itl_bucket", "requestsWaiting": "a:queue",
                          "requestsRunning": "a:running", "requestsCompleted": "sglang:e2e_request_latency_seconds_count",
                          "kvCacheUsage": "a:kv"})
    q = asc.queries_for(spec_of(m), "team-a", "chat")
    assert "rate(sglang:e2e_request_latency_seconds_count{" in q.request_rate_per_s
    assert "vllm:request_success_total" not in q.request_rate_per_s
    assert "a:kv{" in q.kv_usage and "vllm:kv_cache_usage_perc" not in q.kv_usage
    assert "a:itl_bucket{" in q.itl_s and "a:running{" in q.running and "a:queue{" in q.queue_depth


def test_renamed_metrics_are_names_not_promql():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="requestsCompleted|requests_completed"):
        spec_of(manifest(metrics={"requestsCompleted": 'x{a="b"} or vector(1)'}))


# ----------------------------------------------------------------------------- capacity


def test_per_replica_capacity_is_littles_law_over_the_planned_operating_point():
    cand = SimpleNamespace(prediction=SimpleNamespace(concurrency=64, ttft_ms=500.0, tpot_ms=20.0))
    rps, conc = asc.per_replica_capacity(cand, output_tokens=1000)
    assert conc == 64
    assert rps == pytest.approx(64 / (0.5 + 1000 * 0.020))
    # more output per request or a slower token rate: fewer requests per second
    assert asc.per_replica_capacity(cand, 2000)[0] < rps
    assert asc.per_replica_capacity(SimpleNamespace(prediction=SimpleNamespace(
        concurrency=0, ttft_ms=1.0, tpot_ms=1.0)), 10) == (None, None)


def _world(other_usage=()):
    nodes = fleet_nodes(load_fleet("hgx-h100"))
    infos = [i for i in (node_info(n, ready_if_unknown=True) for n in nodes) if i is not None]
    return nodes, World(nodes=lambda: infos, usage=lambda: list(other_usage))


def _running_group(nodes, m) -> list[dict]:
    """The pods reconcile creates for one replica (one decide round on the same fleet)."""
    from meshplan.planner import plan_for_spec

    model = LLMDeployment.from_manifest(m)
    topo = build_topology(nodes, ready_if_unknown=True)
    plan = plan_for_spec(model.spec, topo.select({"meshplan.dev/fleet": "hgx-h100"}))
    out = reconcile_decide(Inputs(name="chat", namespace="team-a", uid="u-1", generation=1, desired_replicas=1,
                                  topology=topo, pods=[], services=[], target=target_for(model.spec, plan, topo),
                                  now=NOW))
    return [copy.deepcopy(d) for d, _ in out.apply if d["kind"] == "Pod"]


def test_capacity_counts_whole_groups_that_fit_beside_the_running_one():
    m = manifest()
    nodes, world = _world()
    pods = _running_group(nodes, m)
    assert len(pods) == 2                                      # TP8 x PP2: two 8-GPU pods on two nodes
    a = asc.Autoscaler(Reconciler(kube=None, world=world), enqueue=lambda key: None)
    cap = a._capacity("team-a", "chat", "u-1", spec_of(m), pods, current=1, ready=1)
    assert isinstance(cap, ReplicaCapacity)
    assert cap.gpus_per_replica == 16
    assert cap.additional_replicas_that_fit == 1               # 4 nodes: the running group + one more
    assert cap.ready_replicas == 1
    assert cap.requests_per_s_at_slo and cap.requests_per_s_at_slo > 0
    # the message's free GPUs leave out what the running group holds
    assert sorted(f for _, f in cap.free_gpus_by_domain) == [0, 0, 8, 8]


def test_capacity_sees_other_tenants_and_the_policy_limits_to_whole_groups():
    m = manifest()
    nodes, world = _world([("other-ns", None, "hgx-h100-3", 1)])
    pods = _running_group(nodes, m)
    used = {p["metadata"]["annotations"]["meshplan.dev/assigned-node"] for p in pods}
    if "hgx-h100-3" in used:
        pytest.fail(f"placement chose the node the test blocks: {used}")
    a = asc.Autoscaler(Reconciler(kube=None, world=world), enqueue=lambda key: None)
    cap = a._capacity("team-a", "chat", "u-1", spec_of(m), pods, current=1, ready=1)
    assert cap.additional_replicas_that_fit == 0               # 8 + 7 free GPUs: no whole 2 x 8 group
    cfg = asc.config_from_spec(spec_of(m), cap.gpus_per_replica)
    snap = MetricsSnapshot(ok=True, ttft_s=3.0, itl_s=0.03, request_rate_per_s=20.0, queue_depth=50.0, running=64.0,
                           sample_age_s=1.0, sample_time=1000.0)
    state = AutoscaleState(desired_replicas=1, above_since=900.0)
    d = decide(state, snap, cfg, cap, now=1000.0)
    assert d.desired_replicas == 1 and d.reason == "ScalingLimited"
    limited = dict((c[0], c) for c in d.condition_tuples())["ScalingLimited"]
    assert limited[1:3] == ("True", "InsufficientCapacity")
    assert "16 GPUs" in limited[3] and "hgx-h100-3=7" in limited[3]


def test_no_plan_is_reported_not_guessed():
    m = manifest()
    m["spec"]["gpus"]["nodeSelector"] = {"meshplan.dev/fleet": "no-such-fleet"}
    nodes, world = _world()
    a = asc.Autoscaler(Reconciler(kube=None, world=world), enqueue=lambda key: None)
    cap = a._capacity("team-a", "chat", "u-1", spec_of(m), [], current=1, ready=0)
    assert isinstance(cap, str) and cap
    d = asc.held_decision(AutoscaleState(desired_replicas=3), asc.NO_PLAN, cap)
    assert (d.desired_replicas, d.changed) == (3, False)
    assert d.condition_tuples()[0][:3] == ("ScalingActive", "False", "NoPlan")


# ----------------------------------------------------------------------------- status, events, restart


# initial_burst_rise 0: these tests are about status and restarts, not the burst headroom
CFG = AutoscaleConfig(min_replicas=1, max_replicas=8, ttft_target_s=1.0, itl_target_s=0.025, up_window_s=10,
                      down_window_s=20, cooldown_s=15, initial_burst_rise=0.0)
HOT = MetricsSnapshot(ok=True, ttft_s=2.5, itl_s=0.02, request_rate_per_s=9.0, queue_depth=3.0, running=40.0,
                      sample_age_s=1.0, sample_time=100.0)


def test_a_scale_up_writes_status_with_inputs_and_an_event_from_to_because():
    d = decide(AutoscaleState(desired_replicas=2, above_since=80.0), HOT, CFG,
               ReplicaCapacity(requests_per_s_at_slo=2.0, additional_replicas_that_fit=10), now=100.0)
    assert d.changed and d.desired_replicas > 2
    doc = asc.status_document(d, HOT, NOW, {"lastScaleTime": "2026-01-01T11:00:00Z"})
    assert doc["fromReplicas"] == 2 and doc["toReplicas"] == d.desired_replicas
    assert doc["lastScaleTime"] == doc["lastDecisionTime"] == "2026-01-01T12:00:00Z"
    assert doc["observedTtftMs"] == 2500.0 and doc["ttftRatio"] == 2.5 and doc["itlRatio"] == 0.8
    assert doc["requestRate"] == 9.0 and doc["requestsWaiting"] == 3.0 and doc["metricsHealthy"] is True
    assert doc["reason"].startswith("ScaledUp: ")
    LLMDeployment.from_manifest({**manifest(), "status": {"autoscaling": doc}})      # fits the status schema
    type_, reason, message = asc.scaling_event(d)
    assert (type_, reason) == ("Normal", "ScaledUp")
    assert message.startswith(f"scaled from 2 to {d.desired_replicas} replica(s) because p")
    assert asc.direction(d) == "up"


def test_metrics_down_holds_and_says_so_in_status():
    down = MetricsSnapshot.failed("MetricsUnavailable", "cannot reach Prometheus", 100.0)
    d = decide(AutoscaleState(desired_replicas=3), down, CFG, ReplicaCapacity(), now=100.0)
    doc = asc.status_document(d, down, NOW, {"lastScaleTime": "2026-01-01T11:00:00Z"})
    assert (doc["fromReplicas"], doc["toReplicas"], doc["metricsHealthy"]) == (3, 3, False)
    assert doc["lastScaleTime"] == "2026-01-01T11:00:00Z"                 # unchanged: nothing scaled
    assert "observedTtftMs" not in doc and "requestRate" not in doc
    assert asc.scaling_event(d) is None and asc.direction(d) is None
    kept = asc.merge_conditions({"ScalingLimited": ("ScalingLimited", "True", "MaxReplicasReached", "m")},
                                d.condition_tuples())
    assert kept["ScalingActive"][1:3] == ("False", "MetricsUnavailable")
    assert kept["ScalingLimited"][2] == "MaxReplicasReached"              # a hold says nothing about limits


def test_status_is_rewritten_on_substance_or_after_the_refresh_period_only():
    prev = {"fromReplicas": 2, "toReplicas": 2, "metricsHealthy": True, "reason": "WithinSLO: p99 0.4",
            "lastDecisionTime": "2026-01-01T12:00:00Z"}
    same = {**prev, "reason": "WithinSLO: p99 0.5", "lastDecisionTime": "2026-01-01T12:00:05Z"}
    assert not asc.needs_write(prev, same, NOW + timedelta(seconds=5))
    assert asc.needs_write(prev, same, NOW + timedelta(seconds=asc.STATUS_REFRESH_S))
    assert asc.needs_write(prev, {**same, "reason": "ScaleUpPending: x"}, NOW + timedelta(seconds=5))
    assert asc.needs_write(prev, {**same, "toReplicas": 3}, NOW + timedelta(seconds=5))
    assert asc.needs_write(prev, {**same, "metricsHealthy": False}, NOW + timedelta(seconds=5))
    assert asc.needs_write(None, same, NOW)


def test_a_restarted_autoscaler_keeps_the_count_and_the_cooldown():
    state = asc.state_from_status({"toReplicas": 3, "lastScaleTime": "2026-01-01T12:00:00Z"}, 3)
    assert state.desired_replicas == 3 and state.last_change_at == NOW.timestamp()
    # a scale-down signal right after the restart still waits for the cooldown
    idle = MetricsSnapshot(ok=True, ttft_s=None, itl_s=None, request_rate_per_s=0.0, queue_depth=0.0, running=0.0,
                           sample_age_s=1.0, sample_time=NOW.timestamp() + 25)
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=8, ttft_target_s=1.0, down_window_s=10, up_window_s=10,
                          cooldown_s=60)
    s = state
    for t in (0, 5, 10, 15, 20, 25):
        d = decide(s, MetricsSnapshot(**{**idle.__dict__, "sample_time": NOW.timestamp() + t}), cfg,
                   ReplicaCapacity(requests_per_s_at_slo=1.0), now=NOW.timestamp() + t)
        s = d.state
        assert d.desired_replicas == 3, (t, d.reason)
    assert d.reason == "CooldownActive"
    assert asc.state_from_status({"lastScaleTime": "garbage"}, 2) == AutoscaleState(desired_replicas=2)


def _status_of(state: AutoscaleState, at: datetime) -> dict:
    """status.autoscaling as written for a decision that left the policy in `state`."""
    held = MetricsSnapshot.failed("MetricsUnavailable", "x", at.timestamp())
    d = dataclasses.replace(decide(state, held, CFG, ReplicaCapacity(), now=at.timestamp()), state=state)
    doc = asc.status_document(d, held, at, None)
    LLMDeployment.from_manifest({**manifest(), "status": {"autoscaling": doc}})      # fits the status schema
    return doc


def test_the_policy_state_survives_a_restart_through_status():
    t = NOW.timestamp()
    state = AutoscaleState(desired_replicas=4, above_since=t - 40, below_since=None, last_change_at=t - 600,
                           learned_rps_per_replica=1.75, learned_at=t - 300, last_down_at=t - 900,
                           learned_from_ttft=True, burst_rise=0.8125, burst_rise_previous=1.25,
                           burst_period_since=t - 7200, watching_since=t - 86400)
    doc = _status_of(state, NOW)
    assert doc["upSignalSince"] == "2026-01-01T11:59:20Z" and "downSignalSince" not in doc
    assert doc["learnedCapacityRps"] == 1.75 and doc["learnedFromTtft"] is True
    assert doc["learnedBurstRise"] == 0.8125 and doc["learnedBurstRisePrevious"] == 1.25
    assert doc["burstMemorySince"] == "2026-01-01T10:00:00Z" and doc["watchingSince"] == "2025-12-31T12:00:00Z"
    doc["lastScaleTime"] = "2026-01-01T11:50:00Z"
    # a quick restart (20 s later): everything comes back, the up window keeps running
    back = asc.state_from_status(doc, 4, now=t + 20)
    assert back == state
    # a long gap: nobody watched the signal, so the window starts again; what was learned stays
    late = asc.state_from_status(doc, 4, now=t + asc.WINDOW_RESUME_S + 1)
    assert late.above_since is None and late.learned_rps_per_replica == 1.75 and late.learned_at == t - 300
    assert (late.burst_rise, late.burst_rise_previous, late.watching_since) == (0.8125, 1.25, t - 86400)
    assert asc.state_from_status(doc, 4).above_since is None                       # no clock, no window


def test_a_restarted_autoscaler_sizes_with_the_capacity_it_learned():
    t = NOW.timestamp()
    learned = AutoscaleState(desired_replicas=4, last_change_at=t - 3600, learned_rps_per_replica=1.0,
                             learned_at=t - 60)
    doc = _status_of(learned, NOW)
    fresh = asc.state_from_status(doc, 4, now=t + 5)
    snap = MetricsSnapshot(ok=True, ttft_s=0.5, itl_s=0.02, request_rate_per_s=6.0, queue_depth=0.0, running=10.0,
                           sample_age_s=1.0, sample_time=t + 5)
    cap = ReplicaCapacity(requests_per_s_at_slo=2.0, additional_replicas_that_fit=10)
    # planner: 6 / (2 x 0.8) -> 4 replicas, enough; learned: 6 / (1 x 0.8) -> 8
    assert decide(fresh, snap, CFG, cap, now=t + 5).load_replicas == 8
    assert decide(AutoscaleState(desired_replicas=4), snap, CFG, cap, now=t + 5).load_replicas == 4


def test_malformed_policy_state_in_status_is_dropped_field_by_field():
    doc = {"toReplicas": 3, "lastScaleTime": "2026-01-01T11:00:00Z", "lastDecisionTime": "2026-01-01T12:00:00Z",
           "upSignalSince": "yesterday", "learnedCapacityRps": -1.0, "learnedCapacityTime": "2026-01-01T11:00:00Z",
           "downSignalSince": "2026-01-01T11:59:00Z"}
    s = asc.state_from_status(doc, 3, now=NOW.timestamp())
    assert s.above_since is None and s.learned_rps_per_replica is None and s.learned_at is None
    assert s.below_since == NOW.timestamp() - 60 and s.last_change_at == NOW.timestamp() - 3600
    burst = asc.state_from_status({"learnedBurstRise": float("nan"), "learnedBurstRisePrevious": -0.5,
                                   "burstMemorySince": "2026-01-01T11:00:00Z", "watchingSince": "soon"}, 3)
    assert (burst.burst_rise, burst.burst_rise_previous, burst.watching_since) == (None, None, None)
    assert burst.burst_period_since == NOW.timestamp() - 3600
    # rises without the time their memory began cannot age: dropped
    assert asc.state_from_status({"learnedBurstRise": 0.5}, 3).burst_rise is None
    no_time = asc.state_from_status({"learnedCapacityRps": 2.0}, 3, now=NOW.timestamp())
    assert no_time.learned_rps_per_replica is None        # an estimate without its time cannot decay: dropped
