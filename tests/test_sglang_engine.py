"""SGLang 0.5.23 findings of issue #15, each against the rule read from SGLang's source (cited in
meshplan/engines/sglang.py). The argv these produce is parsed by SGLang's own parser in
tests/conformance/test_sglang.py."""

from __future__ import annotations

import pytest

from meshplan.planner.engines import check_knobs, engine_layout  # first: meshplan.engines imports the planner
from meshplan.catalog.gpus import get_gpu  # noqa: I001
from meshplan.catalog.models import get_model
from meshplan.engines import sglang
from meshplan.planner.memory import memory_fit
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
from meshplan.render.engine_args import PodRole, RenderError, ServingOptions, engine_command

_PRED = Prediction(ttft_ms=0, tpot_ms=0, tokens_per_s_per_gpu=0, tokens_per_s_per_user=0, concurrency=0)
_MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)


def _argv(layout, *, model="deepseek-ai/DeepSeek-R1", wd="fp8", kvd="fp8", ckpt="fp8", chunk=1024, seqs=256,
          mem=_MEM, gpu="", **serving) -> list[str]:
    cand = Candidate(layout=layout, weight_dtype=wd, kv_dtype=kvd, chunk_size=chunk, max_num_seqs=seqs,
                     memory=mem, prediction=_PRED, engine="sglang", gpu=gpu)
    try:   # the expert count options_from_spec gives the renderer (the EPLB rule sizes redundant experts by it)
        serving.setdefault("num_experts", get_model(model).num_experts)
    except KeyError:
        pass
    opts = ServingOptions(engine="sglang", model=model, checkpoint_dtype=ckpt, **serving)
    return list(engine_command(cand, opts, PodRole(gpus_per_pod=layout.tp * layout.ep)).args)


def _flag(argv: list[str], name: str):
    return argv[argv.index(name) + 1] if name in argv else None


def test_chunk_is_per_attention_dp_rank_and_divides_by_the_page_size():
    """DeepSeek-R1 EP16 on GB200 with chunk 128: SGLang divides --chunked-prefill-size by attn-dp-size
    (16) and asserts the result divides by page_size (64 on Blackwell MLA). Before: 128 / 16 = 8."""
    el = engine_layout(Layout(tp=1, ep=16), "sglang", chunk_size=128)
    rendered = el.flags["--chunked-prefill-size"]
    assert rendered == 128 * 16
    assert rendered // el.flags["--attn-dp-size"] == 128 and (rendered // 16) % 64 == 0
    # no attention DP: the chunk is rendered as planned
    assert engine_layout(Layout(tp=8), "sglang", chunk_size=2048).flags["--chunked-prefill-size"] == 2048


def test_search_refuses_chunks_sglang_pages_cannot_divide():
    assert "multiple of 128" in check_knobs("sglang", 100, 64)
    assert check_knobs("sglang", 128, 400) is None and check_knobs("sglang", 8192, 64) is None


def test_max_running_requests_is_per_replica_as_planned():
    """SGLang: per server; each attention-DP worker gets N // attn-dp (pool_configurator.py)."""
    el = engine_layout(Layout(tp=1, ep=16), "sglang", max_num_seqs=64)
    assert el.flags["--max-running-requests"] == 64
    odd = engine_layout(Layout(tp=1, ep=16), "sglang", max_num_seqs=100)
    assert any("100 // 16 = 6" in n for n in odd.notes)


def test_mem_fraction_static_gives_sglang_the_planned_kv_budget():
    """SGLang 0.5.23 KV = f x (total - runtime) - weights; the planner's KV = usable - weights - act - runtime.
    Before: the planner's 0.9 was rendered as is, so SGLang sized KV as if activations took nothing."""
    model, gpu, layout = get_model("llama-3.1-70b"), get_gpu("NVIDIA-H100-80GB-HBM3"), Layout(tp=4)
    fit = memory_fit(model, gpu, layout, weight_dtype="bf16", kv_dtype="bf16", context_tokens=8192,
                     chunk_size=8192, engine="sglang", memory_fraction=0.9)
    argv = _argv(layout, model="meta-llama/Llama-3.1-70B", wd="bf16", kvd="bf16", ckpt="bf16", chunk=8192,
                 mem=fit, gpu=gpu.name)
    f = float(_flag(argv, "--mem-fraction-static"))
    assert f < 0.9
    sglang_kv = f * (gpu.memory_bytes - fit.runtime_bytes) - fit.weights_bytes
    planned_kv = fit.usable_bytes - fit.weights_bytes - fit.activation_bytes - fit.runtime_bytes
    assert planned_kv * 0.995 <= sglang_kv <= planned_kv   # rounded down to 3 decimals: never more than planned
    # without a memory fit (hand-built plans) the plan's fraction is rendered unchanged
    assert _flag(_argv(layout, model="meta-llama/Llama-3.1-70B", wd="bf16", ckpt="bf16"), "--mem-fraction-static") == "0.9"


def test_eplb_renders_redundant_experts():
    argv = _argv(Layout(tp=1, ep=8))
    assert "--enable-eplb" in argv and _flag(argv, "--ep-num-redundant-experts") == "8"
    assert "--enable-eplb" not in _argv(Layout(tp=1, ep=8), expert_load_balancing="disabled")


def test_eplb_is_not_rendered_for_mixtral():
    """SGLang's Mixtral has no get_model_config_for_expert_location: --enable-eplb asserts at start-up."""
    argv = _argv(Layout(tp=1, ep=2), model="mistralai/Mixtral-8x7B-Instruct-v0.1", wd="bf16", kvd="bf16", ckpt="bf16")
    assert "--enable-eplb" not in argv and "--ep-num-redundant-experts" not in argv
    with pytest.raises(RenderError, match="expertLoadBalancing"):
        _argv(Layout(tp=1, ep=2), model="mistralai/Mixtral-8x7B-Instruct-v0.1", wd="bf16", kvd="bf16", ckpt="bf16",
              expert_load_balancing="enabled")


def test_pinned_weight_and_kv_dtypes_render_a_flag_or_are_refused():
    assert _flag(_argv(Layout(tp=8), wd="fp8", ckpt="bf16"), "--quantization") == "fp8"
    assert _flag(_argv(Layout(tp=8), wd="fp4", ckpt="bf16"), "--quantization") == "nvfp4_online"
    assert _flag(_argv(Layout(tp=8), kvd="fp4"), "--kv-cache-dtype") == "nvfp4"
    assert _flag(_argv(Layout(tp=8), kvd="fp8"), "--kv-cache-dtype") == "fp8_e4m3"
    for wd in ("int4", "int8"):
        with pytest.raises(RenderError, match="spec.precision.weights"):
            _argv(Layout(tp=8), wd=wd, ckpt="bf16")
    assert "--quantization" not in _argv(Layout(tp=8), wd="int4", ckpt="int4")   # AWQ/GPTQ checkpoint: its config
    with pytest.raises(RenderError, match="spec.precision.kvCache"):
        _argv(Layout(tp=8), kvd="int8")


def test_0_5_23_spellings_not_the_deprecated_ones():
    argv = _argv(Layout(tp=2, ep=4), cuda_graphs="disabled")
    assert _flag(argv, "--attn-dp-size") == "4" and "--enable-dp-attention" not in argv and "--dp-size" not in argv
    assert "--disable-cuda-graph" not in argv
    assert _flag(argv, "--cuda-graph-backend-decode") == "disabled"
    assert _flag(argv, "--cuda-graph-backend-prefill") == "disabled"


def test_default_image_is_the_checked_release():
    from meshplan.catalog.engine_options import VERSIONS

    assert sglang.DEFAULT_IMAGE == "lmsysorg/sglang:v0.5.23" == f"lmsysorg/sglang:v{VERSIONS['sglang']}"
