"""Catalogue facts: parameter counts against published totals, KV bytes against
DeepSeek's published per-token figures, HF config parsing, name lookups."""

from __future__ import annotations

import pytest

from meshplan.catalog.gpus import GPUS, get_gpu
from meshplan.catalog.models import MODELS, from_hf_config, get_model, param_count
from meshplan.planner.memory import kv_bytes_per_token
from meshplan.planner.types import Layout

# (catalogue name, published total params, published active params or None); sources:
# model cards on huggingface.co (Meta, Mistral, Qwen, DeepSeek, OpenAI) and the NVIDIA blog.
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, None),
    ("llama-3.1-70b", 70.6e9, None),
    ("llama-3.1-405b", 405e9, None),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("mixtral-8x22b", 141e9, 39e9),
    ("qwen3-32b", 32.8e9, None),
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("deepseek-v3", 671e9, 37e9),
    ("deepseek-r1", 671e9, 37e9),
    ("gpt-oss-120b", 116.8e9, None),   # OpenAI's 5.1B active excludes the embedding table
    ("gpt-moe-1.8t", 1.8e12, None),
    ("minimax-m2", 230e9, None),      # 230B: Xinference's model spec for MiniMaxAI/MiniMax-M2.5 ("Model Size
                                      # (in billions): 230", inference.readthedocs.io models/builtin/llm)
]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_param_count_matches_published_totals(name, total, active):
    arch = get_model(name)
    t, a = param_count(arch)
    assert t == pytest.approx(total, rel=0.03)
    if active is not None:
        assert a == pytest.approx(active, rel=0.05)
    assert a <= t


def test_dense_models_are_all_active_and_moe_models_are_not():
    for m in MODELS.values():
        if m.is_moe:
            assert m.active_params < 0.5 * m.total_params, m.name
        else:
            assert m.active_params == m.total_params, m.name


def test_kv_bytes_per_token_match_deepseek_paper_figures():
    # DeepSeek-V3 report: MLA caches 70,272 B/token (bf16); Llama-3.1-405B ~516 KB.
    assert kv_bytes_per_token(get_model("deepseek-v3"), Layout(), "bf16") == 70_272
    assert kv_bytes_per_token(get_model("llama-3.1-405b"), Layout(), "bf16") == 516_096


def test_from_hf_config_dense_gqa_reproduces_qwen25_72b_kv_figure():
    # Qwen2.5-72B config.json (huggingface.co/Qwen/Qwen2.5-72B); DeepSeek lists 327 KB/token.
    cfg = {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
           "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064,
           "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 70}
    arch = from_hf_config(cfg, "qwen2.5-72b")
    assert arch.sliding_window_layers == 0
    assert kv_bytes_per_token(arch, Layout(), "bf16") == 327_680
    assert arch.total_params == pytest.approx(72.7e9, rel=0.03)


def test_from_hf_config_mla_deepseek():
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
           "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512,
           "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
           "vocab_size": 129280, "quantization_config": {"quant_method": "fp8"}}
    arch = from_hf_config(cfg, "deepseek-v3-from-config")
    assert arch.is_mla and arch.is_moe
    assert arch.native_dtype == "fp8"
    assert arch.total_params == pytest.approx(get_model("deepseek-v3").total_params, rel=1e-9)


def test_from_hf_config_moe_variants():
    mixtral = from_hf_config({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                              "num_local_experts": 8, "num_experts_per_tok": 2}, "m")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.moe_intermediate_size) == (8, 2, 14336)
    qwen_moe = from_hf_config({"num_hidden_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
                               "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288,
                               "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
                               "vocab_size": 151936, "mlp_only_layers": []}, "q")
    assert qwen_moe.total_params == pytest.approx(235e9, rel=0.03)
    assert qwen_moe.active_params == pytest.approx(22e9, rel=0.05)
    oss = from_hf_config({"num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                          "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
                          "num_local_experts": 128, "experts_per_token": 4, "vocab_size": 201088,
                          "sliding_window": 128,
                          "layer_types": ["sliding_attention", "full_attention"] * 18,
                          "quantization_config": {"quant_method": "mxfp4"}}, "o")
    assert (oss.sliding_window, oss.sliding_window_layers, oss.native_dtype) == (128, 18, "fp4")
    assert oss.total_params == pytest.approx(116.8e9, rel=0.03)


def test_from_hf_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        from_hf_config({"hidden_size": 8}, "broken")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        from_hf_config({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                        "vocab_size": 10, "num_local_experts": 8}, "broken-moe")


def test_get_model_accepts_names_and_hf_ids_case_insensitively():
    assert get_model("Llama-3.1-70B").name == "llama-3.1-70b"
    assert get_model("meta-llama/Llama-3.1-70B").name == "llama-3.1-70b"
    assert get_model("deepseek-ai/DeepSeek-R1").name == "deepseek-r1"
    with pytest.raises(KeyError, match="gpt-moe-1.8t"):
        get_model("no-such-model")


def test_get_gpu_accepts_canonical_plain_and_gfd_label_names():
    assert get_gpu("h100").name == "h100_sxm"
    assert get_gpu("NVIDIA-H100-80GB-HBM3").name == "h100_sxm"
    assert get_gpu("b200_sxm").name == "b200_sxm"
    assert get_gpu("GB200").name == "gb200"
    with pytest.raises(KeyError, match="h200_sxm"):
        get_gpu("tpu-v5")


def test_required_gpus_present_with_consistent_facts():
    for name in ("a100_sxm_80gb", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300",
                 "l40s", "mi300x"):
        g = GPUS[name]
        assert g.source and g.memory_gib > 0 and g.hbm_tb_s > 0
        if "fp8" in g.tflops:
            assert g.tflops["fp8"] == pytest.approx(2 * g.tflops["bf16"], rel=0.02), name
        assert g.nvlink_uni_gb_s == g.nvlink_gb_s / 2
    assert GPUS["gb200"].nvlink_domain == 72 and GPUS["h100_sxm"].nvlink_domain == 8
    assert GPUS["l40s"].nvlink_domain == 1
    assert "fp4" in GPUS["b200_sxm"].tflops and "fp4" not in GPUS["h100_sxm"].tflops
    # FP4 weights on Hopper run as weight-only kernels at BF16
    assert GPUS["h100_sxm"].compute_dtype("fp4") == "bf16"


def test_every_model_has_a_source():
    for m in MODELS.values():
        assert m.source, m.name


def test_minimax_m2_catalogue_entry_is_the_real_config_for_every_release():
    # the catalogue's minimax-m2 (the evidence base's MiniMax-M2.5 and M2.7 rows) against the real MiniMax-M2.5
    # config.json (tests/fixtures/models, SOURCES.md): the same dimensions and dtypes, under every release's id
    # (M2.7's own config.json is not in the fixtures: its id is mapped on the cookbook's word, catalog/models.py)
    from pathlib import Path

    from meshplan.catalog.models import load_hf_config

    fixture = Path(__file__).resolve().parent / "fixtures" / "models" / "MiniMaxAI--MiniMax-M2.5_config.json"
    real = load_hf_config(fixture, name="MiniMaxAI/MiniMax-M2.5")
    ids = ("MiniMaxAI/MiniMax-M2", "MiniMaxAI/MiniMax-M2.1", "MiniMaxAI/MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.7")
    archs = {get_model(i) for i in ids}
    assert len(archs) == 1
    (m,) = archs
    fields = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
              "num_experts", "experts_per_token", "num_shared_experts", "moe_intermediate_size",
              "first_k_dense_layers", "sliding_window_layers", "tie_word_embeddings", "native_dtype")
    assert {f: getattr(m, f) for f in fields} == {f: getattr(real, f) for f in fields}
    assert param_count(m) == pytest.approx(param_count(real))
