"""Per-GPU memory fit of one layout: weights, KV cache, activations, runtime.

The formulas (facts and sources in ../shared/docs/planner.md, "Memory"):

- Weights per GPU of the fullest pipeline stage:
  attention / attention-TP, routed experts / (EP x MoE-TP), shared experts /
  attention-TP, dense FFN / the stage's GPUs, all of it / PP, plus the
  embedding and LM head (vocab-parallel over the stage's GPUs; on the first /
  last stage). With attention DP, engines gather tokens for the dense FFN and
  the LM head and run them tensor-parallel over the whole stage.
  Bytes per parameter: bf16/fp16 2, fp8/int8 1, fp4/int4 0.5 plus block
  scales (NVFP4: one FP8 scale per 16 values = +0.0625 B; INT4 groups of 128
  with an FP16 scale = +0.0156 B). With 4-bit weights, attention and the
  embeddings stay at FP8 / BF16 (what NVFP4 and MXFP4 checkpoints ship).
- KV cache per token per GPU: GQA/MHA `2 * L/PP * ceil(Hkv/TP) * head_dim * B`
  (KV heads replicate once TP > Hkv); MLA `L/PP * (kv_lora_rank + rope_dim) * B`,
  not split by TP. L counts full-attention layers only. Sliding-window layers hold
  at most `window` tokens per sequence and are charged per sequence, not per
  token; linear-attention layers (Qwen3-Next, Qwen3.5) hold a fixed recurrent
  state per sequence (`linear_state_bytes_per_seq`) and no per-token KV.
- Weights of a model read from a config.json: each component at the dtype the
  checkpoint ships it in (`component_dtypes`), scaled to a declared totalParams.
- Activations for one engine step of `chunk_size` tokens:
  `2 * chunk * hidden * c(TP)` with c = 10/6/5/5 (dense), 22/13/10/10 (MoE) at
  TP 1/2/4/8 (AIConfigurator's heuristic).
- Runtime: CUDA context and libraries 3.5 GiB, NCCL buffers 0.4 GiB when the
  replica spans more than one GPU.
- Engine semantics: vLLM `--gpu-memory-utilization` and SGLang
  `--mem-fraction-static` cap everything at a fraction of TOTAL memory;
  TensorRT-LLM's `kv_cache_free_gpu_mem_fraction` takes a fraction of the memory
  still FREE after weights, activations and runtime.
- Headroom: an extra fraction of total memory the planner keeps unused on top
  of the engine's own fraction (the seeds' "20% headroom" is `memory_fraction`
  0.9 plus `headroom` 0.1).

A replica with attention data parallelism (the layout's `ep` groups each run
attention on their own sequences) holds `attn_dp` independent KV caches, so its
token capacity is the per-GPU capacity times `attn_dp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from meshplan.catalog.gpus import GpuSpec
from meshplan.catalog.models import ModelArch
from meshplan.planner.types import Layout, MemoryFit

GIB = 2**30

# bytes per parameter including block-scale overhead
WEIGHT_BYTES: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    "fp4": 0.5 + 1 / 16,    # NVFP4: FP8 scale per 16 values
    "int4": 0.5 + 2 / 128,  # AWQ/GPTQ: FP16 scale per group of 128
}
KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5 + 1 / 16, "int4": 0.5 + 2 / 128}

CUDA_CONTEXT_BYTES = 3.5 * GIB        # CUDA context, cuBLAS/cuDNN workspaces (planner.md "Runtime")
NCCL_BUFFER_BYTES = 0.4 * GIB          # NCCL communicator buffers, 350-400 MB (planner.md)

_ACT_C_DENSE = {1: 10, 2: 6, 4: 5}
_ACT_C_MOE = {1: 22, 2: 13, 4: 10}

# dtype order from most to least precise (the accuracy floor compares positions)
PRECISION_ORDER = ("bf16", "fp8", "fp4", "int4")
# 4-bit float and 4-bit integer weights count as the same precision level for the floor
PRECISION_RANK = {"bf16": 0, "fp16": 0, "fp8": 1, "int8": 1, "fp4": 2, "int4": 2}


@dataclass(frozen=True)
class ReplicaMapping:
    """How one replica's GPUs are used, richer than `Layout` (TensorRT-LLM's spelling).

    `attn_tp * attn_dp * pp` = `moe_tp * moe_ep * pp` = GPUs of the replica.
    From a `Layout`: attention TP = tp, attention DP = ep, MoE-TP = tp, EP = ep.
    """

    attn_tp: int = 1
    attn_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    pp: int = 1
    # EPLB's redundant experts over the EP group (the engine module's `redundant_experts` rule): every EP rank
    # holds (experts + redundant) / moe_ep experts (each split moe_tp ways); 0 without EPLB
    redundant_experts: int = 0

    @classmethod
    def from_layout(cls, layout: Layout) -> "ReplicaMapping":
        return cls(attn_tp=layout.tp, attn_dp=layout.ep, moe_tp=layout.tp, moe_ep=layout.ep, pp=layout.pp)

    @property
    def gpus(self) -> int:
        return max(self.attn_tp * self.attn_dp, self.moe_tp * self.moe_ep) * self.pp

    @property
    def gpus_per_stage(self) -> int:
        return max(self.attn_tp * self.attn_dp, self.moe_tp * self.moe_ep)


def as_mapping(layout) -> ReplicaMapping:
    return layout if isinstance(layout, ReplicaMapping) else ReplicaMapping.from_layout(layout)


def _attn_dtype(weight_dtype: str) -> str:
    """4-bit checkpoints keep attention at 8 bits (NVFP4) or 16 bits (MXFP4); we take 8."""
    return "fp8" if weight_dtype in ("fp4", "int4") else weight_dtype


def _embed_dtype(weight_dtype: str) -> str:
    return "bf16" if weight_dtype in ("fp4", "int4", "fp8", "int8") else weight_dtype


def component_dtypes(model: ModelArch, weight_dtype: str) -> dict[str, str]:
    """Dtype of each weight component (attention, dense, shared, experts, embed) when the plan runs the
    weights at `weight_dtype`.

    At the checkpoint's own dtype of a model read from a config.json (`checkpoint_fixed`), each
    component keeps the dtype the checkpoint ships it in (Kimi-K2.5: INT4 experts, BF16 attention,
    shared experts and dense MLP; gpt-oss: MXFP4 experts, BF16 attention). Otherwise (a catalogue
    entry, or a dtype the engine converts to online) the rule above applies: everything at
    `weight_dtype`, attention at 8 bits under 4-bit weights, embeddings at 16 bits when quantized.
    """
    if model.checkpoint_fixed and weight_dtype == model.native_dtype:
        out = {c: model.component_dtype(c) for c in ("attention", "dense", "shared", "experts")}
    else:
        out = {"attention": _attn_dtype(weight_dtype), "dense": weight_dtype, "shared": weight_dtype,
               "experts": weight_dtype}
    out["embed"] = _embed_dtype(weight_dtype)
    return {k: (v if v in WEIGHT_BYTES else "bf16") for k, v in out.items()}


def weight_bytes_per_gpu(model: ModelArch, layout, weight_dtype: str) -> float:
    """Bytes of weights on the fullest GPU of the replica (scaled to a declared totalParams:
    `ModelArch.weight_scale`)."""
    m = as_mapping(layout)
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_BYTES)}, got {weight_dtype!r}")
    cd = component_dtypes(model, weight_dtype)
    ab, eb = WEIGHT_BYTES[cd["attention"]], WEIGHT_BYTES[cd["embed"]]
    L = model.num_layers
    attn_params = (model.attn_params_per_layer * (L - model.linear_attention_layers)
                   + model.linear_attn_params_per_layer * model.linear_attention_layers)
    # dense FFN layers and the vocabulary tables are tensor-parallel over the whole stage
    # (with attention DP, engines gather the tokens for them: SGLang, TensorRT-LLM)
    stage = m.gpus_per_stage
    dense = model.dense_ffn_params_per_layer * model.dense_layers * WEIGHT_BYTES[cd["dense"]] / stage
    experts = 0.0
    if model.is_moe:
        experts = model.moe_layers * (
            model.expert_params * (model.num_experts + m.redundant_experts) * WEIGHT_BYTES[cd["experts"]]
            / (m.moe_ep * m.moe_tp)
            + model.shared_expert_params_per_layer * WEIGHT_BYTES[cd["shared"]] / m.attn_tp
            + model.hidden_size * model.num_experts * 2.0  # router, bf16, replicated
        )
    body = (attn_params * ab / m.attn_tp + dense + experts) / m.pp
    one_table = model.vocab_size * model.hidden_size * eb / stage
    n_tables = 1 if model.tie_word_embeddings else 2
    emb = one_table * (n_tables if m.pp == 1 else 1)
    return (body + emb) * model.weight_scale


def redundant_expert_bytes_per_gpu(model: ModelArch, layout, weight_dtype: str) -> float:
    """Bytes of EPLB's redundant experts on one GPU of the fullest stage (part of `weight_bytes_per_gpu`):
    redundant x one expert's weights over every MoE layer of the stage / (EP x MoE-TP)."""
    m = as_mapping(layout)
    if not model.is_moe or m.redundant_experts <= 0:
        return 0.0
    xb = WEIGHT_BYTES[component_dtypes(model, weight_dtype)["experts"]]
    return (model.moe_layers * model.expert_params * m.redundant_experts * xb / (m.moe_ep * m.moe_tp) / m.pp
            * model.weight_scale)


def kv_bytes_per_token(model: ModelArch, layout, kv_dtype: str, *, include_sliding: bool = False) -> float:
    """KV bytes per GPU per token of context, over the GPU's layers (full-attention layers only
    unless `include_sliding`)."""
    m = as_mapping(layout)
    b = KV_BYTES[kv_dtype]
    layers = model.full_attention_layers + (model.sliding_window_layers if include_sliding else 0)
    layers_per_gpu = math.ceil(layers / m.pp) if layers else 0
    if model.is_mla:
        return layers_per_gpu * (model.kv_lora_rank + model.qk_rope_head_dim) * b
    heads = math.ceil(model.num_kv_heads / m.attn_tp)
    return 2.0 * layers_per_gpu * heads * model.head_dim * b


def sliding_bytes_per_seq(model: ModelArch, layout, kv_dtype: str) -> float:
    """Fixed KV bytes per sequence per GPU for the sliding-window layers (window tokens each)."""
    if not model.sliding_window_layers:
        return 0.0
    m = as_mapping(layout)
    heads = math.ceil(model.num_kv_heads / m.attn_tp)
    layers = math.ceil(model.sliding_window_layers / m.pp)
    return 2.0 * layers * heads * model.head_dim * KV_BYTES[kv_dtype] * model.sliding_window


# Linear-attention (Gated DeltaNet) state is kept in the model dtype: vLLM `--mamba-ssm-cache-dtype auto`
# (docs.vllm.ai engine args: "auto" = the model's dtype); we charge 2 bytes per element.
LINEAR_STATE_BYTES = 2.0


def linear_state_bytes_per_seq(model: ModelArch, layout) -> float:
    """Fixed state bytes per sequence per GPU of the linear-attention layers (heads split by TP)."""
    if not model.linear_attention_layers:
        return 0.0
    m = as_mapping(layout)
    per_layer = model.linear_state_elements_per_seq() / model.linear_attention_layers
    layers = math.ceil(model.linear_attention_layers / m.pp)
    return layers * per_layer * LINEAR_STATE_BYTES / m.attn_tp


def activation_bytes(model: ModelArch, layout, chunk_size: int) -> float:
    m = as_mapping(layout)
    table = _ACT_C_MOE if model.is_moe else _ACT_C_DENSE
    c = table.get(m.attn_tp, 10 if model.is_moe else 5)
    return 2.0 * chunk_size * model.hidden_size * c


def runtime_bytes(layout) -> float:
    m = as_mapping(layout)
    return CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if m.gpus > 1 else 0.0)


def memory_fit(
    model: ModelArch,
    gpu: GpuSpec,
    layout,
    *,
    weight_dtype: str,
    kv_dtype: str,
    context_tokens: int,
    chunk_size: int = 8192,
    max_num_seqs: int = 256,
    engine: str = "vllm",
    memory_fraction: float = 0.9,
    headroom: float = 0.0,
    mtp_layers: int = 0,
) -> MemoryFit:
    """Whether `layout` fits on `gpu`, and how many tokens / sequences of KV cache it holds.

    `context_tokens` is the context one sequence must be able to reach (isl + osl);
    `max_num_seqs` is reported against but does not change the KV arithmetic.
    `mtp_layers`: multi-token-prediction modules loaded for speculative decoding (`mtp_bytes_per_gpu`).
    """
    return _memory_fit(model, gpu, as_mapping(layout), weight_dtype, kv_dtype, int(context_tokens),
                       int(chunk_size), int(max_num_seqs), engine, float(memory_fraction), float(headroom),
                       int(mtp_layers))


def mtp_bytes_per_gpu(model: ModelArch, layout, weight_dtype: str, kv_dtype: str, mtp_layers: int) -> tuple[float, float]:
    """(weight bytes, KV bytes per context token) that `mtp_layers` MTP modules add to the fullest GPU.

    One MTP module (DeepSeek-V3 technical report, arXiv:2412.19437 section 2.2) is one transformer block of
    the main model's shape (for DeepSeek-V3 an MLA + MoE layer) plus a 2h x h projection, sharing the
    embedding and output head; deepseek-ai/DeepSeek-V3 README_WEIGHTS.md counts 11.5B unique MTP parameters
    (of 685B). The engines shard it like a main layer and place it with the last pipeline stage, which
    also keeps its KV cache (one more layer's KV per token)."""
    if mtp_layers <= 0:
        return 0.0, 0.0
    from dataclasses import replace

    m1 = replace(as_mapping(layout), pp=1)
    more = replace(model, num_layers=model.num_layers + mtp_layers)
    cd = component_dtypes(model, weight_dtype)
    proj = mtp_layers * 2.0 * model.hidden_size * model.hidden_size * WEIGHT_BYTES[cd["embed"]] / m1.attn_tp
    weights = weight_bytes_per_gpu(more, m1, weight_dtype) - weight_bytes_per_gpu(model, m1, weight_dtype) + proj
    layers = model.full_attention_layers
    kv = kv_bytes_per_token(model, m1, kv_dtype) / layers * mtp_layers if layers else 0.0
    return weights, kv


@lru_cache(maxsize=65536)
def _memory_fit(model, gpu, m: ReplicaMapping, weight_dtype, kv_dtype, context_tokens, chunk_size,
                max_num_seqs, engine, memory_fraction, headroom, mtp_layers=0) -> MemoryFit:
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_BYTES)}, got {weight_dtype!r}")
    if kv_dtype not in KV_BYTES:
        raise ValueError(f"kv_dtype must be one of {sorted(KV_BYTES)}, got {kv_dtype!r}")
    total = gpu.memory_bytes
    weights = weight_bytes_per_gpu(model, m, weight_dtype)
    act = activation_bytes(model, m, chunk_size)
    runtime = runtime_bytes(m)
    kv_tok = kv_bytes_per_token(model, m, kv_dtype)
    if mtp_layers:
        mtp_w, mtp_kv = mtp_bytes_per_gpu(model, m, weight_dtype, kv_dtype, mtp_layers)
        weights, kv_tok = weights + mtp_w, kv_tok + mtp_kv
    sw_seq = sliding_bytes_per_seq(model, m, kv_dtype) + linear_state_bytes_per_seq(model, m)
    fixed = weights + act + runtime
    if engine == "trtllm":
        # What weights, activations and runtime may take: all memory but the headroom (the engine's
        # fraction applies only to what is left after them, for the KV cache).
        limit = total * (1.0 - headroom)
        limit_text = ((f"{total / GIB:.1f} GiB less {headroom:.0%} headroom" if headroom else "all of its memory")
                      + "; TensorRT-LLM's KV fraction applies to what is left")
        free = limit - fixed
        kv_budget = memory_fraction * free
        usable = fixed + max(kv_budget, 0.0)
    else:  # vllm, sglang: fraction of total memory
        limit = usable = total * max(0.0, memory_fraction - headroom)
        limit_text = f"memory fraction {memory_fraction - headroom:.2f} of {total / GIB:.1f} GiB"
        kv_budget = usable - fixed
    reason = ""
    if kv_budget <= 0:
        # The limit, not `usable`: for TensorRT-LLM `usable` is built from `fixed` and would equal it.
        held = redundant_expert_bytes_per_gpu(model, m, weight_dtype)
        extra = ""
        if held:
            extra = (f" (of which {held / GIB:.1f} GiB are EPLB's {m.redundant_experts} redundant experts"
                     + (": it fits with spec.engine.expertLoadBalancing disabled)" if fixed - held < limit else ")"))
        reason = (f"weights {weights / GIB:.1f} GiB{extra} + activations {act / GIB:.1f} GiB + runtime "
                  f"{runtime / GIB:.1f} GiB = {fixed / GIB:.1f} GiB per GPU exceed the {limit / GIB:.1f} GiB "
                  f"usable on {gpu.name} ({limit_text}); use more TP/EP/PP or a smaller weight dtype")
        return MemoryFit(False, weights, kv_tok, act, runtime, limit, 0, 0, reason)
    per_seq_bytes = kv_tok * context_tokens + sw_seq
    seqs_per_rank = int(kv_budget // per_seq_bytes) if per_seq_bytes > 0 else 10**9
    tokens_per_rank = int(kv_budget // kv_tok) if kv_tok > 0 else 10**12
    capacity_tokens = tokens_per_rank * m.attn_dp
    max_conc = seqs_per_rank * m.attn_dp
    fits = max_conc >= 1
    if not fits:
        reason = (f"KV cache of {kv_budget / GIB:.1f} GiB per GPU cannot hold one sequence of "
                  f"{context_tokens} tokens ({per_seq_bytes / GIB:.2f} GiB); shorten max_context or "
                  f"add TP/PP")
    return MemoryFit(fits, weights, kv_tok, act, runtime, usable, capacity_tokens, max_conc, reason,
                     redundant_expert_bytes=redundant_expert_bytes_per_gpu(model, m, weight_dtype))


def min_gpus_for_weights(model: ModelArch, gpu: GpuSpec, weight_dtype: str) -> int:
    """GPUs needed to hold the weights alone (no KV, no runtime): ceil(total weight bytes / GPU memory)."""
    total = weight_bytes_per_gpu(model, ReplicaMapping(), weight_dtype)
    return max(1, math.ceil(total / gpu.memory_bytes))


def choose_precision(
    model: ModelArch,
    gpu: GpuSpec,
    *,
    gpus: int | None = None,
    accuracy_floor: str = "fp4",
    weights_share: float = 0.6,
    engine: str | None = None,
) -> tuple[str, str]:
    """(weight_dtype, kv_dtype) for `quantization: auto`.

    Rule: walk bf16 -> fp8 -> fp4 -> int4 and take the first dtype that
    (1) is not less precise than `accuracy_floor` (fp4 and int4 are one level), (2) the GPU runs natively
    (fp8 needs FP8 tensor cores, i.e. Hopper/Ada/Blackwell/MI300; fp4 needs
    Blackwell; int4 is weight-only, allowed on GPUs without FP4) and (3) keeps the
    weights within `weights_share` of the memory of `gpus` GPUs (default: one
    NVLink domain), leaving the rest for KV cache. A checkpoint published in a
    smaller dtype (DeepSeek FP8, gpt-oss MXFP4) is never up-cast: its native
    dtype is the starting point, and always allowed (engines run FP4 checkpoints
    weight-only on GPUs without FP4 tensor cores). If nothing fits, the smallest allowed dtype is
    returned and the memory fit will say why. KV cache is fp8 whenever the GPU
    has FP8 tensor cores and the floor allows, else bf16.

    A model read from a real checkpoint's config.json (`checkpoint_fixed`) is only
    planned at a dtype the checkpoint ships in, or one `engine` converts to online
    (`online_conversions`): DeepSeek-R1 FP8 stays FP8 on GB200 (no FP4 without an
    FP4 checkpoint), Kimi-K2.5 stays INT4.
    """
    if accuracy_floor not in PRECISION_RANK:
        raise ValueError(f"accuracy_floor must be one of {sorted(PRECISION_RANK)}, got {accuracy_floor!r}")
    if engine is not None:
        # Engines that cannot be told a weight or KV dtype (NVIDIA NIM: its profile decides; DeepSpeed-MII: 16-bit
        # only; engines.<kind>.SUPPORTED_*_DTYPES) run the checkpoint's weights and a 16-bit KV cache.
        from meshplan.engines import supported_dtypes   # lazy: the engine modules import meshplan.planner

        weights_ok, kv_ok = supported_dtypes(engine)
        if weights_ok is not None or kv_ok is not None:
            w, k = choose_precision(model, gpu, gpus=gpus, accuracy_floor=accuracy_floor,
                                    weights_share=weights_share)
            if weights_ok is not None and w not in weights_ok:
                w = model.native_dtype if model.checkpoint_fixed and model.native_dtype in WEIGHT_BYTES else "bf16"
            if kv_ok is not None and k not in kv_ok:
                k = "bf16"
            return w, k
    n = gpus or gpu.nvlink_domain
    floor = PRECISION_RANK[accuracy_floor]
    kv = "fp8" if gpu.supports("fp8") and floor >= PRECISION_RANK["fp8"] else "bf16"
    if model.checkpoint_fixed:
        native = model.native_dtype if model.native_dtype in WEIGHT_BYTES else "bf16"
        options = [native] + [d for d in online_conversions(native, engine, gpu) if PRECISION_RANK[d] <= floor]
        budget = weights_share * gpu.memory_bytes * n
        for d in options:
            if weight_bytes_per_gpu(model, ReplicaMapping(), d) <= budget:
                return d, kv
        return options[-1], kv
    native = model.native_dtype if model.native_dtype in PRECISION_ORDER else "bf16"
    start = PRECISION_RANK[native]
    allowed = [d for d in PRECISION_ORDER if start <= PRECISION_RANK[d] <= floor
               and (d in ("bf16", "int4", native) or gpu.supports(d))]
    if gpu.supports("fp4") and "fp4" in allowed and native != "int4":
        allowed.remove("int4")  # FP4 tensor cores beat INT4 weight-only kernels at the same size
    if not allowed:
        allowed = [native]
    budget = weights_share * gpu.memory_bytes * n
    choice = allowed[-1]
    for d in allowed:
        if weight_bytes_per_gpu(model, ReplicaMapping(), d) <= budget:
            choice = d
            break
    return choice, kv


def online_conversions(checkpoint_dtype: str, engine: str | None, gpu: GpuSpec) -> tuple[str, ...]:
    """Weight dtypes `engine` produces from a `checkpoint_dtype` checkpoint while loading it.

    vLLM and SGLang quantize a 16-bit checkpoint to FP8 online (`--quantization fp8`, dynamic
    per-tensor scales: docs.vllm.ai features/quantization/fp8 "online dynamic quantization";
    SGLang docs advanced_features/quantization "online quantization" `--quantization fp8`), on GPUs with
    FP8 support. Neither converts to INT4/FP4 online, and TensorRT-LLM reads its quantization from
    the checkpoint (ModelOpt, offline). No engine converts between two quantized formats.
    """
    if checkpoint_dtype in ("bf16", "fp16") and engine in ("vllm", "sglang") and gpu.supports("fp8"):
        return ("fp8",)
    return ()
