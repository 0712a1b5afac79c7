"""Properties of the planner over random models, GPUs, budgets, workloads and objectives (hypothesis).

- A chosen layout always fits memory (checked again, independently of the
  search's bookkeeping) and the GPU budget.
- The frontier is non-dominated among all evaluated candidates.
- More GPUs never lower the best achievable tokens/s/GPU.
- On a fleet, the choice is placeable by `meshplan.placement` (the planner's
  closed-form replica count agrees with the placer).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner import memory, plan
from meshplan.planner.objectives import OBJECTIVES
from meshplan.planner.pareto import dominates, pareto_frontier
from meshplan.planner.search import SearchSpace, search
from meshplan.planner.types import SLO, Workload

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-235b-a22b", "gpt-oss-120b", "deepseek-v3")
GPUS = ("h100", "h200", "b200", "gb200", "l40s", "mi300x")
# a light knob grid keeps each example fast; the properties do not depend on its density
SPACE = SearchSpace(chunk_sizes=(256, 2048), max_num_seqs=(1, 16, 256, 4096), accuracy_floor="fp4")

models = st.sampled_from(MODELS).map(get_model)
gpus = st.sampled_from(GPUS).map(get_gpu)
engines = st.sampled_from(("vllm", "sglang", "trtllm"))
workloads = st.builds(Workload, isl=st.sampled_from((128, 1024, 8192)), osl=st.sampled_from((64, 512)),
                      concurrency=st.sampled_from((None, None, 8, 300)))
slos = st.one_of(st.none(), st.builds(SLO, ttft_ms=st.sampled_from((None, 500.0, 5000.0)),
                                      itl_ms=st.sampled_from((None, 20.0, 100.0))))
# MESHPLAN_PROP_EXAMPLES=200 for a deeper run (default 25 keeps the suite fast)
FAST = settings(max_examples=int(os.environ.get("MESHPLAN_PROP_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(models, gpus, st.integers(1, 96), workloads, slos, st.sampled_from(OBJECTIVES), engines)
def test_a_chosen_layout_fits_memory_and_the_budget(model, gpu, budget, workload, slo, objective, engine):
    p = plan(model, gpu, max_gpus=budget, workload=workload, slo=slo, objective=objective, engine=engine,
             space=SPACE)
    if p.choice is None:
        return
    c = p.choice
    assert c.layout.total_gpus <= budget
    assert c.memory.fits
    # independent re-check with the blog mapping: the engine may only redistribute the experts, never
    # need more memory per GPU for the weights than the blog layout would (same parameters per stage)
    fit = memory.memory_fit(model, gpu, c.layout, weight_dtype=c.weight_dtype, kv_dtype=c.kv_dtype,
                            context_tokens=workload.context, chunk_size=c.chunk_size,
                            max_num_seqs=c.max_num_seqs, engine=engine)
    assert fit.fits, fit.reason
    assert c.max_num_seqs <= max(1, c.memory.max_concurrency)
    if slo is not None:
        assert slo.ttft_ms is None or c.prediction.ttft_ms <= slo.ttft_ms
        assert slo.itl_ms is None or c.prediction.tpot_ms <= slo.itl_ms


@FAST
@given(models, gpus, st.integers(1, 64), workloads, engines)
def test_the_frontier_is_non_dominated(model, gpu, budget, workload, engine):
    res = search(model, gpu, budget, workload, engine=engine, space=SPACE)
    front = pareto_frontier(res.candidates)
    assert bool(front) == bool(res.candidates)
    for f in front:
        assert not any(dominates(c, f) for c in res.candidates)


def _best_throughput(model, gpu, budget, workload, fleet=None):
    res = search(model, gpu, budget, workload, space=SPACE, fleet=fleet)
    return max((c.prediction.tokens_per_s_per_gpu for c in res.candidates), default=0.0)


@FAST
@given(models, gpus, st.integers(1, 48), st.integers(1, 48), workloads)
def test_more_gpus_never_lower_the_best_throughput(model, gpu, n, extra, workload):
    assert _best_throughput(model, gpu, n + extra, workload) >= _best_throughput(model, gpu, n, workload) - 1e-9


@FAST
@given(models, st.lists(st.integers(0, 8), min_size=1, max_size=6), st.integers(0, 8))
def test_more_free_gpus_in_a_fleet_never_lower_the_best_throughput(model, free, extra):
    h100 = get_gpu("h100")

    def fleet(frees):
        from meshplan.topology import build_topology

        nodes, pods = _cluster([("NVIDIA-H100-80GB-HBM3", None, "a", 8, 8 - g) for g in frees])
        return build_topology(nodes, pods)

    more = list(free) + [extra]
    small, big = fleet(free), fleet(more)
    assert (_best_throughput(model, h100, max(1, big.free_gpus), Workload(), big)
            >= _best_throughput(model, h100, max(1, small.free_gpus), Workload(), small) - 1e-9)


def _cluster(draw_nodes):
    """Node and Pod dicts for (product, clique or None, zone, gpus, used) tuples."""
    nodes, pods = [], []
    for i, (product, clique, zone, gpus, used) in enumerate(draw_nodes):
        labels = {"nvidia.com/gpu.product": product, "topology.kubernetes.io/zone": zone,
                  "kubernetes.io/hostname": f"n{i}"}
        if clique:
            labels["nvidia.com/gpu.clique"] = clique
        nodes.append({"metadata": {"name": f"n{i}", "labels": labels},
                      "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})
        if used:
            pods.append({"spec": {"nodeName": f"n{i}", "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": str(min(used, gpus))}}}]},
                "status": {"phase": "Running"}})
    return nodes, pods


hgx_node = st.tuples(st.just("NVIDIA-H100-80GB-HBM3"), st.none(), st.sampled_from(("za", "zb")),
                     st.just(8), st.integers(0, 8))
nvl_node = st.tuples(st.just("NVIDIA-GB200"), st.sampled_from(("c.1", "c.2")), st.just("za"),
                     st.just(4), st.integers(0, 4))
clusters = st.one_of(st.lists(hgx_node, min_size=1, max_size=8), st.lists(nvl_node, min_size=1, max_size=18))


@FAST
@given(clusters, st.sampled_from(("llama-3.1-70b", "mixtral-8x7b", "llama-3.1-8b")).map(get_model),
       st.sampled_from(OBJECTIVES), slos)
def test_the_choice_on_a_fleet_is_placeable(cluster, model, objective, slo):
    from meshplan.placement import place, request_for_layout
    from meshplan.render.pipeline import product_for_gpu
    from meshplan.topology import build_topology

    nodes, pods = _cluster(cluster)
    topo = build_topology(nodes, pods)
    fleet = topo
    p = plan(model, list(fleet.gpus()) or "h100", fleet=fleet, objective=objective, slo=slo, space=SPACE)
    if p.choice is None:
        return
    product, per_node = product_for_gpu(topo, p.choice.gpu)
    result = place(request_for_layout(p.choice.layout, per_node, product=product), topo)
    assert result.ok, (p.choice.layout, result.message())
