"""One LLMDeployment through the pure core: plan -> place -> render.

`plan_place_render(llmd, topology, ...)` is what a reconcile computes between
reading the world and applying the result, and what `meshplan render` prints.
Pure: the topology is given (from `meshplan.topology`), nothing is read.

Steps
1. Restrict the topology to `spec.gpus.nodeSelector`.
2. Plan on that topology's free GPUs (`planner.plan_for_spec` with
   `Topology.to_fleet()`), unless a plan is passed in (the controller re-plans
   only when inputs that matter change).
3. Place the chosen layout on nodes of the chosen GPU product
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

    @property
    def message(self) -> str:
        if self.plan.choice is None:
            return f"no feasible plan: {self.plan.reason}"
        if self.placement is not None and not self.placement.ok:
            return self.placement.message()
        return "ok"


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
) -> PipelineResult:
    """Plan, place and render one `meshplan.api.models.LLMDeployment` on `topology`."""
    import dataclasses

    spec = llmd.spec
    selector = dict(spec.gpus.node_selector or {})
    topo = topology.select(selector)
    if plan is None:
        from meshplan.planner import plan_for_spec

        plan = plan_for_spec(spec, topo.to_fleet(f"of nodes matching {selector}" if selector else ""))
    choice = plan.choice
    if choice is None:
        return PipelineResult(plan)
    product, per_node = product_for_gpu(topo, choice.gpu)
    if product is None:
        from meshplan.catalog.gpus import get_gpu

        per_node = get_gpu(choice.gpu).gpus_per_node if choice.gpu else choice.layout.gpus_per_stage
    request = request_for_layout(choice.layout, per_node or 1, product=product, node_selector=selector)
    placement = place(request, topo, existing)
    serving, network, pods = options_from_spec(spec)
    network = dataclasses.replace(network, compute_domains=compute_domains)
    owner = Owner(llmd.name, llmd.namespace, str(llmd.metadata.get("uid", "")))
    rendered = render_deployment(owner, choice, placement, topo, serving, network, pods, gated=gated)
    return PipelineResult(plan, request, placement, rendered, product)


__all__ = ["PipelineResult", "plan_place_render", "product_for_gpu"]
