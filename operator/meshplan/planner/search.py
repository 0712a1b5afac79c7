"""Layout search: enumerate every valid TP x EP x PP x DP layout and knob setting, evaluate it.

Algorithm

1. Replica shapes. For every `tp` (powers of two), `ep` (1 for dense models;
   powers of two and the divisors of the expert count for MoE) and `pp`
   (powers of two) with `tp * ep * pp` within the GPU budget, apply the rules
   in order and keep the first that fails as the shape's `Rejected` reason:
   - model: `tp` at most the attention heads; `ep` divides the experts (and is 1
     for a dense model); `pp` at most the layers (uneven stages are allowed:
     engines split the remainder);
   - topology (`SearchSpace.cross_domain`): a TP group never crosses an NVLink
     domain (PCIe-only cards: one node) unless `tp` is pinned (then it is priced
     over the RDMA tier and the result carries a warning, not a refusal); an EP
     stage larger than every domain may span the domains of ONE network block
     (wide EP, attention data-parallel over the domains; `cross_domain="never"`
     keeps every stage inside a domain). The performance model prices the RDMA
     share of the collectives. With a fleet (`meshplan.topology.Topology`) the
     fleet rule below checks the stages against the domains' and blocks' free
     GPUs; without one the catalogue's GPU is assumed on RDMA-connected nodes;
   - engine: `engines.check_layout` (e.g. vLLM needs heads divisible by TP
     and experts enough for EP = TP x DP; SGLang DeepEP needs tp = 1), with
     the GPUs per node, so that the rules on how a replica splits into pods
     (vLLM's expert parallelism across pods: no PP, whole DP ranks per pod)
     are the renderer's own (`engines.check_pods`);
   - memory: the weights plus the smallest chunk's activations and one
     sequence of KV cache fit (`memory.memory_fit`);
   - fleet: at least one replica fits the free GPUs (`Fleet.replica_slots`,
     the same rules as `meshplan.placement`), which also bounds DP.
   Pinned sizes (`SearchSpace.tensor/expert/pipeline`) restrict the values.
2. Replicas (DP). With no load given (neither concurrency nor request rate)
   each replica is evaluated saturated at `max_num_seqs` sequences — the
   blog's sweep, in which the batch limit traces the throughput/interactivity
   curve — and DP does not change per-GPU figures, so a shape is evaluated
   once: with `dp="fill"` (default) the candidate takes every replica the
   budget and fleet allow, with `dp="min"` one replica. With a load, the load
   is split over DP replicas and DP moves the point along the curve, so DP takes
   the powers of two and three times the powers of two up to the maximum, plus
   the maximum itself (steps of at most 50%: 1, 2, 3, 4, 6, 8, 12, ...). A fixed DP
   (`dp=int`, e.g. the manifest's replicas) is used as given.
3. Knobs. For each shape: the weight/KV dtypes (pinned, or `auto` through
   `memory.choose_precision`), chunk sizes (128..8192 by default) and batch
   limits (`max_num_seqs`, powers of two by default); `auto` dtypes are
   decided once per GPU product, independent of the budget. Batch limits
   beyond what the KV cache holds are dropped, the KV-cache limit itself is
   added (unless the batch limit is pinned: `max_num_seqs_pinned` keeps it as
   given), and a chunk whose activations do not fit is skipped. Two prunings
   keep the sweep short without changing the frontier: once a larger batch
   limit stops raising tokens/s/GPU the rest of that sweep is dominated, and
   once it misses the SLO's ITL bound the larger ones miss it too.
4. Evaluation: `predictor(...)` (default `perf.predict`) per point, on the
   layout AS THE ENGINE RUNS IT (`engines.engine_layout` gives the effective
   attention TP/DP and MoE TP/EP; e.g. vLLM keeps experts whole). Both the
   predictor and the memory model are injected, so the search is tested
   with simple fakes and the real models alike.

The number of shapes is small (tens to a few hundred even at 1,024 GPUs);
the knob grid is 7 chunks x ~10-16 batch limits; one prediction costs
~20-50 µs, so a full 64-GPU search is ~4-7k predictions
(`benchmarks/plan_speed.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from meshplan.planner import engines as engines_mod
from meshplan.planner.types import Candidate, Dtype, Engine, Layout, MemoryFit, Prediction, Rejected, Workload

CHUNK_SIZES: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
# Batch limits: powers of two up to what the KV cache holds (a 64-GPU pipeline replica holds many
# more sequences than an 8-GPU one, so a fixed ceiling would handicap large replicas).
MAX_NUM_SEQS_CEILING = 65536        # the API's bound of spec.parallelism.maxNumSeqs
MAX_NUM_SEQS: tuple[int, ...] = tuple(2**i for i in range(MAX_NUM_SEQS_CEILING.bit_length()))

Predictor = Callable[..., Prediction]
MemoryFn = Callable[..., MemoryFit]
DpPolicy = Literal["fill", "min"] | int


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. `None` for a size means `auto` (search it)."""

    tensor: int | None = None
    expert: int | None = None
    pipeline: int | None = None
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES
    max_num_seqs: tuple[int, ...] = MAX_NUM_SEQS
    # The batch limits were pinned by the user (spec.parallelism.maxNumSeqs): used as given, never replaced
    # by the KV-cache limit (the engines accept a batch limit above what the cache holds and queue/preempt
    # beyond it; the performance model prices that queueing and the plan says so).
    max_num_seqs_pinned: bool = False
    weight_dtype: Dtype | Literal["auto"] = "auto"
    kv_dtype: Dtype | Literal["auto"] = "auto"
    accuracy_floor: Dtype = "fp8"
    # "auto": an EP stage larger than every NVLink domain may span the domains of one network block (and a
    # pinned TP may cross a domain, with a warning); "never": every stage stays inside one domain.
    cross_domain: Literal["auto", "never"] = "auto"
    memory_fraction: float = 0.9
    headroom: float = 0.0
    a2a_backend: str | None = None
    # spec.engine.expertLoadBalancing: the engine's `redundant_experts` rule turns it into EPLB's redundant
    # experts per layout, held in the memory fit and priced by the performance model (`_redundant`)
    expert_load_balancing: str = "auto"
    # spec.engine.allToAll: "auto" (DeepEP where an EP group crosses an NVLink domain and the engine runs it,
    # normal and low-latency kernels both priced), "deepep-normal", "deepep-low-latency", or "default" (the
    # engine's own all-to-all); `a2a_backend`, when set, is passed as given instead (the engine's spelling)
    all_to_all: str = "auto"
    # spec.engine.batchOverlap: "auto" prices dual-/two-batch overlap on and off wherever the all-to-all is
    # DeepEP (the engines run it only there), "on" asks for it there, "off" never
    batch_overlap: str = "auto"
    # speculative decoding (`types.Speculative`, spec.engine.speculative): priced by `perf.predict` and fitted in
    # memory (its MTP modules); None: off
    speculative: Any = None


@dataclass(frozen=True)
class SearchResult:
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejected, ...]
    shapes: tuple[Layout, ...]            # replica shapes that passed every rule (dp = max replicas)
    weight_dtype: str
    kv_dtype: str
    evaluated: int                        # predictions made
    notes: tuple[str, ...] = field(default=())


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def domain_gpus(gpu: Any) -> int:
    """GPUs one TP/EP group may span without the NIC: the NVLink domain, or for PCIe-only
    cards the node (topology.py's PCIe rule)."""
    return gpu.nvlink_domain if gpu.nvlink_domain > 1 else max(1, gpu.gpus_per_node)


def shape_rule(model: Any, tp: int, ep: int, pp: int, *, domain: int, cross_domain: str = "auto",
               tp_pinned: bool = False, engine: Engine | None, a2a_backend: str | None = None,
               gpus_per_node: int | None = None) -> str | None:
    """The first structural rule (model, topology, engine) that `tp x ep x pp` breaks, or None."""
    heads = model.num_attention_heads
    if tp > heads:
        return f"tp={tp} exceeds the {heads} attention heads of {model.name}"
    if ep > 1 and not model.is_moe:
        return f"ep={ep} needs a mixture-of-experts model; {model.name} is dense"
    if model.is_moe and model.num_experts % ep:
        return f"ep={ep} does not divide the {model.num_experts} experts of {model.name}"
    if pp > model.num_layers:
        return f"pp={pp} exceeds the {model.num_layers} layers of {model.name}"
    if tp * ep > domain and cross_domain == "never":
        return (f"one stage (TP{tp} x EP{ep} = {tp * ep} GPUs) exceeds the {domain}-GPU NVLink domain and "
                f"crossDomain is never: every stage stays inside one domain")
    if tp > domain and not tp_pinned:
        return (f"TP{tp} exceeds the {domain}-GPU NVLink domain: a TP group never crosses a domain unless "
                f"spec.parallelism.tensor pins it (wide EP spans domains with TP inside each)")
    if engine is not None:
        return engines_mod.check_layout(Layout(tp, ep, pp), engine, model, a2a_backend=a2a_backend,
                                        gpus_per_node=gpus_per_node)
    return None


def a2a_options(model: Any, shape: Layout, engine: Engine, space: SearchSpace, domain: int,
                deepep_fabric: bool = True) -> list[tuple[str, bool]]:
    """The (all-to-all backend, batch overlap) pairs the search prices for `shape` (see SearchSpace).

    DeepEP is offered where the engine module spells it (`A2A_BACKENDS`: vLLM, SGLang) and accepts it for
    the layout (`check_layout`: SGLang's DeepEP needs MoE-TP 1); with "auto" only where the EP group
    crosses the NVLink domain (inside one, NVLink all-to-all is what the engines' defaults are tuned for
    and what the calibration measured). Batch overlap needs DeepEP: vLLM 0.32.0 asserts "Microbatching
    currently only supports the deepep_low_latency, deepep_high_throughput, and nixl_ep all2all backends"
    (vllm/config/vllm.py); the engine module's `BATCH_OVERLAP_FLAG` says it has one. `deepep_fabric` False
    (the fleet's RDMA is EFA only: DeepEP's GPU-initiated RDMA needs mlx5 NICs, render/nccl.py) keeps "auto"
    on the engine's default all-to-all."""
    if space.a2a_backend:
        return [(space.a2a_backend, False)]
    if shape.ep <= 1 or not getattr(model, "is_moe", False):
        return [("", False)]
    from meshplan import engines as _engines

    module = _engines.MODULES.get(engine)
    spelled = getattr(module, "A2A_BACKENDS", {}) or {}
    want = space.all_to_all
    if want == "auto":
        names = ["deepep-normal", "deepep-low-latency"] if shape.tp * shape.ep > domain and deepep_fabric else []
    elif want in spelled:
        names = [want]
    else:
        names = []
    names = [n for n in names if n in spelled and engines_mod.check_layout(
        Layout(shape.tp, shape.ep, shape.pp), engine, model, a2a_backend=n) is None]
    if not names:
        return [("", False)]
    overlap_ok = bool(getattr(module, "BATCH_OVERLAP_FLAG", ""))
    overlaps = {"off": [False], "on": [True], "auto": [False, True]}.get(space.batch_overlap, [False])
    if not overlap_ok:
        overlaps = [False]
    return [(n, o) for n in names for o in overlaps]


def _shape_values(model: Any, max_gpus: int, space: SearchSpace) -> tuple[list[int], list[int], list[int]]:
    tps = [space.tensor] if space.tensor else _pow2_upto(max_gpus)
    if space.expert:
        eps = [space.expert]
    elif model.is_moe:
        eps = sorted(set(_pow2_upto(max_gpus)) | {d for d in _divisors(model.num_experts) if d <= max_gpus})
    else:
        eps = [1]
    pps = [space.pipeline] if space.pipeline else _pow2_upto(max_gpus)
    return tps, eps, pps


def enumerate_shapes(
    model: Any,
    gpu: Any,
    max_gpus: int,
    *,
    space: SearchSpace = SearchSpace(),
    engine: Engine | None = None,
    fleet: Any = None,
    memory_fn: MemoryFn | None = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context_tokens: int = 2048,
) -> tuple[list[tuple[Layout, int]], list[Rejected]]:
    """Replica shapes `(Layout(tp, ep, pp), max replicas)` that pass every rule, and the rejected ones.

    `memory_fn=None` skips the memory rule (pure structure).
    """
    # The NVLink domain a TP group must stay in: the fleet's largest (its nodes' real size), else the
    # catalogue's. Whether a stage fits the FREE GPUs is the fleet rule below.
    domain = domain_gpus(gpu)
    if fleet is not None and fleet.domains:
        domain = max(d.total_gpus if d.nvlink else d.gpus_per_node for d in fleet.domains)
    # GPUs per node, as placement and the renderer will split a replica into pods (the fleet's nodes when
    # given, as `Fleet.gpus_per_pod` counts them; else the catalogue's node)
    per_node = max((d.gpus_per_node for d in fleet.domains), default=0) if fleet is not None else 0
    per_node = per_node or getattr(gpu, "gpus_per_node", 0) or None
    tps, eps, pps = _shape_values(model, max_gpus, space)
    ok: list[tuple[Layout, int]] = []
    rejected: list[Rejected] = []
    min_chunk = min(space.chunk_sizes)
    for tp in tps:
        for ep in eps:
            for pp in pps:
                gpr = tp * ep * pp
                if gpr > max_gpus:
                    continue
                shape = Layout(tp, ep, pp)
                reason = shape_rule(model, tp, ep, pp, domain=domain, cross_domain=space.cross_domain,
                                    tp_pinned=space.tensor is not None, engine=engine,
                                    a2a_backend=space.a2a_backend, gpus_per_node=per_node)
                if reason is None and engine is not None and space.speculative is not None:
                    reason = engines_mod.check_speculative_layout(shape, engine, space.speculative)
                if reason is None and memory_fn is not None:
                    fit = memory_fn(model, gpu, _with_redundant(shape, engine, model, space), weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                    context_tokens=context_tokens, chunk_size=min_chunk, max_num_seqs=1,
                                    engine=engine or "vllm", memory_fraction=space.memory_fraction,
                                    headroom=space.headroom, **_mtp_kw(model, space))
                    if not fit.fits:
                        reason = f"memory: {fit.reason}"
                max_dp = max_gpus // gpr
                if reason is None and fleet is not None:
                    span = space.cross_domain != "never"
                    slots = fleet.replica_slots(tp * ep, pp, span_blocks=span)
                    if slots == 0:
                        reason = f"fleet: {fleet.why_no_room(tp * ep, pp, span_blocks=span)}"
                    max_dp = min(max_dp, slots)
                if reason is None:
                    ok.append((shape, max_dp))
                else:
                    rejected.append(Rejected(shape, reason))
    return ok, rejected


def basic_layouts(model: Any, gpu: Any, gpus: int, *, weight_dtype: str, kv_dtype: str = "fp8",
                  engine: Engine | None = None, memory_fn: MemoryFn | None = None,
                  space: SearchSpace = SearchSpace(), context_tokens: int = 2048) -> list[Layout]:
    """The blog's "basic" layouts: TP x EP x PP x DP using exactly `gpus` GPUs (the blog counts 73
    for GPT-MoE-1.8T on 64 GPUs)."""
    shapes, _ = enumerate_shapes(model, gpu, gpus, space=space, engine=engine, memory_fn=memory_fn,
                                 weight_dtype=weight_dtype, kv_dtype=kv_dtype, context_tokens=context_tokens)
    return [replace(s, dp=gpus // s.gpus_per_replica) for s, _ in shapes if gpus % s.gpus_per_replica == 0]


def _dp_values(max_dp: int, dp: DpPolicy, loaded: bool) -> list[int]:
    if isinstance(dp, int):
        return [dp] if 1 <= dp <= max_dp else []
    if not loaded:
        return [max_dp if dp == "fill" else 1]
    # powers of two and three times powers of two (steps of at most 50%), and the maximum
    vals = {v for p in _pow2_upto(max_dp) for v in (p, 3 * p) if v <= max_dp} | {max_dp}
    return sorted(vals)


def _per_replica_workload(workload: Workload, dp: int) -> Workload:
    if workload.concurrency is not None:
        return replace(workload, concurrency=max(1, math.ceil(workload.concurrency / dp)),
                       max_context=workload.context)
    if workload.request_rate is not None:
        return replace(workload, request_rate=workload.request_rate / dp, max_context=workload.context)
    return workload


def _redundant(layout: Layout, engine: Engine | None, model: Any, space: SearchSpace) -> int:
    """EPLB's redundant experts the engine runs for `layout` (`engines.redundant_experts`, the renderer's rule)."""
    if engine is None or not getattr(model, "is_moe", False) or layout.ep <= 1:
        return 0
    return engines_mod.redundant_experts(engine, layout, model, space.expert_load_balancing)


def _with_redundant(shape: Layout, engine: Engine | None, model: Any, space: SearchSpace) -> Any:
    """`shape` for the memory rule: as is without EPLB, else its mapping holding the redundant experts."""
    r = _redundant(shape, engine, model, space)
    if not r:
        return shape
    from meshplan.planner.memory import ReplicaMapping

    return replace(ReplicaMapping.from_layout(shape), redundant_experts=r)


def _effective(layout: Layout, engine: Engine, model: Any, space: SearchSpace) -> Any:
    """The mapping the engine really runs (attention TP/DP, MoE TP/EP, PP, EPLB's redundant experts)."""
    from meshplan.planner.memory import ReplicaMapping

    e = engines_mod.engine_layout(layout, engine, model, a2a_backend=space.a2a_backend)
    return ReplicaMapping(attn_tp=e.attention_tp, attn_dp=e.attention_dp, moe_tp=e.moe_tp, moe_ep=e.moe_ep,
                          pp=e.pp, redundant_experts=_redundant(layout, engine, model, space))


def search(
    model: Any,
    gpu: Any,
    max_gpus: int,
    workload: Workload = Workload(),
    *,
    engine: Engine = "vllm",
    space: SearchSpace = SearchSpace(),
    fleet: Any = None,
    dp: DpPolicy = "fill",
    predictor: Predictor | None = None,
    memory_fn: MemoryFn | None = None,
    precision_fn: Callable[..., tuple[str, str]] | None = None,
    as_engine_runs: bool = True,
    max_itl_ms: float | None = None,
) -> SearchResult:
    """Every valid candidate for `model` on up to `max_gpus` GPUs of `gpu` (see module doc).

    `predictor`, `memory_fn` and `precision_fn` default to `perf.predict`,
    `memory.memory_fit` and `memory.choose_precision`. `as_engine_runs=False`
    evaluates the blog's own layout semantics instead of the engine's spelling.
    `max_itl_ms` (the SLO's inter-token latency bound, if any) prunes the batch
    sweep: a larger batch never lowers the ITL, so once a batch limit misses it the
    larger ones are not evaluated.
    """
    if predictor is None or memory_fn is None or precision_fn is None:
        from meshplan.planner import memory as memory_mod
        from meshplan.planner import perf as perf_mod

        predictor = predictor or perf_mod.predict
        memory_fn = memory_fn or memory_mod.memory_fit
        precision_fn = precision_fn or memory_mod.choose_precision
    if max_gpus < 1:
        raise ValueError(f"the GPU budget must be at least 1 GPU, got {max_gpus} (spec.gpus.maxGpus)")
    notes: list[str] = []
    wd, kd = space.weight_dtype, space.kv_dtype
    if wd == "auto" or kd == "auto":
        # Decided per GPU product at one NVLink domain's memory (the rule's default), NOT from the budget:
        # a dtype that changed with the budget could make more GPUs plan slower.
        auto_w, auto_k = precision_fn(model, gpu, accuracy_floor=space.accuracy_floor, engine=engine)
        if wd == "auto":
            wd = auto_w
            notes.append(f"weights {wd} chosen by the precision rule (accuracy floor {space.accuracy_floor})")
            if getattr(model, "checkpoint_fixed", False):
                native = model.native_dtype
                notes.append(f"the checkpoint ships {native} weights: planned as shipped" if wd == native else
                             f"the checkpoint ships {native} weights: {engine} converts them to {wd} online "
                             f"while loading (--quantization {wd})")
        if kd == "auto":
            kd = auto_k
    # dtypes the engine cannot run for this checkpoint (the engine module's check_precision: vLLM has no online
    # int4/int8/fp4, TensorRT-LLM no online quantization, NIM/MII run 16-bit only) are never proposed: no layout
    # can run them, so the search stops with the engine's reason
    refused = (engines_mod.check_precision(engine, model, gpu, wd, kd) or _context_refusal(engine, workload.context)
               or engines_mod.check_speculative(engine, model, space.speculative))
    if refused:
        return SearchResult((), (Rejected(Layout(1), f"engine: {refused}"),), (), wd, kd, 0, tuple(notes))
    context = workload.context
    if space.tensor is not None and space.cross_domain != "never":
        dom = domain_gpus(gpu)
        if fleet is not None and fleet.domains:
            dom = max(d.total_gpus if d.nvlink else d.gpus_per_node for d in fleet.domains)
        if space.tensor > dom:
            notes.append(f"warning: TP{space.tensor} is pinned and crosses the {dom}-GPU NVLink domain: its "
                         f"all-reduces run over the RDMA network (priced so, usually much slower); TP groups "
                         f"stay inside a domain unless pinned")
    shapes, rejected = enumerate_shapes(model, gpu, max_gpus, space=space, engine=engine, fleet=fleet,
                                        memory_fn=memory_fn, weight_dtype=wd, kv_dtype=kd,
                                        context_tokens=context)
    loaded = workload.concurrency is not None or workload.request_rate is not None
    # the all-to-all backend the renderer passes (DeepEP is priced with its own tables across domains)
    a2a_kw = {"a2a_backend": space.a2a_backend} if space.a2a_backend else {}
    # DeepEP runs over InfiniBand / RoCE (mlx5, IBGDA), not EFA: with a fleet whose RDMA is EFA only, "auto"
    # keeps the engine's default all-to-all
    fabrics = {getattr(d, "fabric", "") for d in getattr(fleet, "domains", ()) or ()} - {""}
    deepep_fabric = not fabrics or bool(fabrics - {"efa"})
    mtp_kw = _mtp_kw(model, space)
    if mtp_kw:
        a2a_kw["speculative"] = space.speculative
    candidates: list[Candidate] = []
    evaluated = 0
    for shape, max_dp in shapes:
        dps = _dp_values(max_dp, dp, loaded)
        if not dps:
            rejected.append(Rejected(shape, f"dp={dp} replicas need {dp * shape.gpus_per_replica} GPUs; "
                                            f"only {max_dp} replicas fit"))
            continue
        mapping = _effective(shape, engine, model, space) if as_engine_runs else shape
        dom = domain_gpus(gpu)
        if fleet is not None and fleet.domains:
            dom = max(d.total_gpus if d.nvlink else d.gpus_per_node for d in fleet.domains)
        options = a2a_options(model, shape, engine, space, dom, deepep_fabric)
        knob_refusals: list[str] = []
        before = len(candidates)
        for chunk in space.chunk_sizes:
            fit = memory_fn(model, gpu, mapping, weight_dtype=wd, kv_dtype=kd, context_tokens=context,
                            chunk_size=chunk, max_num_seqs=max(space.max_num_seqs), engine=engine,
                            memory_fraction=space.memory_fraction, headroom=space.headroom, **mtp_kw)
            if not fit.fits:
                continue
            cap = max(1, fit.max_concurrency)
            if space.max_num_seqs_pinned:
                seqs = sorted(set(space.max_num_seqs))
            else:
                seqs = sorted({s for s in space.max_num_seqs if s <= cap} | {min(cap, max(space.max_num_seqs))})
            # the batch limit as the engine's flag means it (vLLM: per DP rank); the plan prices what one
            # replica then runs (`engines.engine_knobs`, the mapping the renderer uses too)
            knobs = [engines_mod.engine_knobs(engine, shape, chunk, s) for s in seqs]
            # pairs the engine refuses at startup (vLLM: batched tokens >= batch limit) are never proposed
            refusals = [engines_mod.check_knobs(engine, k.chunk_size, k.max_num_seqs) for k in knobs]
            knob_refusals += [r for r in refusals if r]
            seqs = sorted({k.replica_max_num_seqs for k, r in zip(knobs, refusals) if r is None})
            for n_dp in dps:
                per_replica = _per_replica_workload(workload, n_dp)
                layout = replace(shape, dp=n_dp)
                for a2a, overlap in options:
                    kw = dict(a2a_kw)
                    if a2a:
                        kw["a2a_backend"] = a2a
                    if overlap:
                        kw["batch_overlap"] = True
                    prev_tput = -1.0
                    for s in seqs:
                        pred = predictor(model, gpu, mapping, per_replica, weight_dtype=wd, kv_dtype=kd,
                                         chunk_size=chunk, max_num_seqs=s, engine=engine,
                                         concurrency=None if loaded else s, memory=fit, **kw)
                        evaluated += 1
                        if not loaded and pred.tokens_per_s_per_gpu <= prev_tput:
                            # saturated: a larger batch limit gains no throughput and no per-user speed, so
                            # this point and every larger one are dominated by the previous point
                            break
                        prev_tput = pred.tokens_per_s_per_gpu
                        candidates.append(Candidate(layout, wd, kd, chunk, s, fit, pred, engine, gpu.name,
                                                    a2a, overlap))
                        if max_itl_ms is not None and pred.tpot_ms > max_itl_ms:
                            break
        if knob_refusals and len(candidates) == before:       # every knob pair of this shape was refused
            rejected.append(Rejected(shape, f"engine: {knob_refusals[0]}"))
    return SearchResult(tuple(candidates), tuple(rejected), tuple(replace(s, dp=d) for s, d in shapes), wd, kd,
                        evaluated, tuple(notes))


def _mtp_kw(model: Any, space: SearchSpace) -> dict[str, Any]:
    """`mtp_layers` for the memory fit when speculative decoding is on (only then: injected fakes need not know it)."""
    spec = space.speculative
    if spec is None or getattr(spec, "method", "off") == "off":
        return {}
    from meshplan.planner.perf import speculative_layers

    return {"mtp_layers": speculative_layers(model, spec)}


def _context_refusal(engine: str, context: int) -> str:
    """Why `engine` cannot hold sequences of `context` tokens: the module's MAX_CONTEXT (DeepSpeed-MII 8192)."""
    from meshplan import engines as _engines

    limit = getattr(_engines.MODULES.get(engine), "MAX_CONTEXT", None)
    if limit and context > limit:
        return (f"{_engines.title(engine)} holds at most {limit} tokens per sequence (no option raises it); the "
                f"workload needs {context}: lower spec.workload.maxContext or the token counts, or use another engine")
    return ""


__all__ = ["CHUNK_SIZES", "MAX_NUM_SEQS", "SearchSpace", "SearchResult", "search", "enumerate_shapes",
           "basic_layouts", "shape_rule", "domain_gpus", "a2a_options"]
