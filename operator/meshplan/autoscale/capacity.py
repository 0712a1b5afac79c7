"""How many more whole replica groups fit the free NVLink domains (pure).

The policy only counts replicas that can be placed whole (gang: all pods of a
group or none). Rather than re-deriving the placement rules here, this asks
`meshplan.placement.place` itself: place `current + upper` replicas on the
topology and count how many it managed. Replicas are identical and placed in
index order, so the placed ones form a prefix: if replica k did not fit, no
later one does.

The topology must leave out the deployment's own pods (`build_topology(...,
ignore_pod=...)`), as for reconcile, so the running replicas keep their place
and are not counted twice; pass their nodes as `existing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from meshplan.autoscale.policy import ReplicaCapacity
from meshplan.placement import PlacementRequest, PlacementResult, place
from meshplan.topology import Topology


def count_fitting(
    request: PlacementRequest,
    topology: Topology,
    *,
    current: int,
    upper: int,
    existing: Mapping[int, Sequence[str]] | None = None,
) -> tuple[int, PlacementResult]:
    """(replicas beyond `current` that fit, at most `upper`; the trial placement)."""
    if current < 0 or upper < 0:
        raise ValueError(f"current and upper must be >= 0, got {current}, {upper}")
    trial = place(replace(request, replicas=current + upper), topology, existing)
    placed = {r.index for r in trial.placed}
    fits = 0
    while current + fits in placed and fits < upper:
        fits += 1
    if not all(i in placed for i in range(current)):
        fits = 0  # the running replicas themselves do not all fit: add nothing
    return fits, trial


def replica_capacity(
    request: PlacementRequest,
    topology: Topology,
    *,
    current: int,
    max_replicas: int,
    existing: Mapping[int, Sequence[str]] | None = None,
    requests_per_s_at_slo: float | None = None,
    concurrency_at_slo: float | None = None,
    ready_replicas: int | None = None,
) -> ReplicaCapacity:
    """The policy's `ReplicaCapacity` for a deployment now, from a trial placement."""
    fits, _ = count_fitting(request, topology, current=current, upper=max(0, max_replicas - current), existing=existing)
    return ReplicaCapacity.with_domains(
        topology.free_gpus_by_domain(),
        requests_per_s_at_slo=requests_per_s_at_slo,
        concurrency_at_slo=concurrency_at_slo,
        gpus_per_replica=request.gpus_per_replica,
        additional_replicas_that_fit=fits,
        ready_replicas=ready_replicas,
    )
