"""Predicted against observed: `status.observed`, the per-deployment correction factor, the
`PredictionDrift` condition and the re-plan decision (pure; issue 20, build 3).

The planner prices a layout from physics and a calibration fitted on other runs; the running
engines' Prometheus says what it really does. Each autoscaler evaluation compares the two:

- observed: TTFT and ITL at the SLO's percentile (the autoscaler's own snapshot) and at p50/p99,
  output tokens/s per GPU (the engine's generation-token counter, summed over the replicas, over
  the GPUs of the ready replicas) and per user (1 / ITL p50: one stream's token rate);
- predicted: the plan's figures (`status.plan.predicted`).

Correction factor (one for ITL, one for TTFT), learned online:

    ln f <- (1 - ALPHA) ln f + ALPHA ln(observed p50 / predicted),   f in [MIN_FACTOR, MAX_FACTOR]

an exponentially weighted mean of the log ratio, so a steady ratio r is reached geometrically:
after n evaluations |ln f - ln r| = (1 - ALPHA)^n |ln r|, i.e. within `tolerance` after
`evaluations_to_converge(r, tolerance)` = ceil(log2(|ln r| / ln(1 + tolerance))) evaluations with
ALPHA = 1/2 (5 for r = 4, 7 for r = 100, to 5 %). The p50 is compared, not the SLO percentile,
because the prediction is a typical (mean) figure; the tail is the SLO's business. Without fresh
observations (idle, metrics unusable) ln f decays toward 0 (f -> 1) with half-life
DECAY_HALF_LIFE_S, so an old lesson does not outlive the conditions it was learned under. The
factor is persisted in status.observed and restored on restart (`correction_from_status`).

The autoscaler's per-replica capacity uses it (`corrected_capacity`): a request holds a slot for
f_ttft x TTFT + outputTokens x f_itl x ITL, so a replica k times slower than planned is sized
for 1/k of the planned requests/s.

PredictionDrift (condition): True when the ITL factor is beyond DRIFT_THRESHOLD either way, or
the TTFT factor beyond it on the slow side (a lightly loaded replica's TTFT is below the
prediction made at the planned concurrency, so "faster TTFT" is load, not model error); False
within; Unknown before any observation. The message carries the numbers.

Re-plan: with the corrected figures (`corrected_predictor`) the planner may choose another
layout (a slower engine needs more TP to meet the ITL SLO). `replan_action` says what to do:
an event naming both layouts in either mode; with `spec.replan: onDrift` also adopt it, which
the reconciler does through its normal make-before-break path (new groups first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

ALPHA = 0.5
MIN_FACTOR, MAX_FACTOR = 0.1, 1000.0
DECAY_HALF_LIFE_S = 6 * 3600.0
DRIFT_THRESHOLD = 0.5          # observed 1.5x the prediction (or 1/1.5 of it) is drift
COND_PREDICTION_DRIFT = "PredictionDrift"
REPLAN_SUGGESTED = "ReplanSuggested"
REPLAN_ADOPTED = "ReplanOnDrift"


@dataclass(frozen=True)
class Correction:
    """The learned observed/predicted factors of one deployment."""

    itl: float = 1.0
    ttft: float = 1.0
    updated_at: float | None = None       # unix seconds of the last update from observations
    evaluations: int = 0                  # updates from observations so far

    @property
    def learned(self) -> bool:
        return self.evaluations > 0


def _clamp(x: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, x))


def _mix(prev: float, ratio: float | None, alpha: float) -> float:
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return prev
    return _clamp(math.exp((1.0 - alpha) * math.log(prev) + alpha * math.log(_clamp(ratio))))


def _decayed(f: float, dt_s: float, half_life_s: float) -> float:
    if dt_s <= 0 or half_life_s <= 0:
        return f
    return math.exp(math.log(f) * 0.5 ** (dt_s / half_life_s))


def _ratio(observed: float | None, predicted: float | None) -> float | None:
    if observed is None or predicted is None or not (math.isfinite(observed) and math.isfinite(predicted)):
        return None
    if observed <= 0 or predicted <= 0:
        return None
    return observed / predicted


def update_correction(prev: Correction, *, observed_itl_ms: float | None, predicted_itl_ms: float | None,
                      observed_ttft_ms: float | None, predicted_ttft_ms: float | None, now: float,
                      alpha: float = ALPHA, half_life_s: float = DECAY_HALF_LIFE_S) -> Correction:
    """One evaluation's update: fold in the observed/predicted ratios that exist, else decay."""
    r_itl = _ratio(observed_itl_ms, predicted_itl_ms)
    r_ttft = _ratio(observed_ttft_ms, predicted_ttft_ms)
    if r_itl is None and r_ttft is None:
        if prev.updated_at is None:
            return prev
        dt = now - prev.updated_at
        return replace(prev, itl=_decayed(prev.itl, dt, half_life_s), ttft=_decayed(prev.ttft, dt, half_life_s),
                       updated_at=now)
    # the first observation replaces the prior (1.0) with weight alpha like any other: no jump
    return Correction(itl=_mix(prev.itl, r_itl, alpha), ttft=_mix(prev.ttft, r_ttft, alpha), updated_at=now,
                      evaluations=prev.evaluations + 1)


def evaluations_to_converge(ratio: float, tolerance: float = 0.05, alpha: float = ALPHA) -> int:
    """Evaluations of a steady `ratio` after which the factor (from 1.0) is within `tolerance` of it."""
    r = _clamp(ratio)
    if abs(math.log(r)) <= math.log1p(tolerance):
        return 0
    return math.ceil(math.log(math.log1p(tolerance) / abs(math.log(r))) / math.log(1.0 - alpha))


def drift_condition(c: Correction, threshold: float = DRIFT_THRESHOLD) -> tuple[str, str, str, str]:
    """(type, status, reason, message) of PredictionDrift for the current factors."""
    if not c.learned:
        return (COND_PREDICTION_DRIFT, "Unknown", "NoObservations",
                "no latency observed yet to compare with the plan's prediction")
    lim = math.log1p(threshold)
    itl_out = abs(math.log(c.itl)) > lim
    ttft_slow = math.log(c.ttft) > lim
    nums = (f"observed/predicted: ITL x{c.itl:.3g}, TTFT x{c.ttft:.3g} over {c.evaluations} evaluation(s); "
            f"threshold x{1 + threshold:.3g} (or 1/{1 + threshold:.3g} for ITL)")
    if itl_out or ttft_slow:
        slower = (c.itl > 1.0 and itl_out) or ttft_slow
        reason = "ObservedSlowerThanPredicted" if slower else "ObservedFasterThanPredicted"
        return (COND_PREDICTION_DRIFT, "True", reason,
                f"{nums}; the autoscaler sizes replicas with the corrected figures")
    return (COND_PREDICTION_DRIFT, "False", "WithinThreshold", nums)


def drifting(c: Correction, threshold: float = DRIFT_THRESHOLD) -> bool:
    return drift_condition(c, threshold)[1] == "True"


def corrected_capacity(prediction: Any, output_tokens: int, c: Correction) -> tuple[float | None, float | None]:
    """(requests/s, concurrency) one replica serves at the planned concurrency with the corrected
    latencies (Little's law: a request holds its slot for TTFT + outputTokens x ITL)."""
    if prediction is None or not getattr(prediction, "concurrency", 0) or prediction.concurrency <= 0:
        return None, None
    service_s = (c.ttft * prediction.ttft_ms + output_tokens * c.itl * prediction.tpot_ms) / 1000.0
    rps = prediction.concurrency / service_s if service_s > 0 and math.isfinite(service_s) else None
    return rps, float(prediction.concurrency)


def corrected_predictor(c: Correction, base: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A planner `predictor` (perf.predict's signature) whose figures carry the correction: TTFT x
    f_ttft, ITL x f_itl, tokens/s (per GPU and per user) / f_itl."""
    if base is None:
        from meshplan.planner.perf import predict as base

    def predict(*args: Any, **kw: Any) -> Any:
        p = base(*args, **kw)
        return replace(p, ttft_ms=p.ttft_ms * c.ttft, ttft_p50_ms=p.ttft_p50_ms * c.ttft, tpot_ms=p.tpot_ms * c.itl,
                       tokens_per_s_per_gpu=p.tokens_per_s_per_gpu / c.itl,
                       tokens_per_s_per_user=p.tokens_per_s_per_user / c.itl,
                       prefill_ms=p.prefill_ms * c.ttft)

    return predict


def replan_action(mode: str, current_layout: str | None, corrected_layout: str | None,
                  already_told: str | None) -> str | None:
    """What a re-plan with the corrected figures calls for: None (same layout, none found, or this
    layout was already suggested or adopted), "suggest" (event only: spec.replan manual), "adopt"
    (onDrift)."""
    if not current_layout or not corrected_layout or corrected_layout == current_layout:
        return None
    if already_told == corrected_layout:
        return None          # said (or adopted) already; the caller forgets it once the layouts agree
    return "adopt" if mode == "onDrift" else "suggest"


# ---- status.observed ---------------------------------------------------------------------------

def _ms(v_s: float | None) -> float | None:
    return None if v_s is None or not math.isfinite(v_s) or v_s < 0 else round(v_s * 1000.0, 2)


def _num(v: float | None, digits: int = 2) -> float | None:
    return None if v is None or not math.isfinite(v) or v < 0 else round(v, digits)


def _rfc3339(epoch_s: float | None) -> str | None:
    from datetime import datetime, timezone

    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def observed_document(*, percentile: float, at_slo: Mapping[str, float | None], p50: Mapping[str, float | None],
                      p99: Mapping[str, float | None], generation_tokens_per_s: float | None,
                      gpus_serving: int | None, predicted: Mapping[str, Any] | None, correction: Correction,
                      replan_layout: str | None = None, now: float | None = None,
                      capacity_rps: float | None = None, predicted_capacity_rps: float | None = None) -> dict[str, Any]:
    """`status.observed` (meshplan.api.models.ObservedStatus). Latencies in seconds in, ms out."""
    pred = dict(predicted or {})
    itl50 = p50.get("itl_s")
    per_gpu = (generation_tokens_per_s / gpus_serving
               if generation_tokens_per_s is not None and gpus_serving else None)
    doc = {
        "time": _rfc3339(now),
        "percentile": percentile,
        "ttftMs": _ms(at_slo.get("ttft_s")),
        "itlMs": _ms(at_slo.get("itl_s")),
        "ttftP50Ms": _ms(p50.get("ttft_s")),
        "ttftP99Ms": _ms(p99.get("ttft_s")),
        "itlP50Ms": _ms(itl50),
        "itlP99Ms": _ms(p99.get("itl_s")),
        "tokensPerSecondPerGpu": _num(per_gpu),
        "tokensPerSecondPerUser": _num(1.0 / itl50 if itl50 and itl50 > 0 else None),
        "predictedTtftMs": _num(pred.get("ttftP50Ms") or pred.get("ttftMs")),
        "predictedItlMs": _num(pred.get("itlMs")),
        "predictedTokensPerSecondPerGpu": _num(pred.get("tokensPerSecondPerGpu")),
        "predictedTokensPerSecondPerUser": _num(pred.get("tokensPerSecondPerUser")),
        "itlCorrection": round(correction.itl, 4),
        "ttftCorrection": round(correction.ttft, 4),
        "correctionEvaluations": correction.evaluations,
        "correctionTime": _rfc3339(correction.updated_at),
        "capacityRps": _num(capacity_rps, 4),
        "predictedCapacityRps": _num(predicted_capacity_rps, 4),
        "replanLayout": replan_layout,
    }
    return {k: v for k, v in doc.items() if v is not None}


def correction_from_status(observed: Mapping[str, Any] | None) -> Correction:
    """The factors a (re)started operator continues from; anything malformed falls back to 1.0."""
    from datetime import datetime, timezone

    obs = dict(observed or {})

    def factor(key: str) -> float:
        v = obs.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            return _clamp(float(v))
        return 1.0

    try:
        at = datetime.strptime(obs.get("correctionTime") or "", "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        at = None
    n = obs.get("correctionEvaluations")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
    if at is None:
        return Correction()
    return Correction(itl=factor("itlCorrection"), ttft=factor("ttftCorrection"), updated_at=at, evaluations=n)


# ---- the extra queries status.observed needs -----------------------------------------------------

# Output-token counters (prometheus_client appends `_total` to a Counter's name):
# vLLM V1 `vllm:generation_tokens` (vllm/v1/metrics/loggers.py, PrometheusStatLogger), SGLang
# `sglang:generation_tokens_total` (python/sglang/srt/metrics/collector.py). TensorRT-LLM's
# trtllm-serve collector has none: tokens/s per GPU is then left out.
GENERATION_TOKEN_COUNTERS = {
    "vllm": ("vllm:generation_tokens_total",),
    "sglang": ("sglang:generation_tokens_total",),
    "trtllm": (),
}


def observed_queries(queries_at_slo: Any, engine: str, matchers: tuple, window: str,
                     overrides: Any = None) -> dict[str, str]:
    """PromQL for the observed figures beyond the SLO percentile the autoscaler already reads:
    TTFT/ITL at p50 and p99 (the same histograms, scoping and window) and output tokens/s."""
    from meshplan.autoscale.promql import _per_pod, build_queries, render_selector

    out: dict[str, str] = {}
    for pct in (50, 99):
        q = build_queries(engine, matchers, percentile=pct, window=window, overrides=overrides)
        out[f"ttft_p{pct}_s"] = q.ttft_s
        out[f"itl_p{pct}_s"] = q.itl_s
    counters = GENERATION_TOKEN_COUNTERS.get(engine, ())
    if counters:
        sel = render_selector((*matchers, *getattr(overrides, "labels", ())))
        out["generation_tokens_per_s"] = "sum(" + _per_pod([f"rate({c}{sel}[{window}])" for c in counters],
                                                           "pod") + ")"
    return out


__all__ = ["ALPHA", "COND_PREDICTION_DRIFT", "Correction", "DRIFT_THRESHOLD", "MAX_FACTOR", "MIN_FACTOR", "observed_queries",
           "REPLAN_ADOPTED", "REPLAN_SUGGESTED", "correction_from_status", "corrected_capacity",
           "corrected_predictor", "drift_condition", "drifting", "evaluations_to_converge", "observed_document",
           "replan_action", "update_correction"]
