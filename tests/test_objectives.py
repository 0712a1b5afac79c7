"""Choosing per objective among SLO-meeting candidates, with reasons and alternatives."""

from __future__ import annotations

import pytest

from meshplan.planner.objectives import choose, meets_slo, slo_violation
from meshplan.planner.types import SLO, Candidate, Layout, MemoryFit, Prediction

_MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)


def cand(tput, inter, layout=Layout(), ttft=100.0, seqs=8) -> Candidate:
    pred = Prediction(ttft_ms=ttft, tpot_ms=1000 / inter, tokens_per_s_per_gpu=tput,
                      tokens_per_s_per_user=inter, concurrency=seqs)
    return Candidate(layout, "fp8", "fp8", 1024, seqs, _MEM, pred)


HI_T = cand(1000, 10, Layout(tp=1, ep=8, dp=8))
MID = cand(700, 40, Layout(tp=4, ep=4, pp=4))
HI_I = cand(100, 90, Layout(tp=8, ep=8, pp=1))
SMALL = cand(300, 30, Layout(tp=8, ep=1, pp=1))        # 8 GPUs only
POOL = [HI_T, MID, HI_I, SMALL]


def test_max_throughput_and_best_interactivity():
    assert choose(POOL, "maxThroughput").choice is HI_T
    assert choose(POOL, "bestInteractivity").choice is HI_I


def test_balanced_is_the_knee_not_an_end():
    # normalised products: HI_T 1*0.11, MID 0.7*0.44=0.31, HI_I 0.1*1, SMALL 0.3*0.33
    c = choose(POOL, "balanced")
    assert c.choice is MID
    assert "frontier" in c.reason


def test_min_cost_prefers_fewest_gpus_that_meet_the_slo():
    assert choose(POOL, "minCostWithinSLO").choice is SMALL
    # SMALL is too slow per user for this SLO; the next cheapest that meets it is chosen
    slo = SLO(min_tokens_per_s_per_user=35)
    c = choose(POOL, "minCostWithinSLO", slo)
    assert c.choice in (MID, HI_I) and c.choice.layout.total_gpus == 64
    assert c.choice is MID   # same GPU count, more throughput


def test_slo_filters_every_objective():
    slo = SLO(itl_ms=30)     # needs > 33.3 tokens/s/user
    c = choose(POOL, "maxThroughput", slo)
    assert c.choice is MID and c.eligible == 2
    assert "ITL <= 30.0 ms" in c.reason


def test_alternatives_are_other_layout_shapes_in_rank_order():
    twin = cand(990, 10, Layout(tp=1, ep=8, dp=8), seqs=4)   # same shape as HI_T
    c = choose(POOL + [twin], "maxThroughput")
    assert c.choice is HI_T
    assert twin not in c.alternatives
    assert c.alternatives[0] is MID
    assert "Next best: TP4·EP4·PP4" in c.reason


def test_nothing_meets_the_slo_names_the_closest():
    slo = SLO(ttft_ms=50)
    slow = cand(500, 20, ttft=60)
    slower = cand(900, 20, Layout(tp=2), ttft=400)
    c = choose([slower, slow], "maxThroughput", slo)
    assert c.choice is None
    assert "closest" in c.reason and "TTFT 60 ms > 50 ms" in c.reason
    assert c.alternatives[0] is slow


def test_slo_checks():
    p = cand(1, 20, ttft=2500).prediction
    assert meets_slo(p, None)
    assert slo_violation(p, SLO(ttft_ms=2000)) == "TTFT 2,500 ms > 2,000 ms"
    assert meets_slo(p, SLO(itl_ms=50, min_tokens_per_s_per_user=20))
    assert not meets_slo(p, SLO(min_tokens_per_s_per_user=21))


def test_unknown_objective_is_named():
    with pytest.raises(ValueError, match="maxThroughput"):
        choose(POOL, "cheapest")  # type: ignore[arg-type]


def test_a_p50_ttft_target_is_checked_against_the_steady_state_median():
    """perf prices two TTFTs (issue 20): the closed-loop mean (`ttft_ms`, the arrival wave's queue included)
    and the steady-state median (`ttft_p50_ms`). A p50 target is checked against the median; a p99 target
    against the mean, which the median never exceeds."""
    p = Prediction(ttft_ms=2500.0, tpot_ms=10.0, tokens_per_s_per_gpu=100.0, tokens_per_s_per_user=100.0,
                   concurrency=8, ttft_p50_ms=400.0)
    assert meets_slo(p, SLO(ttft_ms=1000, percentile=50))
    assert slo_violation(p, SLO(ttft_ms=300, percentile=50)) == "TTFT 400 ms (p50) > 300 ms"
    assert slo_violation(p, SLO(ttft_ms=1000, percentile=99)) == "TTFT 2,500 ms > 1,000 ms"
    # a prediction without a median (a plan stored before it was priced) falls back to the mean
    old = Prediction(ttft_ms=2500.0, tpot_ms=10.0, tokens_per_s_per_gpu=100.0, tokens_per_s_per_user=100.0,
                     concurrency=8)
    assert not meets_slo(old, SLO(ttft_ms=1000, percentile=50))
