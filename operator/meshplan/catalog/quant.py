"""Checkpoint dtypes per component, read from a Hugging Face `config.json`.

A quantized checkpoint rarely quantizes everything: DeepSeek-R1's FP8 block
checkpoint keeps embeddings and the LM head in BF16; Kimi-K2.5's INT4
checkpoint quantizes the routed experts only (attention, shared experts and the
dense MLP stay BF16); gpt-oss quantizes the experts to MXFP4 and leaves
attention in BF16. `checkpoint_dtypes` returns the weight dtype of each
component the planner prices separately:

    attention, dense (dense-layer FFN), shared (shared experts), experts (routed experts)

Formats read (the field names are the ones each format writes in config.json):

- no `quantization_config`: `torch_dtype` (older transformers) or `dtype`
  (transformers >= 4.56) for everything: bfloat16 -> bf16, float16 -> fp16,
  float32 -> fp16 (vLLM `--dtype auto` serves FP32 checkpoints in FP16:
  docs.vllm.ai engine args, `--dtype`).
- `quant_method: fp8` (DeepSeek/Qwen/MiniMax FP8 block checkpoints,
  `weight_block_size`, transformers FineGrainedFP8Config): every Linear is FP8
  except `modules_to_not_convert` (vLLM reads the same list as ignored layers).
- `quant_method: compressed-tensors` (llm-compressor: INT4 W4A16, W8A8, FP8,
  NVFP4): `config_groups.*.weights` gives `num_bits` and `type` (int|float),
  `targets` the layers a group covers ("Linear" = all, or `re:` regexes),
  `ignore` the layers left in the base dtype.
- `quant_method: mxfp4` (gpt-oss): experts MXFP4 (our fp4), everything in
  `modules_to_not_convert` in the base dtype.
- ModelOpt (`quant_method: modelopt` with `quant_algo`, or the sibling
  `hf_quant_config.json` with `quantization.quant_algo` and `exclude_modules`
  globs): NVFP4 -> fp4, FP8 -> fp8, W4A16_AWQ / W4A8_AWQ / INT4_AWQ -> int4,
  W8A8_SQ_* / INT8 -> int8.
- `quant_method: awq | gptq` (AutoAWQ / GPTQModel): `bits` 4 -> int4, 8 -> int8;
  AWQ's `modules_to_not_convert` in the base dtype.

Module name matching (which component an ignore entry covers): an entry starting
with `re:` is a regular expression matched at the start of the module name
(compressed-tensors' rule); an entry with `*` is a glob (ModelOpt's
`exclude_modules`) matched against the module or one above it; anything else matches whole dotted name parts (`gate`
covers `model.layers.3.mlp.gate`, the router, but not `gate_proj`; an entry
with a trailing dot, as in `model.layers.0.`, covers every module under that
dotted path). A component counts as excluded when
the entries cover it in more than half of the layers that have it.

Embeddings and the LM head are priced in the base dtype by the planner for every
quantized format here (all the checkpoints above leave them unquantized).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

COMPONENTS = ("attention", "dense", "shared", "experts")

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp16", "float": "fp16",
                 "float8_e4m3fn": "fp8"}

# Representative module names of each component in layer {i}, in the spellings the
# common architectures use (Llama/Qwen/DeepSeek `mlp.*`, Mixtral/MiniMax `block_sparse_moe.*`,
# Qwen-Next/3.5 `linear_attn.*`, Qwen-MoE `shared_expert` singular), each also under a
# multimodal wrapper's `language_model.` prefix.
_SAMPLES = {
    "attention": ("model.layers.{i}.self_attn.o_proj", "model.layers.{i}.self_attn.q_proj",
                  "model.layers.{i}.self_attn.kv_a_proj_with_mqa", "model.layers.{i}.linear_attn.out_proj"),
    "dense": ("model.layers.{i}.mlp.down_proj", "model.layers.{i}.mlp.gate_proj"),
    "shared": ("model.layers.{i}.mlp.shared_experts.down_proj", "model.layers.{i}.mlp.shared_expert.down_proj"),
    "experts": ("model.layers.{i}.mlp.experts.0.down_proj", "model.layers.{i}.block_sparse_moe.experts.0.w2"),
}
_PREFIXES = ("", "language_model.", "model.language_model.")


def _base_dtype(cfg: dict) -> str:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    return _TORCH_DTYPES.get(str(raw).lower().replace("torch.", ""), "bf16")


def _covers(entry: str, name: str) -> bool:
    entry = str(entry)
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if "*" in entry or "?" in entry:
        # the module or any module above it (`model.layers.*.self_attn` covers its projections)
        parts = name.split(".")
        return any(fnmatch.fnmatchcase(".".join(parts[:k]), entry) for k in range(1, len(parts) + 1))
    if entry.endswith("."):
        return ("." + name).find("." + entry) != -1   # `layers.0.` covers model.layers.0.*, not layers.10
    parts, want = name.split("."), entry.split(".")
    n = len(want)
    return any(parts[k:k + n] == want for k in range(len(parts) - n + 1))


def _component_layers(component: str, layers: int, moe_layers: range, dense_layers: range) -> range:
    if component == "attention":
        return range(layers)
    if component == "dense":
        return dense_layers
    return moe_layers


def _matched(entries: list[str], component: str, layer_range: range) -> bool:
    """Entries cover `component` in more than half of the layers that have it."""
    if not entries or len(layer_range) == 0:
        return False
    plain = {str(e) for e in entries if not (str(e).startswith("re:") or "*" in str(e) or "?" in str(e)
                                             or str(e).endswith("."))}
    others = [str(e) for e in entries if str(e) not in plain]
    hits = 0
    for i in layer_range:
        names = [p + s.format(i=i) for s in _SAMPLES[component] for p in _PREFIXES]
        found = False
        for n in names:
            parts = n.split(".")
            # every contiguous run of dotted parts: `plain` entries match one of them exactly
            runs = {".".join(parts[a:b]) for a in range(len(parts)) for b in range(a + 1, len(parts) + 1)}
            if plain & runs or any(_covers(e, n) for e in others):
                found = True
                break
        hits += found
    return hits * 2 > len(layer_range)


def _bits_dtype(bits: int, kind: str) -> str:
    kind = (kind or "int").lower()
    if bits == 4:
        return "fp4" if kind == "float" else "int4"
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 16:
        return "bf16"
    raise ValueError(f"quantization_config: {bits}-bit {kind} weights are not a dtype meshplan prices "
                     "(4 or 8 bits); give spec.model.architecture.weightDtype")


_MODELOPT_ALGOS = {"nvfp4": "fp4", "mxfp4": "fp4", "fp8": "fp8", "fp8_block_scales": "fp8", "fp8_pb_wo": "fp8",
                   "w4a16_awq": "int4", "w4a8_awq": "int4", "int4_awq": "int4", "w4a8_mxfp4_fp8": "fp4",
                   "int8_sq": "int8", "w8a8_sq_per_channel": "int8", "int8": "int8", "int8_wo": "int8",
                   "int4_wo": "int4", "nvfp4_awq": "fp4"}


def checkpoint_dtypes(cfg: dict, *, layers: int, moe_layers: range, dense_layers: range,
                      hf_quant: dict | None = None) -> dict[str, str]:
    """Weight dtype of each component (`COMPONENTS`) of the checkpoint `cfg` describes.

    `hf_quant` is a ModelOpt `hf_quant_config.json` published beside config.json.
    Raises ValueError naming the field for a quantization format it does not read.
    """
    base = _base_dtype(cfg)
    out = {c: base for c in COMPONENTS}
    q: dict[str, Any] = dict(cfg.get("quantization_config") or {})
    if not q and hf_quant:
        q = {"quant_method": "modelopt", **(hf_quant.get("quantization") or {})}
    if not q:
        return out
    method = str(q.get("quant_method", "")).lower()
    targets: list[str] | None = None  # None: every Linear
    ignore: list[str] = []
    if method in ("fp8", "fbgemm_fp8"):
        dtype = "fp8"
        ignore = list(q.get("modules_to_not_convert") or q.get("ignored_layers") or [])
    elif method == "mxfp4":
        dtype = "fp4"
        ignore = list(q.get("modules_to_not_convert") or [])
    elif method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not groups:
            raise ValueError("quantization_config.config_groups is empty in a compressed-tensors config; "
                             "give spec.model.architecture.weightDtype")
        # the group that covers the most: the first whose targets include Linear, else the first
        group = next((g for g in groups.values() if "Linear" in (g.get("targets") or [])), next(iter(groups.values())))
        w = group.get("weights") or {}
        dtype = _bits_dtype(int(w.get("num_bits", 16)), str(w.get("type", "int")))
        t = list(group.get("targets") or ["Linear"])
        targets = None if "Linear" in t else t
        ignore = list(q.get("ignore") or [])
    elif method == "modelopt":
        algo = str(q.get("quant_algo") or "").lower()
        if algo not in _MODELOPT_ALGOS:
            raise ValueError(f"ModelOpt quant_algo {q.get('quant_algo')!r} is not one meshplan reads "
                             f"({', '.join(sorted(_MODELOPT_ALGOS))}); give spec.model.architecture.weightDtype")
        dtype = _MODELOPT_ALGOS[algo]
        ignore = list(q.get("exclude_modules") or q.get("ignore") or [])
    elif method in ("awq", "gptq"):
        dtype = _bits_dtype(int(q.get("bits", 4)), "int")
        ignore = list(q.get("modules_to_not_convert") or [])
    else:
        raise ValueError(
            f"quantization_config.quant_method {q.get('quant_method')!r} is not one meshplan reads (fp8, "
            "compressed-tensors, mxfp4, modelopt, awq, gptq); give spec.model.architecture.weightDtype")
    for c in COMPONENTS:
        rng = _component_layers(c, layers, moe_layers, dense_layers)
        covered = True if targets is None else _matched(targets, c, rng)
        if covered and not _matched(ignore, c, rng):
            out[c] = dtype
    return out


__all__ = ["COMPONENTS", "checkpoint_dtypes"]
