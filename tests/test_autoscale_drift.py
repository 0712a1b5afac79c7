"""Predicted against observed (meshplan.autoscale.drift): the correction factor, PredictionDrift,
the corrected capacity and predictor, the re-plan decision and status.observed (issue 20)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from meshplan.autoscale import drift
from meshplan.autoscale.drift import Correction, update_correction
from meshplan.planner.types import Prediction

PRED = Prediction(ttft_ms=200.0, tpot_ms=20.0, tokens_per_s_per_gpu=500.0, tokens_per_s_per_user=50.0,
                  concurrency=32)


def _run(k: float, n: int, start: Correction = Correction(), t0: float = 1000.0) -> list[Correction]:
    out, c = [], start
    for i in range(n):
        c = update_correction(c, observed_itl_ms=k * 20.0, predicted_itl_ms=20.0, observed_ttft_ms=k * 200.0,
                              predicted_ttft_ms=200.0, now=t0 + 10.0 * i)
        out.append(c)
    return out


@pytest.mark.parametrize("k", [4.0, 0.5, 100.0])
def test_factor_converges_to_a_steady_ratio_within_the_stated_bound(k):
    bound = drift.evaluations_to_converge(k, 0.05)
    assert bound == math.ceil(math.log2(abs(math.log(k)) / math.log(1.05)))
    steps = _run(k, bound + 3)
    assert abs(steps[bound - 1].itl / k - 1) <= 0.05, (bound, steps[bound - 1])
    if bound > 1:      # and not before: the bound is tight, not just safe
        assert abs(steps[bound - 2].itl / k - 1) > 0.05
    assert all(abs(c.ttft / k - 1) <= 0.05 for c in steps[bound - 1:])
    assert steps[-1].evaluations == bound + 3


def test_factor_is_bounded_and_ignores_nonsense_ratios():
    c = _run(1e6, 40)[-1]
    assert c.itl == pytest.approx(drift.MAX_FACTOR)
    c2 = update_correction(c, observed_itl_ms=float("nan"), predicted_itl_ms=20.0, observed_ttft_ms=-1.0,
                           predicted_ttft_ms=200.0, now=2000.0)
    assert c2.evaluations == c.evaluations                           # nothing usable: not an observation,
    dt = 2000.0 - c.updated_at                                         # only the decay since the last one
    assert c2.itl == pytest.approx(math.exp(math.log(c.itl) * 0.5 ** (dt / drift.DECAY_HALF_LIFE_S)))
    tiny = _run(1e-9, 40)[-1]
    assert tiny.itl == pytest.approx(drift.MIN_FACTOR)


def test_without_observations_the_factor_decays_toward_one_with_the_half_life():
    c = Correction(itl=4.0, ttft=4.0, updated_at=0.0, evaluations=6)
    later = update_correction(c, observed_itl_ms=None, predicted_itl_ms=20.0, observed_ttft_ms=None,
                              predicted_ttft_ms=200.0, now=drift.DECAY_HALF_LIFE_S)
    assert later.itl == pytest.approx(2.0)          # ln 4 halved
    assert later.evaluations == 6
    assert update_correction(Correction(), observed_itl_ms=None, predicted_itl_ms=None, observed_ttft_ms=None,
                             predicted_ttft_ms=None, now=5.0) == Correction()


def test_drift_condition_fires_beyond_the_threshold_with_the_numbers():
    assert drift.drift_condition(Correction())[1:3] == ("Unknown", "NoObservations")
    slow = _run(3.0, 6)[-1]
    t, status, reason, msg = drift.drift_condition(slow)
    assert (t, status, reason) == ("PredictionDrift", "True", "ObservedSlowerThanPredicted")
    assert "ITL x2.9" in msg and "6 evaluation" in msg
    near = _run(1.2, 6)[-1]
    assert drift.drift_condition(near)[1:3] == ("False", "WithinThreshold")
    fast = Correction(itl=0.4, ttft=1.0, updated_at=1.0, evaluations=3)
    assert drift.drift_condition(fast)[1:3] == ("True", "ObservedFasterThanPredicted")
    # a low TTFT alone is load (a lightly loaded replica), not model error
    light = Correction(itl=1.0, ttft=0.2, updated_at=1.0, evaluations=3)
    assert drift.drift_condition(light)[1] == "False"
    assert drift.drift_condition(Correction(itl=1.0, ttft=2.0, updated_at=1.0, evaluations=3))[1] == "True"


def test_corrected_capacity_sizes_a_k_times_slower_replica_for_a_kth_of_the_requests():
    base_rps, conc = drift.corrected_capacity(PRED, 256, Correction())
    assert base_rps == pytest.approx(32 / ((200.0 + 256 * 20.0) / 1000.0))
    assert conc == 32.0
    slow_rps, _ = drift.corrected_capacity(PRED, 256, Correction(itl=4.0, ttft=4.0, updated_at=1.0, evaluations=5))
    assert slow_rps == pytest.approx(base_rps / 4.0)
    assert drift.corrected_capacity(None, 256, Correction()) == (None, None)


def test_corrected_predictor_scales_latency_and_throughput():
    def base(*_a, **_k):
        return PRED

    p = drift.corrected_predictor(Correction(itl=2.0, ttft=3.0, updated_at=1.0, evaluations=1), base)()
    assert (p.ttft_ms, p.tpot_ms) == (600.0, 40.0)
    assert (p.tokens_per_s_per_gpu, p.tokens_per_s_per_user) == (250.0, 25.0)


def test_a_corrected_replan_of_a_slow_engine_can_choose_another_layout():
    """Real planner, real model: Llama-3.1-70B on H100 at a 40 ms ITL SLO is planned as TP2 (28.9 ms
    predicted); an engine running 2x slower than predicted breaks the SLO there (57.8 ms), and the plan
    with the corrected figures picks TP4 (39.0 ms corrected)."""
    from meshplan.catalog.models import get_model
    from meshplan.planner import plan
    from meshplan.planner.types import SLO, Workload

    model = get_model("llama-3.1-70b")
    wl = Workload(isl=1024, osl=256, concurrency=64)
    slo = SLO(itl_ms=40.0)
    first = plan(model, "h100_sxm", max_gpus=16, workload=wl, slo=slo, objective="minCostWithinSLO")
    assert first.choice is not None
    slow = Correction(itl=2.0, ttft=2.0, updated_at=1.0, evaluations=5)
    second = plan(model, "h100_sxm", max_gpus=16, workload=wl, slo=slo, objective="minCostWithinSLO",
                  predictor=drift.corrected_predictor(slow))
    assert second.choice is not None
    a, b = first.choice.layout, second.choice.layout
    assert (a.tp, a.ep, a.pp) == (2, 1, 1), a
    assert (b.tp, b.ep, b.pp) == (4, 1, 1), b
    assert 2.0 * first.choice.prediction.tpot_ms > 40.0 >= second.choice.prediction.tpot_ms


def test_replan_action_suggests_once_and_adopts_only_on_drift():
    assert drift.replan_action("manual", "TP2", "TP2", None) is None
    assert drift.replan_action("manual", "TP2", None, None) is None
    assert drift.replan_action("manual", "TP2", "TP4", None) == "suggest"
    assert drift.replan_action("manual", "TP2", "TP4", "TP4") is None        # told already
    assert drift.replan_action("onDrift", "TP2", "TP4", None) == "adopt"
    assert drift.replan_action("onDrift", "TP2", "TP4", "TP4") is None        # adopted already


def test_observed_document_and_restart_round_trip():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc).timestamp()
    c = Correction(itl=3.21, ttft=1.5, updated_at=now, evaluations=7)
    doc = drift.observed_document(
        percentile=95.0, at_slo={"ttft_s": 0.9, "itl_s": 0.07}, p50={"ttft_s": 0.5, "itl_s": 0.05},
        p99={"ttft_s": 1.5, "itl_s": 0.09}, generation_tokens_per_s=800.0, gpus_serving=4,
        predicted={"ttftMs": 300.0, "itlMs": 16.0, "tokensPerSecondPerGpu": 900.0, "tokensPerSecondPerUser": 62.5},
        correction=c, replan_layout="TP4", now=now)
    assert doc["ttftMs"] == 900.0 and doc["itlP50Ms"] == 50.0 and doc["itlP99Ms"] == 90.0
    assert doc["tokensPerSecondPerGpu"] == 200.0 and doc["tokensPerSecondPerUser"] == 20.0
    assert doc["predictedItlMs"] == 16.0 and doc["replanLayout"] == "TP4"
    from meshplan.api.models import ObservedStatus

    ObservedStatus.model_validate(doc)       # the schema accepts what the autoscaler writes
    back = drift.correction_from_status(doc)
    assert (back.itl, back.ttft, back.evaluations, back.updated_at) == (3.21, 1.5, 7, now)
    assert doc["predictedTtftMs"] == 300.0          # a plan without a median TTFT: its ttftMs
    with_p50 = drift.observed_document(
        percentile=95.0, at_slo={}, p50={"ttft_s": 0.5}, p99={}, generation_tokens_per_s=None, gpus_serving=None,
        predicted={"ttftMs": 300.0, "ttftP50Ms": 120.0, "itlMs": 16.0}, correction=c, now=now)
    assert with_p50["predictedTtftMs"] == 120.0     # the observed p50 is compared with the plan's median
    assert drift.correction_from_status({"itlCorrection": "x", "correctionTime": "bad"}) == Correction()
    assert drift.correction_from_status({"itlCorrection": 5000.0, "correctionTime": "2026-12-01T12:00:00Z"}
                                        ).itl == drift.MAX_FACTOR


def test_observed_queries_read_p50_p99_and_the_generation_token_counter():
    from meshplan.autoscale.promql import build_queries, scope_matchers

    m = scope_matchers("ns", "demo")
    q = build_queries("vllm", m, percentile=95, window="60s")
    extra = drift.observed_queries(q, "vllm", m, "60s")
    assert "histogram_quantile(0.5," in extra["ttft_p50_s"] and "histogram_quantile(0.99," in extra["itl_p99_s"]
    assert "vllm:generation_tokens_total" in extra["generation_tokens_per_s"]
    assert 'meshplan_dev_deployment="demo"' in extra["generation_tokens_per_s"]
    assert "generation_tokens_per_s" not in drift.observed_queries(q, "trtllm", m, "60s")


def test_observed_status_is_written_while_the_factor_moves_and_when_the_replan_layout_changes():
    from meshplan.controller.autoscaling import observed_needs_write

    prev = {"itlCorrection": 2.0, "ttftCorrection": 2.0}
    assert observed_needs_write({}, prev)
    assert observed_needs_write(prev, {"itlCorrection": 2.1, "ttftCorrection": 2.0})       # moved 5 %
    assert not observed_needs_write(prev, {"itlCorrection": 2.01, "ttftCorrection": 2.0})  # settled
    assert observed_needs_write(prev, {**prev, "replanLayout": "TP4"})


def test_the_drift_condition_quotes_the_stored_observed_status_when_this_evaluation_is_not_written():
    """status.observed is written only while a factor moves by more than 2 %; the condition (written by the
    reconciler) must then quote the stored evaluation, not the in-memory one status.observed never shows
    (a clean-clone CI run caught the message citing evaluation 21 while status.observed showed 19)."""
    from meshplan.controller.autoscaling import observed_needs_write, reported_drift_condition

    steps = _run(3.0, 12)
    stored = drift.observed_document(percentile=99.0, at_slo={}, p50={}, p99={}, generation_tokens_per_s=None,
                                     gpus_serving=None, predicted=None, correction=steps[-2],
                                     replan_layout=None, now=steps[-2].updated_at)
    new = drift.observed_document(percentile=99.0, at_slo={}, p50={}, p99={}, generation_tokens_per_s=None,
                                  gpus_serving=None, predicted=None, correction=steps[-1],
                                  replan_layout=None, now=steps[-1].updated_at)
    assert not observed_needs_write(stored, new)                 # settled: this evaluation is not written
    live = drift.drift_condition(steps[-1])
    assert "over 12 evaluation" in live[3]
    shown = reported_drift_condition(live, stored, new, wrote=False)
    assert shown[:3] == live[:3] and "over 11 evaluation" in shown[3], shown
    assert f"ITL x{stored['itlCorrection']:.3g}" in shown[3]
    # written (by this evaluation or the autoscaling refresh): the live condition, which is what is stored
    assert reported_drift_condition(live, stored, new, wrote=True) == live
    # nothing stored yet (a first evaluation that is not written cannot happen, but a malformed status can)
    assert reported_drift_condition(live, {}, new, wrote=False) == live
    assert reported_drift_condition(None, stored, None, wrote=False) is None


def test_changing_spec_replan_does_not_change_the_plan_key():
    """spec.replan is what to do on drift, not an input of the plan: switching it must not replan."""
    from meshplan.api.models import LLMDeploymentSpec
    from meshplan.controller.reconcile import spec_key

    a = LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}})
    b = LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}, "replan": "onDrift"})
    assert b.replan == "onDrift" and a.replan == "manual"
    assert spec_key(a) == spec_key(b)
    with pytest.raises(Exception):
        LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}, "replan": "always"})


def _autoscaler_with(events: list, enqueued: list):
    """An Autoscaler on a stand-in reconciler (events recorded, an empty fleet): only the drift wiring runs."""
    from types import SimpleNamespace

    from meshplan.controller.autoscaling import Autoscaler
    from meshplan.topology import build_topology

    async def event(body, type_, reason, message):
        events.append((reason, message))

    rec = SimpleNamespace(plans={}, plans_moved=set(), autoscaler_conditions={}, _event=event,
                          world=SimpleNamespace(topology_without=lambda ns, name: build_topology([])))
    return Autoscaler(rec, enqueued.append)


@pytest.mark.parametrize("mode", ["manual", "onDrift"])
def test_drift_wiring_suggests_or_adopts_the_corrected_layout(mode):
    import asyncio

    from meshplan.api.models import LLMDeploymentSpec
    from meshplan.autoscale.snapshot import MetricsSnapshot
    from meshplan.controller.reconcile import plan_key
    from meshplan.topology import build_topology

    events, enqueued = [], []
    a = _autoscaler_with(events, enqueued)
    key, uid = ("ns", "demo"), "uid-1"
    a.uids[key] = uid
    a.corrections[uid] = Correction(itl=2.0, ttft=2.0, updated_at=1.0, evaluations=5)
    corrected = object()
    a._corrected_plan = lambda k, spec, corr: ("TP4", corrected)      # the planner itself is tested above
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-70b"}, "replan": mode,
                                             "slo": {"itlMs": 40}})
    body = {"metadata": {"name": "demo", "namespace": "ns", "uid": uid},
            "status": {"plan": {"layout": "TP2", "gpusPerReplica": 2,
                                "predicted": {"ttftMs": 300.0, "itlMs": 28.9}}, "readyReplicas": 1}}
    snap = MetricsSnapshot(ok=True, ttft_s=0.9, itl_s=0.06, sample_time=1.0)
    extra = {"itl_p50_s": 0.0578, "ttft_p50_s": 0.6, "itl_p99_s": 0.06, "ttft_p99_s": 0.9,
             "generation_tokens_per_s": 100.0}
    for _ in range(2):
        doc, cond = asyncio.run(a._observed_status(key, uid, body, spec, snap, extra, 10.0))
    assert cond[1:3] == ("True", "ObservedSlowerThanPredicted")
    assert doc["replanLayout"] == "TP4" and doc["tokensPerSecondPerGpu"] == 50.0
    if mode == "manual":
        assert [r for r, _ in events] == ["ReplanSuggested"]          # once, not at every evaluation
        assert "TP2 would become TP4" in events[0][1]
        assert a.reconciler.plans == {} and not enqueued
    else:
        assert [r for r, _ in events] == ["ReplanOnDrift"]                 # adopted once
        assert a.reconciler.plans[uid] == (plan_key(spec, build_topology([])), corrected)
        assert uid in a.reconciler.plans_moved and enqueued == [key]


def test_the_corrected_plan_runs_the_real_planner_on_the_deployments_topology():
    """`_corrected_plan` itself (the wiring test above stubs it): the planner on the world's Topology with the
    corrected predictor. It called the removed `Topology.to_fleet()` once, which only the e2e caught."""
    from types import SimpleNamespace

    from meshplan.api.models import LLMDeploymentSpec
    from meshplan.controller.autoscaling import Autoscaler
    from meshplan.devcluster.fleets import fleet_nodes, load_fleet
    from meshplan.topology import build_topology

    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), [], ready_if_unknown=True)
    rec = SimpleNamespace(plans={}, plans_moved=set(), autoscaler_conditions={},
                          world=SimpleNamespace(topology_without=lambda ns, name: topo))
    a = Autoscaler(rec, lambda *_: None)
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-70b"}, "slo": {"itlMs": 40}})
    label, plan = a._corrected_plan(("ns", "demo"), spec, Correction(itl=2.0, ttft=2.0, updated_at=1.0,
                                                                      evaluations=5))
    assert plan is not None and label == plan.choice.layout.label()


def test_the_observed_p50_ttft_is_compared_with_the_predicted_median():
    from meshplan.planner.types import Prediction

    p = Prediction(ttft_ms=900.0, tpot_ms=10.0, tokens_per_s_per_gpu=1.0, tokens_per_s_per_user=100.0,
                   concurrency=4, ttft_p50_ms=150.0)
    assert p.median_ttft_ms == 150.0
    assert Prediction(ttft_ms=900.0, tpot_ms=10.0, tokens_per_s_per_gpu=1.0, tokens_per_s_per_user=100.0,
                      concurrency=4).median_ttft_ms == 900.0
    assert getattr(None, "median_ttft_ms", None) is None       # what the autoscaler reads without a plan
    scaled = drift.corrected_predictor(Correction(itl=2.0, ttft=3.0, evaluations=1), base=lambda *a, **k: p)()
    assert scaled.ttft_p50_ms == pytest.approx(450.0) and scaled.ttft_ms == pytest.approx(2700.0)
