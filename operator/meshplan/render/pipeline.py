"""One LLMDeployment through the pure core: plan -> place -> render.

`plan_place_render(llmd, topology, ...)` is what a reconcile computes between
reading the world and applying the result, and what `meshplan render` prints.
Pure: the topology is given (from `meshplan.topology`), nothing is read.

Steps
1. Restrict the topology to `spec.gpus.nodeSelector`.
2. Plan on that topology's free GPUs (`planner.plan_for_spec` with
   `Topology`), unless a plan is passed in (the controller re-plans
   only when inputs that matter change).
3. Place as many replicas of the chosen layout as the operator applies
   (`desired_replicas`: spec.replicas / autoscaling, the controller's own rule)
   on nodes of the chosen GPU product
   (`placement.request_for_layout`, `placement.place`), keeping `existing`
   replicas where they are.
4. Render the placed replica groups (`render_deployment`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from meshplan.placement import PlacementRequest, PlacementResult, place, request_for_layout
from meshplan.planner.types import Plan
from meshplan.render import Owner, Rendered, render_deployment
from meshplan.render.options import options_from_spec
from meshplan.topology import Topology


@dataclass(frozen=True)
class PipelineResult:
    plan: Plan
    request: PlacementRequest | None = None
    placement: PlacementResult | None = None
    rendered: Rendered | None = None
    product: str | None = None            # nvidia.com/gpu.product the replicas run on
    replicas_why: str = ""                # where the replica count comes from (replicas_and_why)

    @property
    def message(self) -> str:
        if self.plan.choice is None:
            return f"no feasible plan: {self.plan.reason}"
        if self.placement is not None and not self.placement.ok:
            return self.placement.message()
        return "ok"


def replicas_and_why(spec: Any, status: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """The replica count the operator applies, and where it comes from (one sentence).

    `spec.replicas`; with `spec.autoscaling.enabled` the autoscaler's last decision
    (`status.autoscaling.toReplicas`) clamped to [minReplicas, maxReplicas], starting from
    `spec.replicas`. The controller (`reconcile.desired_replicas`) and `meshplan render` both use it.
    The planner's DP is NOT this count: it is what the SLO search sized for `spec.workload`.
    """
    a = spec.autoscaling
    if not a.enabled:
        return spec.replicas, f"spec.replicas is {spec.replicas}"
    decided = ((status or {}).get("autoscaling") or {}).get("toReplicas")
    n = spec.replicas if decided is None else int(decided)
    hi = a.max_replicas if a.max_replicas is not None else n
    out = max(a.min_replicas, min(n, hi))
    src = (f"the autoscaler's last decision, {int(decided)}," if decided is not None
           else f"spec.replicas {spec.replicas}, where autoscaling starts,")
    bounds = f"within autoscaling.minReplicas {a.min_replicas} .. maxReplicas {hi}"
    return out, f"{src}{' clamped' if out != n else ''} {bounds}"


def desired_replicas(spec: Any, status: Mapping[str, Any] | None = None) -> int:
    """The replica count the operator applies (see `replicas_and_why`)."""
    return replicas_and_why(spec, status)[0]


def product_for_gpu(topology: Topology, gpu: str) -> tuple[str | None, int]:
    """(nvidia.com/gpu.product label, GPUs per node) of the domains whose catalogue GPU is `gpu`."""
    best: tuple[int, str] | None = None
    per_node: dict[str, int] = {}
    for d in topology.domains:
        name = d.gpu          # resolved from the nodes' labels (meshplan.topology.gpu_view)
        if gpu and name != gpu:
            continue
        per_node[d.product] = max(per_node.get(d.product, 0), d.gpus_per_node)
        key = (d.free_gpus, d.product)
        best = key if best is None or key > best else best
    if best is None:
        return None, 0
    return best[1], per_node[best[1]]


def plan_place_render(
    llmd: Any,
    topology: Topology,
    *,
    plan: Plan | None = None,
    existing: Mapping[int, Sequence[str]] | None = None,
    compute_domains: bool = False,
    gated: bool = True,
    replicas: int | None = None,
    disagg: Any = None,
) -> PipelineResult:
    """Plan, place and render one `meshplan.api.models.LLMDeployment` on `topology`.

    `replicas`: how many replica groups to place and render; by default what the operator applies
    for this spec (`desired_replicas`, from `spec.replicas` and autoscaling), not the plan's DP (what
    the SLO search sized for the workload). As in the controller (`controller.decide`), the plan's DP
    is not part of a replica's shape: the candidate is rendered with dp 1, so the pods carry the plan
    hash the operator would give them.
    """
    import dataclasses

    spec = llmd.spec
    selector = dict(spec.gpus.node_selector or {})
    topo = topology.select(selector)
    if plan is None:
        from meshplan.planner import plan_for_spec

        plan = plan_for_spec(spec, topo.named(f"of nodes matching {selector}" if selector else ""))
    choice = plan.choice
    if choice is None:
        return PipelineResult(plan)
    product, per_node = product_for_gpu(topo, choice.gpu)
    if product is None:
        from meshplan.catalog.gpus import get_gpu

        per_node = get_gpu(choice.gpu).gpus_per_node if choice.gpu else choice.layout.gpus_per_stage
    n, why = replicas_and_why(spec) if replicas is None else (replicas, "as asked")
    candidate = dataclasses.replace(choice, layout=dataclasses.replace(choice.layout, dp=1))
    request = request_for_layout(candidate.layout, per_node or 1, replicas=n, product=product,
                                 node_selector=selector)
    placement = place(request, topo, existing)
    serving, network, pods = options_from_spec(spec)
    if disagg is not None:   # engines.base.Disaggregation: render one role of a disaggregated deployment (issue 19)
        serving = dataclasses.replace(serving, disagg=disagg)
    network = dataclasses.replace(network, compute_domains=compute_domains)
    owner = Owner(llmd.name, llmd.namespace, str(llmd.metadata.get("uid", "")))
    rendered = render_deployment(owner, candidate, placement, topo, serving, network, pods, gated=gated)
    return PipelineResult(plan, request, placement, rendered, product, why)


__all__ = ["PipelineResult", "desired_replicas", "plan_place_render", "product_for_gpu", "replicas_and_why"]
