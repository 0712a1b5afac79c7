"""A disaggregated deployment's decisions, pure (issue 19), beside `controller.decide`'s aggregated path.

`decide.py` is untouched: an LLMDeployment without `spec.serving`, or with `disaggregation: disabled`, or whose
`auto` plan keeps aggregated serving, goes through it exactly as before. This module holds what the operator adds
for a disaggregated plan (`planner.disagg.DisaggPlan` with `disaggregated` True).

`disaggregation_status(dplan)`: the `status.disaggregation` document (`api.models.DisaggregationStatus`): the
mode, whether it is disaggregated, the roles compactly (the `Roles` printer column), the P:D ratio, per role the
layout, group count and predicted latency (TTFT for prefill, ITL for decode), the KV path's tier, the aggregated
plan it was compared with, and the planner's reason.

"""

from __future__ import annotations

from typing import Any

REASON_MAX = 4096


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(max(0.0, float(x)), nd)


def disaggregation_status(dplan: Any) -> dict[str, Any]:
    """`status.disaggregation` for a `planner.types.DisaggPlan` (camelCase, no None values)."""
    out: dict[str, Any] = {"mode": dplan.mode, "disaggregated": bool(dplan.disaggregated), "label": dplan.label()[:256]}
    c = dplan.choice
    if c is not None:
        out["ratio"] = c.ratio
        out["prefill"] = {"layout": c.prefill.layout.label(), "replicas": c.prefill_workers,
                          "ttftMs": _round(c.prefill.prediction.ttft_ms)}
        out["decode"] = {"layout": c.decode.layout.label(), "replicas": c.decode_workers,
                         "itlMs": _round(c.decode.prediction.tpot_ms, 3)}
        out["kvPath"] = {"tier": str(c.kv_path.tier)[:64]}
    a = dplan.aggregated.choice if dplan.aggregated is not None else None
    if a is not None:
        out["aggregated"] = {
            "label": (a.layout.label() + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else ""))[:256],
            "tokensPerSecondPerGpu": _round(a.prediction.tokens_per_s_per_gpu),
            "tokensPerSecondPerUser": _round(a.prediction.tokens_per_s_per_user)}
    if dplan.reason:
        out["reason"] = dplan.reason[:REASON_MAX]
    return out


__all__ = ["disaggregation_status"]
