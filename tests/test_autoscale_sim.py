"""The autoscaling simulator's own mechanics (benchmarks/autoscale_sim.py): what its figures rest on."""

from __future__ import annotations

import math

from benchmarks.autoscale_sim import STEP_S, Ours, Static, UtilisationHPA, diurnal_trace, simulate
from meshplan.autoscale.policy import AutoscaleConfig
from meshplan.autoscale.queueing import ReplicaModel

MODEL = ReplicaModel()
TTFT_S, ITL_S = 1.0, 0.025


def test_static_gpu_hours_are_replicas_times_gpus_times_hours():
    rates = [5.0] * int(2 * 3600 / STEP_S)
    r = simulate(Static(6), rates, MODEL, TTFT_S, ITL_S, startup_s=180, seed=1)
    assert math.isclose(r.gpu_hours, 6 * MODEL.gpus * 2.0)
    assert r.changes == 0


def test_ours_settles_on_constant_load_without_oscillating():
    cap = MODEL.capacity_at_slo(TTFT_S, ITL_S)
    rates = [3.5 * cap] * int(4 * 3600 / STEP_S)          # 3.5 replicas' worth at SLO, for 4 h
    conc = MODEL.concurrency_at_slo(TTFT_S, ITL_S)
    # Without a burst prior: flat in the second half, at a count the load with its remembered rise
    # (Poisson noise only) needs, within the scale-down margin's dead band.
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=16, ttft_target_s=TTFT_S, itl_target_s=ITL_S,
                          initial_burst_rise=0.0)
    ours = Ours(cfg, cap, MODEL.gpus, start=1, concurrency_at_slo=conc)
    r = simulate(ours, rates, MODEL, TTFT_S, ITL_S, startup_s=180, seed=3)
    replicas = r.series["replicas"]
    last_hours = replicas[len(replicas) // 2:]
    assert len(set(last_hours)) == 1, "the count still moves in the second half of a constant day"
    rise = max(ours.state.burst_rise or 0.0, ours.state.burst_rise_previous or 0.0)
    assert rise < 0.25, "noise read as a burst"
    sized = 3.5 * (1 + rise) / cfg.target_load_fraction
    assert math.ceil(sized) <= last_hours[0] <= math.ceil(sized * (1 + cfg.load_down_margin))
    assert r.attainment_requests > 0.95
    # With the default prior (+150 %, fading): the count only comes down in the second half.
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=16, ttft_target_s=TTFT_S, itl_target_s=ITL_S)
    r = simulate(Ours(cfg, cap, MODEL.gpus, start=1, concurrency_at_slo=conc), rates, MODEL, TTFT_S, ITL_S,
                 startup_s=180, seed=3)
    last_hours = r.series["replicas"][len(rates) // 2:]
    assert last_hours == sorted(last_hours, reverse=True)
    assert r.attainment_requests > 0.95


def test_dcgm_style_utilisation_saturates_so_its_hpa_never_scales_down():
    # A continuously batching engine keeps a kernel running whenever any sequence is in flight:
    # at a trough of 15 % of the peak the HPA on that signal still holds its maximum.
    rates = diurnal_trace(seed=1, hours=6, peak_rps=20.0, trough_frac=0.15, bursts_per_day=0)
    hpa = UtilisationHPA(0.7, min_replicas=1, max_replicas=16, start=16, signal="busy")
    r = simulate(hpa, rates, MODEL, TTFT_S, ITL_S, startup_s=180, seed=1)
    assert min(r.series["replicas"]) == 16
    oracle = UtilisationHPA(0.7, min_replicas=1, max_replicas=16, start=16, signal="offered")
    assert min(simulate(oracle, rates, MODEL, TTFT_S, ITL_S, startup_s=180, seed=1).series["replicas"]) < 16
