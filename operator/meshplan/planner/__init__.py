"""The planner: which TP x EP x PP x DP layout, knobs and dtypes to run, and why.

`plan(...)` is the pure entry point: model + GPUs (+ optional fleet of free
capacity) + workload + SLO + objective -> `types.Plan`. It searches every
candidate GPU product (`search.search`), builds the throughput-vs-
interactivity Pareto frontier over all of them (`pareto`), picks per
objective among the candidates that meet the SLO (`objectives.choose`) and
returns the choice, the reason, the frontier, the next-best alternatives and
every rejected layout with its reason. `plan_for_spec(spec, fleet)` adapts an
`LLMDeployment` spec (meshplan.api.models) to it; the operator and the CLI
both call that.

Defaults when the spec leaves things open (documented in the CRD too):
- GPU products: the fleet's products; with no fleet and no `gpus.products`,
  `DEFAULT_GPU` (H100 SXM: the most widely deployed datacenter GPU).
- GPU budget: `gpus.maxGpus`; else all free GPUs of the fleet; else the
  smallest power of two that is at least one NVLink domain and twice the GPUs
  the weights alone need (room for KV cache).
- Replicas: a manifest that sets `replicas` (without autoscaling) fixes DP;
  otherwise DP fills the budget, except for `minCostWithinSLO`, which takes the
  fewest replicas that meet the SLO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.planner.objectives import OBJECTIVES, choose, meets_slo
from meshplan.planner.pareto import pareto_frontier, thin
from meshplan.planner.search import DpPolicy, SearchSpace, search
from meshplan.planner.types import SLO, Engine, Objective, Plan, Rejected, Workload

DEFAULT_GPU = "h100_sxm"

_FRONTIER_MAX = 200        # frontier points kept in a Plan (thinned evenly beyond that)


def default_budget(model: Any, gpu: Any, weight_dtype: str = "fp8") -> int:
    """The smallest power of two >= one NVLink domain and >= 2x the GPUs the weights need."""
    from meshplan.planner.memory import min_gpus_for_weights
    from meshplan.planner.search import domain_gpus

    need = 2 * min_gpus_for_weights(model, gpu, weight_dtype)
    n = 1
    while n < max(need, domain_gpus(gpu)):
        n *= 2
    return n


def _itl_bound(slo: SLO | None) -> float | None:
    """The tightest inter-token latency the SLO allows (itlMs or 1000 / minTokensPerSecondPerUser)."""
    if slo is None:
        return None
    bounds = [b for b in (slo.itl_ms,) if b is not None]
    if slo.min_tokens_per_s_per_user:
        bounds.append(1000.0 / slo.min_tokens_per_s_per_user)
    return min(bounds) if bounds else None


def plan(
    model: Any,
    gpus: Sequence[Any] | Any = DEFAULT_GPU,
    *,
    max_gpus: int | None = None,
    workload: Workload = Workload(),
    slo: SLO | None = None,
    objective: Objective = "balanced",
    engine: Engine = "vllm",
    space: SearchSpace = SearchSpace(),
    fleet: Any = None,
    replicas: int | None = None,
    predictor: Any = None,
    n_alternatives: int = 3,
    keep_curves: bool = False,
) -> Plan:
    """Plan `model` on the GPU products `gpus` (catalogue names or `GpuSpec`s); see module doc.

    `keep_curves` adds every layout's own frontier to `extra["shape_frontiers"]` (for the plot).
    """
    from meshplan.catalog.gpus import get_gpu

    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)} (spec.objective)")
    gpu_list = [gpus] if isinstance(gpus, str) or not isinstance(gpus, Sequence) else list(gpus)
    specs = [get_gpu(g) if isinstance(g, str) else g for g in gpu_list]
    fleet_notes: list[str] = []
    if fleet is not None:
        # A requested catalogue GPU also matches the variants the nodes' labels made of it
        # (`h100_sxm@40536mib`, `a100_sxm_40gb/mig-1g.5gb`: see catalog.gpus.get_gpu).
        wanted = {g.name for g in specs}
        specs = [get_gpu(n) for n in fleet.gpus()
                 if n in wanted or n.split("@")[0] in wanted or n.split("@")[0].split("/")[0] in wanted]
        fleet_notes = [*fleet.notes, *fleet.unknown]
        if not specs:
            where = f"the fleet {fleet.name}" if getattr(fleet, "name", "") else "the fleet"
            unknown = list(fleet.unknown)
            told = "; ".join(unknown[:3]) + (f" (and {len(unknown) - 3} more nodes)" if len(unknown) > 3 else "")
            if unknown and not fleet.gpus():
                reason = f"no GPU of {where} is in the GPU catalogue: {told}"
            else:
                reason = (f"{where} has no free GPUs of "
                          f"{', '.join(str(getattr(g, 'name', g)) for g in gpu_list)} "
                          f"(free: {', '.join(fleet.gpus()) or 'none'}); change spec.gpus.products or free capacity"
                          + (f"; {told}" if unknown else ""))
            return Plan(None, objective, reason, model=getattr(model, "name", ""), extra={"notes": list(fleet.notes)})
    dp: DpPolicy = replicas if replicas else ("min" if objective == "minCostWithinSLO" else "fill")
    candidates: list = []
    rejected: list[Rejected] = []
    evaluated = 0
    extra: dict[str, Any] = {"per_gpu": {}}
    if fleet_notes:
        extra["notes"] = list(fleet_notes)
    params_warning = model.params_warning() if hasattr(model, "params_warning") else ""
    if params_warning:  # architecture.totalParams disagrees with the dimensions
        extra["warnings"] = [params_warning]
        extra.setdefault("notes", []).append(f"warning: {params_warning}")
    from meshplan import engines as _engines

    priced = getattr(_engines.MODULES.get(engine), "PRICED_AS_REASON", "")
    if priced:   # NIM, DeepSpeed-MII: no calibration of their own (engines.<kind>.PRICED_AS)
        extra.setdefault("warnings", []).append(priced)
        extra.setdefault("notes", []).append(f"warning: {priced}")
    for g in specs:
        sub = fleet.for_gpu(g.name) if fleet is not None else None
        budget = max_gpus
        if sub is not None:
            budget = min(budget or sub.free_gpus, sub.free_gpus)
        if budget is None:
            budget = default_budget(model, g)
            extra.setdefault("notes", []).append(f"no GPU budget given: planned for {budget} x {g.name}")
        if budget < 1:
            continue
        res = search(model, g, budget, workload, engine=engine, space=space, fleet=sub, dp=dp,
                     predictor=predictor, max_itl_ms=_itl_bound(slo))
        candidates.extend(res.candidates)
        rejected.extend(Rejected(r.layout, f"{g.name}: {r.reason}") for r in res.rejected)
        evaluated += res.evaluated
        extra["per_gpu"][g.name] = {"max_gpus": budget, "weight_dtype": res.weight_dtype,
                                    "kv_dtype": res.kv_dtype, "shapes": len(res.shapes),
                                    "candidates": len(res.candidates), "rejected": len(res.rejected),
                                    "notes": list(res.notes)}
        for n in res.notes:  # what the precision rule did with the checkpoint's dtype (plan output)
            if ("checkpoint" in n or n.startswith("warning: TP")) and f"{g.name}: {n}" not in extra.get("notes", []):
                extra.setdefault("notes", []).append(f"{g.name}: {n}")
    chosen = choose(candidates, objective, slo, n_alternatives=n_alternatives)
    # The frontier shown is that of the candidates that meet the SLO (where the choice lies), or of all
    # candidates when nothing meets it.
    eligible = [c for c in candidates if meets_slo(c.prediction, slo)] if slo is not None else candidates
    frontier = pareto_frontier(eligible or candidates)
    reason = chosen.reason
    c = chosen.choice
    if c is not None and space.max_num_seqs_pinned and c.max_num_seqs > c.memory.max_concurrency:
        fixed = getattr(_engines.MODULES.get(engine), "FIXED_KNOBS", None)
        what = (f"{_engines.title(engine)}'s batch limit {c.max_num_seqs} (it has no option for it) is planned"
                if fixed and c.max_num_seqs == fixed[1] else
                f"spec.parallelism.maxNumSeqs {c.max_num_seqs} is pinned and kept")
        kept = (f"{what}, although the KV cache of "
                f"{c.layout.label()} holds {c.memory.max_concurrency:,} sequences of {workload.context:,} tokens "
                f"per replica: the engine queues (or preempts) the rest, and the prediction includes it")
        reason = f"{reason}. {kept}"
        extra.setdefault("notes", []).append(kept)
    if chosen.choice is not None and fleet is not None and fleet.notes_for(chosen.choice.gpu):
        # What the nodes' labels changed about the chosen GPU (memory label, MIG, sharing) is part of the
        # sentence the Planned condition and status.plan.reason show.
        reason += f" (GPU {chosen.choice.gpu} from the node labels: {'; '.join(fleet.notes_for(chosen.choice.gpu))})"
    if not candidates and rejected:
        # the example shown: a wide layout's topology reason when there is one (it says what the cluster
        # lacks, e.g. RDMA between the nodes), else the first rejection
        ex = next((r for r in rejected if "network block" in r.reason or "RDMA" in r.reason), rejected[0])
        reason = (f"every layout was rejected; e.g. {ex.layout.label()}: {ex.reason}")
    a2a_line = _a2a_comparison(candidates, chosen.choice, objective, slo)
    if a2a_line:
        reason = f"{reason}; {a2a_line}"
        extra["all_to_all"] = a2a_line
    spec_note = next((n for n in (c.prediction.notes if c is not None else ()) if n.startswith("speculative ")), "")
    if spec_note:   # expected tokens per step and the TPOT gain (perf.predict), in status.plan.reason
        reason = f"{reason}; {spec_note}"
    if params_warning:  # also in the reason, which the operator writes to status.plan.reason
        reason = f"{reason}; warning: {params_warning}"
    if chosen.choice is not None:
        from meshplan.planner.engines import engine_layout

        e = engine_layout(chosen.choice.layout, engine, model, chunk_size=chosen.choice.chunk_size,
                          max_num_seqs=chosen.choice.max_num_seqs, memory_fraction=space.memory_fraction,
                          kv_dtype=chosen.choice.kv_dtype,
                          a2a_backend=chosen.choice.a2a_backend or space.a2a_backend,
                          batch_overlap=chosen.choice.batch_overlap)
        extra["engine_args"] = e.argv()
        extra["engine_config"] = e.config
        extra["engine_notes"] = list(e.notes)
        eplb = _eplb_summary(chosen.choice, engine, model, space, e.moe_ep)
        if eplb:
            extra["eplb"] = eplb
            extra.setdefault("notes", []).append(eplb["text"])
    extra["eligible"] = chosen.eligible
    extra["slo"] = slo is not None
    topo_line = _topology_comparison(candidates, chosen.choice, objective, slo, fleet, rejected,
                                     {g.name: g for g in specs})
    if topo_line:
        extra["topology"] = topo_line
    if keep_curves:                                   # per-layout curves, for the plot
        extra["shape_frontiers"] = shape_frontiers(candidates)
    return Plan(
        choice=chosen.choice,
        objective=objective,
        reason=reason,
        frontier=thin(frontier, _FRONTIER_MAX),
        alternatives=chosen.alternatives,
        rejected=tuple(rejected),
        evaluated=evaluated,
        gpu=chosen.choice.gpu if chosen.choice is not None else ",".join(g.name for g in specs),
        model=getattr(model, "name", ""),
        extra=extra,
    )


def _eplb_summary(choice: Any, engine: Engine, model: Any, space: SearchSpace, ep_size: int) -> dict[str, Any]:
    """The chosen layout's EPLB as the plan explains it: redundant experts (the engine's rule), their GiB per GPU
    (held in the memory fit) and the predicted balance gain (`perf.eplb_balance`); {} without EPLB."""
    from meshplan.planner.engines import redundant_experts
    from meshplan.planner.perf import eplb_balance

    if not getattr(model, "is_moe", False) or choice.layout.ep <= 1:
        return {}
    r = redundant_experts(engine, choice.layout, model, space.expert_load_balancing)
    if r <= 0:
        return {}
    gib = choice.memory.redundant_expert_bytes / 2**30
    b0, b1 = eplb_balance(ep_size, 0), eplb_balance(ep_size, r)
    text = (f"EPLB (spec.engine.expertLoadBalancing {space.expert_load_balancing}): {r} redundant experts over the "
            f"EP{ep_size} group ({(model.num_experts + r) // ep_size} physical experts per GPU) hold "
            f"{gib:.2f} GiB per GPU, in the memory fit; predicted MoE balance (mean/max rank load) {b0:.2f} -> "
            f"{b1:.2f}: the busiest rank's expert work {1 - b0 / b1:.0%} shorter")
    return {"redundant_experts": r, "ep_size": ep_size, "gib_per_gpu": round(gib, 3),
            "balance_without": round(b0, 3), "balance_with": round(b1, 3), "text": text}


def _domain_gpus_for(gpu_name: str, fleet: Any, specs: dict[str, Any] | None = None) -> int:
    """GPUs of the largest NVLink domain of this GPU: the fleet's, else the GPU spec's (the planned spec
    objects first: a GPU passed as a `GpuSpec` need not be in the catalogue)."""
    from meshplan.catalog.gpus import get_gpu
    from meshplan.planner.search import domain_gpus

    if fleet is not None:
        sizes = [d.total_gpus if d.nvlink else d.gpus_per_node for d in fleet.domains if d.gpu == gpu_name]
        if sizes:
            return max(sizes)
    spec = (specs or {}).get(gpu_name)
    return domain_gpus(spec if spec is not None else get_gpu(gpu_name))


def _topology_comparison(candidates: Sequence[Any], choice: Any, objective: str, slo: Any, fleet: Any,
                         rejected: Sequence[Rejected], specs: dict[str, Any] | None = None) -> str:
    """One sentence: the choice against the best layout inside one NVLink domain and the best wide-EP layout
    (a stage spread over the domains of a network block), with their predicted figures; '' without a choice."""
    if choice is None:
        return ""

    sizes: dict[str, int] = {}

    def wide(c: Any) -> bool:
        if c.gpu not in sizes:
            sizes[c.gpu] = _domain_gpus_for(c.gpu, fleet, specs)
        return c.layout.gpus_per_stage > sizes[c.gpu]

    def fig(c: Any) -> str:
        p = c.prediction
        return (f"{c.layout.label()} x DP{c.layout.dp} on {c.gpu} ({c.layout.total_gpus} GPUs): "
                f"{p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at {p.tokens_per_s_per_user:.1f} tokens/s/user")

    parts = []
    for label, subset in (("inside one NVLink domain", [c for c in candidates if not wide(c)]),
                          ("wide EP across NVLink domains of one RDMA network block",
                           [c for c in candidates if wide(c)])):
        best = choose(subset, objective, slo, n_alternatives=0).choice if subset else None
        if best is None:
            if "wide" in label:
                r = next((r for r in rejected if "network block" in r.reason or "RDMA" in r.reason), None)
            else:
                dom = _domain_gpus_for(choice.gpu, fleet, specs)
                inside = [r for r in rejected if r.layout.gpus_per_replica <= dom]
                r = max(inside, key=lambda r: r.layout.gpus_per_replica) if inside else None
            why = (f" ({r.layout.label()}: {r.reason})" if r and not subset else
                   " (none meets the SLO)" if subset else " (no layout fits)")
            parts.append(f"best {label}: none{why}")
        elif best == choice:
            parts.append(f"chosen {label}: {fig(best)}")
        else:
            parts.append(f"best {label}: {fig(best)}")
    return "; ".join(parts)


def _a2a_label(c: Any) -> str:
    name = c.a2a_backend or "engine default all-to-all"
    return f"{name}{' + batch overlap' if c.batch_overlap else ''}"


def _a2a_comparison(candidates: Sequence[Any], choice: Any, objective: str, slo: Any) -> str:
    """Why the chosen all-to-all / batch overlap: the best candidate of the chosen layout with each other
    priced option (spec.engine.allToAll / batchOverlap auto), with figures; '' when only one was priced."""
    if choice is None:
        return ""
    same = [c for c in candidates if c.layout == choice.layout and c.gpu == choice.gpu]
    options = sorted({(c.a2a_backend, c.batch_overlap) for c in same})
    if len(options) <= 1:
        return ("all-to-all: " + _a2a_label(choice)) if choice.a2a_backend else ""
    parts = []
    for a2a, ov in options:
        if (a2a, ov) == (choice.a2a_backend, choice.batch_overlap):
            continue
        sub = [c for c in same if (c.a2a_backend, c.batch_overlap) == (a2a, ov)]
        best = choose(sub, objective, slo, n_alternatives=0).choice
        if best is None:
            parts.append(f"{_a2a_label(sub[0])}: none meets the SLO")
            continue
        p = best.prediction
        parts.append(f"{_a2a_label(best)}: {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at "
                     f"{p.tokens_per_s_per_user:.1f} tokens/s/user")
    p = choice.prediction
    return (f"all-to-all {_a2a_label(choice)} chosen by the {objective} objective "
            f"({p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at {p.tokens_per_s_per_user:.1f} tokens/s/user) "
            f"over " + "; ".join(parts))


def shape_frontiers(candidates: Sequence[Any]) -> dict[str, list[tuple[float, float]]]:
    """Per layout (`TP4·EP4·PP4 x DP4 @gb200`), its own frontier as (tokens/s/user, tokens/s/GPU)
    points: the curves of the blog's picture."""
    groups: dict[str, list] = {}
    for c in candidates:
        groups.setdefault(layout_name(c), []).append(c)
    return {k: [(c.prediction.tokens_per_s_per_user, c.prediction.tokens_per_s_per_gpu)
                for c in pareto_frontier(v)] for k, v in groups.items()}


def layout_name(c: Any) -> str:
    lay = c.layout
    return lay.label() + (f" x DP{lay.dp}" if lay.dp > 1 else "") + (f" @{c.gpu}" if c.gpu else "")


def candidate_to_dict(c: Any) -> dict[str, Any]:
    """A candidate as plain data (JSON/YAML/status), units in the keys."""
    p = c.prediction
    return {
        "layout": c.layout.label(), "tp": c.layout.tp, "ep": c.layout.ep, "pp": c.layout.pp, "dp": c.layout.dp,
        "gpus_per_replica": c.layout.gpus_per_replica, "total_gpus": c.layout.total_gpus, "gpu": c.gpu,
        "engine": c.engine, "weight_dtype": c.weight_dtype, "kv_dtype": c.kv_dtype,
        "chunk_size": c.chunk_size, "max_num_seqs": c.max_num_seqs,
        "memory_per_gpu_gib": round(c.memory.usable_bytes / 2**30, 2),
        "kv_capacity_tokens": c.memory.kv_capacity_tokens,
        "ttft_ms": round(p.ttft_ms, 2), "ttft_p50_ms": round(p.ttft_p50_ms, 2), "itl_ms": round(p.tpot_ms, 3),
        "tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu, 3),
        "tokens_per_s_per_user": round(p.tokens_per_s_per_user, 3),
        "concurrency_per_replica": p.concurrency, "notes": list(p.notes),
        "all_to_all": c.a2a_backend or "default", "batch_overlap": bool(c.batch_overlap),
    }


def plan_to_dict(p: Plan, *, rejected: bool = True) -> dict[str, Any]:
    """A plan as plain data for `--output json|yaml` and the operator's status."""
    out = {
        "model": p.model, "gpu": p.gpu, "objective": p.objective, "reason": p.reason,
        "choice": candidate_to_dict(p.choice) if p.choice is not None else None,
        "engine_args": p.extra.get("engine_args"), "engine_config": p.extra.get("engine_config"),
        "alternatives": [candidate_to_dict(c) for c in p.alternatives],
        "frontier": [candidate_to_dict(c) for c in p.frontier],
        "evaluated": p.evaluated, "eligible": p.extra.get("eligible"),
        "warnings": list(p.extra.get("warnings", [])),
        "search": p.extra.get("per_gpu"),
        "eplb": {k: v for k, v in p.extra.get("eplb", {}).items() if k != "text"} or None,
    }
    if rejected:
        out["rejected"] = [{"layout": r.layout.label(), "tp": r.layout.tp, "ep": r.layout.ep, "pp": r.layout.pp,
                            "reason": r.reason} for r in p.rejected]
    return out


# --------------------------------------------------------------------------- spec adapter


def model_from_spec(model_spec: Any) -> Any:
    """`spec.model` -> `catalog.models.ModelArch` (catalogue name, or explicit architecture)."""
    from meshplan.catalog.models import from_hf_config, get_model

    arch = model_spec.architecture
    if arch is None:
        try:
            return get_model(model_spec.name)
        except KeyError as exc:
            raise ValueError(f"spec.model.name: {exc.args[0]}") from exc
    # Reuse the Hugging Face config parser: the Architecture fields are named after config.json.
    cfg = {
        "num_hidden_layers": arch.layers, "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.attention_heads, "num_key_value_heads": arch.kv_heads,
        "head_dim": arch.head_dim, "intermediate_size": arch.intermediate_size or arch.moe_intermediate_size,
        "vocab_size": arch.vocab_size, "n_routed_experts": arch.experts,
        "num_experts_per_tok": arch.experts_per_token, "n_shared_experts": arch.shared_experts,
        "moe_intermediate_size": arch.moe_intermediate_size, "first_k_dense_replace": arch.dense_layers,
        "kv_lora_rank": arch.kv_lora_rank, "q_lora_rank": arch.q_lora_rank,
        "qk_rope_head_dim": arch.qk_rope_head_dim, "qk_nope_head_dim": arch.qk_nope_head_dim,
        "v_head_dim": arch.v_head_dim,
    }
    if arch.sliding_window_layers:
        cfg["sliding_window"] = arch.sliding_window
        cfg["layer_types"] = (["sliding_attention"] * arch.sliding_window_layers
                              + ["full_attention"] * (arch.layers - arch.sliding_window_layers))
    base = from_hf_config({k: v for k, v in cfg.items() if v is not None}, model_spec.name,
                          source="spec.model.architecture")
    from dataclasses import replace

    wd = arch.weight_dtype
    return replace(
        base,
        linear_attention_layers=arch.linear_attention_layers or 0,
        linear_key_heads=arch.linear_key_heads or 0,
        linear_value_heads=arch.linear_value_heads or 0,
        linear_key_head_dim=arch.linear_key_head_dim or 0,
        linear_value_head_dim=arch.linear_value_head_dim or 0,
        linear_conv_kernel=(arch.linear_conv_kernel or 4) if arch.linear_attention_layers else 0,
        # the checkpoint's dtypes are known only when the user says them (architecture.weightDtype)
        native_dtype=wd or "bf16",
        expert_dtype=wd or "" if arch.experts else "",
        attention_dtype=arch.attention_dtype or "",
        dense_dtype=arch.dense_dtype or "",
        shared_expert_dtype=arch.shared_expert_dtype or "",
        checkpoint_fixed=wd is not None,
        mtp_layers=int(arch.mtp_layers or 0),
        declared_total_params=float(arch.total_params or 0),
        total_params=0.0, active_params=0.0,  # recomputed with the linear-attention layers
    )


# Default MTP acceptance rate when spec.engine.speculative.acceptanceRate is unset: DeepSeek-V3 technical report
# (arXiv:2412.19437, section 5.4.3 "Multi-Token Prediction Evaluation"): "the acceptance rate of the second token
# prediction ranges between 85% and 90%"; the low end.
MTP_DEFAULT_ACCEPTANCE = 0.85
MTP_DEFAULT_SOURCE = "default: DeepSeek-V3 technical report arXiv:2412.19437 section 5.4.3, 85-90% for the second token"


def speculative_from_spec(engine_spec: Any) -> Any:
    """`spec.engine.speculative` -> `types.Speculative` (None when off), with the acceptance rate's source."""
    from meshplan.planner.types import Speculative

    s = getattr(engine_spec, "speculative", None)
    if s is None or s.method == "off":
        return None
    if s.acceptance_rate is not None:
        return Speculative(s.method, s.tokens, float(s.acceptance_rate), "spec.engine.speculative.acceptanceRate")
    return Speculative(s.method, s.tokens, MTP_DEFAULT_ACCEPTANCE, MTP_DEFAULT_SOURCE)


def plan_inputs_from_spec(spec: Any) -> dict[str, Any]:
    """The keyword arguments of `plan` that an `LLMDeploymentSpec` determines."""
    from meshplan.api.models import pinned

    w, p, pr = spec.workload, spec.parallelism, spec.precision
    slo = None
    if spec.slo is not None:
        slo = SLO(ttft_ms=spec.slo.ttft_ms, itl_ms=spec.slo.itl_ms, percentile=spec.slo.percentile,
                  min_tokens_per_s_per_user=spec.slo.min_tokens_per_second_per_user)
    chunk, seqs = pinned(p.chunk_size), pinned(p.max_num_seqs)
    from meshplan import engines as _engines

    fixed = getattr(_engines.MODULES.get(spec.engine.kind), "FIXED_KNOBS", None)
    if fixed:   # an engine without options for them (DeepSpeed-MII) is planned at the values it runs
        chunk, seqs = chunk or fixed[0], seqs or fixed[1]
    space = SearchSpace(
        tensor=pinned(p.tensor), expert=pinned(p.expert), pipeline=pinned(p.pipeline),
        chunk_sizes=(chunk,) if chunk else SearchSpace().chunk_sizes,
        max_num_seqs=(seqs,) if seqs else SearchSpace().max_num_seqs, max_num_seqs_pinned=bool(seqs),
        weight_dtype=pr.weights, kv_dtype=pr.kv_cache, accuracy_floor=pr.accuracy_floor,
        expert_load_balancing=spec.engine.expert_load_balancing,
        all_to_all=getattr(spec.engine, "all_to_all", "auto"), batch_overlap=getattr(spec.engine, "batch_overlap", "auto"),
        speculative=speculative_from_spec(spec.engine),
    )
    replicas = None
    if "replicas" in spec.model_fields_set and not spec.autoscaling.enabled and spec.replicas > 0:
        replicas = spec.replicas
    return dict(
        model=model_from_spec(spec.model),
        gpus=list(spec.gpus.products) or None,
        max_gpus=spec.gpus.max_gpus,
        workload=Workload(isl=w.input_tokens, osl=w.output_tokens, concurrency=w.concurrency,
                          request_rate=w.request_rate, max_context=w.max_context),
        slo=slo,
        objective=spec.objective,
        engine=spec.engine.kind,
        space=space,
        replicas=replicas,
    )


def plan_for_spec(spec: Any, fleet: Any = None, *, cross_domain: str | None = None, **overrides: Any) -> Plan:
    """Plan an `LLMDeploymentSpec`, restricted to `fleet` (a `meshplan.topology.Topology`) when given.

    GPU products: `spec.gpus.products`, else the fleet's, else `DEFAULT_GPU`.
    `cross_domain` ("auto" | "never", `SearchSpace.cross_domain`; None: the default "auto") decides whether an
    EP stage larger than every NVLink domain may span the domains of one network block.
    """
    from dataclasses import replace

    kw = plan_inputs_from_spec(spec)
    if cross_domain is not None:
        kw["space"] = replace(kw["space"], cross_domain=cross_domain)
    if kw["gpus"] is None:
        kw["gpus"] = list(fleet.gpus()) if fleet is not None and fleet.gpus() else [DEFAULT_GPU]
    else:
        from meshplan.catalog.gpus import get_gpu

        names = []
        for i, product in enumerate(kw["gpus"]):
            try:
                names.append(get_gpu(product).name)
            except KeyError as exc:
                raise ValueError(f"spec.gpus.products[{i}]: {exc.args[0]}") from exc
        kw["gpus"] = names
    kw.update(overrides)
    return plan(fleet=fleet, **kw)


__all__ = ["plan", "plan_for_spec", "plan_to_dict", "candidate_to_dict", "shape_frontiers", "plan_inputs_from_spec", "model_from_spec", "default_budget", "DEFAULT_GPU"]
