"""Memory fit properties: TP/EP/PP shrink weights, KV heads replicate past TP > Hkv,
MLA is not split by TP, engine fraction semantics, the seeds' FP4 claim."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import MODELS, get_model
from meshplan.planner.memory import (
    ReplicaMapping,
    choose_precision,
    kv_bytes_per_token,
    memory_fit,
    min_gpus_for_weights,
    weight_bytes_per_gpu,
)
from meshplan.planner.types import Layout

H100 = get_gpu("h100_sxm")
B200 = get_gpu("b200_sxm")
GPU_192GB = dataclasses.replace(B200, name="b200_192gb", memory_gib=192e9 / 2**30)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_more_tp_never_increases_weights_per_gpu(name):
    m = MODELS[name]
    prev = math.inf
    for tp in (1, 2, 4, 8, 16, 32, 64):
        w = weight_bytes_per_gpu(m, Layout(tp=tp), "bf16")
        assert w <= prev
        prev = w


@pytest.mark.parametrize("name", [n for n, m in sorted(MODELS.items()) if m.is_moe])
def test_more_ep_and_pp_never_increase_weights_per_gpu(name):
    m = MODELS[name]
    for ep_a, ep_b in ((1, 2), (2, 4), (4, 8)):
        assert weight_bytes_per_gpu(m, Layout(ep=ep_b), "fp8") < weight_bytes_per_gpu(m, Layout(ep=ep_a), "fp8")
    assert weight_bytes_per_gpu(m, Layout(pp=4), "fp8") < weight_bytes_per_gpu(m, Layout(pp=2), "fp8")


def test_kv_heads_replicate_once_tp_exceeds_kv_heads():
    llama = get_model("llama-3.1-70b")   # 8 KV heads
    kv = {tp: kv_bytes_per_token(llama, Layout(tp=tp), "bf16") for tp in (1, 2, 4, 8, 16, 32)}
    assert kv[4] == 2 * kv[8]
    assert kv[8] == kv[16] == kv[32]     # one KV head per GPU: it stops shrinking
    assert kv[1] == 8 * kv[8]


def test_mla_latent_is_not_split_by_tp():
    ds = get_model("deepseek-v3")
    assert kv_bytes_per_token(ds, Layout(tp=8), "fp8") == kv_bytes_per_token(ds, Layout(tp=1), "fp8")
    # PP splits the layers, so it does shrink the per-GPU KV
    assert kv_bytes_per_token(ds, Layout(pp=2), "fp8") < kv_bytes_per_token(ds, Layout(), "fp8")


def test_seed_claim_gpt_moe_fp4_weights_need_at_least_five_192gb_gpus():
    gpt = get_model("gpt-moe-1.8t")
    assert min_gpus_for_weights(gpt, GPU_192GB, "fp4") >= 5
    # and four such GPUs (EP4) indeed cannot hold the model
    fit = memory_fit(gpt, GPU_192GB, Layout(ep=4), weight_dtype="fp4", kv_dtype="fp8", context_tokens=4096)
    assert not fit.fits
    assert "weights" in fit.reason and "use more TP/EP/PP" in fit.reason


def test_trtllm_fraction_of_free_memory_leaves_more_kv_than_fraction_of_total():
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", context_tokens=2048, memory_fraction=0.9)
    m = get_model("llama-3.1-70b")
    vllm = memory_fit(m, H100, Layout(tp=4), engine="vllm", **kw)
    trt = memory_fit(m, H100, Layout(tp=4), engine="trtllm", **kw)
    assert trt.kv_capacity_tokens > vllm.kv_capacity_tokens
    # vLLM/SGLang: weights + KV + activations + runtime stay within fraction x total
    used = vllm.weights_bytes + vllm.activation_bytes + vllm.runtime_bytes + \
        vllm.kv_capacity_tokens * vllm.kv_bytes_per_token
    assert used <= 0.9 * H100.memory_bytes * (1 + 1e-9)


def _gib_figures(reason):
    import re

    return [float(x) for x in re.findall(r"([0-9][0-9,]*\.[0-9]) GiB", reason.replace(",", ""))]


@pytest.mark.parametrize("engine,headroom", [("trtllm", 0.0), ("trtllm", 0.1), ("vllm", 0.0), ("sglang", 0.1)])
def test_weights_rejection_states_the_true_need_and_limit(engine, headroom):
    """Defect (issue 16): TensorRT-LLM's rejection said "= 955.3 GiB per GPU exceed the 955.3 GiB usable":
    the "usable" figure was built from the need itself. The message must give the need and the real limit
    (all memory less headroom for TensorRT-LLM, the memory fraction of total for vLLM/SGLang)."""
    gpt = get_model("gpt-moe-1.8t")
    gb200 = get_gpu("gb200")
    fit = memory_fit(gpt, gb200, Layout(), weight_dtype="fp4", kv_dtype="fp8", context_tokens=4096,
                     engine=engine, memory_fraction=0.9, headroom=headroom)
    assert not fit.fits
    need = (fit.weights_bytes + fit.activation_bytes + fit.runtime_bytes) / 2**30
    limit = gb200.memory_bytes / 2**30 * ((1 - headroom) if engine == "trtllm" else (0.9 - headroom))
    figures = _gib_figures(fit.reason)
    # weights, activations, runtime, their sum, the limit, the GPU's total
    assert figures[3] == pytest.approx(need, abs=0.05)
    assert figures[4] == pytest.approx(limit, abs=0.05)
    assert figures[3] > figures[4]
    assert fit.usable_bytes == pytest.approx(limit * 2**30)


def test_headroom_and_longer_context_never_raise_capacity():
    m = get_model("qwen3-32b")
    base = memory_fit(m, H100, Layout(tp=2), weight_dtype="bf16", kv_dtype="bf16", context_tokens=4096)
    tight = memory_fit(m, H100, Layout(tp=2), weight_dtype="bf16", kv_dtype="bf16", context_tokens=4096,
                       headroom=0.1)
    longer = memory_fit(m, H100, Layout(tp=2), weight_dtype="bf16", kv_dtype="bf16", context_tokens=16384)
    assert tight.kv_capacity_tokens < base.kv_capacity_tokens
    assert longer.max_concurrency < base.max_concurrency
    assert base.max_concurrency * 4096 <= base.kv_capacity_tokens


def test_attention_dp_multiplies_replica_kv_capacity():
    ds = get_model("deepseek-v3")
    one = memory_fit(ds, B200, ReplicaMapping(attn_tp=8, attn_dp=1, moe_tp=1, moe_ep=8), weight_dtype="fp4",
                     kv_dtype="fp8", context_tokens=2048)
    dp8 = memory_fit(ds, B200, ReplicaMapping(attn_tp=1, attn_dp=8, moe_tp=1, moe_ep=8), weight_dtype="fp4",
                     kv_dtype="fp8", context_tokens=2048)
    assert dp8.kv_capacity_tokens > 4 * one.kv_capacity_tokens


def test_sliding_window_layers_cost_per_sequence_not_per_token():
    oss = get_model("gpt-oss-120b")
    full_only = kv_bytes_per_token(oss, Layout(), "fp8")
    everything = kv_bytes_per_token(oss, Layout(), "fp8", include_sliding=True)
    assert full_only == pytest.approx(everything / 2)


def test_choose_precision_rule():
    assert choose_precision(get_model("llama-3.1-8b"), H100) == ("bf16", "fp8")
    # native checkpoints are never up-cast
    assert choose_precision(get_model("gpt-oss-120b"), H100)[0] == "fp4"
    assert choose_precision(get_model("deepseek-v3"), H100, gpus=16)[0] == "fp8"
    # one 8-GPU H100 node cannot hold DeepSeek in FP8 (671 GB), but its checkpoint ships FP8 and no engine
    # makes INT4 from it online: it stays FP8 (the memory fit then asks for more GPUs), never a dtype the
    # published checkpoint does not ship in (issue 16)
    assert choose_precision(get_model("deepseek-v3"), H100)[0] == "fp8"
    assert choose_precision(get_model("deepseek-v3"), B200, accuracy_floor="fp4")[0] == "fp8"
    # too big for bf16 or fp8 within one B200 domain -> fp4 on Blackwell
    assert choose_precision(get_model("gpt-moe-1.8t"), B200)[0] == "fp4"
    # the accuracy floor is never crossed
    assert choose_precision(get_model("gpt-moe-1.8t"), B200, accuracy_floor="fp8")[0] == "fp8"
    # A100 has no FP8 tensor cores, so no online FP8 either; the BF16 checkpoint stays BF16
    w, kv = choose_precision(get_model("llama-3.1-405b"), get_gpu("a100"), engine="vllm")
    assert w == "bf16" and kv == "bf16"
    # on H100 vLLM quantizes the BF16 checkpoint to FP8 while loading; TensorRT-LLM cannot
    assert choose_precision(get_model("llama-3.1-405b"), H100, engine="vllm")[0] == "fp8"
    assert choose_precision(get_model("llama-3.1-405b"), H100, engine="trtllm")[0] == "bf16"
    with pytest.raises(ValueError, match="accuracy_floor"):
        choose_precision(get_model("llama-3.1-8b"), H100, accuracy_floor="fp2")
