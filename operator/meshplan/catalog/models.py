"""Model catalogue: transformer architectures as the planner needs them.

A `ModelArch` carries only what memory and time depend on: layer count,
attention shape (GQA/MHA or MLA), FFN shape (dense or MoE), vocabulary and
sliding-window layers. Parameter counts are computed from the dimensions by
`param_count` (and checked against the published totals in tests), so a model
given as a Hugging Face `config.json` (`from_hf_config`) is handled exactly
like a catalogue entry.

Conventions:
- FFNs are gated (SwiGLU: gate, up, down = 3 matrices of hidden x intermediate),
  which is true for every catalogue model.
- MoE layers: `num_experts` routed experts of `moe_intermediate_size`, each
  token goes to `experts_per_token` of them, plus `num_shared_experts` always-on
  experts of the same size. The first `first_k_dense_layers` layers use a dense
  FFN of `intermediate_size` instead (DeepSeek-V3: 3).
- MLA (DeepSeek-V2/V3): queries through a `q_lora_rank` bottleneck, keys and
  values from a `kv_lora_rank` latent plus a shared `qk_rope_head_dim` key;
  the KV cache stores only latent + rope key per token and layer.
- Hybrid attention (Qwen3-Next, Qwen3.5: `layer_types` with `linear_attention`,
  or `full_attention_interval`): `linear_attention_layers` are Gated DeltaNet
  layers. They keep a fixed recurrent state per sequence (value heads x key dim x
  value dim, plus a short convolution window) and no KV cache that grows with
  the context; only the other layers hold KV per token.
- Checkpoint dtypes: `native_dtype` is the dtype of the bulk of the weights (the
  routed experts of a MoE, else the dense layers); `attention_dtype`,
  `dense_dtype`, `shared_expert_dtype` and `expert_dtype` give each component's
  dtype when a config.json says so (`catalog.quant`), "" meaning native_dtype.
  `checkpoint_fixed` marks a model whose dtypes come from a real checkpoint's
  config: `precision.weights: auto` then never plans a dtype the checkpoint does
  not ship in, except what the engine converts online (planner.memory).
- `declared_total_params`: the total a user declared (`architecture.totalParams`).
  Weights are sized from the dimensions scaled to it (`weight_scale`), and
  `params_warning` says when it differs from the computed count by more than
  `PARAMS_TOLERANCE`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from meshplan.catalog.quant import checkpoint_dtypes

# How far a declared total parameter count may differ from `param_count` before the plan warns.
# param_count leaves out norms, biases, multi-token-prediction layers (DeepSeek-V3/R1: 11.5B of 685B
# published = 1.7%, deepseek-ai/DeepSeek-V3 README_WEIGHTS.md) and vision towers (Kimi-K2.5's
# MoonViT ~0.4B): real models land within a few percent, a wrong count (x10, /10) far outside.
PARAMS_TOLERANCE = 0.10


@dataclass(frozen=True)
class ModelArch:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_layers: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0              # tokens a sliding-window layer attends to
    sliding_window_layers: int = 0       # how many layers use the sliding window
    total_params: float = 0.0            # computed by param_count when 0
    active_params: float = 0.0           # per token; computed when 0
    source: str = ""
    tie_word_embeddings: bool = False
    native_dtype: str = "bf16"           # dtype of the published checkpoint's weights
    # per-component checkpoint dtypes ("" = native_dtype), see the module doc
    attention_dtype: str = ""
    dense_dtype: str = ""
    shared_expert_dtype: str = ""
    expert_dtype: str = ""
    checkpoint_fixed: bool = False       # dtypes read from a real checkpoint's config
    # hybrid attention: Gated DeltaNet layers (config.json linear_num_key_heads, ...)
    linear_attention_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    declared_total_params: float = 0.0   # architecture.totalParams, 0 = not declared
    # multi-token-prediction (MTP) modules the checkpoint ships (config.json `num_nextn_predict_layers`;
    # DeepSeek-V3/R1: 1, the DeepSeek-V3 technical report arXiv:2412.19437 section 2.2 "MTP module"): each
    # is one more transformer block (attention + MoE) plus a 2h x h projection, sharing the embedding and
    # output head. 0: the model cannot run MTP speculative decoding.
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if self.total_params <= 0 or self.active_params <= 0:
            total, active = param_count(self)
            if self.total_params <= 0:
                object.__setattr__(self, "total_params", float(total))
            if self.active_params <= 0:
                object.__setattr__(self, "active_params", float(active))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV cache grows with the context (not sliding-window, not linear attention)."""
        return self.num_layers - self.sliding_window_layers - self.linear_attention_layers

    def component_dtype(self, component: str) -> str:
        """Checkpoint dtype of `attention`, `dense`, `shared` or `experts`."""
        own = {"attention": self.attention_dtype, "dense": self.dense_dtype,
               "shared": self.shared_expert_dtype, "experts": self.expert_dtype}[component]
        return own or self.native_dtype

    @property
    def weight_scale(self) -> float:
        """declared / computed total parameters (1 when nothing is declared)."""
        if self.declared_total_params > 0 and self.total_params > 0:
            return self.declared_total_params / self.total_params
        return 1.0

    def params_warning(self) -> str:
        """A warning when the declared total differs from the computed one by more than PARAMS_TOLERANCE."""
        r = self.weight_scale
        if abs(r - 1.0) <= PARAMS_TOLERANCE:
            return ""
        return (f"spec.model.architecture.totalParams {self.declared_total_params / 1e9:,.1f}B differs from the "
                f"{self.total_params / 1e9:,.1f}B computed from the dimensions by {100 * (r - 1):+.0f}% (tolerance "
                f"{100 * PARAMS_TOLERANCE:.0f}%); weights are sized at the declared count: check totalParams and "
                "the dimensions")

    @property
    def linear_attn_params_per_layer(self) -> float:
        """Gated DeltaNet projections (Qwen3-Next modeling code): q, k (key heads x key dim), v and the
        output gate z (value heads x value dim), a and b (one per value head), out_proj."""
        h = self.hidden_size
        k = self.linear_key_heads * self.linear_key_head_dim
        v = self.linear_value_heads * self.linear_value_head_dim
        return float(h * 2 * k + h * 2 * v + h * 2 * self.linear_value_heads + v * h)

    def linear_state_elements_per_seq(self) -> float:
        """Fixed per-sequence state of all linear-attention layers: recurrent state (value heads x key dim x
        value dim) plus the convolution window ((kernel - 1) x (2 key + value channels))."""
        if not self.linear_attention_layers:
            return 0.0
        rec = self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv_ch = 2 * self.linear_key_heads * self.linear_key_head_dim + self.linear_value_heads * self.linear_value_head_dim
        conv = max(0, self.linear_conv_kernel - 1) * conv_ch
        return float(self.linear_attention_layers * (rec + conv))

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    # ---- parameter groups (per layer unless said otherwise) -------------------------
    @property
    def attn_params_per_layer(self) -> float:
        h = self.hidden_size
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            heads = self.num_attention_heads
            q = (h * self.q_lora_rank + self.q_lora_rank * heads * qk) if self.q_lora_rank else h * heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = heads * self.v_head_dim * h
            return float(q + kv_a + kv_b + o)
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        return float(q + kv + o)

    @property
    def dense_ffn_params_per_layer(self) -> float:
        return 3.0 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> float:
        """One routed expert of one layer."""
        return 3.0 * self.hidden_size * self.moe_intermediate_size

    @property
    def shared_expert_params_per_layer(self) -> float:
        return self.num_shared_experts * self.expert_params

    @property
    def embedding_params(self) -> float:
        return float(self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2))

    def kv_elements_per_token(self) -> float:
        """KV-cache elements per token over all attention layers (sliding included, linear attention not),
        unsplit (TP=1)."""
        layers = self.num_layers - self.linear_attention_layers
        if self.is_mla:
            return float(layers * (self.kv_lora_rank + self.qk_rope_head_dim))
        return float(2 * layers * self.num_kv_heads * self.head_dim)


def param_count(arch: ModelArch) -> tuple[float, float]:
    """(total, active-per-token) parameters computed from the dimensions.

    Norms and biases are ignored (< 0.1%); embeddings and the LM head count in
    both totals (the LM head is a GEMM every token).
    """
    attn = (arch.attn_params_per_layer * (arch.num_layers - arch.linear_attention_layers)
            + arch.linear_attn_params_per_layer * arch.linear_attention_layers)
    dense = arch.dense_ffn_params_per_layer * arch.dense_layers
    if arch.is_moe:
        router = arch.hidden_size * arch.num_experts * arch.moe_layers
        experts_total = arch.expert_params * arch.num_experts * arch.moe_layers
        experts_active = arch.expert_params * arch.experts_per_token * arch.moe_layers
        shared = arch.shared_expert_params_per_layer * arch.moe_layers
    else:
        router = experts_total = experts_active = shared = 0.0
    emb = arch.embedding_params
    total = attn + dense + router + experts_total + shared + emb
    active = attn + dense + router + experts_active + shared + emb
    return total, active


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


def _m(**kw) -> ModelArch:
    # A catalogue entry with a published checkpoint (a Hugging Face source) ships in native_dtype: the
    # precision rule keeps it (or what the engine converts to online), as for a config.json.
    kw.setdefault("checkpoint_fixed", "huggingface.co/" in kw.get("source", ""))
    return ModelArch(**kw)


_CATALOG: tuple[ModelArch, ...] = (
    _m(name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
       head_dim=128, intermediate_size=14336, vocab_size=128256, source=_hf("meta-llama/Llama-3.1-8B")),
    _m(name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
       head_dim=128, intermediate_size=28672, vocab_size=128256, source=_hf("meta-llama/Llama-3.1-70B")),
    _m(name="llama-3.1-405b", num_layers=126, hidden_size=16384, num_attention_heads=128, num_kv_heads=8,
       head_dim=128, intermediate_size=53248, vocab_size=128256, source=_hf("meta-llama/Llama-3.1-405B")),
    _m(name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
       head_dim=128, intermediate_size=14336, vocab_size=32000, num_experts=8, experts_per_token=2,
       moe_intermediate_size=14336, source=_hf("mistralai/Mixtral-8x7B-v0.1")),
    _m(name="mixtral-8x22b", num_layers=56, hidden_size=6144, num_attention_heads=48, num_kv_heads=8,
       head_dim=128, intermediate_size=16384, vocab_size=32768, num_experts=8, experts_per_token=2,
       moe_intermediate_size=16384, source=_hf("mistralai/Mixtral-8x22B-v0.1")),
    _m(name="qwen3-32b", num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8,
       head_dim=128, intermediate_size=25600, vocab_size=151936, source=_hf("Qwen/Qwen3-32B")),
    _m(name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_attention_heads=64, num_kv_heads=4,
       head_dim=128, intermediate_size=12288, vocab_size=151936, num_experts=128, experts_per_token=8,
       moe_intermediate_size=1536, source=_hf("Qwen/Qwen3-235B-A22B")),
    _m(name="deepseek-v3", num_layers=61, hidden_size=7168, num_attention_heads=128, num_kv_heads=128,
       head_dim=128, intermediate_size=18432, vocab_size=129280, num_experts=256, experts_per_token=8,
       num_shared_experts=1, moe_intermediate_size=2048, first_k_dense_layers=3, kv_lora_rank=512,
       q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, native_dtype="fp8",
       mtp_layers=1, source=_hf("deepseek-ai/DeepSeek-V3")),
    _m(name="deepseek-r1", num_layers=61, hidden_size=7168, num_attention_heads=128, num_kv_heads=128,
       head_dim=128, intermediate_size=18432, vocab_size=129280, num_experts=256, experts_per_token=8,
       num_shared_experts=1, moe_intermediate_size=2048, first_k_dense_layers=3, kv_lora_rank=512,
       q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, native_dtype="fp8",
       mtp_layers=1, source=_hf("deepseek-ai/DeepSeek-R1")),
    _m(name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_attention_heads=64, num_kv_heads=8,
       head_dim=64, intermediate_size=2880, vocab_size=201088, num_experts=128, experts_per_token=4,
       moe_intermediate_size=2880, sliding_window=128, sliding_window_layers=18, native_dtype="fp4",
       source=_hf("openai/gpt-oss-120b")),
    # MiniMax-M2 (MiniMaxM2ForCausalLM, model_type minimax_m2), as MiniMaxAI/MiniMax-M2.5's config.json gives it
    # (a copy in tests/fixtures/models; tests/test_catalog.py checks this entry against it): 62 layers, all MoE (no
    # dense layer, no shared expert), 256 experts of FFN width 1536, top-8, GQA 48 query / 8 KV heads of 128,
    # vocabulary 200,064; FP8 weights (quant_method fp8, weight_block_size [128, 128], modules_to_not_convert:
    # gate, e_score_correction_bias, lm_head). The ids of MiniMax-M2, M2.1, M2.5 and M2.7 map to it: M2.1 and M2.5
    # are the same architecture (github.com/SemiAnalysisAI/InferenceX/issues/826: M2.1 'is same arch' as M2.5); M2.7's config.json was not read here, it is
    # taken as the same because SGLang's cookbook serves it with the same layouts (TP2 FP8 on 2 x 192 GB). param_count
    # gives 228.7B total (230B as the model is listed) and 11.0B active, 1.2B of it the embedding and output tables.
    _m(name="minimax-m2", num_layers=62, hidden_size=3072, num_attention_heads=48, num_kv_heads=8,
       head_dim=128, intermediate_size=1536, vocab_size=200064, num_experts=256, experts_per_token=8,
       moe_intermediate_size=1536, native_dtype="fp8", source=_hf("MiniMaxAI/MiniMax-M2.5")),
    # GPT-MoE-1.8T: the model of NVIDIA's "Demystifying AI Inference Deployments for
    # Trillion Parameter LLMs" blog (2024) and the seeds: 1.8T parameters, 16 experts,
    # top-2. OpenAI never published it; the dimensions follow SemiAnalysis' published
    # estimate ("GPT-4 Architecture, Infrastructure, ...", 2023: ~1.8T total, 120
    # layers, 16 experts of ~111B, 2 routed per token, ~55B shared attention) with
    # a 12,288 hidden size, GQA with 8 KV heads and a 100k vocabulary chosen by us.
    # param_count gives 1.78T total, ~0.26T active.
    _m(name="gpt-moe-1.8t", num_layers=120, hidden_size=12288, num_attention_heads=96, num_kv_heads=8,
       head_dim=128, intermediate_size=24576, vocab_size=100277, num_experts=16, experts_per_token=2,
       moe_intermediate_size=24576,
       source="NVIDIA blog 'Demystifying AI Inference Deployments for Trillion Parameter LLMs' (2024): "
              "1.8T, 16 experts, top-2; dims from SemiAnalysis 'GPT-4 Architecture' estimate (2023)"),
)

MODELS: dict[str, ModelArch] = {m.name: m for m in _CATALOG}

# Hugging Face ids (lower-case) -> catalogue name
_HF_IDS: dict[str, str] = {
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/llama-3.1-405b": "llama-3.1-405b",
    "meta-llama/llama-3.1-405b-instruct": "llama-3.1-405b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x22b-v0.1": "mixtral-8x22b",
    "mistralai/mixtral-8x22b-instruct-v0.1": "mixtral-8x22b",
    "qwen/qwen3-32b": "qwen3-32b",
    "qwen/qwen3-235b-a22b": "qwen3-235b-a22b",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    "deepseek-ai/deepseek-v3-0324": "deepseek-v3",
    "deepseek-ai/deepseek-r1": "deepseek-r1",
    "deepseek-ai/deepseek-r1-0528": "deepseek-r1",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "minimaxai/minimax-m2": "minimax-m2",
    "minimaxai/minimax-m2.1": "minimax-m2",
    "minimaxai/minimax-m2.5": "minimax-m2",
    "minimaxai/minimax-m2.7": "minimax-m2",
}


# Quantized checkpoints of catalogue models, by Hugging Face id (lower-case) -> (catalogue name, the
# checkpoint's dtype, per-component dtypes it leaves unquantized). Each as its config.json /
# hf_quant_config.json says (copies in tests/fixtures/models, sources in SOURCES.md).
_HF_VARIANTS: dict[str, tuple[str, str, dict]] = {
    # quant_method fp8, weight_block_size [128, 128]: every Linear FP8
    "qwen/qwen3-235b-a22b-fp8": ("qwen3-235b-a22b", "fp8", {}),
    "qwen/qwen3-32b-fp8": ("qwen3-32b", "fp8", {}),
    # ModelOpt NVFP4, exclude_modules = every layer's self_attn projections
    "nvidia/deepseek-v3.1-nvfp4": ("deepseek-v3", "fp4", {"attention_dtype": "bf16"}),
}


def _variant(key: str) -> ModelArch:
    from dataclasses import replace

    base, dtype, parts = _HF_VARIANTS[key]
    m = MODELS[base]
    repo = key  # lower-case id; the source names the page
    return replace(m, name=f"{m.name}-{dtype}", native_dtype=dtype, checkpoint_fixed=True,
                   source=f"https://huggingface.co/{repo}/blob/main/config.json (dimensions: {m.source})",
                   total_params=m.total_params, active_params=m.active_params, **parts)


def get_model(name: str) -> ModelArch:
    """Catalogue entry by name ("llama-3.1-70b") or Hugging Face id, case-insensitive (a quantized
    checkpoint's id gives the entry at that checkpoint's dtypes)."""
    key = str(name).strip().lower()
    if key in MODELS:
        return MODELS[key]
    if key in _HF_IDS:
        return MODELS[_HF_IDS[key]]
    if key in _HF_VARIANTS:
        return _variant(key)
    tail = key.rsplit("/", 1)[-1]
    if tail in MODELS:
        return MODELS[tail]
    raise KeyError(
        f"unknown model {name!r}; known: {', '.join(sorted(MODELS))} (or a Hugging Face id of one of "
        f"them, or give the model's config.json)"
    )


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def from_hf_config(cfg: dict, name: str, source: str = "", hf_quant: dict | None = None) -> ModelArch:
    """Build a `ModelArch` from a Hugging Face `config.json` dict.

    Handles dense GQA/MHA (Llama, Qwen, Mistral), MoE (Mixtral `num_local_experts`,
    Qwen-MoE `num_experts` + `moe_intermediate_size`, gpt-oss, DeepSeek
    `n_routed_experts`/`n_shared_experts`/`first_k_dense_replace`), MLA
    (`kv_lora_rank`, ...), sliding-window layers (`layer_types`, `sliding_window`),
    linear-attention layers (`layer_types` `linear_attention`, or `full_attention_interval`:
    every interval-th layer is full attention, Qwen3-Next) and the checkpoint's dtype per
    component (`catalog.quant`; `hf_quant` is a ModelOpt hf_quant_config.json).
    Multimodal configs are read from their `text_config`.
    """
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise ValueError(f"config for {name!r} lacks {exc.args[0]!r}; is it a transformer config.json?") from exc
    kv_heads = int(_first(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    inter = int(_first(cfg, "intermediate_size", "ffn_dim", default=4 * hidden))
    n_exp = int(_first(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0)
    topk = int(_first(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0)
    moe_inter = int(_first(cfg, "moe_intermediate_size", default=inter if n_exp else 0) or 0)
    shared = int(_first(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    if not shared and cfg.get("shared_expert_intermediate_size") and moe_inter:
        shared = max(1, round(int(cfg["shared_expert_intermediate_size"]) / moe_inter))
    first_dense = int(_first(cfg, "first_k_dense_replace", default=0) or 0)
    if n_exp and not first_dense and cfg.get("mlp_only_layers"):
        first_dense = len(cfg["mlp_only_layers"])
    kv_lora = int(cfg.get("kv_lora_rank") or 0)
    sw = 0
    sw_layers = 0
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sw_layers = sum(1 for t in layer_types if "sliding" in str(t))
        sw = int(cfg.get("sliding_window") or 0) if sw_layers else 0
    elif cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        sw = int(cfg["sliding_window"])
        max_window = cfg.get("max_window_layers")
        sw_layers = layers if max_window is None else max(0, layers - int(max_window))
        if sw_layers == 0:
            sw = 0
    lin_layers = 0
    if isinstance(layer_types, list) and layer_types:
        lin_layers = sum(1 for t in layer_types if "linear" in str(t))
    elif cfg.get("full_attention_interval") and cfg.get("linear_num_value_heads"):
        interval = int(cfg["full_attention_interval"])
        lin_layers = layers - layers // interval if interval > 0 else 0
    if n_exp and topk == 0:
        raise ValueError(f"config for {name!r} has {n_exp} experts but no num_experts_per_tok")
    first_dense_eff = first_dense if n_exp else layers
    dtypes = checkpoint_dtypes(cfg, layers=layers, moe_layers=range(first_dense_eff, layers) if n_exp else range(0),
                               dense_layers=range(first_dense_eff), hf_quant=hf_quant)
    native = dtypes["experts"] if n_exp else dtypes["dense"]
    return ModelArch(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        num_experts=n_exp,
        experts_per_token=topk if n_exp else 0,
        num_shared_experts=shared if n_exp else 0,
        moe_intermediate_size=moe_inter if n_exp else 0,
        first_k_dense_layers=first_dense if n_exp else 0,
        kv_lora_rank=kv_lora,
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        sliding_window=sw,
        sliding_window_layers=sw_layers,
        source=source or f"config.json for {name}",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        native_dtype=native,
        attention_dtype=dtypes["attention"],
        dense_dtype=dtypes["dense"],
        shared_expert_dtype=dtypes["shared"] if n_exp and shared else "",
        expert_dtype=dtypes["experts"] if n_exp else "",
        checkpoint_fixed=True,
        linear_attention_layers=lin_layers,
        linear_key_heads=int(cfg.get("linear_num_key_heads") or 0) if lin_layers else 0,
        linear_value_heads=int(cfg.get("linear_num_value_heads") or 0) if lin_layers else 0,
        linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 0) if lin_layers else 0,
        linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 0) if lin_layers else 0,
        linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 0) if lin_layers else 0,
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
    )


def hf_quant_config_path(path: str | Path) -> Path:
    """Where a ModelOpt hf_quant_config.json sits beside `path` (`config.json` -> `hf_quant_config.json`,
    `<org>--<name>_config.json` -> `<org>--<name>_hf_quant_config.json`)."""
    p = Path(path)
    stem = p.name[: -len("config.json")] if p.name.endswith("config.json") else p.stem + "_"
    return p.with_name(stem + "hf_quant_config.json")


def load_hf_config(path: str | Path, name: str | None = None) -> ModelArch:
    """Read a config.json file into a `ModelArch` (name defaults to the file stem), with the ModelOpt
    hf_quant_config.json beside it when there is one."""
    p = Path(path)
    q = hf_quant_config_path(p)
    hf_quant = json.loads(q.read_text()) if q.is_file() and q != p else None
    return from_hf_config(json.loads(p.read_text()), name or p.stem, source=str(p), hf_quant=hf_quant)


def architecture_manifest(m: ModelArch) -> dict:
    """`spec.model.architecture` (camelCase, as in the CRD) describing `m`, e.g. one read from a
    config.json: what `meshplan architecture config.json` prints. Fields left at their defaults are omitted."""
    out: dict = {"layers": m.num_layers, "hiddenSize": m.hidden_size, "attentionHeads": m.num_attention_heads,
                 "vocabSize": m.vocab_size}
    if m.is_mla:
        out.update(kvLoraRank=m.kv_lora_rank, qkRopeHeadDim=m.qk_rope_head_dim)
        for key, v in (("qLoraRank", m.q_lora_rank), ("qkNopeHeadDim", m.qk_nope_head_dim), ("vHeadDim", m.v_head_dim)):
            if v:
                out[key] = v
    else:
        out["kvHeads"] = m.num_kv_heads
        out["headDim"] = m.head_dim
    if not m.is_moe or m.first_k_dense_layers:
        out["intermediateSize"] = m.intermediate_size
    if m.is_moe:
        out.update(experts=m.num_experts, expertsPerToken=m.experts_per_token,
                   moeIntermediateSize=m.moe_intermediate_size)
        if m.num_shared_experts:
            out["sharedExperts"] = m.num_shared_experts
        if m.first_k_dense_layers:
            out["denseLayers"] = m.first_k_dense_layers
    if m.sliding_window_layers:
        out.update(slidingWindow=m.sliding_window, slidingWindowLayers=m.sliding_window_layers)
    if m.linear_attention_layers:
        out.update(linearAttentionLayers=m.linear_attention_layers, linearKeyHeads=m.linear_key_heads,
                   linearValueHeads=m.linear_value_heads, linearKeyHeadDim=m.linear_key_head_dim,
                   linearValueHeadDim=m.linear_value_head_dim)
        if m.linear_conv_kernel:
            out["linearConvKernel"] = m.linear_conv_kernel
    if m.mtp_layers:
        out["mtpLayers"] = m.mtp_layers
    out["weightDtype"] = m.native_dtype
    for key, comp, present in (("attentionDtype", "attention", True),
                               ("denseDtype", "dense", m.dense_layers > 0),
                               ("sharedExpertDtype", "shared", m.num_shared_experts > 0)):
        if present and m.component_dtype(comp) != m.native_dtype:
            out[key] = m.component_dtype(comp)
    return out


__all__ = ["ModelArch", "MODELS", "PARAMS_TOLERANCE", "architecture_manifest", "get_model", "from_hf_config", "load_hf_config",
           "hf_quant_config_path", "param_count"]
