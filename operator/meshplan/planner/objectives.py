"""Choosing one candidate per objective, with the reason and the next-best alternatives.

Only candidates that meet the SLO (`meets_slo`) are eligible; the SLO's
targets are compared with the model's predictions (TTFT, ITL = TPOT,
tokens/s/user). The objectives:

- `maxThroughput`: the most tokens/s/GPU; ties go to more tokens/s/user,
  then fewer GPUs.
- `bestInteractivity`: the most tokens/s/user; ties go to more tokens/s/GPU,
  then fewer GPUs.
- `balanced`: on the Pareto frontier of the eligible candidates, the point
  that maximises the product of both axes normalised by their best values,
  (throughput / best throughput) x (interactivity / best interactivity): the
  point where a hyperbola throughput x interactivity = constant touches the
  frontier. It is scale-free (units and the frontier's extent do not move it)
  and picks the knee of a convex frontier, never an end point unless one end
  dominates.
- `minCostWithinSLO`: the fewest GPUs (all replicas), then the most
  tokens/s/GPU, then the most tokens/s/user. Without an SLO every candidate is
  eligible, so it is simply the smallest deployment that runs.

Alternatives are the next best under the same ranking, one per layout shape
(TP x EP x PP), so they show genuinely different options, not the same layout
with a different batch limit. When nothing meets the SLO there is no choice;
the reason names the closest candidate and by how much it misses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshplan.planner.pareto import pareto_frontier
from meshplan.planner.types import SLO, Candidate, Objective, Prediction

OBJECTIVES: tuple[Objective, ...] = ("maxThroughput", "bestInteractivity", "balanced", "minCostWithinSLO")


@dataclass(frozen=True)
class Choice:
    choice: Candidate | None
    reason: str
    alternatives: tuple[Candidate, ...] = ()
    eligible: int = 0                    # candidates that met the SLO


def predicted_ttft(pred: Prediction, slo: SLO | None) -> float:
    """The predicted TTFT an SLO's target is checked against: at percentile 50 the steady-state median
    (`ttft_p50_ms`, perf._core); at a higher percentile the closed-loop mean (`ttft_ms`: the arrival wave's
    queue included, above the median; the model prices no tail beyond it)."""
    return pred.median_ttft_ms if slo is not None and slo.percentile == 50 else pred.ttft_ms


def slo_violation(pred: Prediction, slo: SLO | None) -> str:
    """Why `pred` misses `slo` ("" when it meets it, or when there is no SLO)."""
    if slo is None:
        return ""
    misses = []
    ttft = predicted_ttft(pred, slo)
    if slo.ttft_ms is not None and ttft > slo.ttft_ms:
        p50 = " (p50)" if slo.percentile == 50 and pred.ttft_p50_ms > 0 else ""
        misses.append(f"TTFT {ttft:,.0f} ms{p50} > {slo.ttft_ms:,.0f} ms")
    if slo.itl_ms is not None and pred.tpot_ms > slo.itl_ms:
        misses.append(f"ITL {pred.tpot_ms:,.2f} ms > {slo.itl_ms:,.2f} ms")
    if slo.min_tokens_per_s_per_user is not None and pred.tokens_per_s_per_user < slo.min_tokens_per_s_per_user:
        misses.append(f"{pred.tokens_per_s_per_user:,.2f} tokens/s/user < {slo.min_tokens_per_s_per_user:,.2f}")
    return "; ".join(misses)


def meets_slo(pred: Prediction, slo: SLO | None) -> bool:
    return not slo_violation(pred, slo)


def slo_shortfall(pred: Prediction, slo: SLO | None) -> float:
    """How far `pred` misses `slo` as the worst ratio (1.0 = just meets it; larger is worse)."""
    if slo is None:
        return 1.0
    ratios = [1.0]
    if slo.ttft_ms:
        ratios.append(predicted_ttft(pred, slo) / slo.ttft_ms)
    if slo.itl_ms:
        ratios.append(pred.tpot_ms / slo.itl_ms)
    if slo.min_tokens_per_s_per_user:
        ratios.append(slo.min_tokens_per_s_per_user / max(pred.tokens_per_s_per_user, 1e-9))
    return max(ratios)


def describe(c: Candidate) -> str:
    """One line: layout, knobs and predicted figures."""
    p = c.prediction
    lay = c.layout
    dp = f" x DP{lay.dp}" if lay.dp > 1 else ""
    return (f"{lay.label()}{dp} ({lay.total_gpus} GPU{'s' if lay.total_gpus != 1 else ''}), chunk {c.chunk_size}, max_num_seqs {c.max_num_seqs}, "
            f"{c.weight_dtype} weights / {c.kv_dtype} KV: {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at "
            f"{p.tokens_per_s_per_user:,.1f} tokens/s/user (TTFT {p.ttft_ms:,.0f} ms, ITL {p.tpot_ms:,.1f} ms)")


def describe_deployed(c: Candidate, replicas: int, replicas_why: str = "", gpu_product: str | None = None) -> str:
    """What runs, in one sentence: the chosen layout at the replica count the operator applies (which the
    autoscaler or spec.replicas decides, not the search), and how that differs from the search's DP.

    `describe` (and a plan's reason) says what the SLO search saw: its DP is what it sized for
    spec.workload, and its predictions are per replica at that DP's share of the load.
    """
    lay, p = c.layout, c.prediction
    gpr = lay.gpus_per_replica
    n = max(0, int(replicas))
    on = f" of {gpu_product or c.gpu}" if (gpu_product or c.gpu) else ""
    text = (f"running {lay.label()} x {n} replica(s) = {n * gpr} GPU{'s' if n * gpr != 1 else ''}{on}"
            + (f" ({replicas_why})" if replicas_why else "")
            + f"; each replica: chunk {c.chunk_size}, max_num_seqs {c.max_num_seqs}, {c.weight_dtype} weights / "
              f"{c.kv_dtype} KV, predicted {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at "
              f"{p.tokens_per_s_per_user:,.1f} tokens/s/user (TTFT {p.ttft_ms:,.0f} ms, ITL {p.tpot_ms:,.1f} ms)")
    if lay.dp != n:
        text += (f"; the SLO search sized DP{lay.dp} ({lay.total_gpus} GPUs) for spec.workload, and the predictions "
                 f"are per replica at that DP's share of the load")
    return text


def _t(c: Candidate) -> float:
    return c.prediction.tokens_per_s_per_gpu


def _i(c: Candidate) -> float:
    return c.prediction.tokens_per_s_per_user


def _rank_key(objective: Objective, pool: Sequence[Candidate]) -> Callable[[Candidate], tuple]:
    if objective == "maxThroughput":
        return lambda c: (_t(c), _i(c), -c.layout.total_gpus)
    if objective == "bestInteractivity":
        return lambda c: (_i(c), _t(c), -c.layout.total_gpus)
    if objective == "minCostWithinSLO":
        return lambda c: (-c.layout.total_gpus, _t(c), _i(c))
    if objective == "balanced":
        t_best = max((_t(c) for c in pool), default=1.0) or 1.0
        i_best = max((_i(c) for c in pool), default=1.0) or 1.0
        return lambda c: ((_t(c) / t_best) * (_i(c) / i_best), _t(c))
    raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")


def _shape(c: Candidate) -> tuple[int, int, int]:
    return (c.layout.tp, c.layout.ep, c.layout.pp)


def _distinct_shapes(ranked: Sequence[Candidate], skip: Candidate | None, n: int) -> tuple[Candidate, ...]:
    seen = {_shape(skip)} if skip is not None else set()
    out = []
    for c in ranked:
        if _shape(c) in seen:
            continue
        seen.add(_shape(c))
        out.append(c)
        if len(out) == n:
            break
    return tuple(out)


_WHY = {
    "maxThroughput": "the most tokens/s/GPU",
    "bestInteractivity": "the most tokens/s/user",
    "balanced": "the largest product of normalised tokens/s/GPU and tokens/s/user on the frontier",
    "minCostWithinSLO": "the fewest GPUs, then the most tokens/s/GPU",
}


def _slo_text(slo: SLO | None) -> str:
    if slo is None:
        return "no SLO"
    parts = []
    if slo.ttft_ms is not None:
        parts.append(f"TTFT <= {slo.ttft_ms:,.0f} ms")
    if slo.itl_ms is not None:
        parts.append(f"ITL <= {slo.itl_ms:,.1f} ms")
    if slo.min_tokens_per_s_per_user is not None:
        parts.append(f">= {slo.min_tokens_per_s_per_user:,.1f} tokens/s/user")
    return "SLO " + ", ".join(parts) if parts else "no SLO"


def choose(
    candidates: Sequence[Candidate],
    objective: Objective,
    slo: SLO | None = None,
    *,
    n_alternatives: int = 3,
) -> Choice:
    """Pick the best candidate for `objective` among those that meet `slo`."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    eligible = [c for c in candidates if meets_slo(c.prediction, slo)]
    if not eligible:
        if not candidates:
            return Choice(None, "no candidate to choose from: every layout was rejected (see rejected)")
        closest = sorted(candidates, key=lambda c: (slo_shortfall(c.prediction, slo), -_t(c)))
        best = closest[0]
        return Choice(
            None,
            f"no candidate meets the {_slo_text(slo)} ({len(candidates):,} evaluated); the closest is "
            f"{describe(best)}, which misses by {slo_violation(best.prediction, slo)}. Relax the SLO (spec.slo), "
            f"allow more GPUs or replicas (spec.gpus.maxGpus, spec.replicas) or a faster GPU (spec.gpus.products).",
            _distinct_shapes(closest, None, n_alternatives),
            0,
        )
    pool = pareto_frontier(eligible) if objective == "balanced" else eligible
    key = _rank_key(objective, pool)
    ranked = sorted(pool, key=key, reverse=True)
    best = ranked[0]
    alts = _distinct_shapes(ranked, best, n_alternatives)
    among = (f"{len(eligible):,} candidates that meet the {_slo_text(slo)}" if slo is not None
             else f"{len(eligible):,} candidates (no SLO given)")
    reason = f"{objective}: {describe(best)}; {_WHY[objective]} of {among}"
    if alts:
        a = alts[0]
        reason += (f". Next best: {a.layout.label()}" + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else "")
                   + f" with {_t(a):,.1f} tokens/s/GPU at {_i(a):,.1f} tokens/s/user")
    return Choice(best, reason, alts, len(eligible))


__all__ = ["OBJECTIVES", "Choice", "choose", "describe", "describe_deployed", "meets_slo", "slo_violation",
           "slo_shortfall"]
