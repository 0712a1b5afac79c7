"""Performance model: TTFT, TPOT and throughput of one replica, from physics plus a few
calibrated global efficiencies.

Algorithm (facts in ../shared/docs/planner.md, "Time" and "Communication"):

1. One engine ITERATION on one pipeline stage processes, per attention rank, `d`
   decode tokens (one per running sequence) and `p` prefill tokens. Its time is
   the sum over the stage's layers of
   - attention projections, dense FFN, shared experts, LM head: roofline
     `max(flops / (peak * gemm_eff), weight_bytes / (hbm * mem_eff))`;
   - attention core: decode reads each sequence's KV cache (sliding-window layers
     at most `window` tokens), prefill is compute (causal, half the square);
   - routed experts: all attention ranks' tokens meet in the EP group; an EP rank
     reads only the DISTINCT experts the step touches, `E/ep * (1 - (1 - k/E)^T)`,
     and computes `T * k / ep` token-experts: the reads at `moe_eff` x
     `mem_eff` of HBM bandwidth, the grouped GEMMs at `moe_gemm_eff` x
     `gemm_eff` of peak (many small GEMMs: an op kind of its own, fitted on
     TTFT since prefill is where experts compute);
   - communication: TP all-reduce (ring, 2 per layer), EP dispatch + combine
     (all-to-all, whose latency also grows with the peers it signals,
     `a2a_peer_us` per EP rank), each over NVLink while the group fits the NVLink domain; beyond
     it an all-to-all sends the share of traffic that leaves the domain through
     each GPU's own NIC, while an all-reduce's rings spread over all the domain's
     NICs (`_allreduce_bw`); each with a per-collective latency. With a DeepEP
     all-to-all backend (`a2a_backend` "deepep*", what SGLang's `--moe-a2a-backend
     deepep` and vLLM's `--all2all-backend deepep_*` run) an EP group that crosses
     the NVLink domain is priced with DeepEP's published bandwidths instead
     (`deepep_a2a_s`);
   - a fixed `layer_us` per layer (kernel launches that CUDA graphs do not hide),
   plus `iter_ms` per iteration (scheduler, sampling).
2. DECODE (TPOT): at concurrency B the engine runs `B_run = min(B, max_num_seqs,
   KV capacity, token budget)` sequences (the token budget: a chunk of C tokens
   per iteration sustains at most C * OSL / (ISL + OSL) decoding sequences per
   rank, since each iteration must also carry their successors' prefill). In steady state each finished request is replaced,
   so on average an iteration also carries `B_run * ISL / OSL` prefill tokens
   (capped by the chunk budget): other requests' prefill lands in decode steps
   and lengthens TPOT (only where other requests run: a lone request decodes
   in decode-only steps). They land as whole prompts (or chunks of one): a share
   of the iterations carries `min(chunk - decodes, ISL)` prefill tokens, the rest are
   decode-only, and TPOT is the mean (spreading them evenly would let a dense,
   memory-bound step absorb them free and make a sparse MoE step touch many
   more experts than any real step does). With PP the sequences split into `min(PP, B)` microbatches
   that rotate through the stages: a token crosses all stages (TPOT = sum of
   stage times + PP hops), throughput is B tokens per TPOT.
3. PREFILL (TTFT) has three parts:
   - its own chunks: `ISL / chunk_free` iterations, each carrying the chunk plus
     the running decodes (chunk_free = chunk budget minus decode tokens);
   - the arrival WAVE: a closed-loop benchmark releases requests together, so a
     request waits for a share of the others' prefill tokens in its wave, set by
     the scheduler's admission policy (`wave` whole-request admission as in
     TensorRT-LLM, `wave_prefill_first` SGLang, `wave_budget_first` vLLM V1);
   - ADMISSION: when B exceeds the batch slots or the KV cache, the excess waits
     for running requests to finish (Little's law for a closed loop):
     `wait = service_time * (B / B_run - 1)`, service = prefill + OSL * TPOT.
4. Outputs per replica: tokens/s/user = 1000 / TPOT, tokens/s/GPU = B_run *
   1000 / TPOT / GPUs.

`ReplicaMapping` (in `memory`) is the richer mapping the calibration data
needs (attention TP x attention DP, MoE-TP x EP, PP); a `types.Layout` maps to
it as attention TP = MoE-TP = tp, attention DP = EP = ep.

Speed: per-(model, GPU, dtype) constants are cached; one `predict` costs a
handful of iteration evaluations of ~20 arithmetic terms each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.catalog.gpus import GpuSpec
from meshplan.catalog.models import ModelArch
from meshplan.planner import memory as mem
from meshplan.planner.memory import ReplicaMapping, as_mapping
from meshplan.planner.types import Layout, MemoryFit, Prediction, Speculative, Workload


@dataclass(frozen=True)
class PerfParams:
    """Global physical efficiencies, fitted by `meshplan.planner.calibration`."""

    gemm_eff: float = 0.6        # share of dense tensor peak reached by GEMMs
    mem_eff: float = 0.8         # share of HBM bandwidth reached streaming weights
    attn_eff: float = 0.6        # share of HBM bandwidth reached reading the KV cache
    moe_eff: float = 0.7         # share of the weight-streaming rate reached reading routed experts (x mem_eff),
                                 # and of the GEMM rate by their grouped GEMMs unless moe_gemm_eff is set
    moe_gemm_eff: float = 0.0    # share of the dense GEMM rate reached by routed experts' grouped GEMMs
                                 # (x gemm_eff); 0: the same as moe_eff
    layer_us: float = 15.0       # fixed cost per layer per iteration (µs)
    iter_ms: float = 3.0         # fixed cost per iteration (ms)
    comm_eff: float = 0.7        # share of link bandwidth reached by collectives
    comm_us: float = 10.0        # latency per collective inside the NVLink domain (µs)
    nic_us: float = 40.0         # latency per collective that crosses the NIC (µs)
    ttft_base_ms: float = 0.0    # per-request fixed cost before the first token (HTTP, tokenise); not
                                 # fitted: leave-one-model-out preferred waits in engine iterations
    ttft_iters: float = 2.0      # engine iterations a request waits around its prefill (arrival mid-step,
                                 # overlap scheduler, first sampled token)
    wave: float = 0.1            # share of the arrival wave's prefill a request waits for (mixed batches)
    wave_prefill_first: float = 0.5  # the same for prefill-first schedulers (SGLang's default)
    wave_budget_first: float = 0.1   # the same for vLLM V1 (fills each step's token budget with waiting prefills)
    interference: float = 1.0    # share of others' prefill tokens that lands in decode iterations
    a2a_peer_us: float = 0.5     # all-to-all latency added per peer EP rank (µs), on top of comm_us / nic_us:
                                 # a dispatch or combine signals every peer. DeepEP's published low-latency
                                 # kernels (README table, H800 + CX7, 128 tokens) grow ~1.7 µs per added peer
                                 # in dispatch (77 µs at EP8, 173 µs at EP64) and ~3.6 µs in combine
                                 # (114 -> 314 µs)
    ttft_p50_base_ms: float = 0.0  # steady-state (median) TTFT: fixed per-request cost (HTTP, tokenise, detokenise,
                                   # first streamed chunk) ...
    ttft_p50_iters: float = 0.0    # ... plus these engine steps, plus the request's own prefill (`_core`); the
                                   # committed values are calibration.TTFT_P50 (fitted on measured medians)
    family_layer_us: tuple = ()  # ((GPU family, us), ...): a per-layer serving overhead added to layer_us on GPUs
                                 # of a family the calibration set has no measurement of (`for_gpu`); the
                                 # committed values are calibration.FAMILY_LAYER_US

    def with_values(self, **kw) -> "PerfParams":
        return PerfParams(**{**self.__dict__, **kw})


# ---- engine defaults ------------------------------------------------------------------

# Schedulers that run new requests' prefill as separate batches ahead of decode
# (SGLang without --enable-mixed-chunk) rather than mixing chunks into decode
# iterations (vLLM V1, TensorRT-LLM): a request arriving with others waits for
# more of their prefill.
PREFILL_FIRST_ENGINES = frozenset({"sglang"})
# vLLM V1 schedules running decodes, then fills the rest of the step's token
# budget with waiting requests' prefill chunks; TensorRT-LLM (default capacity
# scheduler, overlap scheduler) admits whole requests and adds a step of delay.
BUDGET_FIRST_ENGINES = frozenset({"vllm"})


def _priced_as(engine: str) -> str:
    """NIM and DeepSpeed-MII are priced as vLLM (their modules' PRICED_AS say why)."""
    from meshplan.engines import priced_as   # lazy: the engine modules import meshplan.planner

    return priced_as(engine)


def _in_step(q: "PerfParams", workload: Workload) -> "PerfParams":
    """`q` with a wave share of 1 for every scheduler when the workload's requests are in step
    (`Workload.synchronized`): each request of a round waits for all of the round's prompts on its rank."""
    if workload.synchronized:
        return q.with_values(wave=1.0, wave_prefill_first=1.0, wave_budget_first=1.0)
    return q


def _wave(q: "PerfParams", engine: str) -> float:
    engine = _priced_as(engine)
    if engine in PREFILL_FIRST_ENGINES:
        return q.wave_prefill_first
    if engine in BUDGET_FIRST_ENGINES:
        return q.wave_budget_first
    return q.wave

def engine_defaults(engine: str, gpu: GpuSpec) -> tuple[int, int]:
    """(chunk_size = max tokens per iteration, max_num_seqs) an engine uses when not told.

    vLLM V1 OpenAI server on >= 70 GiB GPUs: max_num_batched_tokens 8192,
    max_num_seqs 1024 (else 2048 / 256) — vllm/engine/arg_utils.py defaults.
    SGLang: chunked_prefill_size 8192 (16384 on > 160 GB GPUs), running requests
    bounded by the KV cache — sglang/srt/server_args.py. TensorRT-LLM
    trtllm-serve: max_num_tokens 8192, max_batch_size 2048. NIM and DeepSpeed-MII: as vLLM (`_priced_as`).
    """
    engine = _priced_as(engine)
    if engine == "trtllm":
        return 8192, 2048
    if engine == "sglang":
        return (16384 if gpu.memory_gib > 160 else 8192), 4096
    return (8192, 1024) if gpu.memory_gib >= 70 else (2048, 256)


# ---- cached per-(model, gpu, mapping, dtype) constants --------------------------------

@dataclass(frozen=True)
class _Stage:
    """Per-layer work of one GPU, reduced to coefficients (bytes and flops per token)."""

    n_layers: float              # layers per stage
    n_moe: float                 # MoE layers per stage
    n_dense_ffn: float           # dense-FFN layers per stage
    n_full_attn: float           # full-attention layers per stage
    n_sw_attn: float             # sliding-window layers per stage
    window: int
    # per layer, per GPU
    attn_w_bytes: float
    attn_flops_tok: float        # projections, per token
    dense_w_bytes: float
    dense_flops_tok: float
    shared_w_bytes: float
    shared_flops_tok: float
    expert_w_bytes: float        # one expert slice on one GPU
    experts_per_rank: float
    kv_bytes_tok_layer: float    # KV bytes per context token per layer per GPU
    attn_core_flops_ctx: float   # decode attention flops per (token x context token) per layer per GPU
    prefill_attn_flops: float    # prefill attention flops per (token x context token) per layer per GPU
    lm_w_bytes: float
    lm_flops_tok: float
    peak_gemm: float             # FLOP/s for weight GEMMs
    peak_attn: float             # FLOP/s for attention (bf16)
    hbm: float                   # bytes/s
    tp_bw: float                 # bytes/s one direction for TP all-reduce
    ep_bw: float                 # effective bytes/s for EP all-to-all
    tp_cross: bool               # TP group crosses the NVLink domain
    ep_cross: bool               # EP group crosses the NVLink domain
    pp_bw: float                 # bytes/s between stages
    act_bytes: float             # bytes per activation element on the wire (bf16)
    dispatch_bytes: float        # bytes per element for EP dispatch
    deepep: bool = False         # the all-to-all runs DeepEP's kernels (priced by `deepep_a2a_s` across domains)
    nic_gb_s: float = 0.0        # the GPU's NIC, one direction (GB/s)
    deepep_mode: str = ""        # DeepEP kernels pinned: "normal" | "low-latency"; "": by tokens per rank (auto)
    overlap: bool = False        # dual-batch (vLLM DBO) / two-batch (SGLang TBO) overlap of the all-to-all


# DeepEP V1 published kernel bandwidths (github.com/deepseek-ai/DeepEP docs/legacy.md "Performance"; H800
# with one ConnectX-7 400 Gb/s InfiniBand NIC per GPU, ~50 GB/s; FP8 dispatch, BF16 combine, 7168 hidden,
# top-8). Bottleneck RDMA bandwidth per GPU in GB/s, by EP size. Normal kernels (NVLink + RDMA forwarding),
# measured at 4096 tokens per batch: dispatch / combine. Low-latency kernels (pure RDMA), measured at 128
# tokens per batch: their latency there is the bytes over this bandwidth (EP16 dispatch: 128 x 8 x 7168 B
# / 63 GB/s = 117 µs against the 118 µs published; combine 2 B / 74 GB/s = 198 µs against 195 µs).
DEEPEP_NIC_GB_S = 50.0
DEEPEP_NORMAL_GB_S: dict[int, tuple[float, float]] = {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
DEEPEP_LOW_LATENCY_GB_S: dict[int, tuple[float, float]] = {
    8: (98.0, 127.0), 16: (63.0, 74.0), 32: (48.0, 53.0), 64: (43.0, 46.0), 128: (39.0, 39.0), 256: (39.0, 40.0)}
# DeepEP recommends the low-latency kernels for decoding batches below 256 tokens per rank (legacy.md,
# "num_max_dispatch_tokens_per_rank ... should be less than 256"); larger steps (prefill) use the normal ones.
DEEPEP_LOW_LATENCY_MAX_TOKENS = 256


# Dual-batch overlap splits a step into two micro-batches only above a token count: vLLM 0.32.0
# ParallelConfig.dbo_decode_token_threshold = 32 (decode-only steps) and dbo_prefill_token_threshold = 512
# (steps carrying a prefill), vllm/config/parallel.py; below them the step runs as one batch. SGLang's
# two-batch overlap splits any batch it can (tbo_token_distribution_threshold 0.48 decides how, not
# whether); the planner uses vLLM's thresholds for both (a small batch gains nothing from a split).
DBO_DECODE_TOKEN_THRESHOLD = 32
DBO_PREFILL_TOKEN_THRESHOLD = 512

# The planner's all-to-all names (spec.engine.allToAll) and the engines' spellings that mean DeepEP.
_DEEPEP_NORMAL = ("deepep-normal", "deepep_high_throughput")
_DEEPEP_LOW_LATENCY = ("deepep-low-latency", "deepep_low_latency")


def deepep_mode(a2a_backend: str | None) -> str:
    """"normal" | "low-latency" for a pinned DeepEP kernel family, "" for DeepEP auto or no DeepEP."""
    b = str(a2a_backend or "")
    return "normal" if b in _DEEPEP_NORMAL else "low-latency" if b in _DEEPEP_LOW_LATENCY else ""


def _table_bw(table: dict[int, tuple[float, float]], ep: int) -> tuple[float, float]:
    """The row for `ep`: the published one, else the nearest published EP size (log scale)."""
    if ep in table:
        return table[ep]
    near = min(table, key=lambda k: (abs(math.log2(k) - math.log2(max(ep, 1))), k))
    return table[near]


def deepep_a2a_s(tokens_per_rank: float, k: int, hidden: int, dispatch_bytes: float, combine_bytes: float,
                 ep: int, nic_gb_s: float, mode: str = "") -> tuple[float, str]:
    """Seconds of one MoE layer's dispatch + combine with DeepEP across NVLink domains, and the kernel used.

    Bytes per GPU: its tokens x top-k x hidden x bytes per element (DeepEP's 'logical bandwidth' counts
    every routed copy, local ones included), over the published bandwidth scaled from the 50 GB/s NIC it
    was measured on to this GPU's NIC (`nic_gb_s`). `mode` pins the kernels ("normal": vLLM
    `deepep_high_throughput`, SGLang `--deepep-mode normal`; "low-latency": `deepep_low_latency`,
    `--deepep-mode low_latency`); "" chooses by tokens per rank as SGLang's `--deepep-mode auto` does
    (low-latency for decode batches, normal for prefill)."""
    scale = nic_gb_s / DEEPEP_NIC_GB_S if nic_gb_s > 0 else 1.0
    if mode == "low-latency" or (mode != "normal" and tokens_per_rank <= DEEPEP_LOW_LATENCY_MAX_TOKENS):
        kernel, (bd, bc) = "low-latency", _table_bw(DEEPEP_LOW_LATENCY_GB_S, ep)
    else:
        kernel, (bd, bc) = "normal", _table_bw(DEEPEP_NORMAL_GB_S, ep)
    per = tokens_per_rank * k * hidden
    return per * dispatch_bytes / (bd * scale * 1e9) + per * combine_bytes / (bc * scale * 1e9), kernel


def _link_bw(gpu: GpuSpec, group: int) -> float:
    """Effective one-direction bandwidth (bytes/s) for a collective over `group` GPUs.

    Inside the NVLink domain: NVLink. Beyond it, the share of peers outside the
    domain is reached over the NIC: time adds up per share.
    """
    nv = gpu.nvlink_uni_gb_s * 1e9 if gpu.nvlink_domain > 1 else 0.0
    nic = gpu.nic_gb_s * 1e9
    if group <= 1:
        return nv or nic
    if group <= gpu.nvlink_domain and nv > 0:
        return nv
    inside = (gpu.nvlink_domain - 1) / (group - 1) if nv > 0 else 0.0
    outside = 1.0 - inside
    return 1.0 / ((inside / nv if nv else 0.0) + outside / nic)


def _allreduce_bw(gpu: GpuSpec, group: int) -> float:
    """Effective bandwidth (bytes/s) of a ring all-reduce over `group` GPUs.

    Unlike an all-to-all (each GPU sends its own data to peers in other domains,
    through its own NIC: `_link_bw`), NCCL runs an all-reduce as several rings
    (channels), each splitting a share of the data and crossing every domain
    boundary once, on a different NIC per channel; a domain's NICs therefore carry
    the inter-domain traffic in parallel and the ring runs at the slower of NVLink
    and (GPUs per domain) x NIC. Source: NCCL's multi-channel rings
    (one ring per NIC/GPU pair, NCCL_MIN_NCHANNELS / NCCL_CROSS_NIC in the NCCL
    environment-variable docs); nccl-tests report inter-node all-reduce bus
    bandwidth of the order of the aggregate NIC bandwidth per node, not of one NIC.
    """
    if group <= gpu.nvlink_domain or gpu.nvlink_domain <= 1:
        return _link_bw(gpu, group)
    # the group spans whole domains; every GPU of a domain has its own NIC
    return min(gpu.nvlink_uni_gb_s * 1e9, gpu.nvlink_domain * gpu.nic_gb_s * 1e9)


@lru_cache(maxsize=8192)
def _stage(model: ModelArch, gpu: GpuSpec, m: ReplicaMapping, weight_dtype: str, kv_dtype: str,
           a2a_backend: str | None = None, batch_overlap: bool = False) -> _Stage:
    cd = mem.component_dtypes(model, weight_dtype)   # per component (checkpoint dtypes, config.json)
    wb = mem.WEIGHT_BYTES[cd["dense"]]
    ab = mem.WEIGHT_BYTES[cd["attention"]]
    eb = mem.WEIGHT_BYTES[cd["embed"]]
    sb = mem.WEIGHT_BYTES[cd["shared"]]
    xb = mem.WEIGHT_BYTES[cd["experts"]]
    kvb = mem.KV_BYTES[kv_dtype]
    pp = m.pp
    L = model.num_layers
    tp = m.attn_tp
    h = model.hidden_size
    attn_p = model.attn_params_per_layer
    if model.is_mla:
        heads = model.num_attention_heads / tp
        kv_tok_layer = (model.kv_lora_rank + model.qk_rope_head_dim) * kvb
        # absorbed MLA decode: scores over latent+rope, then values in latent space
        core = 2.0 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        pre = 2.0 * heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        heads = model.num_attention_heads / tp
        kv_heads = math.ceil(model.num_kv_heads / tp)
        kv_tok_layer = 2.0 * kv_heads * model.head_dim * kvb
        core = 4.0 * heads * model.head_dim
        pre = core
    # physical experts per EP rank: EPLB's redundant copies are weights a rank reads too
    experts_per_rank = (model.num_experts + m.redundant_experts) / m.moe_ep if model.is_moe else 0.0
    return _Stage(
        n_layers=L / pp,
        n_moe=model.moe_layers / pp,
        n_dense_ffn=model.dense_layers / pp,
        n_full_attn=model.full_attention_layers / pp,
        n_sw_attn=model.sliding_window_layers / pp,
        window=model.sliding_window,
        attn_w_bytes=attn_p * ab / tp,
        attn_flops_tok=2.0 * attn_p / tp,
        dense_w_bytes=model.dense_ffn_params_per_layer * wb / tp,
        dense_flops_tok=2.0 * model.dense_ffn_params_per_layer / tp,
        shared_w_bytes=model.shared_expert_params_per_layer * sb / tp,
        shared_flops_tok=2.0 * model.shared_expert_params_per_layer / tp,
        expert_w_bytes=model.expert_params * xb / m.moe_tp,
        experts_per_rank=experts_per_rank,
        kv_bytes_tok_layer=kv_tok_layer,
        attn_core_flops_ctx=core,
        prefill_attn_flops=pre,
        lm_w_bytes=model.vocab_size * h * eb / tp,
        lm_flops_tok=2.0 * model.vocab_size * h / tp,
        peak_gemm=gpu.peak_flops(weight_dtype),
        peak_attn=gpu.peak_flops("bf16"),
        hbm=gpu.hbm_tb_s * 1e12,
        tp_bw=_allreduce_bw(gpu, tp),
        ep_bw=_link_bw(gpu, m.moe_tp * m.moe_ep),
        tp_cross=tp > gpu.nvlink_domain,
        ep_cross=m.moe_tp * m.moe_ep > gpu.nvlink_domain,
        pp_bw=_link_bw(gpu, m.gpus_per_stage * 2) if m.gpus_per_stage * 2 > gpu.nvlink_domain else _link_bw(gpu, 2),
        act_bytes=2.0,
        dispatch_bytes=1.0 if weight_dtype in ("fp8", "fp4", "int8") else 2.0,
        deepep=bool(a2a_backend) and str(a2a_backend).startswith("deepep"),
        nic_gb_s=gpu.nic_gb_s,
        deepep_mode=deepep_mode(a2a_backend),
        overlap=bool(batch_overlap) and model.is_moe and m.moe_ep > 1,
    )


def a2a_layer_s(model: ModelArch, st: _Stage, m: ReplicaMapping, q: PerfParams, T: float) -> float:
    """Seconds of one MoE layer's EP dispatch + combine for `T` tokens per attention rank.

    The busiest EP rank receives `eplb_gain(moe_ep, redundant_experts)` of what it receives without EPLB:
    the bytes (DeepEP's table time, the default all-to-all's transfer) scale with it, the fixed
    per-collective latencies do not.

    DeepEP across NVLink domains: its published tables (`deepep_a2a_s`); the normal kernels also pay the
    per-collective latency the default all-to-all does (`nic_us` + `a2a_peer_us` per peer, dispatch and
    combine: they signal every peer and wait on the host for the received counts, and run outside CUDA
    graphs: SGLang 0.5.23 disables them with --deepep-mode normal, arg_groups/moe_hook.py), while the
    low-latency kernels' published figures are their whole latency. Otherwise the all-to-all over the
    EP group's links (NVLink inside a domain, the NIC beyond) with its fitted latencies."""
    k = model.experts_per_token
    tok_gpu = T / m.attn_tp
    bal = eplb_gain(m.moe_ep, m.redundant_experts)
    if st.deepep and st.ep_cross:
        a2a_s, kernel = deepep_a2a_s(tok_gpu, k, model.hidden_size, st.dispatch_bytes, st.act_bytes,
                                     m.moe_tp * m.moe_ep, st.nic_gb_s, st.deepep_mode)
        a2a_s *= bal
        if st.deepep_mode == "normal":
            a2a_s += 2 * (q.nic_us + q.a2a_peer_us * (m.moe_ep - 1)) * 1e-6
        return a2a_s
    a2a = tok_gpu * k * model.hidden_size * (st.dispatch_bytes + st.act_bytes) * (m.moe_ep - 1) / m.moe_ep
    lat = q.nic_us if st.ep_cross else q.comm_us
    return a2a * bal / (st.ep_bw * q.comm_eff) + 2 * (lat + q.a2a_peer_us * (m.moe_ep - 1)) * 1e-6


def overlap_splits(d: float, p: float) -> bool:
    """Whether a step of `d` decode and `p` prefill tokens per rank is split into two micro-batches
    (vLLM's DBO thresholds, `DBO_DECODE_TOKEN_THRESHOLD` / `DBO_PREFILL_TOKEN_THRESHOLD`)."""
    return (d + p) > (DBO_PREFILL_TOKEN_THRESHOLD if p > 0 else DBO_DECODE_TOKEN_THRESHOLD)


def iteration_ms(model: ModelArch, st: _Stage, m: ReplicaMapping, q: PerfParams,
                 d: float, ctx: float, p: float, pctx: float, verify: int = 1) -> float:
    """Time (ms) of one iteration of ONE pipeline stage.

    d: decode tokens per attention rank, ctx: their mean context; p: prefill
    tokens per attention rank, pctx: mean context a prefill token attends to.

    With batch overlap (`st.overlap`: vLLM `--enable-dbo`, SGLang `--enable-two-batch-overlap`) a step
    above the split thresholds runs as two micro-batches of half the tokens whose all-to-all and compute
    interleave: while one micro-batch dispatches or combines, the other computes (vLLM docs design/dbo.md,
    "overlap the sparse all-to-all communication in the MoE layer with the surrounding computation";
    lmsys.org/blog/2025-05-05-large-scale-ep, two-batch overlap). Each micro-batch costs its compute c and
    its all-to-all a at half the tokens; the step costs 2 x max(c, a): the hidden part is min(c, a) per
    micro-batch. The split's price is in c: every micro-batch reads the weights again and pays the
    per-layer fixed cost again, so a memory-bound decode step with a small all-to-all gets slower.

    verify: decode tokens per sequence (speculative decoding verifies k + 1 per step): the attention
    core computes over all d tokens but reads each sequence's KV cache once (d / verify sequences).
    """
    T = d + p
    if T <= 0:
        return q.iter_ms / m.pp
    if st.overlap and st.n_moe and overlap_splits(d, p):
        from dataclasses import replace as _replace

        flat = _replace(st, overlap=False)
        half_ms = iteration_ms(model, flat, m, q, d / 2.0, ctx, p / 2.0, pctx) - q.iter_ms / m.pp
        a = st.n_moe * a2a_layer_s(model, flat, m, q, T / 2.0) * 1e3
        c = max(half_ms - a, 0.0)
        return 2.0 * max(c, a) + q.iter_ms / m.pp
    ge = q.gemm_eff
    me_bw = st.hbm * q.mem_eff
    fl = st.peak_gemm * ge
    # attention projections
    t = st.n_layers * max(T * st.attn_flops_tok / fl, st.attn_w_bytes / me_bw)
    # attention core: decode (KV reads) + prefill (compute)
    kv_bw = st.hbm * q.attn_eff
    fa = st.peak_attn * ge
    if d > 0:
        full = d * ctx
        sw = d * min(ctx, st.window) if st.n_sw_attn else 0.0
        kv_full, kv_sw = (full, sw) if verify == 1 else (full / verify, sw / verify)
        t += st.n_full_attn * max(kv_full * st.kv_bytes_tok_layer / kv_bw, full * st.attn_core_flops_ctx / fa)
        if sw:
            t += st.n_sw_attn * max(kv_sw * st.kv_bytes_tok_layer / kv_bw, sw * st.attn_core_flops_ctx / fa)
    if p > 0:
        t += st.n_full_attn * p * pctx * st.prefill_attn_flops / fa
        if st.n_sw_attn:
            t += st.n_sw_attn * p * min(pctx, st.window) * st.prefill_attn_flops / fa
    # dense FFN layers
    if st.n_dense_ffn:
        t += st.n_dense_ffn * max(T * st.dense_flops_tok / fl, st.dense_w_bytes / me_bw)
    # MoE layers
    if st.n_moe:
        k = model.experts_per_token
        E = model.num_experts
        t_all = T * m.attn_dp                       # tokens meeting in the EP group
        touched = st.experts_per_rank * (1.0 - (1.0 - k / E) ** t_all)
        pairs = t_all * k / m.moe_ep               # token-expert pairs per EP rank
        # EPLB: the busiest EP rank computes (and receives) `bal` of what it does without EPLB (eplb_gain)
        bal = eplb_gain(m.moe_ep, m.redundant_experts)
        t_exp = max(pairs * bal * 2.0 * model.expert_params / m.moe_tp / (fl * (q.moe_gemm_eff or q.moe_eff)),
                    touched * st.expert_w_bytes / (me_bw * q.moe_eff))
        if st.shared_w_bytes:
            t_exp += max(T * st.shared_flops_tok / fl, st.shared_w_bytes / me_bw)
        t += st.n_moe * t_exp
        if m.moe_ep > 1:
            t += st.n_moe * a2a_layer_s(model, st, m, q, T)
    # TP all-reduce: after attention and after FFN
    if m.attn_tp > 1:
        n = m.attn_tp
        size = T * model.hidden_size * st.act_bytes
        lat = q.nic_us if st.tp_cross else q.comm_us
        t += st.n_layers * 2 * (2.0 * size * (n - 1) / n / (st.tp_bw * q.comm_eff) + lat * 1e-6)
    # fixed per-layer cost
    t += st.n_layers * q.layer_us * 1e-6
    # LM head (last stage; charged once per token rotation, spread over stages)
    t += max(d * st.lm_flops_tok / fl, st.lm_w_bytes / me_bw) / m.pp
    return t * 1e3 + q.iter_ms / m.pp


# ---- EPLB: expert load balance across EP ranks ---------------------------------------------------
# Balancedness = mean / max of the MoE work of the EP ranks in one layer (LMSYS blog 2025-05-05 "Deploying
# DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs", section "Expert
# Parallelism Load Balancer": measured as mean over maximum tokens per GPU; "as the number of GPUs (EP size)
# increases, the imbalance issue gets more severe"; "even with EPLB, some imbalance is inevitable").
# Model (meshplan's, anchored on that blog's figures):
#   without EPLB the busiest rank carries I0(n) = 1 + A log2(n) times the mean (n EP ranks);
#   with EPLB and R redundant experts the excess shrinks to I_R = 1 + (I0 - 1) n / (n + R)
#   (one redundant expert per rank, R = n, halves it; more replicas of the hot experts shrink it further).
# A = 0.1 per doubling is the smallest value consistent with the blog's EPLB ablation (1.49x prefill speedup
# at EP32: a speedup of the whole step is at most the busiest rank's excess, so I0(32) >= 1.49); its decode
# figure (2.54x at EP72) asks for more, so this is conservative.
# The calibration rows (AIConfigurator silicon data) record no EPLB, i.e. they ran without it: the fitted
# efficiencies already include I0, so the model scales the busiest rank's routed-expert GEMMs and its
# dispatch/combine bytes by I_R / I0 (`eplb_gain`) and leaves every EPLB-off prediction unchanged. What EPLB
# costs is priced too: each rank reads (experts + R) / n experts' weights (`_stage.experts_per_rank`) and
# holds them (`memory.weight_bytes_per_gpu`).
EPLB_IMBALANCE_PER_DOUBLING = 0.1


def eplb_balance(ep_size: int, redundant: int) -> float:
    """Predicted balancedness (mean / max rank load) of an EP group of `ep_size` ranks with `redundant`
    redundant experts under EPLB (0: no EPLB); 1.0 without expert parallelism."""
    if ep_size <= 1:
        return 1.0
    excess = EPLB_IMBALANCE_PER_DOUBLING * math.log2(ep_size)
    if redundant > 0:
        excess *= ep_size / (ep_size + redundant)
    return 1.0 / (1.0 + excess)


def eplb_gain(ep_size: int, redundant: int) -> float:
    """The busiest EP rank's MoE work with EPLB over the work without it, I_R / I0 (1.0 when redundant is 0)."""
    if redundant <= 0 or ep_size <= 1:
        return 1.0
    return eplb_balance(ep_size, 0) / eplb_balance(ep_size, redundant)


def distinct_experts(num_experts: int, k: int, tokens: float) -> float:
    """Expected distinct experts touched by `tokens` tokens routed top-k of E uniformly."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def with_committed_ttft_p50(q: PerfParams) -> PerfParams:
    """`q` with the steady-state TTFT's committed constants (calibration.TTFT_P50)."""
    from meshplan.planner.calibration import TTFT_P50
    return q.with_values(ttft_p50_base_ms=TTFT_P50["base_ms"], ttft_p50_iters=TTFT_P50["iters"])


@lru_cache(maxsize=1)
def committed_params() -> PerfParams:
    """What the planner predicts with: the calibration fit (`FITTED_PARAMS`), the steady-state TTFT's constants
    (`TTFT_P50`) and the per-family per-layer overheads fitted on the evidence base (`FAMILY_LAYER_US`)."""
    from meshplan.planner.calibration import FAMILY_LAYER_US, FITTED_PARAMS
    return with_committed_ttft_p50(FITTED_PARAMS).with_values(family_layer_us=tuple(sorted(FAMILY_LAYER_US.items())))


def _params(params) -> PerfParams:
    if params is None:
        return committed_params()
    if isinstance(params, dict):
        return PerfParams(**params)
    return params


def for_gpu(q: PerfParams, gpu: GpuSpec) -> PerfParams:
    """`q` with its GPU family's per-layer overhead (`family_layer_us`) added to `layer_us`: the serving stack's
    fixed cost per transformer layer and step on a family the calibration set never measured (kernel launches
    and latency-bound kernels; calibration.FAMILY_LAYER_US says how it was fitted). It grows with the model's
    depth and the pipeline stage's share of it, which a per-step constant does not. Families without one
    (every NVIDIA family: their per-layer cost is in the calibration fit) are priced as fitted."""
    extra = dict(q.family_layer_us).get(gpu.family, 0.0)
    return q.with_values(layer_us=q.layer_us + extra, family_layer_us=()) if extra else q


def predict(
    model: ModelArch,
    gpu: GpuSpec,
    layout: Layout | ReplicaMapping,
    workload: Workload,
    *,
    weight_dtype: str,
    kv_dtype: str,
    chunk_size: int | None = None,
    max_num_seqs: int | None = None,
    engine: str = "vllm",
    concurrency: int | None = None,
    memory: MemoryFit | None = None,
    params: PerfParams | dict | None = None,
    memory_fraction: float = 0.9,
    a2a_backend: str | None = None,
    batch_overlap: bool = False,
    speculative: Speculative | None = None,
) -> Prediction:
    """Per-replica TTFT, TPOT and throughput of `layout` serving `workload`.

    `a2a_backend` (a DeepEP name: `deepep-normal`, `deepep-low-latency`, or an engine's spelling) prices
    an EP group across NVLink domains with DeepEP's kernels; `batch_overlap` prices dual-/two-batch
    overlap (see `iteration_ms`).

    `concurrency` (requests in flight on this replica) defaults to the
    workload's concurrency divided over the layout's DP replicas; with only a
    request rate, Little's law sets it from a first TPOT estimate. `memory`
    (a `MemoryFit`) supplies the KV capacity; it is computed when not given.
    `speculative` (a `types.Speculative`, MTP) prices speculative decoding (`_core`, "speculative") and
    the MTP modules' weights and KV cache in the memory fit.
    """
    q0 = _params(params)
    q = for_gpu(q0, gpu)
    q = _in_step(q, workload)
    m = as_mapping(layout)
    dchunk, dseqs = engine_defaults(engine, gpu)
    chunk = int(chunk_size or dchunk)
    seqs_cap = int(max_num_seqs or dseqs)
    isl = max(1, int(workload.isl))
    osl = max(1, int(workload.osl))
    spec = speculative if speculative is not None and speculative.method != "off" else None
    if memory is None:
        mtp_kw = {"mtp_layers": speculative_layers(model, spec)} if spec is not None else {}
        memory = mem.memory_fit(model, gpu, m, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                context_tokens=workload.context, chunk_size=chunk,
                                max_num_seqs=seqs_cap, engine=engine, memory_fraction=memory_fraction, **mtp_kw)
    st = _stage(model, gpu, m, weight_dtype, kv_dtype, a2a_backend, bool(batch_overlap))
    dp = layout.dp if isinstance(layout, Layout) else 1
    notes: list[str] = []
    if q.layer_us != q0.layer_us:
        notes.append(f"{gpu.family} per-layer serving overhead {q.layer_us - q0.layer_us:.0f} us x {model.num_layers} "
                     "layers a step (a GPU family the calibration set never measured; fitted on the evidence base: "
                     "calibration.FAMILY_LAYER_US)")

    if workload.synchronized:
        notes.append("requests in step (fixed lengths, closed loop): every round arrives at once, each request "
                     "waits for the whole round's prompts on its attention rank")

    if concurrency is None:
        if workload.concurrency is not None:
            concurrency = max(1, math.ceil(workload.concurrency / dp))
        elif workload.request_rate is not None:
            # Little's law with a first guess of the request time at low load
            base = _core(model, st, m, q, isl, osl, 1, chunk, seqs_cap, memory, engine, spec)
            r_time_s = (base[0] + osl * base[1]) / 1e3
            concurrency = max(1, math.ceil(workload.request_rate / dp * r_time_s))
            notes.append(f"concurrency {concurrency} from request rate via Little's law")
        else:
            concurrency = max(1, min(seqs_cap, memory.max_concurrency or 1))
    B = max(1, int(concurrency))
    ttft, tpot, b_run, prefill_ms, ttft_p50 = _core(model, st, m, q, isl, osl, B, chunk, seqs_cap, memory, engine,
                                                    spec, in_step=workload.synchronized)
    if b_run < B:
        notes.append(f"only {b_run} of {B} requests run at once (batch slots / KV cache); the rest queue")
    plain = _core(model, st, m, q, isl, osl, B, chunk, seqs_cap, memory, engine)[1] if spec is not None else 0.0
    if plain > 0:
        e = spec.expected_tokens
        notes.append(f"speculative {spec.method}: {spec.tokens} draft token(s) per step at acceptance rate "
                     f"{spec.acceptance_rate:.2f} ({spec.source or 'spec.engine.speculative'}) = {e:.2f} tokens per "
                     f"step (Leviathan et al. 2023); a step of {tpot * e:.2f} ms verifies {spec.tokens + 1} tokens per "
                     f"sequence and runs the draft: TPOT {tpot:.2f} ms against {plain:.2f} ms without "
                     f"({100 * (tpot / plain - 1):+.0f}% ITL)")
    tps_user = 1000.0 / tpot
    tps_gpu = b_run * tps_user / m.gpus
    return Prediction(ttft_ms=ttft, tpot_ms=tpot, tokens_per_s_per_gpu=tps_gpu,
                      tokens_per_s_per_user=tps_user, concurrency=B, prefill_ms=prefill_ms,
                      notes=tuple(notes), ttft_p50_ms=ttft_p50)


def speculative_layers(model: ModelArch, spec: Speculative | None) -> int:
    """MTP modules the engine loads for `spec` (their weights and KV cache are in the memory fit): the
    checkpoint's (`ModelArch.mtp_layers`); vLLM, SGLang and TensorRT-LLM reuse them for more draft tokens."""
    if spec is None or spec.method != "mtp":
        return 0
    return max(1, int(getattr(model, "mtp_layers", 0) or 0))


def _draft_ms(model: ModelArch, st: _Stage, m: ReplicaMapping, q: PerfParams, d: float, ctx: float,
              spec: Speculative) -> float:
    """Time (ms) the MTP drafts add to one step, on the last pipeline stage: per draft token one pass of an
    MTP module over the stage's `d` sequences per rank: one transformer block (attention + MoE or dense FFN,
    the same shape as a main-model layer: DeepSeek-V3 technical report arXiv:2412.19437 section 2.2), its
    2h x h projection of [hidden; embedding] (bf16, split over attention TP) and the shared output head
    (the full LM head, charged as in `iteration_ms`), without the per-iteration scheduler cost."""
    one = replace(st, n_layers=1.0, n_moe=1.0 if model.is_moe else 0.0, n_dense_ffn=0.0 if model.is_moe else 1.0,
                  n_full_attn=1.0, n_sw_attn=0.0)
    m1 = replace(m, pp=1)
    layer = iteration_ms(model, one, m1, q, d, ctx, 0.0, 0.0) - q.iter_ms
    h = model.hidden_size
    proj_s = max(d * 2.0 * 2 * h * h / m.attn_tp / (st.peak_gemm * q.gemm_eff),
                 2 * h * h * 2.0 / m.attn_tp / (st.hbm * q.mem_eff))
    return spec.tokens * (layer + proj_s * 1e3)


def _core(model, st: _Stage, m: ReplicaMapping, q: PerfParams, isl: int, osl: int, B: int,
          chunk: int, seqs_cap: int, memory: MemoryFit, engine: str = "vllm",
          spec: Speculative | None = None, in_step: bool = False) -> tuple[float, float, int, float, float]:
    """(ttft_ms, tpot_ms, running sequences, no-queue prefill_ms, ttft_p50_ms) at concurrency B.

    Two TTFTs. `ttft_ms` is what a closed-loop benchmark's MEAN measures: the requests released together
    (the arrival wave) queue behind each other's prefill, and `ttft_iters` steps pass around it (fitted on
    the calibration set's mean TTFT). `ttft_p50_ms` is the steady state a request arriving into the running
    batch sees, what the MEDIAN measures: a fixed per-request cost, `ttft_p50_iters` steps, its own prefill
    and its wait for the prefills ahead of it on its rank (`prefill_queue_ms`); no wave (issue 20:
    InferenceX's runs of DeepSeek-R1 measure a median TTFT that stays at 100-130 ms from concurrency 4 to 64
    on MI355X at 1k/1k while the mean grows 150 -> 550 ms and p99 0.5 -> 4 s: the mean is the burst's tail). Both queue the same way when the replica is over its batch or KV
    limit (B > running sequences). With requests in step (`in_step`, `Workload.synchronized`) every round
    is an arrival wave, so the median request waits for its round's prompts as the mean does: the steady
    state there is the wave.

    Speculative decoding (`spec`, k draft tokens at acceptance rate a): every step a running sequence feeds
    k + 1 tokens to the target model (its last token and the k drafts to verify), so a decode step carries
    d * (k + 1) tokens per rank: the GEMMs compute k + 1 times the tokens over the same weight reads, the
    attention core reads each sequence's KV once (`iteration_ms` verify), and more tokens touch more experts;
    the MTP drafts add `_draft_ms`. A step yields E = (1 - a^(k+1)) / (1 - a) tokens per sequence
    (`types.expected_tokens_per_step`), so TPOT = step time / E, requests finish E times faster (their
    successors' prefill lands E times as often) and each running sequence takes k + 1 tokens of the step's
    token budget (vLLM counts the draft tokens in max_num_batched_tokens). With `spec` None every term
    reduces to the plain decode step."""
    # admission: batch slots and KV capacity. Engines admit a request only when its
    # whole context (isl + osl) is guaranteed (TensorRT-LLM GUARANTEED_NO_EVICT) or
    # preempt and recompute when it is not (vLLM, SGLang): either way a replica
    # sustains about capacity / (isl + osl) sequences.
    kv_seqs = B
    if memory.kv_capacity_tokens > 0:
        kv_seqs = max(1, int(memory.kv_capacity_tokens // (isl + osl)))
    elif not memory.fits:
        kv_seqs = 1
    ranks = m.attn_dp
    # token budget: in steady state every iteration must also carry the prefill of the
    # requests that replace finished ones, d * ISL / OSL tokens per rank, so a chunk
    # budget sustains at most d = chunk * OSL / (ISL + OSL) decoding sequences per rank
    # and microbatch; the rest wait for admission like any other excess.
    verify = 1 + (spec.tokens if spec is not None else 0)
    e_tok = spec.expected_tokens if spec is not None else 1.0
    if spec is None:
        budget_seqs = max(1, int(chunk * osl / (isl + osl))) * ranks * max(1, m.pp)
    else:
        budget_seqs = max(1, int(chunk / (verify + e_tok * isl / osl))) * ranks * max(1, m.pp)
    b_run = max(1, min(B, seqs_cap, kv_seqs, budget_seqs))
    micro = min(m.pp, b_run)                        # pipeline microbatches in flight
    d = b_run / ranks / micro                       # decode tokens per rank per stage step
    ctx = isl + osl / 2.0
    # other requests' prefill landing in decode iterations (steady state): d * ISL / OSL
    # tokens per rank per iteration on average, but they arrive as whole prompts (or
    # chunks of one), not spread thinly: a share f of the iterations carries p_one
    # prefill tokens and the rest are decode-only. Spreading them evenly would
    # under-price dense models (a memory-bound step absorbs a few extra tokens for
    # free) and over-price MoE models (a few extra tokens touch many more experts).
    # Only OTHER requests' prompts land in a request's decode steps (its own prefill came
    # before them, its successor's after it), so a lone request (concurrency 1, or one
    # admitted at a time) decodes in decode-only steps (issue 20: a single long-context
    # request was predicted at about twice its measured TPOT). With others running the
    # fitted steady-state rate d * ISL / OSL stands: scaling it by (b_run - 1) / b_run was
    # tried and dropped (leave-one-model-out TPOT 13.7% -> 15.6%, TTFT 33.7% -> 39.5%).
    dv = d * verify                                 # decode tokens per rank per step (k + 1 per sequence)
    room = max(chunk - dv, 0.0)
    others = 0.0 if b_run <= 1 else 1.0
    p_avg = min(room, q.interference * d * others * isl / osl * e_tok)
    p_one = min(room, float(isl))
    pctx = isl / 2.0
    if p_avg <= 0.0 or p_one <= p_avg:
        stage = iteration_ms(model, st, m, q, dv, ctx, p_avg, pctx, verify)
    else:
        f = p_avg / p_one
        stage = ((1.0 - f) * iteration_ms(model, st, m, q, dv, ctx, 0.0, pctx, verify)
                 + f * iteration_ms(model, st, m, q, dv, ctx, p_one, pctx, verify))
    if spec is not None:
        stage += _draft_ms(model, st, m, q, d, ctx, spec)
    hop_ms = 0.0
    if m.pp > 1:
        hop_ms = (dv * model.hidden_size * st.act_bytes / (st.pp_bw * q.comm_eff) + 10e-6) * 1e3
    step = m.pp * (stage + hop_ms)
    tpot = step / e_tok
    # prefill of one request: own chunks plus its share of the arrival wave
    chunk_free = max(chunk - dv, chunk / 4.0)
    per_rank = max(1.0, b_run / ranks)
    wave = _wave(q, engine)
    tokens = isl * (1.0 + wave * (per_rank - 1.0))
    n_iter = max(1.0, tokens / chunk_free)
    p_iter = min(tokens, chunk_free)
    pf_stage = iteration_ms(model, st, m, q, dv, ctx, p_iter, pctx, verify)
    prefill = n_iter * m.pp * (pf_stage + hop_ms)
    p_own = min(isl, chunk_free)
    own_stage = pf_stage if p_own == p_iter else iteration_ms(model, st, m, q, dv, ctx, p_own, pctx, verify)
    own = max(1.0, isl / chunk_free) * m.pp * (own_stage + hop_ms)
    ttft = q.ttft_base_ms + q.ttft_iters * step + prefill
    waited = prefill if in_step else own
    ttft_p50 = q.ttft_p50_base_ms + q.ttft_p50_iters * step + waited
    if not in_step:
        ttft_p50 += prefill_queue_ms(per_rank - 1.0, own, ttft_p50 + osl * tpot)
    if B > b_run:
        service = prefill + osl * tpot
        ttft += service * (B / b_run - 1.0)
        ttft_p50 += (waited + osl * tpot) * (B / b_run - 1.0)
    return ttft, tpot, b_run, own, ttft_p50


def prefill_queue_ms(others: float, service_ms: float, cycle_ms: float) -> float:
    """Steady-state wait of a request for the prefills ahead of it on its attention rank (ms): `others` requests
    run beside it, each coming back for a new prompt once per `cycle_ms` + this wait (a closed loop: TTFT +
    OSL x TPOT), and each prompt keeps the rank busy `service_ms` (its own prefill, `_core`'s `own`). As an
    M/D/1 queue (Pollaczek-Khinchine with deterministic service: wait = rho x S / (2 (1 - rho))), with the
    arrival rate rho / S = others / (cycle + wait) solved with the wait itself, so rho stays below 1:
    wait = ((n S - c) + sqrt((c - n S)^2 + 2 n S^2)) / 2. No constant. Issue 20: InferenceX's median TTFT at
    8k-token prompts grows with concurrency (MI355X SGLang DeepSeek-R1 TP8 FP8: 292 ms at concurrency 4, 488 ms at
    64) where the model without this wait predicted 287 -> 305 ms; at 1k-token prompts the rank is rarely busy
    and the wait is a few ms (docs/evidence.md)."""
    n, s_, c = max(0.0, others), max(0.0, service_ms), max(0.0, cycle_ms)
    if n <= 0.0 or s_ <= 0.0:
        return 0.0
    a = n * s_ - c
    return (a + math.sqrt(a * a + 2.0 * n * s_ * s_)) / 2.0


def predict_disagg(
    model: ModelArch,
    gpu: GpuSpec,
    prefill: Layout | ReplicaMapping,
    decode: Layout | ReplicaMapping,
    workload: Workload,
    *,
    weight_dtype: str,
    kv_dtype: str,
    concurrency: int,
    prefill_workers: int = 1,
    decode_workers: int = 1,
    prefill_batch: int = 1,
    engine: str = "trtllm",
    params: PerfParams | dict | None = None,
    memory_fraction: float = 0.9,
    kv_gb_s: float | None = None,
    kv_latency_us: float = 0.0,
) -> Prediction:
    """Prefill/decode disaggregated serving: `prefill_workers` replicas of `prefill`
    feed `decode_workers` replicas of `decode`; `concurrency` is the total in flight.

    Decode workers run decode-only iterations (no prefill interference). Prefill
    workers batch `prefill_batch` requests per attention rank; requests arrive at
    the closed-loop rate X = concurrency / (TTFT + OSL * TPOT). While X is below
    the prefill capacity, TTFT = base + batch service time x (1 + wave share of
    the other requests released with it per prefill rank) + KV transfer, the same
    wave model as aggregated serving; when prefill is the bottleneck the loop
    slows to its capacity and TTFT = concurrency / capacity - OSL * TPOT.

    The KV cache of each request (ISL tokens of the whole model) moves from the prefill to the decode
    worker over one link: `kv_gb_s` / `kv_latency_us` are the tier of the path between them
    (`meshplan.topology.Tier`: NVLink inside a domain, RDMA inside a network block, TCP beyond;
    `planner.disagg.kv_path` decides which); without them the GPU's NIC (`gpu.nic_gb_s`, no latency),
    as the calibration set's runs (one RDMA fabric) were priced.
    """
    q = for_gpu(_params(params), gpu)
    q = _in_step(q, workload)
    pm, dm = as_mapping(prefill), as_mapping(decode)
    isl, osl = max(1, workload.isl), max(1, workload.osl)
    dchunk, dseqs = engine_defaults(engine, gpu)
    # decode side
    d_mem = mem.memory_fit(model, gpu, dm, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                           context_tokens=isl + osl, chunk_size=dchunk, engine=engine,
                           memory_fraction=memory_fraction)
    if not d_mem.fits:
        raise ValueError(f"decode layout does not fit memory: {d_mem.reason}")
    dst = _stage(model, gpu, dm, weight_dtype, kv_dtype)
    B = max(1, math.ceil(concurrency / max(1, decode_workers)))
    kv_seqs = max(1, int(d_mem.kv_capacity_tokens // (isl + osl)))
    b_run = max(1, min(B, dseqs, kv_seqs))
    micro = min(dm.pp, b_run)
    d = b_run / dm.attn_dp / micro
    hop = 0.0
    if dm.pp > 1:
        hop = (d * model.hidden_size * 2.0 / (dst.pp_bw * q.comm_eff) + 10e-6) * 1e3
    tpot = dm.pp * (iteration_ms(model, dst, dm, q, d, isl + osl / 2.0, 0.0, 0.0) + hop)
    # prefill side
    pst = _stage(model, gpu, pm, weight_dtype, kv_dtype)
    per_rank = max(1, prefill_batch)
    tokens = min(per_rank * isl, max(dchunk, isl))
    per_iter_reqs = tokens / isl
    n_iter = max(1.0, isl / dchunk)
    service_ms = pm.pp * iteration_ms(model, pst, pm, q, 0.0, 0.0, tokens, isl / 2.0) * n_iter
    cap_per_s = prefill_workers * pm.attn_dp * per_iter_reqs / (service_ms / 1e3)
    kv_bytes = isl * mem.kv_bytes_per_token(model, ReplicaMapping(), kv_dtype, include_sliding=True)
    link_gb_s = gpu.nic_gb_s if kv_gb_s is None else kv_gb_s
    xfer_ms = kv_bytes / (link_gb_s * 1e9 * q.comm_eff) * 1e3 + kv_latency_us / 1e3
    cycle_ms = service_ms + xfer_ms + osl * tpot
    x = concurrency / (cycle_ms / 1e3)
    notes = []
    if x < cap_per_s:
        # the arrival wave: requests released together queue at the prefill ranks
        ranks = max(1, prefill_workers * pm.attn_dp)
        wave = _wave(q, engine)
        in_wave = max(0.0, concurrency / ranks / per_iter_reqs - 1.0)
        in_line = service_ms * (1.0 + wave * in_wave)
        ttft = q.ttft_base_ms + q.ttft_iters * tpot + in_line + xfer_ms
        # steady state (`_core`): one request's prefill and its wait for those ahead, no wave; in step, every
        # round's wave
        waited = (in_line if workload.synchronized else
                  pm.pp * iteration_ms(model, pst, pm, q, 0.0, 0.0, float(min(isl, dchunk)), isl / 2.0) * n_iter)
        ttft_p50 = q.ttft_p50_base_ms + q.ttft_p50_iters * tpot + waited + xfer_ms
        if not workload.synchronized:
            # every running request comes back to a prefill rank once per cycle, as in `_core`
            ttft_p50 += prefill_queue_ms(concurrency / ranks - 1.0, waited, ttft_p50 + osl * tpot)
    else:
        ttft = concurrency / cap_per_s * 1e3 - osl * tpot
        ttft_p50 = ttft
        notes.append("prefill workers are the bottleneck")
    if B > b_run:
        ttft += (service_ms + osl * tpot) * (B / b_run - 1.0)
        ttft_p50 += (service_ms + osl * tpot) * (B / b_run - 1.0)
        notes.append(f"decode worker runs {b_run} of {B} requests at once")
    gpus = prefill_workers * pm.gpus + decode_workers * dm.gpus
    tps_user = 1000.0 / tpot
    # the decode workers generate no faster than the prefill workers hand them requests: at most the prefill
    # capacity (requests/s) x OSL output tokens/s (else the running batch is not full)
    tps_total = b_run * decode_workers * tps_user
    if cap_per_s * osl < tps_total:
        tps_total = cap_per_s * osl
        notes.append(f"output tokens/s bounded by the prefill capacity ({cap_per_s:,.2f} requests/s x {osl} tokens)")
    return Prediction(ttft_ms=ttft, tpot_ms=tpot,
                      tokens_per_s_per_gpu=tps_total / gpus,
                      tokens_per_s_per_user=tps_user, concurrency=concurrency,
                      prefill_ms=service_ms, notes=tuple(notes), ttft_p50_ms=ttft_p50)
