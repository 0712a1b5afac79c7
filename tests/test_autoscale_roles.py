"""Per-role autoscaling of a disaggregated deployment (autoscale.roles): each role on its own signals through
`policy.decide`, the P:D ratio bounds, whole groups, capacity per role, metrics held per role, the state's JSON.

The step simulations advance a prefill fleet and a decode fleet with the repository's queueing model
(`autoscale.queueing.step_fleet`, the same fluid model the aggregated simulator and the e2e exporter use):
the prefill workers' service time grows with the prompt (80 us per prompt token, plus 10 % per request
already in the batch, 4 slots), the decode workers' with the output (the model's default TPOT coefficients,
the calibration fit for Llama-3.1-70B TP4, 128 slots); requests the prefill fleet completes are the decode
fleet's arrivals. The coefficients are test assumptions chosen so that the baseline load is served within the
SLO with neither role able to shrink; the point is which role each change moves."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.autoscale import policy as P
from meshplan.autoscale import roles as R
from meshplan.autoscale.policy import AutoscaleConfig, AutoscaleConfigError, AutoscaleState, ReplicaCapacity, decide
from meshplan.autoscale.queueing import ReplicaModel, step_fleet
from meshplan.autoscale.snapshot import METRIC_PROBLEMS, METRICS_STALE, METRICS_UNAVAILABLE, MetricsSnapshot
from meshplan.planner.types import SLO

T0 = 1_000_000.0
SLO_ = SLO(ttft_ms=500, itl_ms=25)
DT = 15.0            # evaluation period (a quarter of the 60 s up window, as the controller runs it)
START_S = 60.0       # a new group serves this long after it is asked for
KV_TOKENS = 110_000  # KV-cache tokens one decode group holds (assumption)


def prefill_model(isl: int) -> ReplicaModel:
    return ReplicaModel(tpot_base_s=0.0, tpot_per_seq_s=0.0, prefill_s=isl * 80e-6, prefill_per_seq_s=isl * 8e-6,
                        max_num_seqs=4, output_tokens=0, gpus=4)


def decode_model(osl: int) -> ReplicaModel:
    return ReplicaModel(prefill_s=0.005, prefill_per_seq_s=0.0, max_num_seqs=128, output_tokens=osl, gpus=8)


def waiting(model: ReplicaModel, rps: float) -> float:
    """Mean requests waiting for a slot of one replica (Erlang C over the model's max_num_seqs slots)."""
    c, mu = model.max_num_seqs, 1.0 / model.service_s(model.max_num_seqs)
    a = rps / mu
    if a >= c:
        return 0.0  # saturated: the fluid backlog holds them
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    pc = b / (1.0 - rho * (1.0 - b))
    return pc * rho / (1.0 - rho)


@dataclass
class Fleet:
    desired: int
    ready: int
    starting: list[float] = field(default_factory=list)
    backlog: float = 0.0
    served: deque = field(default_factory=lambda: deque(maxlen=8))  # a 2 m rate window of DT steps

    def advance(self, now: float) -> None:
        self.ready = min(self.desired, self.ready + sum(1 for t in self.starting if t <= now))
        self.starting = [t for t in self.starting if t > now]

    def set(self, n: int, now: float) -> None:
        if n > self.desired:
            self.starting += [now + START_S] * (n - self.desired)
        elif n < self.desired:
            self.ready = min(self.ready, n)
            self.starting = self.starting[: max(0, n - self.ready)]
        self.desired = n

    def rate(self) -> float:
        return sum(self.served) / (len(self.served) * DT)


def simulate(phases, *, plan_ratio=(2, 3), p0=2, d0=3, roles_module=R):
    """Run `phases` [(seconds, requests/s, ISL, OSL), ...]; one `decide_roles` per DT. Returns
    [(t, prefill groups, decode groups, RolesDecision, prefill snapshot, decode snapshot)]."""
    cfg = roles_module.RolesConfig.from_slo(SLO_, plan_ratio=plan_ratio, prefill_replicas=(1, 16),
                                            decode_replicas=(1, 16), initial_burst_rise=0.0)
    # the planner's per-group capacity at the SLO, for the workload it planned (ISL 1024 / OSL 256)
    rps_p = prefill_model(1024).capacity_at_slo(SLO_.ttft_ms / 1e3, None)
    rps_d = decode_model(256).capacity_at_slo(None, SLO_.itl_ms / 1e3)
    conc_d = decode_model(256).concurrency_at_slo(None, SLO_.itl_ms / 1e3)
    state = R.RolesState(AutoscaleState(p0), AutoscaleState(d0))
    pf, df = Fleet(p0, p0), Fleet(d0, d0)
    t, out = T0, []
    for seconds, rps, isl, osl in phases:
        pm, dm = prefill_model(isl), decode_model(osl)
        end = t + seconds
        while t < end:
            t += DT
            pf.advance(t)
            df.advance(t)
            sp = step_fleet(pm, rps * DT, pf.ready, pf.backlog, DT)
            pf.backlog = sp.backlog
            pf.served.append(sp.served)
            sd = step_fleet(dm, sp.served, df.ready, df.backlog, DT)
            df.backlog = sd.backlog
            df.served.append(sd.served)
            lp, ld = sp.latency, sd.latency
            snap_p = MetricsSnapshot(
                ok=True, ttft_s=lp.ttft_p99_s, itl_s=None, request_rate_per_s=pf.rate(),
                queue_depth=pf.backlog + waiting(pm, sp.per_replica_rps) * pf.ready,
                running=lp.running * pf.ready, sample_age_s=5.0, sample_time=t)
            snap_d = MetricsSnapshot(
                ok=True, ttft_s=None, itl_s=ld.itl_p99_s, request_rate_per_s=df.rate(), queue_depth=df.backlog,
                running=ld.running * df.ready, kv_usage=min(1.0, ld.running * (isl + osl / 2) / KV_TOKENS),
                sample_age_s=5.0, sample_time=t)
            cap_p = ReplicaCapacity(requests_per_s_at_slo=rps_p, gpus_per_replica=4, ready_replicas=pf.ready)
            cap_d = ReplicaCapacity(requests_per_s_at_slo=rps_d, concurrency_at_slo=conc_d, gpus_per_replica=8,
                                    ready_replicas=df.ready)
            dec = roles_module.decide_roles(state, snap_p, snap_d, cfg, cap_p, cap_d, t)
            state = dec.state
            pf.set(dec.prefill.desired_replicas, t)
            df.set(dec.decode.desired_replicas, t)
            out.append((t, dec.prefill.desired_replicas, dec.decode.desired_replicas, dec, snap_p, snap_d))
    return out


BASE = (600, 30.0, 1024, 256)   # ten minutes of the planned workload
CHANGE_AT = T0 + 600


def _after(run, t):
    return [r for r in run if r[0] > t]


def test_the_baseline_moves_neither_role() -> None:
    run = simulate([BASE, (600, 30.0, 1024, 256)])
    assert {(p, d) for _, p, d, *_ in run} == {(2, 3)}
    assert all(r[3].prefill.reason == P.WITHIN_SLO and r[3].decode.reason == P.WITHIN_SLO for r in run)


def test_longer_prompts_scale_prefill_not_decode_within_two_windows() -> None:
    run = simulate([BASE, (900, 30.0, 1536, 256)])
    after = _after(run, CHANGE_AT)
    # the change is visible on the prefill side: TTFT over its target and more waiting
    assert after[0][4].ttft_s > SLO_.ttft_ms / 1e3 and after[0][4].queue_depth > run[0][4].queue_depth
    # ... and the decode side's ITL and KV usage stay within bounds (KV rises with the prompt, below 72 %)
    assert all(r[5].itl_s < SLO_.itl_ms / 1e3 and r[5].kv_usage < 0.72 for r in after)
    first_up = next(r for r in after if r[1] > 2)
    up_window = AutoscaleConfig(ttft_target_s=1.0).up_window_s
    assert first_up[0] - CHANGE_AT <= 2 * up_window
    assert first_up[3].prefill.reason == P.SCALED_UP and "TTFT" in first_up[3].prefill.message
    assert {d for _, _, d, *_ in run} == {3}                  # decode never moves
    assert run[-1][1] == 3 and run[-1][4].ttft_s <= SLO_.ttft_ms / 1e3  # and prefill settled within the SLO


def test_longer_outputs_scale_decode_not_prefill_within_two_windows() -> None:
    run = simulate([BASE, (900, 30.0, 1024, 384)])
    after = _after(run, CHANGE_AT)
    assert after[0][5].itl_s > SLO_.itl_ms / 1e3 and after[0][5].kv_usage > 0.9  # ITL up, KV over the watermark
    first_up = next(r for r in after if r[2] > 3)
    assert first_up[0] - CHANGE_AT <= 2 * AutoscaleConfig(itl_target_s=1.0).up_window_s
    ratios = dict(first_up[3].decode.policy.slo_ratios)
    assert ratios["itl"] > 1.0 and ratios["kv"] > 1.0 and "ttft" not in ratios
    assert "KV-cache usage 0.97" in first_up[3].decode.message
    assert {p for _, p, *_ in run} == {2}                     # prefill never moves
    assert run[-1][5].itl_s <= SLO_.itl_ms / 1e3 and run[-1][5].kv_usage < 0.9


def test_kv_pressure_alone_scales_decode_and_is_sourced_to_the_engines_gauges() -> None:
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(1, 8), decode_replicas=(1, 8),
                                 initial_burst_rise=0.0)
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    state = R.RolesState(AutoscaleState(2), AutoscaleState(2))
    ok_p = MetricsSnapshot(ok=True, ttft_s=0.2, request_rate_per_s=5, queue_depth=0, running=2, sample_age_s=5)

    def dec_snap(kv):
        return MetricsSnapshot(ok=True, itl_s=0.015, request_rate_per_s=5, queue_depth=0, running=20, kv_usage=kv,
                               sample_age_s=5)

    s, seen = state, []
    for t in (0, 30, 60):
        d = R.decide_roles(s, ok_p, dec_snap(0.95), cfg, cap, cap, T0 + t)
        s = d.state
        seen.append(d.decode.reason)
    assert seen == [P.SCALE_UP_PENDING, P.SCALE_UP_PENDING, P.SCALED_UP]  # after the up window, as for latency
    assert d.decode.desired_replicas == 3 and d.prefill.desired_replicas == 2
    s = state
    for t in (0, 30, 60, 90):
        d = R.decide_roles(s, ok_p, dec_snap(0.85), cfg, cap, cap, T0 + t)  # under the 0.9 watermark
        s = d.state
    assert d.decode.desired_replicas == 2
    # the names the watermark reads are the engines' own 0..1 gauges, as the captures in the repo show them
    from meshplan.autoscale.promql import ENGINE_METRICS
    root = __import__("pathlib").Path(__file__).parent / "fixtures" / "metrics"
    vllm = (root / "vllm-0.32.0-cpu-capture.prom").read_text()
    sglang = (root / "sglang-production-metrics.prom").read_text()
    assert ENGINE_METRICS["vllm"].kv_usage_gauges[0] == "vllm:kv_cache_usage_perc"
    assert "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage." in vllm
    assert ENGINE_METRICS["sglang"].kv_usage_gauges == ("sglang:token_usage",)
    assert "# TYPE sglang:token_usage gauge" in sglang
    for name in ("vllm:kv_cache_usage_perc", "sglang:token_usage"):
        assert name in R.__doc__


def test_a_kv_breach_is_learned_from_like_an_itl_breach() -> None:
    # KV over the watermark for a whole up window with every decode group ready: the load per group then is
    # what a group can hold (the KV cache holds the running batch), learned as an ITL breach is (no drift back)
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(1, 8), decode_replicas=(1, 8),
                                 initial_burst_rise=0.0)
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64, ready_replicas=2)
    sp = MetricsSnapshot(ok=True, ttft_s=0.2, request_rate_per_s=5, queue_depth=0, running=2, sample_age_s=5)
    sd = MetricsSnapshot(ok=True, itl_s=0.015, request_rate_per_s=5, queue_depth=0, running=20, kv_usage=0.95,
                         sample_age_s=5)
    s = R.RolesState(AutoscaleState(2), AutoscaleState(2))
    for t in (0, 30, 60):
        d = R.decide_roles(s, sp, sd, cfg, cap, cap, T0 + t)
        s = d.state
    assert d.decode.reason == P.SCALED_UP
    assert s.decode.learned_rps_per_replica == pytest.approx(2.5) and s.decode.learned_from_ttft is False
    assert s.prefill.learned_rps_per_replica is None


def test_each_role_ignores_the_other_roles_latency() -> None:
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(1, 8), decode_replicas=(1, 8),
                                 initial_burst_rise=0.0)
    assert cfg.prefill.itl_target_s is None and cfg.prefill.ttft_target_s == 0.5
    assert cfg.decode.ttft_target_s is None and cfg.decode.itl_target_s == 0.025 and cfg.decode.kv_high_watermark == 0.9
    assert cfg.prefill.kv_high_watermark is None
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0)
    # prefill pods with a terrible ITL (they emit one token) and decode pods with a terrible TTFT
    sp = MetricsSnapshot(ok=True, ttft_s=0.2, itl_s=5.0, request_rate_per_s=5, queue_depth=0, running=2,
                         sample_age_s=5, kv_usage=1.0)
    sd = MetricsSnapshot(ok=True, ttft_s=30.0, itl_s=0.015, request_rate_per_s=5, queue_depth=0, running=20,
                         kv_usage=0.3, sample_age_s=5)
    s = R.RolesState(AutoscaleState(2), AutoscaleState(2))
    for t in (0, 30, 60, 90):
        d = R.decide_roles(s, sp, sd, cfg, cap, cap, T0 + t)
        s = d.state
        assert d.prefill.reason != P.SCALE_UP_PENDING and d.decode.reason != P.SCALE_UP_PENDING
    assert (d.prefill.desired_replicas, d.decode.desired_replicas) == (2, 2)


def test_config_needs_both_targets_and_refuses_crossed_signals() -> None:
    with pytest.raises(AutoscaleConfigError, match="ttftMs is needed; the prefill groups scale on TTFT"):
        R.RolesConfig.from_slo(SLO(itl_ms=25), plan_ratio=(1, 1), prefill_replicas=(1, 4), decode_replicas=(1, 4))
    with pytest.raises(AutoscaleConfigError, match="itlMs is needed; the decode groups scale on ITL"):
        R.RolesConfig.from_slo(SLO(ttft_ms=500), plan_ratio=(1, 1), prefill_replicas=(1, 4), decode_replicas=(1, 4))
    both = AutoscaleConfig(ttft_target_s=1.0, itl_target_s=0.05)
    with pytest.raises(AutoscaleConfigError, match="prefill role is not scaled on ITL"):
        R.RolesConfig(both, replace(both, ttft_target_s=None), (1, 1), R.RatioBounds.around(1, 1))
    with pytest.raises(AutoscaleConfigError, match="kv_high_watermark"):
        AutoscaleConfig(itl_target_s=0.05, kv_high_watermark=1.5)


def test_an_aggregated_config_never_reads_kv_usage() -> None:
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=8, ttft_target_s=1.0, itl_target_s=0.05,
                          initial_burst_rise=0.0)
    full = MetricsSnapshot(ok=True, ttft_s=0.3, itl_s=0.02, request_rate_per_s=1, queue_depth=0, running=2,
                           kv_usage=1.0, sample_age_s=5)
    s = AutoscaleState(2)
    for t in (0, 30, 60, 90):
        d = decide(s, full, cfg, ReplicaCapacity(requests_per_s_at_slo=10.0), T0 + t)
        s = d.state
    assert "kv" not in dict(d.slo_ratios) and d.reason != P.SCALED_UP


# --- the ratio ----------------------------------------------------------------


def test_ratio_bounds_default_to_half_and_double_the_plans_ratio_in_whole_groups() -> None:
    b = R.RatioBounds.around(2, 3)
    assert (b.low, b.high) == (R.Fraction(1, 3), R.Fraction(4, 3))
    assert b.prefill_range(3) == (1, 4) and b.prefill_range(6) == (2, 8) and b.prefill_range(0) == (0, 0)
    # 1:8 with one decode group: 1/16 .. 1/4 of a group holds no whole count; one prefill group stands
    assert R.RatioBounds.around(1, 8).prefill_range(1) == (1, 1)
    assert R.RatioBounds.around(1, 3).prefill_range(7) == (2, 4)  # ceil(7/6), floor(14/3)
    assert R.prefill_for_decode(4, (2, 3)) == 3 and R.prefill_for_decode(3, (2, 3)) == 2
    assert R.prefill_for_decode(1, (1, 8)) == 1 and R.prefill_for_decode(0, (1, 1)) == 0
    with pytest.raises(AutoscaleConfigError):
        R.RatioBounds.around(0, 1)
    with pytest.raises(AutoscaleConfigError):
        R.RatioBounds(R.Fraction(2), R.Fraction(1))


def test_the_ratio_bound_holds_under_a_skewed_load_and_decode_is_not_dragged_up() -> None:
    # prompts twice as long: the prefill groups want more than 4 per 3 decode groups (2x the plan's 2:3)
    run = simulate([BASE, (900, 30.0, 2048, 256)])
    b = R.RatioBounds.around(2, 3)
    assert all(b.holds(p, d) for _, p, d, *_ in run)
    assert {d for _, _, d, *_ in run} == {3}
    assert max(p for _, p, *_ in run) == 4
    bound = [r[3].prefill for r in run if r[3].prefill.reason == R.RATIO_BOUND]
    assert bound, "the prefill side should have pressed against the bound"
    cond = next(c for c in bound[-1].conditions if c.type == P.COND_SCALING_LIMITED)
    assert cond.status == "True" and cond.reason == R.RATIO_BOUND
    assert cond.message.startswith("prefill: wanted 5, limited to 4 by 3 decode group(s)")
    assert bound[-1].policy.desired_replicas == 5          # the policy's own wish, kept for inspection
    assert bound[-1].state.desired_replicas == 4 and not bound[-1].changed


def _steady(ttft=0.2, itl=0.015, rps=5.0, running=20.0, kv=0.3, queue=0.0) -> tuple[MetricsSnapshot, MetricsSnapshot]:
    return (MetricsSnapshot(ok=True, ttft_s=ttft, request_rate_per_s=rps, queue_depth=queue, running=2,
                            sample_age_s=5),
            MetricsSnapshot(ok=True, itl_s=itl, request_rate_per_s=rps, queue_depth=0, running=running, kv_usage=kv,
                            sample_age_s=5))


CFG11 = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(1, 8), decode_replicas=(1, 8),
                               initial_burst_rise=0.0, cooldown_s=0.0)


def test_a_clamped_scale_up_keeps_no_change_in_its_state() -> None:
    # prefill at the top of the bound (2 per decode group): its scale-up is clamped to nothing
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    sp, sd = _steady(ttft=2.0)
    s = R.RolesState(AutoscaleState(4, last_change_at=T0 - 999), AutoscaleState(2))
    for t in (0, 30, 60):
        d = R.decide_roles(s, sp, sd, CFG11, cap, cap, T0 + t)
        s = d.state
    assert d.prefill.policy.desired_replicas == 5 and d.prefill.desired_replicas == 4
    assert d.prefill.reason == R.RATIO_BOUND and not d.prefill.changed
    assert s.prefill.desired_replicas == 4 and s.prefill.last_change_at == T0 - 999  # no cooldown started
    assert s.prefill.above_since == T0                                              # the window keeps running


def test_a_scale_down_yields_before_a_scale_up() -> None:
    # decode wants one less (idle, below every threshold for a down window); prefill wants one more
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    sp = MetricsSnapshot(ok=True, ttft_s=2.0, request_rate_per_s=1, queue_depth=0, running=2, sample_age_s=5)
    sd = MetricsSnapshot(ok=True, itl_s=0.01, request_rate_per_s=1, queue_depth=0, running=2, kv_usage=0.05,
                         sample_age_s=5)
    s = R.RolesState(AutoscaleState(4), AutoscaleState(2))  # 4:2 is the top of the 1:1 plan's [1/2, 2]
    for t in range(0, 301, 30):
        d = R.decide_roles(s, sp, sd, CFG11, cap, cap, T0 + t)
        s = d.state
        assert R.RatioBounds.around(1, 1).holds(d.prefill.desired_replicas, d.decode.desired_replicas)
    last = d
    assert last.decode.policy.desired_replicas == 1 and last.decode.desired_replicas == 2   # held
    assert "scale-down 2 -> 1 held at 2" in last.decode.message
    # ... and then the scale-up yields too (4 is already 2 per decode group)
    assert last.prefill.desired_replicas == 4 and last.prefill.reason == R.RATIO_BOUND


def test_a_scale_down_of_prefill_yields_to_the_lower_bound() -> None:
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    sp = MetricsSnapshot(ok=True, ttft_s=0.05, request_rate_per_s=0.5, queue_depth=0, running=1, sample_age_s=5)
    sd = MetricsSnapshot(ok=True, itl_s=0.02, request_rate_per_s=0.5, queue_depth=0, running=30, kv_usage=0.6,
                         sample_age_s=5)
    s = R.RolesState(AutoscaleState(2), AutoscaleState(4))  # 2:4 is the bottom of [1/2, 2]
    for t in range(0, 301, 30):
        d = R.decide_roles(s, sp, sd, CFG11, cap, cap, T0 + t)
        s = d.state
    assert d.prefill.policy.desired_replicas == 1 and d.prefill.desired_replicas == 2
    assert d.prefill.reason == R.RATIO_BOUND and "held at 2" in d.prefill.message
    assert s.prefill.desired_replicas == 2


def test_counts_outside_the_bounds_are_corrected_by_raising_the_short_role_as_far_as_fits() -> None:
    sp, sd = _steady()
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    s = R.RolesState(AutoscaleState(1), AutoscaleState(6))  # 1:6 under a 1:1 plan: prefill needs 3
    d = R.decide_roles(s, sp, sd, CFG11, replace(cap, additional_replicas_that_fit=1), cap, T0)
    assert d.prefill.desired_replicas == 2 and d.prefill.reason == R.RATIO_CORRECTED
    assert "only 2 may run or fit" in d.prefill.message and d.notes
    d = R.decide_roles(s, sp, sd, CFG11, cap, cap, T0)
    assert d.prefill.desired_replicas == 3 and d.prefill.state.desired_replicas == 3 and not d.notes
    assert d.decode.desired_replicas == 6 and d.decode.reason == d.decode.policy.reason


def test_both_roles_reach_zero_together_when_both_may() -> None:
    # min 0 on both roles and no traffic at all: neither role's scale-down may leave the other stranded
    # (a prefill group without decode serves nothing), and they still get to zero
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(0, 8), decode_replicas=(0, 8),
                                 initial_burst_rise=0.0, cooldown_s=0.0)
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    idle_p = MetricsSnapshot(ok=True, request_rate_per_s=0, queue_depth=0, running=0, sample_age_s=5)
    idle_d = MetricsSnapshot(ok=True, request_rate_per_s=0, queue_depth=0, running=0, kv_usage=0.0, sample_age_s=5)
    s = R.RolesState(AutoscaleState(1, below_since=T0 - 30), AutoscaleState(1))  # prefill's window is ahead
    counts = []
    for t in range(0, 601, 30):
        d = R.decide_roles(s, idle_p, idle_d, cfg, cap, cap, T0 + t)
        s = d.state
        counts.append((d.prefill.desired_replicas, d.decode.desired_replicas))
        assert R.RatioBounds.around(1, 1).holds(*counts[-1])
    # prefill's window ends first (t=270) and is held beside the decode group, its window kept running; at
    # t=300 decode's ends too and both go together
    assert counts[9] == (1, 1) and counts[10] == (0, 0) and counts[-1] == (0, 0)


def test_the_docs_figures_are_the_simulations() -> None:
    doc = (__import__("pathlib").Path(__file__).parent.parent / "docs" / "autoscaling.md").read_text()
    section = doc.split("## Disaggregated deployments", 1)[1]
    prompt = simulate([BASE, (900, 30.0, 1536, 256)])
    a = _after(prompt, CHANGE_AT)
    assert (round(prompt[0][4].ttft_s, 2), round(a[0][4].ttft_s, 2)) == (0.31, 0.73)
    assert (round(prompt[0][5].kv_usage, 2), round(a[0][5].kv_usage, 2)) == (0.45, 0.65)
    assert next(r[0] for r in a if r[1] > 2) - CHANGE_AT == 75
    out = _after(simulate([BASE, (900, 30.0, 1024, 384)]), CHANGE_AT)
    assert (round(out[0][5].itl_s * 1e3, 1), round(out[0][5].kv_usage, 2)) == (28.6, 0.97)
    assert next(r for r in out if r[2] > 3)[0] - CHANGE_AT == 75 and out[-1][2] == 5
    for text in ("from 0.31 s to 0.73 s", "from 0.45 to 0.65", "75 s later", "ITL to 28.6 ms", "KV usage to 0.97",
                 "3 → 5", "4-per-3 bound", "prompts 1024 → 1536", "outputs 256 → 384"):
        assert text in section, text


def test_a_replica_bounds_correction_never_yields_to_the_ratio() -> None:
    # decode's minReplicas raised to 6 under a 1:1 plan with 1 prefill group: decode goes to 6 (the spec is a hard
    # bound) and prefill is raised into the ratio bounds (at least 3 beside 6), not decode held at 2
    cfg = replace(CFG11, decode=replace(CFG11.decode, min_replicas=6))
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    d = R.decide_roles(R.RolesState(AutoscaleState(1), AutoscaleState(2)), *_steady(), cfg, cap, cap, T0)
    assert d.decode.desired_replicas == 6 and d.decode.reason == P.BOUNDS_CORRECTED
    assert d.prefill.desired_replicas == 3 and d.prefill.reason == R.RATIO_CORRECTED
    assert "raised 1 -> 3: 1:6 after the replica-bounds correction is outside" in d.prefill.message
    # prefill's maxReplicas lowered to 1 beside 4 decode groups: prefill goes to 1, decode... is not lowered
    # (rule 3 only raises); the counts stay outside and the decision says so
    cfg = replace(CFG11, prefill=replace(CFG11.prefill, max_replicas=1))
    d = R.decide_roles(R.RolesState(AutoscaleState(2), AutoscaleState(4)), *_steady(), cfg, cap, cap, T0)
    assert d.prefill.desired_replicas == 1 and d.prefill.reason == P.BOUNDS_CORRECTED
    assert d.decode.desired_replicas == 4 and d.notes and "outside" in d.notes[0]


_lat = st.one_of(st.none(), st.floats(0.0, 5.0))


@settings(max_examples=300, deadline=None)
@given(rp=st.integers(1, 4), rd=st.integers(1, 4), d0=st.integers(1, 8), pick=st.floats(0, 1),
       ttft=_lat, itl=st.one_of(st.none(), st.floats(0.0, 0.1)), kv=st.one_of(st.none(), st.floats(0.0, 1.0)),
       rps_p=st.floats(0.0, 60.0), rps_d=st.floats(0.0, 60.0), queue=st.floats(0.0, 200.0),
       fit_p=st.one_of(st.none(), st.integers(0, 4)), fit_d=st.one_of(st.none(), st.integers(0, 4)),
       elapsed=st.sampled_from([0.0, 60.0, 400.0]), bad=st.sampled_from(["", "prefill", "decode"]))
def test_properties_ratio_whole_groups_fit_and_direction(rp, rd, d0, pick, ttft, itl, kv, rps_p, rps_d, queue,
                                                         fit_p, fit_d, elapsed, bad) -> None:
    bounds = R.RatioBounds.around(rp, rd)
    lo, hi = bounds.prefill_range(d0)
    p0 = lo + int(pick * (hi - lo))                     # any count inside the bounds to start from
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(rp, rd), prefill_replicas=(1, 64), decode_replicas=(1, 64),
                                 initial_burst_rise=0.0)
    sp = MetricsSnapshot(ok=True, ttft_s=ttft, request_rate_per_s=rps_p, queue_depth=queue, running=rps_p,
                         sample_age_s=5)
    sd = MetricsSnapshot(ok=True, itl_s=itl, request_rate_per_s=rps_d, queue_depth=queue, running=rps_d * 4,
                         kv_usage=kv, sample_age_s=5)
    if bad == "prefill":
        sp = MetricsSnapshot.failed(METRICS_UNAVAILABLE, "down")
    elif bad == "decode":
        sd = MetricsSnapshot.failed(METRICS_UNAVAILABLE, "down")
    cap_p = ReplicaCapacity(requests_per_s_at_slo=5.0, additional_replicas_that_fit=fit_p)
    cap_d = ReplicaCapacity(requests_per_s_at_slo=5.0, concurrency_at_slo=32, additional_replicas_that_fit=fit_d)
    state = R.RolesState(AutoscaleState(p0, above_since=T0 - elapsed, below_since=T0 - elapsed),
                         AutoscaleState(d0, above_since=T0 - elapsed, below_since=T0 - elapsed))
    d = R.decide_roles(state, sp, sd, cfg, cap_p, cap_d, T0)
    p, q = d.prefill.desired_replicas, d.decode.desired_replicas
    assert isinstance(p, int) and isinstance(q, int)
    assert bounds.holds(p, q) and not d.notes              # started inside: stays inside
    for role, new, old, fit in (("prefill", p, p0, fit_p), ("decode", q, d0, fit_d)):
        r = d.role(role)
        assert 1 <= new <= 64
        if fit is not None:
            assert new <= old + fit                       # never more groups than fit
        # never moved against its own signals, and never further than its own policy asked
        assert min(old, r.policy.desired_replicas) <= new <= max(old, r.policy.desired_replicas)
        assert r.state.desired_replicas == new
        if bad == role:
            assert new == old and r.reason == METRICS_UNAVAILABLE


# --- capacity, whole groups ------------------------------------------------------


def test_whole_groups_only_and_the_capacity_limit_names_the_role() -> None:
    sp, sd = _steady(ttft=3.0)
    # load alone needs many prefill groups (rate 30 req/s at 4 per group); only one more fits
    sp = replace(sp, request_rate_per_s=30.0)
    cap_p = ReplicaCapacity.with_domains({"node-a": 4, "node-b": 2}, requests_per_s_at_slo=5.0, gpus_per_replica=4,
                                         additional_replicas_that_fit=1)
    cap_d = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64, gpus_per_replica=8,
                            additional_replicas_that_fit=0)
    cfg = R.RolesConfig.from_slo(SLO_, plan_ratio=(1, 1), prefill_replicas=(1, 16), decode_replicas=(1, 16),
                                 initial_burst_rise=0.0)
    s = R.RolesState(AutoscaleState(2), AutoscaleState(2))
    d = R.decide_roles(s, sp, sd, cfg, cap_p, cap_d, T0)
    assert isinstance(d.prefill.desired_replicas, int) and d.prefill.desired_replicas == 3
    lim = next(c for c in d.prefill.conditions if c.type == P.COND_SCALING_LIMITED)
    assert lim.reason == P.REASON_INSUFFICIENT_CAPACITY and lim.message.startswith("prefill: wanted ")
    assert "1 more whole group(s) of 4 GPUs" in lim.message and "node-a=4" in lim.message
    assert d.prefill.message.startswith("prefill: ")
    assert d.decode.desired_replicas == 2
    assert all(c.message.startswith("decode: ") for c in d.decode.conditions)
    # a corrective raise respects the fit too: nothing fits, nothing is raised
    s = R.RolesState(AutoscaleState(1), AutoscaleState(6))
    d = R.decide_roles(s, *_steady(), cfg, replace(cap_p, additional_replicas_that_fit=0), cap_d, T0)
    assert d.prefill.desired_replicas == 1 and d.notes and "outside" in d.notes[0]
    assert "; not raised (1): 1:6 was outside" in d.prefill.message and "no more may run or fit" in d.prefill.message


def test_role_capacity_from_the_plans_per_role_predictions() -> None:
    pre = SimpleNamespace(prediction=SimpleNamespace(tokens_per_s_per_gpu=2048.0, concurrency=64),
                          layout=SimpleNamespace(gpus_per_replica=4))
    dec = SimpleNamespace(prediction=SimpleNamespace(tokens_per_s_per_gpu=512.0, concurrency=32),
                          layout=SimpleNamespace(gpus_per_replica=8))
    cp = R.role_capacity_from_plan(pre, "prefill", isl=1024, osl=256, additional_replicas_that_fit=2)
    cd = R.role_capacity_from_plan(dec, "decode", isl=1024, osl=256)
    assert cp.requests_per_s_at_slo == pytest.approx(8.0) and cp.concurrency_at_slo is None
    assert cp.gpus_per_replica == 4 and cp.additional_replicas_that_fit == 2
    assert cd.requests_per_s_at_slo == pytest.approx(16.0) and cd.concurrency_at_slo == 32.0
    with pytest.raises(ValueError):
        R.role_capacity_from_plan(pre, "router", isl=1, osl=1)


def test_role_capacity_from_a_real_disaggregated_plan() -> None:
    # DeepSeek-R1 on H200 (catalogue model and GPU, the real performance model): the plan's operating point read
    # per role. A prefill group's rate is the plan's closed-loop rate (a request's cycle includes its TTFT, as
    # for an aggregated replica); a decode group holds a request only for its OSL x ITL, so the decode side's
    # rate is higher by exactly (TTFT + OSL x ITL) / (OSL x ITL).
    from meshplan.catalog.gpus import get_gpu
    from meshplan.catalog.models import get_model
    from meshplan.planner.disagg import plan_disagg
    from meshplan.planner.types import Workload
    wl = Workload(isl=8192, osl=1024)
    c = plan_disagg(get_model("deepseek-r1"), get_gpu("h200"), mode="enabled", max_gpus=32, workload=wl,
                    slo=SLO(ttft_ms=2000, itl_ms=15), objective="balanced").choice
    cp = R.role_capacity_from_plan(c.prefill, "prefill", isl=wl.isl, osl=wl.osl)
    cd = R.role_capacity_from_plan(c.decode, "decode", isl=wl.isl, osl=wl.osl)
    decode_s = wl.osl * c.decode.prediction.tpot_ms / 1e3
    assert cd.concurrency_at_slo == c.decode.prediction.concurrency
    assert cd.requests_per_s_at_slo == pytest.approx(c.decode.prediction.concurrency / decode_s)
    total_p = cp.requests_per_s_at_slo * c.prefill_workers
    total_d = cd.requests_per_s_at_slo * c.decode_workers
    assert total_p / total_d == pytest.approx(decode_s / (c.prefill.prediction.ttft_ms / 1e3 + decode_s))
    assert cp.gpus_per_replica == c.prefill.layout.gpus_per_replica


# --- metrics held per role ----------------------------------------------------------


def _alone(role_state, snap, cfg, cap, now):
    return decide(role_state, snap, cfg, cap, now)


@pytest.mark.parametrize("broken", [
    MetricsSnapshot.failed(METRICS_UNAVAILABLE, "Prometheus at http://prom:9090 refused the connection"),
    MetricsSnapshot(ok=True, ttft_s=float("nan"), request_rate_per_s=5, queue_depth=0, running=2, sample_age_s=5),
    MetricsSnapshot(ok=True, ttft_s=0.2, request_rate_per_s=5, queue_depth=0, running=2, sample_age_s=400),
])
def test_untrusted_prefill_metrics_hold_prefill_and_leave_decode_alone(broken) -> None:
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    _, sd = _steady(itl=0.04, kv=0.95)  # decode is breaching: it must still scale
    s = R.RolesState(AutoscaleState(3, above_since=T0 - 30), AutoscaleState(2))
    for t in (0, 30, 60):
        d = R.decide_roles(s, broken, sd, CFG11, cap, cap, T0 + t)
        alone = _alone(s.decode, sd, CFG11.decode, cap, T0 + t)
        assert (d.decode.desired_replicas, d.decode.reason, d.decode.state) == \
               (alone.desired_replicas, alone.reason, alone.state)
        assert d.prefill.desired_replicas == 3 and d.prefill.reason in METRIC_PROBLEMS
        assert d.prefill.state.above_since is None  # windows reset, as policy.decide does
        active = next(c for c in d.prefill.conditions if c.type == P.COND_SCALING_ACTIVE)
        assert active.status == "False" and active.message.startswith("prefill: holding 3 replicas")
        s = d.state
    assert d.decode.desired_replicas == 3 and d.decode.reason == P.SCALED_UP


def test_untrusted_decode_metrics_hold_decode_and_leave_prefill_alone() -> None:
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    sp, _ = _steady(ttft=2.0)
    stale = MetricsSnapshot(ok=True, itl_s=0.5, request_rate_per_s=5, queue_depth=0, running=20, kv_usage=1.0,
                            sample_age_s=300)
    s = R.RolesState(AutoscaleState(2), AutoscaleState(2))
    for t in (0, 30, 60):
        d = R.decide_roles(s, sp, stale, CFG11, cap, cap, T0 + t)
        alone = _alone(s.prefill, sp, CFG11.prefill, cap, T0 + t)
        assert (d.prefill.desired_replicas, d.prefill.reason, d.prefill.state) == \
               (alone.desired_replicas, alone.reason, alone.state)
        assert d.decode.desired_replicas == 2 and d.decode.reason == METRICS_STALE
        s = d.state
    assert d.prefill.desired_replicas == 3


def test_a_missing_kv_series_blocks_decode_scale_down_and_says_so() -> None:
    cap = ReplicaCapacity(requests_per_s_at_slo=10.0, concurrency_at_slo=64)
    sp, _ = _steady()
    idle_d = MetricsSnapshot(ok=True, itl_s=0.01, request_rate_per_s=0.5, queue_depth=0, running=1, kv_usage=None,
                             sample_age_s=5, missing=("kv_usage (vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc)",))
    s = R.RolesState(AutoscaleState(2), AutoscaleState(3))
    for t in range(0, 601, 30):
        d = R.decide_roles(s, sp, idle_d, CFG11, cap, cap, T0 + t)
        s = d.state
    assert d.decode.desired_replicas == 3
    active = next(c for c in d.decode.conditions if c.type == P.COND_SCALING_ACTIVE)
    assert "KV usage is not compared with its high-watermark" in active.message
    assert "no scale-down while kv_usage is missing" in active.message
    # with the series present the same idle decode fleet does shrink
    s = R.RolesState(AutoscaleState(2), AutoscaleState(3))
    for t in range(0, 601, 30):
        d = R.decide_roles(s, sp, replace(idle_d, kv_usage=0.05, missing=()), CFG11, cap, cap, T0 + t)
        s = d.state
    assert d.decode.desired_replicas < 3


# --- state ----------------------------------------------------------------------------


def test_roles_state_roundtrips_through_json_and_a_broken_role_falls_back_alone() -> None:
    run = simulate([BASE, (300, 30.0, 1536, 256)])
    state = run[-1][3].state
    assert state.prefill.demand_samples and state.prefill.last_change_at is not None
    text = json.dumps(state.to_dict())
    back = R.RolesState.from_dict(json.loads(text), default_prefill=1, default_decode=1)
    assert back == state
    doc = json.loads(text)
    doc["decode"]["desired_replicas"] = "many"
    half = R.RolesState.from_dict(doc, default_prefill=1, default_decode=5)
    assert half.prefill == state.prefill and half.decode == AutoscaleState(5)
    assert R.RolesState.from_dict(None, default_prefill=2, default_decode=3) == \
        R.RolesState(AutoscaleState(2), AutoscaleState(3))
