"""The seeds' (NVIDIA blog's) claims about GPT-MoE-1.8T on 64 GPUs of 192 GB, as RATIOS.

Source: NVIDIA, "Demystifying AI Inference Deployments for Trillion Parameter
LLMs" (2024), summarised in shared/seeds/000_*.txt and checked in
shared/docs/planner.md. The blog's charts are images, so only ratios and
rankings are tested, with the margins issue 4 sets.

How a claim "A gives x times the tokens/s/user of B at y less tokens/s/GPU" is
read: each layout is swept over chunk sizes and batch limits (its own
throughput/interactivity curve, as in the blog's chart); B's operating point is
its highest tokens/s/GPU at the blog's reading speed (>= 20 tokens/s/user); A
must have a point meeting both ratios against that point. Layouts are evaluated
with the blog's own semantics (`as_engine_runs=False`).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.catalog.gpus import BLOG_GPU
from meshplan.catalog.models import get_model
from meshplan.planner import memory
from meshplan.planner.search import SearchSpace, search
from meshplan.planner.types import Workload

GPT = get_model("gpt-moe-1.8t")
READING_SPEED = 20.0          # tokens/s/user, the blog's reading speed
WORKLOAD = Workload(isl=1024, osl=256)

def curve(tp: int, ep: int, pp: int, chunks=None):
    space = SearchSpace(tensor=tp, expert=ep, pipeline=pp, weight_dtype="fp4", kv_dtype="fp8")
    if chunks:
        space = replace(space, chunk_sizes=chunks)
    res = search(GPT, BLOG_GPU, 64, WORKLOAD, engine="trtllm", space=space, as_engine_runs=False)
    assert res.candidates, f"TP{tp}xEP{ep}xPP{pp} produced no candidate: {res.rejected}"
    return res.candidates


def best_at(cands, min_tokens_per_s_per_user: float):
    ok = [c for c in cands if c.prediction.tokens_per_s_per_user >= min_tokens_per_s_per_user]
    return max(ok, key=lambda c: c.prediction.tokens_per_s_per_gpu) if ok else None


def test_fp4_weights_need_at_least_5_gpus():
    assert memory.min_gpus_for_weights(GPT, BLOG_GPU, "fp4") >= 5
    # and the search agrees: no replica of 4 GPUs or fewer fits
    res = search(GPT, BLOG_GPU, 64, WORKLOAD, engine="trtllm",
                 space=SearchSpace(weight_dtype="fp4", kv_dtype="fp8", chunk_sizes=(1024,), max_num_seqs=(8,)))
    assert min(c.layout.gpus_per_replica for c in res.candidates) >= 5
    assert all(r.reason.startswith("memory:") for r in res.rejected if r.layout.gpus_per_replica <= 4)


def test_ep16pp4_buys_no_interactivity_over_ep16dp4_at_the_same_per_gpu_load():
    """The seed claim (EP16PP4 gives >= 1.5x the tokens/s/user of EP16DP4 at <= 20% less tokens/s/GPU),
    restated from the physics (issue 20): a pipeline stage holds 1/pp of the layers for one microbatch,
    so at the same sequences per GPU PP4 and DP4 price alike. Our model: EP16DP4 at reading speed runs
    340.6 tokens/s/GPU at 21.3 tokens/s/user; no EP16PP4 point at >= 0.8x that throughput is faster per
    user (21.27 against 21.29). NVIDIA's AIConfigurator 0.12.0 agrees to 0.1% (PP4 against PP1, EP8 on
    B200): `python benchmarks/pp_vs_dp.py --aiconfigurator`."""
    dp4 = best_at(curve(1, 16, 1), READING_SPEED)
    assert dp4.layout.dp == 4
    assert dp4.prediction.tokens_per_s_per_gpu == pytest.approx(340.6, rel=0.03), dp4.prediction
    assert dp4.prediction.tokens_per_s_per_user == pytest.approx(21.3, rel=0.03), dp4.prediction
    pp4 = curve(1, 16, 4)
    near = [c for c in pp4 if c.prediction.tokens_per_s_per_gpu >= 0.8 * dp4.prediction.tokens_per_s_per_gpu]
    assert near, "EP16PP4 has no point within 20% of EP16DP4's throughput"
    fastest = max(c.prediction.tokens_per_s_per_user for c in near)
    # PP buys no interactivity: at most the hops' rounding above DP's, nowhere near the claimed 1.5x
    assert fastest <= 1.01 * dp4.prediction.tokens_per_s_per_user, (fastest, dp4.prediction)
    assert fastest < 1.5 * dp4.prediction.tokens_per_s_per_user
    # and its own best point at reading speed is DP4's, to 1%
    pp_best = best_at(pp4, READING_SPEED)
    assert pp_best.prediction.tokens_per_s_per_gpu == pytest.approx(dp4.prediction.tokens_per_s_per_gpu, rel=0.01)


def test_pipeline_stages_price_like_replicas_at_the_same_sequences_per_gpu():
    """Why the claim above fails: a stage holds 1/pp of the layers for one microbatch, so pp stages
    of b sequences cost what a replica of b costs, per token and per GPU (AIConfigurator agrees:
    benchmarks/pp_vs_dp.py). Only the P2P hops separate them; KV-capped rows are excluded."""
    from meshplan.planner.perf import predict
    from meshplan.planner.types import Layout

    for per_gpu in (1, 8, 32):
        dp, pp = (predict(GPT, BLOG_GPU, Layout(tp=1, ep=16, pp=n), WORKLOAD, weight_dtype="fp4",
                          kv_dtype="fp8", engine="trtllm", concurrency=per_gpu * 16 * n) for n in (1, 4))
        assert not dp.notes and not pp.notes, (dp.notes, pp.notes)
        assert pp.tokens_per_s_per_user <= dp.tokens_per_s_per_user            # the hops only add time
        assert pp.tokens_per_s_per_user == pytest.approx(dp.tokens_per_s_per_user, rel=0.01)
        assert pp.tokens_per_s_per_gpu == pytest.approx(dp.tokens_per_s_per_gpu, rel=0.01)


def test_tp4ep4pp4_doubles_throughput_of_tp64_at_no_less_interactivity():
    tp64 = best_at(curve(64, 1, 1), READING_SPEED)
    mixed = curve(4, 4, 4)
    t = tp64.prediction
    better = [c for c in mixed if c.prediction.tokens_per_s_per_user >= t.tokens_per_s_per_user]
    best = max(better, key=lambda c: c.prediction.tokens_per_s_per_gpu)
    assert best.prediction.tokens_per_s_per_gpu >= 2.0 * t.tokens_per_s_per_gpu, (best.prediction, t)


def _best_by_chunk():
    cands = curve(2, 16, 2)
    by_chunk = {}
    for chunk in sorted({c.chunk_size for c in cands}):
        b = best_at([c for c in cands if c.chunk_size == chunk], READING_SPEED)
        if b is not None:
            by_chunk[chunk] = b.prediction.tokens_per_s_per_gpu
    return by_chunk


def test_best_chunk_for_tp2ep16pp2_at_reading_speed_is_within_5_percent_of_the_best_of_256_to_2048():
    """The chunk claim restated (issue 20): the seeds put the best chunk in 512-2048; what holds is that
    the choice inside 256-2048 moves throughput at reading speed by under 5% (256: 358.0, 512: 351.8,
    1,024: 347.2, 2,048: 347.1 tokens/s/GPU) and no chunk outside it beats that range's best by more."""
    by_chunk = _best_by_chunk()
    in_range = {k: v for k, v in by_chunk.items() if 256 <= k <= 2048}
    assert set(in_range) == {256, 512, 1024, 2048}, by_chunk
    best_in_range = max(in_range.values())
    assert max(by_chunk.values()) <= 1.05 * best_in_range, by_chunk
    assert min(in_range.values()) >= 0.95 * best_in_range, by_chunk
    assert best_in_range == pytest.approx(358.0, rel=0.03), by_chunk


def test_a_128_token_chunk_cannot_keep_up_with_tp2ep16pp2s_prefill_at_reading_speed():
    """The half of the chunk claim that holds: 128 tokens cannot carry the batch's prefill at 1,024 sequences
    (the budget admits fewer), so it gives the least throughput of every chunk size."""
    by_chunk = _best_by_chunk()
    assert all(by_chunk[128] < v for k, v in by_chunk.items() if k != 128), by_chunk
    # clearly worse than the claimed range, by the original claim test's margin
    assert by_chunk[128] < 0.95 * max(v for k, v in by_chunk.items() if 512 <= k <= 2048), by_chunk
