"""The one mapping from a blog-style layout to each engine's parallel arguments."""

from __future__ import annotations

import pytest

from meshplan.catalog.models import get_model
from meshplan.planner.engines import ENGINES, check_layout, engine_layout
from meshplan.planner.types import Layout

GPT = get_model("gpt-moe-1.8t")        # 96 heads, 16 experts
LLAMA = get_model("llama-3.1-70b")     # dense, 64 heads


def test_every_engine_uses_all_gpus_of_a_replica():
    # Whatever the spelling, the engine's effective degrees must cover exactly tp*ep*pp GPUs.
    for engine in ENGINES:
        for layout in (Layout(1, 16, 1), Layout(4, 4, 4), Layout(2, 8, 2), Layout(8, 1, 2)):
            why = check_layout(layout, engine, GPT)
            if why:   # NIM: no EP; DeepSpeed-MII: no EP, no PP. The others run all four.
                assert (engine, "expert" in why or "pipeline" in why) in {("nim", True), ("deepspeed", True)}, why
                continue
            e = engine_layout(layout, engine, GPT)
            assert e.gpus_per_replica == layout.gpus_per_replica, (engine, layout)
            assert e.moe_tp * e.moe_ep * e.pp == layout.gpus_per_replica or layout.ep == 1


def test_vllm_ep_is_tp_times_dp_over_the_same_gpus():
    e = engine_layout(Layout(tp=2, ep=4, pp=2), "vllm", GPT, chunk_size=1024, max_num_seqs=64,
                      memory_fraction=0.9, kv_dtype="fp8")
    assert e.flags["--tensor-parallel-size"] == 2
    assert e.flags["--data-parallel-size"] == 4
    assert e.flags["--pipeline-parallel-size"] == 2
    assert e.flags["--enable-expert-parallel"] is True
    assert (e.moe_tp, e.moe_ep) == (1, 8)            # experts whole, EP = TP x DP
    assert not e.exact and "EP8" in e.notes[0]
    assert e.flags["--max-num-batched-tokens"] == 1024
    assert e.flags["--max-num-seqs"] == 16                 # per DP rank: 64 per replica over 4 DP ranks
    assert e.flags["--gpu-memory-utilization"] == 0.9
    assert e.flags["--kv-cache-dtype"] == "fp8"
    argv = e.argv()
    assert "--enable-expert-parallel" in argv and argv[argv.index("--data-parallel-size") + 1] == "4"


def test_vllm_dense_layout_has_no_expert_flags():
    e = engine_layout(Layout(tp=8, pp=2), "vllm", LLAMA)
    assert "--enable-expert-parallel" not in e.flags and "--data-parallel-size" not in e.flags
    assert e.exact and (e.attention_tp, e.pp) == (8, 2)


def test_vllm_rejects_ep_group_larger_than_the_experts():
    # TP2xEP16 = 32 GPUs of experts for 16 experts: vLLM cannot split experts.
    reason = check_layout(Layout(tp=2, ep=16, pp=2), "vllm", GPT)
    assert reason and "32" in reason and "16 experts" in reason
    with pytest.raises(ValueError):
        engine_layout(Layout(tp=2, ep=16, pp=2), "vllm", GPT)
    # The same layout is exact for SGLang (MoE-TP 2 x EP 16) and TensorRT-LLM.
    assert check_layout(Layout(tp=2, ep=16, pp=2), "sglang", GPT) is None
    assert check_layout(Layout(tp=2, ep=16, pp=2), "trtllm", GPT) is None


def test_heads_must_divide_by_tp_for_vllm_and_sglang():
    assert "96 attention heads" in check_layout(Layout(tp=64), "vllm", GPT)
    assert check_layout(Layout(tp=64), "sglang", GPT)
    assert check_layout(Layout(tp=32), "vllm", GPT) is None


def test_sglang_maps_the_blog_layout_exactly():
    e = engine_layout(Layout(tp=4, ep=4, pp=4), "sglang", GPT, chunk_size=896, max_num_seqs=32)
    # SGLang 0.5.23 spelling: --attn-dp-size (the deprecated --dp-size --enable-dp-attention is not rendered)
    assert e.flags["--tp-size"] == 16 and e.flags["--attn-dp-size"] == 4 and e.flags["--ep-size"] == 4
    assert "--dp-size" not in e.flags and "--enable-dp-attention" not in e.flags and e.flags["--pp-size"] == 4
    assert (e.attention_tp, e.attention_dp, e.moe_tp, e.moe_ep) == (4, 4, 4, 4)
    assert e.exact
    # SGLang divides --chunked-prefill-size by attn-dp: 896 x 4 gives each rank the planned 896
    assert e.flags["--chunked-prefill-size"] == 896 * 4 and e.flags["--max-running-requests"] == 32


def test_sglang_deepep_needs_ep_equal_tp():
    assert "DeepEP" in check_layout(Layout(tp=4, ep=4), "sglang", GPT, a2a_backend="deepep")
    e = engine_layout(Layout(tp=1, ep=16), "sglang", GPT, a2a_backend="deepep")
    assert e.flags["--tp-size"] == e.flags["--ep-size"] == 16
    assert e.flags["--moe-a2a-backend"] == "deepep"


def test_trtllm_gpus_per_worker_identity():
    # tp * pp * attention_dp == moe_tp * moe_ep * pp (AIConfigurator notation)
    for layout in (Layout(1, 16, 1), Layout(4, 4, 4), Layout(2, 16, 2), Layout(8, 1, 1)):
        e = engine_layout(layout, "trtllm", GPT)
        assert e.attention_tp * e.pp * e.attention_dp == e.moe_tp * e.moe_ep * e.pp == layout.gpus_per_replica
    e = engine_layout(Layout(tp=1, ep=16), "trtllm", GPT, max_num_seqs=128, chunk_size=2048, memory_fraction=0.85)
    assert e.config["enable_attention_dp"] is True and e.flags["--ep_size"] == 16
    # max_batch_size is per attention-DP rank: 128 per replica over 16 ranks (tests/test_trtllm_findings.py)
    assert e.flags["--max_batch_size"] == 8 and e.flags["--max_num_tokens"] == 2048
    assert e.flags["--kv_cache_free_gpu_memory_fraction"] == 0.85
    mixed = engine_layout(Layout(tp=4, ep=4, pp=4), "trtllm", GPT)
    assert mixed.config["moe_tensor_parallel_size"] == 4 and mixed.flags["--tp_size"] == 16
    assert not mixed.exact and "TP16" in mixed.notes[0]


def test_dense_model_rejects_expert_parallelism_everywhere():
    for engine in ENGINES:
        assert "dense" in check_layout(Layout(tp=2, ep=2), engine, LLAMA)


def test_unknown_engine_is_named():
    assert "use one of" in check_layout(Layout(), "tgi")  # type: ignore[arg-type]


def test_vllm_refuses_fewer_batched_tokens_than_sequences():
    from meshplan.planner.engines import check_knobs

    # vllm/config/scheduler.py: max_num_batched_tokens must be >= max_num_seqs
    assert "must be >= max_num_seqs" in check_knobs("vllm", 128, 400)
    assert check_knobs("vllm", 400, 400) is None and check_knobs("vllm", 2048, 256) is None
    assert check_knobs("sglang", 128, 400) is None and check_knobs("trtllm", 128, 400) is None
