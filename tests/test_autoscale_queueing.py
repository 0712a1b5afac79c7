"""The replica latency model shared by the simulator and the e2e exporter."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.autoscale.queueing import ReplicaModel, step_fleet

M = ReplicaModel()

# Measured TPOT/TTFT (ms) at concurrency 4..64: Llama-3.1-70B FP8, vLLM, TP4, H100 SXM, ISL/OSL 1024
# (silicon_calibration.csv rows 2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c*_tp4_*).
MEASURED = {4: (11.8, 81), 8: (12.1, 96), 16: (13.2, 121), 32: (16.5, 175), 64: (19.5, 256)}


@pytest.mark.parametrize("concurrency", sorted(MEASURED))
def test_fit_matches_measured_runs(concurrency: int) -> None:
    tpot_ms, ttft_ms = MEASURED[concurrency]
    assert M.tpot_s(concurrency) * 1000 == pytest.approx(tpot_ms, rel=0.08)
    assert M.ttft0_s(concurrency) * 1000 == pytest.approx(ttft_ms, rel=0.08)


@given(st.floats(0, 3.0), st.floats(0, 3.0))
def test_latency_is_monotone_in_load(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    la, lb = M.latency(lo), M.latency(hi)
    assert lb.ttft_p99_s >= la.ttft_p99_s - 1e-12
    assert lb.itl_p99_s >= la.itl_p99_s - 1e-12
    assert lb.running >= la.running - 1e-12


def test_littles_law_holds_below_saturation() -> None:
    for rps in (0.5, 1.0, 2.0, 2.5):
        n = M.running_at(rps)
        assert n == pytest.approx(rps * M.service_s(n), rel=1e-9)


def test_capacity_at_slo_is_the_knee() -> None:
    cap = M.capacity_at_slo(1.0, 0.025)
    assert 0 < cap < M.max_rps
    ok, over = M.latency(cap * 0.999), M.latency(cap * 1.02)
    assert ok.ttft_p99_s <= 1.0 and ok.itl_p99_s <= 0.025
    assert over.ttft_p99_s > 1.0 or over.itl_p99_s > 0.025
    # a looser SLO never has less capacity
    assert M.capacity_at_slo(2.0, 0.05) >= cap
    # an impossible SLO has none
    assert M.capacity_at_slo(0.01, None) == 0.0


def test_fleet_backlog_builds_and_drains() -> None:
    cap_per_step = M.max_rps * 10
    s = step_fleet(M, arrivals=3 * cap_per_step, ready=2, backlog=0.0, dt_s=10)
    assert s.backlog == pytest.approx(cap_per_step) and s.utilisation == 1.0
    assert s.latency is not None and s.latency.ttft_p99_s > 1.0
    s2 = step_fleet(M, arrivals=0.0, ready=4, backlog=s.backlog, dt_s=10)
    assert s2.backlog == 0.0 and s2.served == pytest.approx(cap_per_step)


def test_fleet_without_ready_replicas_queues_everything() -> None:
    s = step_fleet(M, arrivals=5, ready=0, backlog=2, dt_s=10)
    assert s.backlog == 7 and s.latency is None and s.served == 0


def test_more_replicas_lower_latency() -> None:
    few = step_fleet(M, arrivals=40, ready=2, backlog=0, dt_s=10).latency
    many = step_fleet(M, arrivals=40, ready=4, backlog=0, dt_s=10).latency
    assert many.ttft_p99_s < few.ttft_p99_s and many.itl_p99_s < few.itl_p99_s
    assert math.isfinite(few.ttft_p99_s)
