"""Pareto frontier of tokens/s/GPU vs tokens/s/user."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplan.planner.pareto import dominates, pareto_frontier
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction

_MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)


def cand(tput: float, inter: float, tp: int = 1) -> Candidate:
    pred = Prediction(ttft_ms=100, tpot_ms=1000 / inter, tokens_per_s_per_gpu=tput,
                      tokens_per_s_per_user=inter, concurrency=1)
    return Candidate(Layout(tp=tp), "bf16", "bf16", 512, 8, _MEM, pred)


def test_dominated_points_are_dropped_and_order_is_left_to_right():
    a, b, c = cand(100, 10), cand(60, 30), cand(20, 50)
    d = cand(50, 25)           # dominated by b
    e = cand(100, 5)           # same throughput as a, less interactive
    front = pareto_frontier([d, c, e, a, b])
    assert front == (a, b, c)
    assert [x.prediction.tokens_per_s_per_user for x in front] == [10, 30, 50]


def test_duplicates_keep_one():
    a1, a2 = cand(10, 10, tp=1), cand(10, 10, tp=2)
    assert len(pareto_frontier([a1, a2])) == 1


def test_empty():
    assert pareto_frontier([]) == ()


points = st.lists(st.tuples(st.floats(0.1, 1e4), st.floats(0.1, 1e3)), min_size=1, max_size=60)


@given(points)
def test_frontier_is_non_dominated_and_covers_every_point(pts):
    cs = [cand(t, i) for t, i in pts]
    front = pareto_frontier(cs)
    # no frontier point is dominated by any candidate
    for f in front:
        assert not any(dominates(c, f) for c in cs)
    # every candidate is on the frontier or weakly dominated by a frontier point
    for c in cs:
        assert any(f is c or (f.prediction.tokens_per_s_per_gpu >= c.prediction.tokens_per_s_per_gpu and
                              f.prediction.tokens_per_s_per_user >= c.prediction.tokens_per_s_per_user)
                   for f in front)
    # along the frontier, interactivity rises and throughput falls
    for left, right in zip(front, front[1:]):
        assert right.prediction.tokens_per_s_per_user > left.prediction.tokens_per_s_per_user
        assert right.prediction.tokens_per_s_per_gpu < left.prediction.tokens_per_s_per_gpu
