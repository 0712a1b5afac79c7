"""Real Hugging Face config.json files (tests/fixtures/models, sources in SOURCES.md) read as the planner prices them.

Every expected number here is worked out by hand from the config file's own fields, with the formula
written next to it; none is produced by the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from meshplan.api.models import LLMDeployment, LLMDeploymentSpec, validate_semantics
from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import architecture_manifest, from_hf_config, get_model, load_hf_config
from meshplan.planner import model_from_spec, plan_for_spec, plan_to_dict
from meshplan.planner.memory import (
    choose_precision,
    kv_bytes_per_token,
    linear_state_bytes_per_seq,
    sliding_bytes_per_seq,
    weight_bytes_per_gpu,
)
from meshplan.planner.search import SearchSpace
from meshplan.planner.types import Layout

FIX = Path(__file__).resolve().parent / "fixtures" / "models"
TP1 = Layout(tp=1)


def load(stem: str):
    return load_hf_config(FIX / f"{stem}_config.json", name=stem.replace("--", "/"))


def raw(stem: str) -> dict:
    return json.loads((FIX / f"{stem}_config.json").read_text())


# ------------------------------------------------------------------ the fixtures are what SOURCES.md says

def test_every_fixture_is_listed_in_sources_with_repo_path_and_commit():
    sources = (FIX / "SOURCES.md").read_text()
    files = sorted(p.name for p in FIX.glob("*.json"))
    assert len([f for f in files if not f.endswith("hf_quant_config.json")]) >= 10
    for f in files:
        row = next((line for line in sources.splitlines() if line.startswith(f"| {f} |")), None)
        assert row is not None, f"{f} missing from SOURCES.md"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5 and cells[3].endswith(f) and len(cells[4]) == 40, row
        json.loads((FIX / f).read_text())  # a real JSON file


# ------------------------------------------------------------------ dtype per component

# (attention, dense, shared experts, routed experts) as each checkpoint ships them; "-" = no such component
DTYPES = {
    # torch_dtype bfloat16, no quantization_config
    "meta-llama--Meta-Llama-3.1-8B": ("bf16", "bf16", "-", "-"),
    "meta-llama--Meta-Llama-3.1-70B": ("bf16", "bf16", "-", "-"),
    "Qwen--Qwen3-32B": ("bf16", "bf16", "-", "-"),
    # quant_method fp8, weight_block_size [128, 128], nothing but lm_head/norms/routers left out
    "Qwen--Qwen3-32B-FP8": ("fp8", "fp8", "-", "-"),
    "Qwen--Qwen3-235B-A22B-FP8": ("fp8", "-", "-", "fp8"),
    "deepseek-ai--DeepSeek-R1": ("fp8", "fp8", "fp8", "fp8"),
    "MiniMaxAI--MiniMax-M2.5": ("fp8", "-", "-", "fp8"),
    # compressed-tensors, group_0 weights num_bits 4 type int; ignore self_attn, shared_experts, mlp.*_proj
    "moonshotai--Kimi-K2.5": ("bf16", "bf16", "bf16", "int4"),
    # modelopt NVFP4 (config_groups num_bits 4 type float); ignore every layer's self_attn*
    "nvidia--Kimi-K2.5-NVFP4": ("bf16", "fp4", "fp4", "fp4"),
    # hf_quant_config.json beside it: quant_algo NVFP4, exclude_modules = each layer's self_attn projections
    "nvidia--DeepSeek-V3.1-NVFP4": ("bf16", "fp4", "fp4", "fp4"),
    # quant_method mxfp4, modules_to_not_convert model.layers.*.self_attn, router, embeddings, lm_head
    "openai--gpt-oss-120b": ("bf16", "-", "-", "fp4"),
    # dtype bfloat16 (text_config), no quantization
    "Qwen--Qwen3.5-397B-A17B": ("bf16", "-", "bf16", "bf16"),
    "Qwen--Qwen3-Next-80B-A3B-Thinking": ("bf16", "-", "bf16", "bf16"),
}


@pytest.mark.parametrize("stem", sorted(DTYPES))
def test_checkpoint_dtype_per_component(stem):
    m = load(stem)
    attn, dense, shared, experts = DTYPES[stem]
    assert m.component_dtype("attention") == attn
    if dense != "-":
        assert m.dense_layers > 0 and m.component_dtype("dense") == dense
    else:
        assert m.dense_layers == 0
    if shared != "-":
        assert m.num_shared_experts == 1 and m.component_dtype("shared") == shared
    else:
        assert m.num_shared_experts == 0
    if experts != "-":
        assert m.is_moe and m.component_dtype("experts") == experts
    assert m.native_dtype == (experts if experts != "-" else dense)
    assert m.checkpoint_fixed


def test_modelopt_quantization_lives_in_hf_quant_config_json():
    # the NVFP4 checkpoint's config.json alone says bfloat16 and nothing else; the sibling file says NVFP4
    cfg = raw("nvidia--DeepSeek-V3.1-NVFP4")
    assert "quantization_config" not in cfg
    assert from_hf_config(cfg, "x").native_dtype == "bf16"
    assert load("nvidia--DeepSeek-V3.1-NVFP4").native_dtype == "fp4"


def test_unknown_quant_method_is_refused_with_the_field_named():
    cfg = {**raw("meta-llama--Meta-Llama-3.1-8B"), "quantization_config": {"quant_method": "hqq"}}
    with pytest.raises(ValueError, match=r"quantization_config.quant_method 'hqq'.*weightDtype"):
        from_hf_config(cfg, "x")


def test_awq_and_gptq_bits_and_ignore_lists():
    # No full AWQ/GPTQ config.json copy was found in the stored public sources, so the quantization_config
    # here is written after the one a MiniMax-M2.5-AWQ checkpoint is described with (quant_method awq, bits 4,
    # group_size 128, zero_point, modules_to_not_convert self_attn, block_sparse_moe.gate, model.layers.0.),
    # on the real MiniMax-M2.5 dimensions.
    cfg = {**raw("MiniMaxAI--MiniMax-M2.5"), "quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
        "modules_to_not_convert": ["self_attn", "block_sparse_moe.gate", "model.layers.0."]}}
    m = from_hf_config(cfg, "awq")
    assert (m.component_dtype("attention"), m.component_dtype("experts")) == ("bf16", "int4")
    from meshplan.catalog.quant import _covers

    assert _covers("model.layers.0.", "model.layers.0.block_sparse_moe.experts.0.w2")
    assert not _covers("model.layers.0.", "model.layers.10.block_sparse_moe.experts.0.w2")
    assert _covers("layers.0.", "model.language_model.layers.0.mlp.down_proj")
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 8}
    m = from_hf_config(cfg, "gptq")
    assert (m.component_dtype("attention"), m.component_dtype("experts")) == ("int8", "int8")


def test_ignore_entries_match_whole_name_parts_not_substrings():
    # MiniMax's `gate` (the router) must not exclude the experts' projections
    cfg = {**raw("Qwen--Qwen3-235B-A22B-FP8"), "quantization_config": {
        "quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["gate", "o"]}}
    m = from_hf_config(cfg, "x")
    assert m.component_dtype("experts") == "fp8" and m.component_dtype("attention") == "fp8"


# ------------------------------------------------------------------ KV bytes per token, by hand

# KV bytes per token at TP1, bf16 cache (2 bytes per element), full-attention layers only:
#   GQA/MHA: 2 (K and V) x full layers x num_key_value_heads x head_dim x 2
#   MLA:     full layers x (kv_lora_rank + qk_rope_head_dim) x 2
KV = {
    "meta-llama--Meta-Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,        # 131,072
    "meta-llama--Meta-Llama-3.1-70B": 2 * 80 * 8 * 128 * 2,       # 327,680
    "Qwen--Qwen3-32B": 2 * 64 * 8 * 128 * 2,                      # 262,144
    "Qwen--Qwen3-32B-FP8": 2 * 64 * 8 * 128 * 2,
    "Qwen--Qwen3-235B-A22B-FP8": 2 * 94 * 4 * 128 * 2,            # 192,512
    "MiniMaxAI--MiniMax-M2.5": 2 * 62 * 8 * 128 * 2,              # 253,952
    "deepseek-ai--DeepSeek-R1": 61 * (512 + 64) * 2,              # 70,272
    "moonshotai--Kimi-K2.5": 61 * (512 + 64) * 2,
    "nvidia--Kimi-K2.5-NVFP4": 61 * (512 + 64) * 2,
    "nvidia--DeepSeek-V3.1-NVFP4": 61 * (512 + 64) * 2,
    # layer_types: 18 full_attention of 36 (the 18 sliding_attention layers hold at most 128 tokens)
    "openai--gpt-oss-120b": 2 * 18 * 8 * 64 * 2,                  # 36,864
    # layer_types: 15 full_attention of 60, the 45 linear_attention layers hold no KV
    "Qwen--Qwen3.5-397B-A17B": 2 * 15 * 2 * 256 * 2,              # 30,720
    # full_attention_interval 4 over 48 layers: 12 full-attention layers
    "Qwen--Qwen3-Next-80B-A3B-Thinking": 2 * 12 * 2 * 256 * 2,    # 24,576
}


@pytest.mark.parametrize("stem", sorted(KV))
def test_kv_bytes_per_token_by_hand(stem):
    assert kv_bytes_per_token(load(stem), TP1, "bf16") == KV[stem]


def test_sliding_and_linear_attention_state_per_sequence_by_hand():
    oss = load("openai--gpt-oss-120b")
    # 18 sliding layers x 2 x 8 KV heads x 64 x 2 bytes x 128-token window
    assert sliding_bytes_per_seq(oss, TP1, "bf16") == 18 * 2 * 8 * 64 * 2 * 128
    q35 = load("Qwen--Qwen3.5-397B-A17B")
    # per linear layer: recurrent state 64 value heads x 128 key dim x 128 value dim, plus the conv window
    # (kernel 4 - 1) x (2 x 16 key heads x 128 + 64 value heads x 128) channels; 45 layers; 2 bytes each
    per_layer = 64 * 128 * 128 + 3 * (2 * 16 * 128 + 64 * 128)
    assert linear_state_bytes_per_seq(q35, TP1) == 45 * per_layer * 2
    assert linear_state_bytes_per_seq(q35, Layout(tp=4)) == 45 * per_layer * 2 / 4
    # the case: counting the linear layers as full attention overstated KV 4x (60 vs 15 layers)
    assert 2 * 60 * 2 * 256 * 2 / kv_bytes_per_token(q35, TP1, "bf16") == 4


# ------------------------------------------------------------------ parameters against the model cards

# Published totals (Hugging Face model cards): Llama 3.1 8B 8.03B, 70B 70.6B; Qwen3-235B-A22B 235B;
# DeepSeek-R1 671B; Kimi-K2.5 1T; gpt-oss-120b 116.8B (117B); MiniMax-M2.5 229B/230B; Qwen3.5-397B-A17B 397B;
# Qwen3-Next-80B-A3B 80B. Counted from the dimensions within 5% (norms, biases, MTP and vision towers aside).
PUBLISHED = {
    "meta-llama--Meta-Llama-3.1-8B": 8.03e9, "meta-llama--Meta-Llama-3.1-70B": 70.6e9,
    "Qwen--Qwen3-235B-A22B-FP8": 235e9, "deepseek-ai--DeepSeek-R1": 671e9, "moonshotai--Kimi-K2.5": 1.0e12,
    "openai--gpt-oss-120b": 116.8e9, "MiniMaxAI--MiniMax-M2.5": 229e9, "Qwen--Qwen3.5-397B-A17B": 397e9,
    "Qwen--Qwen3-Next-80B-A3B-Thinking": 80e9,
}


@pytest.mark.parametrize("stem", sorted(PUBLISHED))
def test_parameter_count_matches_the_model_card(stem):
    assert load(stem).total_params == pytest.approx(PUBLISHED[stem], rel=0.05)


def test_int4_experts_weigh_a_quarter_of_bf16_and_attention_stays_bf16():
    kimi = load("moonshotai--Kimi-K2.5")
    w = weight_bytes_per_gpu(kimi, TP1, "int4")
    # experts: 60 MoE layers x 384 x 3 x 7168 x 2048 params at 0.5 + 2/128 bytes (INT4, FP16 scale per 128)
    experts = 60 * 384 * 3 * 7168 * 2048 * (0.5 + 2 / 128)
    # everything else at 2 bytes: MLA attention per layer (q_a, q_b, kv_a, kv_b, o), 1 dense layer, 60 shared
    # experts, router (bf16), embeddings + LM head
    attn = (7168 * 1536 + 1536 * 64 * 192) + 7168 * (512 + 64) + 512 * 64 * (128 + 128) + 64 * 128 * 7168
    rest = (61 * attn + 3 * 7168 * 18432 + 60 * 3 * 7168 * 2048) * 2 + 60 * 7168 * 384 * 2 + 2 * 163840 * 7168 * 2
    assert w == pytest.approx(experts + rest, rel=1e-9)


# ------------------------------------------------------------------ precision.weights: auto

def test_auto_never_plans_a_dtype_the_checkpoint_does_not_ship():
    gb200, h100 = get_gpu("gb200"), get_gpu("h100")
    r1 = load("deepseek-ai--DeepSeek-R1")
    # FP4 is allowed by the floor and fits, but the checkpoint is FP8 and no engine makes FP4 from it online
    assert choose_precision(r1, gb200, accuracy_floor="fp4", engine="vllm")[0] == "fp8"
    assert choose_precision(r1, h100, accuracy_floor="fp4", engine="vllm", gpus=8)[0] == "fp8"
    assert choose_precision(load("moonshotai--Kimi-K2.5"), gb200, engine="sglang")[0] == "int4"
    assert choose_precision(load("Qwen--Qwen3-235B-A22B-FP8"), gb200, accuracy_floor="fp4")[0] == "fp8"
    assert choose_precision(load("MiniMaxAI--MiniMax-M2.5"), gb200, accuracy_floor="fp4")[0] == "fp8"
    assert choose_precision(load("openai--gpt-oss-120b"), h100)[0] == "fp4"


def test_auto_converts_bf16_to_fp8_online_only_where_the_engine_can():
    l70 = load("meta-llama--Meta-Llama-3.1-70B")          # 141 GB of bf16 weights
    l40s = get_gpu("l40s")                                 # 48 GB: 2 GPUs x 0.6 = 57.6 GB for weights
    assert choose_precision(l70, l40s, gpus=2, engine="vllm")[0] == "fp8"     # vLLM --quantization fp8
    assert choose_precision(l70, l40s, gpus=2, engine="sglang")[0] == "fp8"
    assert choose_precision(l70, l40s, gpus=2, engine="trtllm")[0] == "bf16"  # TensorRT-LLM: offline only
    assert choose_precision(l70, l40s, gpus=2, engine="vllm", accuracy_floor="bf16")[0] == "bf16"
    # plenty of memory: kept as shipped
    assert choose_precision(l70, get_gpu("h200"), engine="vllm")[0] == "bf16"


def _spec_from_config(stem: str, **spec) -> LLMDeploymentSpec:
    m = load(stem)
    return LLMDeploymentSpec.model_validate(
        {"model": {"name": stem.replace("--", "/"), "architecture": architecture_manifest(m)}, **spec})


def test_architecture_from_config_json_reaches_the_planner_unchanged():
    for stem in DTYPES:
        m = load(stem)
        via_spec = model_from_spec(_spec_from_config(stem).model)
        assert kv_bytes_per_token(via_spec, TP1, "bf16") == kv_bytes_per_token(m, TP1, "bf16"), stem
        assert linear_state_bytes_per_seq(via_spec, TP1) == linear_state_bytes_per_seq(m, TP1), stem
        assert sliding_bytes_per_seq(via_spec, TP1, "bf16") == sliding_bytes_per_seq(m, TP1, "bf16"), stem
        assert via_spec.native_dtype == m.native_dtype and via_spec.checkpoint_fixed, stem
        for c in ("attention", "dense", "shared", "experts"):
            if c == "dense" and not m.dense_layers or c == "shared" and not m.num_shared_experts:
                continue
            assert via_spec.component_dtype(c) == m.component_dtype(c), (stem, c)
        # tied embeddings are not an API field; otherwise the same weights
        if not m.tie_word_embeddings:
            assert weight_bytes_per_gpu(via_spec, TP1, m.native_dtype) == pytest.approx(
                weight_bytes_per_gpu(m, TP1, m.native_dtype), rel=1e-9), stem


def test_deepseek_r1_architecture_on_gb200_plans_fp8_not_bf16():
    # the issue's case: spec.model.architecture copied from DeepSeek-R1's config.json on GB200
    spec = _spec_from_config("deepseek-ai--DeepSeek-R1", gpus={"products": ["gb200"], "maxGpus": 72})
    p = plan_for_spec(spec, space=SearchSpace(chunk_sizes=(2048,), max_num_seqs=(64, 256),
                                              accuracy_floor="fp4"))
    assert p.choice is not None and p.choice.weight_dtype == "fp8"
    assert any("checkpoint ships fp8" in n for n in p.extra["notes"])
    # without weightDtype the checkpoint's dtype is unknown: the old free rule applies, and says nothing
    arch = {k: v for k, v in architecture_manifest(load("deepseek-ai--DeepSeek-R1")).items() if k != "weightDtype"}
    spec2 = LLMDeploymentSpec.model_validate({"model": {"name": "r1", "architecture": arch},
                                              "gpus": {"products": ["gb200"], "maxGpus": 72}})
    assert not model_from_spec(spec2.model).checkpoint_fixed


def test_total_params_is_honoured_and_a_wrong_one_warns():
    base = architecture_manifest(load("Qwen--Qwen3-32B"))
    computed = model_from_spec(_spec_from_config("Qwen--Qwen3-32B").model)
    weights = {}
    for factor in (1.0, 10.0, 0.1):
        arch = {**base, "totalParams": int(computed.total_params * factor)}
        spec = LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-32B", "architecture": arch},
                                                 "gpus": {"products": ["h100"], "maxGpus": 8}})
        m = model_from_spec(spec.model)
        weights[factor] = weight_bytes_per_gpu(m, TP1, "bf16")
        p = plan_for_spec(spec, space=SearchSpace(chunk_sizes=(2048,), max_num_seqs=(64,)))
        warned = [w for w in plan_to_dict(p)["warnings"] if "totalParams" in w]
        assert bool(warned) == (factor != 1.0), factor
        if warned:
            assert f"{100 * (factor - 1):+.0f}%" in warned[0] and "10%" in warned[0]
            assert any(n.startswith("warning: spec.model.architecture.totalParams") for n in p.extra["notes"])
            assert "warning: spec.model.architecture.totalParams" in p.reason  # -> status.plan.reason
    # x10 and /10 no longer plan the same
    assert weights[10.0] == pytest.approx(10 * weights[1.0], rel=1e-6)
    assert weights[0.1] == pytest.approx(0.1 * weights[1.0], rel=1e-6)
    # within the tolerance: no warning
    ok = {**base, "totalParams": int(computed.total_params * 1.05)}
    assert not model_from_spec(LLMDeploymentSpec.model_validate(
        {"model": {"name": "q", "architecture": ok}}).model).params_warning()


# ------------------------------------------------------------------ Hugging Face ids as spec.model.name

def test_hf_id_is_accepted_as_model_name_and_matched_to_the_catalogue():
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}})
    assert validate_semantics(spec) == []
    assert model_from_spec(spec.model) is get_model("llama-3.1-8b")
    assert model_from_spec(LLMDeploymentSpec.model_validate(
        {"model": {"name": "deepseek-ai/DeepSeek-R1"}}).model).name == "deepseek-r1"


@pytest.mark.parametrize("hf_id,stem", [("Qwen/Qwen3-235B-A22B-FP8", "Qwen--Qwen3-235B-A22B-FP8"),
                                        ("Qwen/Qwen3-32B-FP8", "Qwen--Qwen3-32B-FP8"),
                                        ("nvidia/DeepSeek-V3.1-NVFP4", "nvidia--DeepSeek-V3.1-NVFP4")])
def test_quantized_checkpoint_ids_match_the_catalogue_at_their_config_dtypes(hf_id, stem):
    cat, cfg = get_model(hf_id), load(stem)
    assert cat.checkpoint_fixed and cat.native_dtype == cfg.native_dtype
    for c in ("attention", "experts") if cfg.is_moe else ("attention", "dense"):
        assert cat.component_dtype(c) == cfg.component_dtype(c), c
    assert kv_bytes_per_token(cat, TP1, "bf16") == KV[stem]
    spec = LLMDeploymentSpec.model_validate({"model": {"name": hf_id}})
    assert validate_semantics(spec) == []


def test_unknown_hf_id_needs_an_architecture_and_says_so():
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "moonshotai/Kimi-K2.5"}})
    problems = validate_semantics(spec)
    assert len(problems) == 1 and "spec.model.name 'moonshotai/Kimi-K2.5'" in problems[0]
    assert "spec.model.architecture" in problems[0]
    with pytest.raises(ValueError, match=r"spec.model.name: unknown model 'moonshotai/Kimi-K2.5'"):
        model_from_spec(spec.model)
    # with the architecture from its config.json it plans
    assert validate_semantics(_spec_from_config("moonshotai--Kimi-K2.5")) == []


@pytest.mark.parametrize("bad", ["org/", "/name", "a/b/c", "org/-flag", "--trust-remote-code", "org name"])
def test_malformed_model_names_are_refused(bad):
    with pytest.raises(pydantic.ValidationError, match="name"):
        LLMDeploymentSpec.model_validate({"model": {"name": bad}})


def test_linear_attention_fields_need_their_heads():
    arch = {**architecture_manifest(load("Qwen--Qwen3.5-397B-A17B"))}
    del arch["linearValueHeads"]
    with pytest.raises(pydantic.ValidationError, match="linearValueHeads"):
        LLMDeploymentSpec.model_validate({"model": {"name": "q", "architecture": arch}})
    arch = {**architecture_manifest(load("openai--gpt-oss-120b"))}
    del arch["slidingWindow"]
    with pytest.raises(pydantic.ValidationError, match="slidingWindow is required"):
        LLMDeploymentSpec.model_validate({"model": {"name": "o", "architecture": arch}})


def test_architecture_command_prints_a_spec_that_parses(capsys):
    from meshplan.cli import main

    assert main(["architecture", str(FIX / "moonshotai--Kimi-K2.5_config.json")]) == 0
    import yaml

    doc = yaml.safe_load(capsys.readouterr().out)
    manifest = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "k"},
                "spec": doc["spec"]}
    spec = LLMDeployment.from_manifest(manifest).spec
    assert spec.model.name == "moonshotai/Kimi-K2.5"
    assert spec.model.architecture.weight_dtype == "int4" and spec.model.architecture.attention_dtype == "bf16"
