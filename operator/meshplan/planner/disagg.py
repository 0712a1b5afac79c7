"""Prefill/decode disaggregation: whether to split serving into prefill and decode workers, and how.

`plan_disagg(...)` is pure and takes the inputs of `planner.plan` plus `mode`:

- `disabled`: the aggregated plan only (`DisaggPlan.disaggregated` False, `choice` None).
- `enabled`: the best disaggregated candidate for the objective and SLO.
- `auto`: the better of the best disaggregated candidate and the aggregated plan's choice, per objective
  (the same ranking as `objectives.choose`: tokens/s/GPU, tokens/s/user, their normalised product over
  both sets' frontiers, or the fewest GPUs), with the reason giving both sides' figures.

Search, per GPU product and budget (as `plan`):

1. Replica shapes: `search.enumerate_shapes` with the engine's rules (`engines.check_layout`, so only layouts
   the engine's renderer runs), the memory rule and the fleet rule; each priced as the engine runs it
   (`search._effective`). Prefill and decode workers take shapes from the same list.
2. Screening (keeps the pairing short without changing the frontier much): prefill shapes on the Pareto
   frontier of (prefill time per request, requests/s per GPU); decode shapes on the frontier of (tokens/s per
   GPU, tokens/s per user) over their batch sweep (powers of two up to the engine's batch default and the KV
   cache). At most `MAX_PREFILL_SHAPES` prefill shapes and `MAX_DECODE_SHAPES_PER_SIZE` decode shapes per worker
   size (GPUs per worker: smaller decode workers leave room for prefill ones), thinned evenly along the frontier.
3. Pairing: every screened prefill x decode shape, P:D worker ratio of `RATIOS`, scaled by the number of
   ratio units k the GPU budget and the fleet's free replica slots of each shape allow (`fill`: the most;
   `minCostWithinSLO`: one unit), and every decode batch; priced by `perf.predict_disagg` with the KV
   transfer over `kv_path`'s tier.
4. KV path (`kv_path`): a unit (the prefill groups and the decode groups of one ratio unit) inside one NVLink
   domain transfers over NVLink; else over the RDMA fabric of one network block; else TCP. With a fleet the
   units must fit the free GPUs of the domains (or blocks); without one, the catalogue's domain size and an
   InfiniBand fabric (what `search` assumes too). All units are priced on the slowest path any needs.

Without a load (no concurrency or request rate) every point is saturated at its decode batch, like the
aggregated sweep; a concurrency is split as given. A request rate is priced at the saturated sweep (noted).
Speculative decoding is not priced in disaggregated serving (noted when on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from meshplan.planner.objectives import OBJECTIVES, meets_slo
from meshplan.planner.pareto import pareto_frontier, thin
from meshplan.planner.search import SearchSpace
from meshplan.planner.types import (SLO, Candidate, DisaggCandidate, DisaggPlan, Engine, KvPath, Layout,
                                    Objective, Plan, Prediction, Workload)

DisaggMode = Literal["auto", "enabled", "disabled"]
MODES: tuple[str, ...] = ("auto", "enabled", "disabled")

# P:D worker ratios tried (prefill workers : decode workers per unit)
RATIOS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (1, 3), (1, 4), (1, 6), (1, 8), (2, 1), (3, 1), (4, 1),
                                       (6, 1), (8, 1), (2, 3), (3, 2), (3, 4), (4, 3))
MAX_PREFILL_SHAPES = 4
MAX_DECODE_SHAPES_PER_SIZE = 2

# TCP between nodes without a shared RDMA fabric: an ASSUMPTION, not a measurement: one 100 GbE front-end port
# (12.5 GB/s) carrying kernel TCP, and 50 µs per message (kernel stack and switch, typical of datacenter TCP
# round trips). NIXL and Mooncake fall back to TCP there; the figure is a planning bound, stated as such.
TCP_GB_S = 12.5
TCP_LATENCY_US = 50.0
TCP_SOURCE = ("assumed: 100 GbE front-end NIC per node (12.5 GB/s) over kernel TCP, 50 µs per message "
              "(planner.disagg.TCP_GB_S; no measurement)")


def kv_path(gpu: Any, prefill: Layout, decode: Layout, units: int, fleet: Any = None, *,
            kv_bytes: float = 0.0, comm_eff: float | None = None) -> KvPath:
    """The tier between a decode group and the prefill groups that feed it (see module doc, step 4).

    `prefill`/`decode`: the per-unit layouts (`dp` = workers per unit); `units`: how many such units run."""
    from meshplan.planner.perf import _params
    from meshplan.planner.search import domain_gpus
    from meshplan.topology import Tier, nvlink_tier, rdma_tier

    eff = _params(None).comm_eff if comm_eff is None else comm_eff   # the fitted figure predict_disagg uses
    unit = prefill.total_gpus + decode.total_gpus
    name = getattr(gpu, "name", str(gpu))
    tier: Tier
    if fleet is None:
        dom = domain_gpus(gpu)
        if unit <= dom:
            tier, why = nvlink_tier(name), (f"each unit ({unit} GPUs) fits one {dom}-GPU NVLink domain "
                                            f"(catalogue, no fleet)")
        else:
            tier, why = rdma_tier("ib", name), (f"a unit ({unit} GPUs) exceeds the {dom}-GPU NVLink domain; no "
                                                f"fleet given: RDMA (InfiniBand) assumed between the nodes")
    else:
        doms = [d for d in fleet.domains if d.gpu == name]
        in_domains = sum(d.free_gpus // unit for d in doms)
        blocks = [b for b in fleet.blocks if b.gpu == name]
        in_blocks = sum(b.free_gpus // unit for b in blocks)
        if in_domains >= units:
            tier = nvlink_tier(name)
            why = f"{units} unit(s) of {unit} GPUs fit the free GPUs of single NVLink domains"
        elif in_blocks >= units and blocks:
            tier = rdma_tier(blocks[0].fabric, name)
            why = (f"{units} unit(s) of {unit} GPUs do not fit single NVLink domains ({in_domains} do); they fit "
                   f"network blocks ({', '.join(b.name for b in blocks[:3])}) over {blocks[0].fabric}")
        else:
            tier = Tier("tcp", TCP_GB_S, TCP_LATENCY_US, TCP_SOURCE)
            why = (f"{units} unit(s) of {unit} GPUs fit neither single NVLink domains ({in_domains}) nor one RDMA "
                   f"network block ({in_blocks}): the KV cache moves over TCP")
    if tier.kind == "tcp" and tier.gb_s <= 0:
        tier = Tier("tcp", TCP_GB_S, TCP_LATENCY_US, TCP_SOURCE)
    if tier.gb_s <= 0:      # a GPU passed as a spec, not in the catalogue: the same figures from the spec itself
        nv = tier.kind in ("nvlink", "pcie") and getattr(gpu, "nvlink_domain", 1) > 1
        tier = Tier(tier.kind, gpu.nvlink_uni_gb_s if nv else gpu.nic_gb_s, tier.latency_us,
                    f"{name}: {'NVLink' if nv else 'NIC'} bandwidth of the given GPU spec; latency as {tier.source}")
    ms = (kv_bytes / (tier.gb_s * 1e9 * eff) * 1e3 if kv_bytes else 0.0) + tier.latency_us / 1e3
    return KvPath(tier.kind, tier.gb_s, tier.latency_us, kv_bytes, ms, tier.source, why)


def _rank(objective: str, t_best: float, i_best: float):
    def key(c: Any) -> tuple:
        p, g = c.prediction, _gpus(c)
        t, i = p.tokens_per_s_per_gpu, p.tokens_per_s_per_user
        if objective == "maxThroughput":
            return (t, i, -g)
        if objective == "bestInteractivity":
            return (i, t, -g)
        if objective == "minCostWithinSLO":
            return (-g, t, i)
        return ((t / (t_best or 1.0)) * (i / (i_best or 1.0)), t)
    return key


def _gpus(c: Any) -> int:
    return c.total_gpus if isinstance(c, DisaggCandidate) else c.layout.total_gpus


def _best(pool: Sequence[Any], objective: str) -> tuple[Any | None, list[Any]]:
    """The best of `pool` for `objective` and the ranked rest (balanced: on the pool's frontier)."""
    if not pool:
        return None, []
    ranked_pool = pareto_frontier(pool) if objective == "balanced" else pool
    t_best = max(c.prediction.tokens_per_s_per_gpu for c in ranked_pool)
    i_best = max(c.prediction.tokens_per_s_per_user for c in ranked_pool)
    ranked = sorted(ranked_pool, key=_rank(objective, t_best, i_best), reverse=True)
    return ranked[0], ranked[1:]


def _fig(p: Prediction) -> str:
    return (f"{p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at {p.tokens_per_s_per_user:,.1f} tokens/s/user "
            f"(TTFT {p.ttft_ms:,.0f} ms, ITL {p.tpot_ms:,.1f} ms)")


def describe(d: DisaggCandidate) -> str:
    """One line: the roles, their figures, the ratio and the KV path."""
    k = d.kv_path
    return (f"{d.label()} on {d.decode.gpu} ({d.total_gpus} GPUs, P:D {d.ratio}): {_fig(d.prediction)}; prefill "
            f"{d.prefill.layout.label()} TTFT {d.prefill.prediction.ttft_ms:,.0f} ms (prefill "
            f"{d.prefill.prediction.prefill_ms:,.0f} ms), decode {d.decode.layout.label()} batch "
            f"{d.decode.max_num_seqs} ITL {d.decode.prediction.tpot_ms:,.1f} ms; KV {k.bytes_per_request / 2**20:,.1f} "
            f"MiB per request over {k.tier} ({k.gb_s:g} GB/s, {k.latency_us:g} µs): {k.transfer_ms:,.2f} ms")


def _search_gpu(model: Any, g: Any, budget: int, workload: Workload, *, engine: Engine, space: SearchSpace,
                fleet: Any, slo: SLO | None, dp_policy: Any, itl_bound: float | None,
                notes: list[str]) -> tuple[list[DisaggCandidate], int]:
    from meshplan.planner import engines as engines_mod
    from meshplan.planner import memory as mem
    from meshplan.planner import perf
    from meshplan.planner.memory import ReplicaMapping
    from meshplan.planner.search import _effective, enumerate_shapes

    wd, kd = space.weight_dtype, space.kv_dtype
    if wd == "auto" or kd == "auto":
        aw, ak = mem.choose_precision(model, g, accuracy_floor=space.accuracy_floor, engine=engine)
        wd, kd = (aw if wd == "auto" else wd), (ak if kd == "auto" else kd)
    refused = engines_mod.check_precision(engine, model, g, wd, kd)
    if refused:
        notes.append(f"{g.name}: disaggregated: engine: {refused}")
        return [], 0
    isl, osl = max(1, workload.isl), max(1, workload.osl)
    shapes, _ = enumerate_shapes(model, g, budget, space=space, engine=engine, fleet=fleet,
                                 memory_fn=mem.memory_fit, weight_dtype=wd, kv_dtype=kd,
                                 context_tokens=workload.context)
    if not shapes:
        return [], 0
    dchunk, dseqs = perf.engine_defaults(engine, g)
    frac = space.memory_fraction
    kv_bytes = isl * mem.kv_bytes_per_token(model, ReplicaMapping(), kd, include_sliding=True)
    wl = Workload(isl=isl, osl=osl)
    kw = dict(weight_dtype=wd, kv_dtype=kd, engine=engine, memory_fraction=frac)
    evaluated = 0
    info: dict[Layout, tuple[Any, int, Any]] = {}     # shape -> (mapping, max workers, decode memory fit)
    for shape, max_dp in shapes:
        m = _effective(shape, engine, model, space)
        fit = mem.memory_fit(model, g, m, weight_dtype=wd, kv_dtype=kd, context_tokens=isl + osl,
                             chunk_size=dchunk, engine=engine, memory_fraction=frac)
        if fit.fits:
            info[shape] = (m, max_dp, fit)
    if not info:
        return [], 0
    # prefill screening: time per request and requests/s per GPU (independent of the decode partner)
    pre: list[tuple[Layout, float, float]] = []
    for shape, (m, _, _) in info.items():
        p = perf.predict_disagg(model, g, m, m, wl, concurrency=1, **kw)
        evaluated += 1
        pre.append((shape, p.prefill_ms, m.attn_dp / max(p.prefill_ms, 1e-9) / shape.gpus_per_replica))
    pre_front = pareto_frontier(pre, throughput=lambda r: r[2], interactivity=lambda r: -r[1])
    p_shapes = [r[0] for r in thin(pre_front, MAX_PREFILL_SHAPES)]
    # decode screening: the batch sweep per shape (TPOT does not depend on the prefill side)
    probe = info[p_shapes[0]][0]
    dec_pts: list[tuple[Layout, int, float, float]] = []
    batches: dict[Layout, list[int]] = {}
    for shape, (m, _, fit) in info.items():
        cap = max(1, min(dseqs, int(fit.kv_capacity_tokens // (isl + osl))))
        bs = sorted({b for b in (2 ** i for i in range(17)) if b <= cap} | {cap})
        if workload.concurrency is not None:
            bs = [cap]
        ok: list[int] = []
        prev = -1.0
        for b in bs:
            if engines_mod.check_knobs(engine, dchunk, b):
                continue
            p = perf.predict_disagg(model, g, probe, m, wl, concurrency=b, **kw)
            evaluated += 1
            if itl_bound is not None and p.tpot_ms > itl_bound:
                break
            t = min(b, cap) * 1000.0 / p.tpot_ms / shape.gpus_per_replica
            if t <= prev:
                break
            prev = t
            ok.append(b)
            dec_pts.append((shape, b, t, 1000.0 / p.tpot_ms))
        batches[shape] = ok
    if not dec_pts:
        return [], evaluated
    # per decode size (GPUs per worker): the frontier of that size's shapes, so that smaller decode workers,
    # which leave the budget room for prefill workers, are kept next to the largest
    by_size: dict[int, list[tuple[Layout, int, float, float]]] = {}
    for r in dec_pts:
        by_size.setdefault(r[0].gpus_per_replica, []).append(r)
    d_shapes: list[Layout] = []
    for size in sorted(by_size):
        front = pareto_frontier(by_size[size], throughput=lambda r: r[2], interactivity=lambda r: r[3])
        d_shapes += thin(list(dict.fromkeys(r[0] for r in front)), MAX_DECODE_SHAPES_PER_SIZE)
    fill = dp_policy != "min"
    out: list[DisaggCandidate] = []
    for ps in p_shapes:
        pm, p_max, p_fit = info[ps]
        for ds in d_shapes:
            dm, d_max, d_fit = info[ds]
            for rp, rd in RATIOS:
                unit = rp * ps.gpus_per_replica + rd * ds.gpus_per_replica
                k_max = min(budget // unit, p_max // rp, d_max // rd)
                if k_max < 1:
                    continue
                k = k_max if fill else 1
                n_p, n_d = rp * k, rd * k
                path = kv_path(g, replace(ps, dp=rp), replace(ds, dp=rd), k, fleet, kv_bytes=kv_bytes)
                for b in batches[ds]:
                    conc = workload.concurrency if workload.concurrency is not None else b * n_d
                    p = perf.predict_disagg(model, g, pm, dm, wl, concurrency=conc, prefill_workers=n_p,
                                            decode_workers=n_d, kv_gb_s=path.gb_s,
                                            kv_latency_us=path.latency_us, **kw)
                    evaluated += 1
                    gp, gd = n_p * ps.gpus_per_replica, n_d * ds.gpus_per_replica
                    cycle_s = (p.ttft_ms + osl * p.tpot_ms) / 1e3
                    req_s = conc / max(cycle_s, 1e-9)
                    b_run = min(b, max(1, -(-conc // n_d)))
                    pre_pred = Prediction(ttft_ms=p.ttft_ms, tpot_ms=0.0,
                                          tokens_per_s_per_gpu=req_s * isl / gp, tokens_per_s_per_user=0.0,
                                          concurrency=conc, prefill_ms=p.prefill_ms, notes=p.notes,
                                          ttft_p50_ms=p.ttft_p50_ms)
                    dec_pred = Prediction(ttft_ms=0.0, tpot_ms=p.tpot_ms,
                                          tokens_per_s_per_gpu=p.tokens_per_s_per_gpu * (gp + gd) / gd,
                                          tokens_per_s_per_user=p.tokens_per_s_per_user, concurrency=b_run)
                    out.append(DisaggCandidate(
                        Candidate(replace(ps, dp=n_p), wd, kd, dchunk, 1, p_fit, pre_pred, engine, g.name),
                        Candidate(replace(ds, dp=n_d), wd, kd, dchunk, b, d_fit, dec_pred, engine, g.name),
                        p, path))
    return out, evaluated


def plan_disagg(
    model: Any,
    gpus: Sequence[Any] | Any = None,
    *,
    mode: DisaggMode = "auto",
    max_gpus: int | None = None,
    workload: Workload = Workload(),
    slo: SLO | None = None,
    objective: Objective = "balanced",
    engine: Engine = "vllm",
    space: SearchSpace = SearchSpace(),
    fleet: Any = None,
    replicas: int | None = None,
    aggregated: Plan | None = None,
    n_alternatives: int = 3,
) -> DisaggPlan:
    """Disaggregated or aggregated serving for `model` (see module doc); `aggregated` reuses a plan already
    made with the same inputs (else `planner.plan` is called)."""
    from meshplan.catalog.gpus import get_gpu
    from meshplan.planner import DEFAULT_GPU, _itl_bound, default_budget, plan

    if mode not in MODES:
        raise ValueError(f"disaggregation {mode!r} is not one of {', '.join(MODES)} "
                         f"(spec.serving.disaggregation / --disaggregation)")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)} (spec.objective)")
    gpus = DEFAULT_GPU if gpus is None else gpus
    agg = aggregated if aggregated is not None else plan(
        model, gpus, max_gpus=max_gpus, workload=workload, slo=slo, objective=objective, engine=engine,
        space=space, fleet=fleet, replicas=replicas)
    a = agg.choice
    a_text = (f"aggregated {a.layout.label()}" + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else "")
              + f" ({a.layout.total_gpus} GPUs): {_fig(a.prediction)}") if a is not None else "no aggregated choice"
    if mode == "disabled":
        return DisaggPlan("disabled", False, None, agg, objective,
                          f"disaggregation disabled: {a_text}", evaluated=0)
    gpu_list = [gpus] if isinstance(gpus, str) or not isinstance(gpus, Sequence) else list(gpus)
    specs = [get_gpu(x) if isinstance(x, str) else x for x in gpu_list]
    if fleet is not None:
        wanted = {x.name for x in specs}
        specs = [get_gpu(n) for n in fleet.gpus()
                 if n in wanted or n.split("@")[0] in wanted or n.split("@")[0].split("/")[0] in wanted]
    dp_policy = "min" if objective == "minCostWithinSLO" and not replicas else "fill"
    notes: list[str] = []
    if space.speculative is not None:
        notes.append("speculative decoding is not priced for disaggregated serving (aggregated only)")
    if workload.request_rate is not None and workload.concurrency is None:
        notes.append("a request rate is priced as the saturated sweep for disaggregated serving")
    cands: list[DisaggCandidate] = []
    evaluated = 0
    for g in specs:
        sub = fleet.for_gpu(g.name) if fleet is not None else None
        budget = max_gpus
        if sub is not None:
            budget = min(budget or sub.free_gpus, sub.free_gpus)
        if budget is None:
            budget = default_budget(model, g)
        if budget < 2:
            continue
        found, n = _search_gpu(model, g, budget, workload, engine=engine, space=space, fleet=sub, slo=slo,
                               dp_policy=dp_policy, itl_bound=_itl_bound(slo), notes=notes)
        cands.extend(found)
        evaluated += n
    eligible = [c for c in cands if meets_slo(c.prediction, slo)]
    best, rest = _best(eligible, objective)
    alts: list[DisaggCandidate] = []
    seen = {(best.prefill.layout.tp, best.prefill.layout.ep, best.prefill.layout.pp, best.decode.layout.tp,
             best.decode.layout.ep, best.decode.layout.pp)} if best is not None else set()
    for c in rest:
        key = (c.prefill.layout.tp, c.prefill.layout.ep, c.prefill.layout.pp, c.decode.layout.tp,
               c.decode.layout.ep, c.decode.layout.pp)
        if key not in seen and len(alts) < n_alternatives:
            seen.add(key)
            alts.append(c)
    extra: dict[str, Any] = {"notes": notes, "candidates": len(cands)}
    if best is None:
        why = ("no disaggregated candidate meets the SLO" if cands else "no disaggregated layout pair fits the budget")
        why += f" ({len(cands):,} priced)"
        reason = (f"{why}; " + (f"disaggregation enabled but nothing to run; {a_text}" if mode == "enabled"
                                else f"aggregated: {a_text}"))
        return DisaggPlan(mode, False, None, agg, objective, reason, (), evaluated, 0, extra)
    d_text = f"disaggregated {describe(best)}"
    gain = ""
    if a is not None:
        pa, pd = a.prediction, best.prediction
        gain = (f"{pd.tokens_per_s_per_gpu / max(pa.tokens_per_s_per_gpu, 1e-9):.2f}x the tokens/s/GPU and "
                f"{pd.tokens_per_s_per_user / max(pa.tokens_per_s_per_user, 1e-9):.2f}x the tokens/s/user of "
                f"aggregated")
        extra["gain_tokens_per_s_per_gpu"] = pd.tokens_per_s_per_gpu / max(pa.tokens_per_s_per_gpu, 1e-9)
        extra["gain_tokens_per_s_per_user"] = pd.tokens_per_s_per_user / max(pa.tokens_per_s_per_user, 1e-9)
    if mode == "enabled":
        reason = f"disaggregation enabled ({objective}): {d_text}; " + (f"{gain}: {a_text}" if a else a_text)
        return DisaggPlan(mode, True, best, agg, objective, reason, tuple(alts), evaluated, len(eligible), extra)
    # auto: compare per objective, both sides normalised by the better of the two frontiers (balanced)
    if a is None:
        reason = f"auto ({objective}): {d_text}; no aggregated layout meets the SLO ({agg.reason})"
        return DisaggPlan(mode, True, best, agg, objective, reason, tuple(alts), evaluated, len(eligible), extra)
    # one ranking over both sets (balanced: on their joint frontier, normalised by its best values); the
    # aggregated side is its plan's frontier and choice, the disaggregated side every eligible candidate
    union = list(pareto_frontier(eligible)) + list(agg.frontier) + [a]
    top, _ = _best(union, objective)
    wins = isinstance(top, DisaggCandidate)
    if wins:
        best = top
        d_text = f"disaggregated {describe(best)}"
        pa, pd = a.prediction, best.prediction
        extra["gain_tokens_per_s_per_gpu"] = pd.tokens_per_s_per_gpu / max(pa.tokens_per_s_per_gpu, 1e-9)
        extra["gain_tokens_per_s_per_user"] = pd.tokens_per_s_per_user / max(pa.tokens_per_s_per_user, 1e-9)
        gain = (f"{extra['gain_tokens_per_s_per_gpu']:.2f}x the tokens/s/GPU and "
                f"{extra['gain_tokens_per_s_per_user']:.2f}x the tokens/s/user of aggregated")
    measure = {"maxThroughput": "more tokens/s/GPU", "bestInteractivity": "more tokens/s/user",
               "minCostWithinSLO": "fewer GPUs (then more tokens/s/GPU)",
               "balanced": "a larger product of normalised tokens/s/GPU and tokens/s/user"}[objective]
    if wins:
        reason = f"auto ({objective}): {d_text} has {measure} than {a_text}: {gain}"
    else:
        reason = (f"auto ({objective}): {a_text} has {measure} than the best {d_text} "
                  f"({gain}): aggregated kept")
    return DisaggPlan(mode, wins, best, agg, objective, reason, tuple(alts), evaluated, len(eligible), extra)


def disagg_plan_for_spec(spec: Any, fleet: Any = None, *, mode: DisaggMode = "auto",
                         aggregated: Plan | None = None, cross_domain: str | None = None,
                         **overrides: Any) -> DisaggPlan:
    """`plan_disagg` for an `LLMDeploymentSpec` (the inputs `planner.plan_for_spec` takes)."""
    from meshplan.planner import DEFAULT_GPU, plan_for_spec, plan_inputs_from_spec

    agg = aggregated if aggregated is not None else plan_for_spec(spec, fleet, cross_domain=cross_domain,
                                                                  **overrides)
    kw = plan_inputs_from_spec(spec)
    if cross_domain is not None:
        kw["space"] = replace(kw["space"], cross_domain=cross_domain)
    if kw["gpus"] is None:
        kw["gpus"] = list(fleet.gpus()) if fleet is not None and fleet.gpus() else [DEFAULT_GPU]
    kw.update(overrides)
    return plan_disagg(mode=mode, fleet=fleet, aggregated=agg, **kw)


def kv_path_to_dict(k: KvPath) -> dict[str, Any]:
    return {"tier": k.tier, "gb_s": k.gb_s, "latency_us": k.latency_us,
            "bytes_per_request": round(k.bytes_per_request), "transfer_ms": round(k.transfer_ms, 3),
            "source": k.source, "why": k.why}


def disagg_candidate_to_dict(d: DisaggCandidate) -> dict[str, Any]:
    from meshplan.planner import candidate_to_dict

    p = d.prediction
    return {"label": d.label(), "gpu": d.decode.gpu, "gpus": d.total_gpus, "ratio": d.ratio,
            "prefill_workers": d.prefill_workers, "decode_workers": d.decode_workers,
            "prefill": {**candidate_to_dict(d.prefill), "role_ttft_ms": round(d.prefill.prediction.ttft_ms, 2)},
            "decode": {**candidate_to_dict(d.decode), "role_itl_ms": round(d.decode.prediction.tpot_ms, 3)},
            "ttft_ms": round(p.ttft_ms, 2), "ttft_p50_ms": round(p.ttft_p50_ms, 2), "itl_ms": round(p.tpot_ms, 3),
            "tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu, 2),
            "tokens_per_s_per_user": round(p.tokens_per_s_per_user, 2),
            "kv_path": kv_path_to_dict(d.kv_path)}


def disagg_plan_to_dict(d: DisaggPlan) -> dict[str, Any]:
    """A `DisaggPlan` as plain data (`meshplan plan --disaggregation ... -o json`)."""
    a = d.aggregated.choice
    return {
        "mode": d.mode, "disaggregated": d.disaggregated, "label": d.label(), "objective": d.objective,
        "reason": d.reason,
        "choice": disagg_candidate_to_dict(d.choice) if d.choice is not None else None,
        "alternatives": [disagg_candidate_to_dict(c) for c in d.alternatives],
        "aggregated": None if a is None else {
            "label": a.layout.label() + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else ""), "gpu": a.gpu,
            "gpus": a.layout.total_gpus, "ttft_ms": round(a.prediction.ttft_ms, 2),
            "itl_ms": round(a.prediction.tpot_ms, 3),
            "tokens_per_s_per_gpu": round(a.prediction.tokens_per_s_per_gpu, 2),
            "tokens_per_s_per_user": round(a.prediction.tokens_per_s_per_user, 2)},
        "gain_tokens_per_s_per_gpu": d.extra.get("gain_tokens_per_s_per_gpu"),
        "gain_tokens_per_s_per_user": d.extra.get("gain_tokens_per_s_per_user"),
        "evaluated": d.evaluated, "eligible": d.eligible, "notes": list(d.extra.get("notes", [])),
    }


__all__ = ["MODES", "RATIOS", "plan_disagg", "disagg_plan_for_spec", "kv_path", "describe",
           "disagg_plan_to_dict", "disagg_candidate_to_dict", "TCP_GB_S", "TCP_LATENCY_US"]
