"""The ONE condition helper, and the status document of an LLMDeployment (pure).

Conditions follow the Kubernetes API conventions (metav1.Condition): type,
status, reason (CamelCase), message (with the numbers), observedGeneration and
lastTransitionTime, which changes only when the status value changes, so
`kubectl describe` shows how long a state has held.

Condition types (docs/architecture.md) and what they mean here
- Planned      a layout was chosen for the current spec (False: InvalidSpec,
               InsufficientCapacity with needed vs free GPUs, NoFeasiblePlan).
- Placed       every desired replica group has NVLink-aligned nodes (False:
               InsufficientCapacity with the placement's numbers).
- Available    readyReplicas >= desiredReplicas >= 1: every replica the user
               asked for serves (a replica is ready when all its pods are).
               Defined against desired, not ">= 1", so a deployment that lost a
               replica says so; `Degraded` tells "serving, but fewer".
- Progressing  groups are being created, released, replaced or removed.
- Degraded     0 < readyReplicas < desiredReplicas, or a group was restarted.
- ScalingLimited  desired replicas are held back by capacity (or, later, by
               the autoscaler's bounds).
- ScalingActive  (autoscaling only) the autoscaler's metrics are usable
               (False: MetricsUnavailable, MetricsStale, MetricsInvalid, and the
               count is held). Decided by controller.autoscaling, written here.
- Routed       (disaggregated deployments only) the InferencePool selects a served
               revision (False: InferencePoolCRDMissing naming the CRD, NoRevisionReady).
               Decided by controller.decide_disagg.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

CONDITION_TYPES = ("Planned", "Placed", "Available", "Progressing", "Degraded", "ScalingLimited", "ScalingActive")


def rfc3339(now: datetime) -> str:
    return now.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    previous: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> dict[str, Any]:
    """One condition; keeps the previous lastTransitionTime when the status value did not change."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    prev = next((c for c in previous if c.get("type") == type_), None)
    ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == value else None
    out = {"type": type_, "status": value, "reason": reason, "message": message[:32768],
           "lastTransitionTime": ltt or rfc3339(now)}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def conditions(
    previous: Sequence[Mapping[str, Any]],
    values: Iterable[tuple[str, bool | str, str, str]],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """All conditions from (type, status, reason, message) tuples: CONDITION_TYPES first in their fixed
    order, then other types (e.g. the autoscaler's ScalingActive) in the order given."""
    by_type = {t: condition(previous, t, s, r, m, generation, now) for t, s, r, m in values}
    return [by_type[t] for t in CONDITION_TYPES if t in by_type] + \
        [c for t, c in by_type.items() if t not in CONDITION_TYPES]


def merge_values(own: list[tuple[str, bool | str, str, str]],
                 others: tuple[tuple[str, bool | str, str, str], ...]) -> list[tuple[str, bool | str, str, str]]:
    """Conditions computed elsewhere (the autoscaler's) merged into ours: new types are added; for a
    type both set, ours wins when it is True (e.g. ScalingLimited by capacity right now), else theirs."""
    out = {v[0]: v for v in own}
    for v in others:
        mine = out.get(v[0])
        if mine is None or mine[1] not in (True, "True"):
            out[v[0]] = tuple(v)
    return list(out.values())


def transitioned(previous: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from the previous condition of its type in status or reason (event-worthy)."""
    prev = next((c for c in previous if c.get("type") == new["type"]), None)
    return prev is None or prev.get("status") != new["status"] or prev.get("reason") != new["reason"]


def plan_summary(candidate: Any, reason: str | None = None, *, nodes_per_replica: int | None = None,
                 gpu_product: str | None = None) -> dict[str, Any]:
    """A planner `Candidate` as `status.plan` / `status.alternatives[]` (meshplan.api.models.PlanSummary)."""
    lay, p = candidate.layout, candidate.prediction
    out: dict[str, Any] = {
        "layout": lay.label(), "tp": lay.tp, "ep": lay.ep, "pp": lay.pp, "dp": lay.dp,
        "gpusPerReplica": lay.gpus_per_replica,
        "weightsDtype": candidate.weight_dtype, "kvCacheDtype": candidate.kv_dtype,
        "chunkSize": candidate.chunk_size, "maxNumSeqs": candidate.max_num_seqs,
        "memoryPerGpuGib": round(candidate.memory.usable_bytes / 2**30, 2),
        "predicted": {
            "ttftMs": round(p.ttft_ms, 1), "itlMs": round(p.tpot_ms, 2),
            **({"ttftP50Ms": round(p.ttft_p50_ms, 1)} if p.ttft_p50_ms > 0 else {}),
            "tokensPerSecondPerGpu": round(p.tokens_per_s_per_gpu, 1),
            "tokensPerSecondPerUser": round(p.tokens_per_s_per_user, 1),
        },
    }
    if nodes_per_replica:
        out["nodesPerReplica"] = nodes_per_replica
    if gpu_product or candidate.gpu:
        out["gpuProduct"] = gpu_product or candidate.gpu
    if reason:
        out["reason"] = reason[:4096]
    return out


def status_patch(live: Mapping[str, Any] | None, desired: Mapping[str, Any],
                 owned: Sequence[str]) -> dict[str, Any] | None:
    """The merge patch turning `live` status into `desired` for the keys meshplan's reconciler owns
    (`owned`; e.g. `autoscaling` belongs to the autoscaler and is left alone). None when equal."""
    live = live or {}
    patch: dict[str, Any] = {}
    for key in owned:
        if key in desired:
            if live.get(key) != desired[key]:
                patch[key] = desired[key]
        elif key in live:
            patch[key] = None
    return patch or None


__all__ = ["CONDITION_TYPES", "condition", "conditions", "merge_values", "plan_summary", "rfc3339", "status_patch", "transitioned"]
