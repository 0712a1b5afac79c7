"""Performance-model properties: monotonicity, links, admission, expert counting, and the
fitted parameters staying physical."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner import perf
from meshplan.planner.calibration import FIT_NAMES, FITTED_PARAMS
from meshplan.planner.memory import ReplicaMapping, memory_fit
from meshplan.planner.perf import distinct_experts, predict
from meshplan.planner.types import Layout, Workload

H100 = get_gpu("h100_sxm")
H200 = get_gpu("h200_sxm")
B200 = get_gpu("b200_sxm")
LLAMA70 = get_model("llama-3.1-70b")
DS = get_model("deepseek-v3")


def _p(model=LLAMA70, gpu=H100, layout=Layout(tp=4), isl=1024, osl=256, conc=16, **kw):
    kw.setdefault("weight_dtype", "fp8")
    kw.setdefault("kv_dtype", "fp8")
    return predict(model, gpu, layout, Workload(isl=isl, osl=osl), concurrency=conc, **kw)


def test_tpot_never_falls_as_concurrency_grows():
    prev = 0.0
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        t = _p(conc=c).tpot_ms
        assert t >= prev
        prev = t


def test_throughput_per_gpu_grows_with_batch_until_saturation():
    low, high = _p(conc=1), _p(conc=64)
    assert high.tokens_per_s_per_gpu > 10 * low.tokens_per_s_per_gpu
    assert high.tokens_per_s_per_user < low.tokens_per_s_per_user


def test_ttft_grows_with_input_length():
    prev = 0.0
    for isl in (128, 512, 2048, 8192, 32768):
        t = _p(isl=isl, conc=4).ttft_ms
        assert t > prev
        prev = t


def test_outputs_are_consistent():
    p = _p(conc=32)
    assert p.tokens_per_s_per_user == pytest.approx(1000.0 / p.tpot_ms)
    assert p.tokens_per_s_per_gpu == pytest.approx(32 * p.tokens_per_s_per_user / 4)
    assert 0 < p.prefill_ms <= p.ttft_ms


def test_crossing_the_nvlink_domain_slows_tensor_parallelism():
    small_domain = dataclasses.replace(H100, name="h100_4gpu_domain", nvlink_domain=4)
    inside = _p(layout=Layout(tp=8), conc=32)
    across = _p(gpu=small_domain, layout=Layout(tp=8), conc=32)
    assert across.tpot_ms > inside.tpot_ms
    assert across.ttft_ms > inside.ttft_ms


def test_expert_parallelism_beyond_the_domain_is_slower_than_inside():
    wide_domain = dataclasses.replace(B200, name="b200_nvl64", nvlink_domain=64)
    m = ReplicaMapping(attn_tp=1, attn_dp=64, moe_tp=1, moe_ep=64)
    kw = dict(model=DS, layout=m, conc=512, weight_dtype="fp4")
    assert _p(gpu=B200, **kw).tpot_ms > _p(gpu=wide_domain, **kw).tpot_ms


def test_distinct_experts_counts_only_touched_experts():
    assert distinct_experts(256, 8, 1) == pytest.approx(8)
    assert distinct_experts(256, 8, 0) == 0
    prev = 0.0
    for t in (1, 4, 16, 64, 256, 4096):
        d = distinct_experts(256, 8, t)
        assert prev < d <= 256
        prev = d
    assert distinct_experts(256, 8, 10_000) == pytest.approx(256, rel=1e-6)


def test_small_moe_batches_read_fewer_expert_weights():
    # decode at batch 1 touches 8 of 256 experts: much cheaper than reading all of them
    one = _p(model=DS, gpu=B200, layout=Layout(tp=8), conc=1, weight_dtype="fp4")
    many = _p(model=DS, gpu=B200, layout=Layout(tp=8), conc=256, weight_dtype="fp4")
    assert many.tpot_ms > 1.5 * one.tpot_ms


def test_admission_queue_when_concurrency_exceeds_kv_capacity():
    mf = memory_fit(LLAMA70, H100, Layout(tp=2), weight_dtype="fp8", kv_dtype="fp8", context_tokens=9216)
    cap = mf.max_concurrency
    assert cap > 2
    under = _p(layout=Layout(tp=2), isl=8192, osl=1024, conc=cap // 2, memory=mf)
    over = _p(layout=Layout(tp=2), isl=8192, osl=1024, conc=cap * 3, memory=mf)
    # beyond capacity the extra requests wait for whole requests to finish
    assert over.ttft_ms > 1024 * over.tpot_ms
    assert under.ttft_ms < 1024 * under.tpot_ms
    assert any("queue" in n for n in over.notes)


def test_a_small_chunk_budget_caps_the_running_batch():
    small = _p(isl=4096, osl=256, conc=256, chunk_size=256)
    large = _p(isl=4096, osl=256, conc=256, chunk_size=8192)
    assert small.tokens_per_s_per_gpu < large.tokens_per_s_per_gpu
    assert small.ttft_ms > large.ttft_ms


def test_pipeline_microbatches_multiply_concurrency_not_per_user_speed():
    m = get_model("gpt-moe-1.8t")
    gpu = dataclasses.replace(B200, name="b200_192gb", memory_gib=192e9 / 2**30)
    pp1 = _p(model=m, gpu=gpu, layout=Layout(ep=16), conc=64, weight_dtype="fp4")
    pp4 = _p(model=m, gpu=gpu, layout=Layout(ep=16, pp=4), conc=256, weight_dtype="fp4")
    # 4 stages hold 4 microbatches: 4x the sequences at about the same per-user speed and
    # per-GPU throughput (a token still crosses every layer)
    assert pp4.tokens_per_s_per_user == pytest.approx(pp1.tokens_per_s_per_user, rel=0.15)
    assert pp4.tokens_per_s_per_gpu == pytest.approx(pp1.tokens_per_s_per_gpu, rel=0.15)
    # one sequence gains nothing from PP: it waits for all four stages in turn
    one_pp1 = _p(model=m, gpu=gpu, layout=Layout(ep=16), conc=1, weight_dtype="fp4")
    one_pp4 = _p(model=m, gpu=gpu, layout=Layout(ep=16, pp=4), conc=1, weight_dtype="fp4")
    assert one_pp4.tokens_per_s_per_user <= one_pp1.tokens_per_s_per_user * 1.05


def test_request_rate_sets_concurrency_by_littles_law():
    wl = Workload(isl=1024, osl=256, request_rate=4.0)
    p = predict(LLAMA70, H100, Layout(tp=4), wl, weight_dtype="fp8", kv_dtype="fp8")
    assert p.concurrency >= 4  # at least rate x (TTFT + OSL x TPOT) with each request > 1 s
    assert any("Little" in n for n in p.notes)


def test_disaggregated_prediction_has_no_prefill_interference_in_tpot():
    wl = Workload(isl=8192, osl=1024)
    agg = _p(model=DS, gpu=B200, layout=Layout(tp=8), isl=8192, osl=1024, conc=32)
    dis = perf.predict_disagg(DS, B200, Layout(tp=8), Layout(tp=8), wl, weight_dtype="fp8", kv_dtype="fp8",
                              concurrency=32, prefill_workers=1, decode_workers=1)
    assert dis.tpot_ms < agg.tpot_ms


def test_fitted_parameters_are_physical():
    for name in FIT_NAMES:
        v = getattr(FITTED_PARAMS, name)
        assert v > 0, name
        if name.endswith("_eff") or name.startswith("wave") or name == "interference":
            assert v <= 1.0, name


def test_nelder_mead_finds_a_quadratic_minimum():
    from meshplan.planner.calibration import nelder_mead

    best, val = nelder_mead(lambda x: (x[0] - 1.5) ** 2 + 3 * (x[1] + 0.5) ** 2, [0.0, 0.0], iters=400)
    assert best[0] == pytest.approx(1.5, abs=1e-2) and best[1] == pytest.approx(-0.5, abs=1e-2)
    assert val < 1e-3


def test_fit_recovers_synthetic_measurements():
    from meshplan.planner import calibration as cal

    truth = perf.PerfParams().with_values(gemm_eff=0.45, mem_eff=0.7, layer_us=30.0, ttft_base_ms=50.0)
    scenarios = []
    for conc in (1, 8, 64):
        for isl in (1024, 8192):
            for tp in (1, 4):
                sc = cal.Scenario(id=f"s{conc}-{isl}-{tp}", model=LLAMA70, model_key="llama", gpu=H100,
                                  engine="vllm", weight_dtype="fp8", kv_dtype="fp8", isl=isl, osl=512,
                                  concurrency=conc, mapping=ReplicaMapping(attn_tp=tp, moe_tp=tp))
                try:
                    ttft, tpot = cal.predict_scenario(sc, truth)
                except ValueError:
                    continue
                scenarios.append(dataclasses.replace(sc, measured_ttft_ms=ttft, measured_tpot_ms=tpot))
    start = perf.PerfParams()
    fitted = cal.fit(scenarios, base=start, iters=150)
    assert cal.loss(scenarios, fitted) < 0.25 * cal.loss(scenarios, start)
    assert cal.loss(scenarios, fitted, ttft_weight=0.0) < 0.03  # TPOT within ~3% on average


def test_ttft_stage_loss_is_relative_error_capped():
    """The TTFT stage's robust loss: a run measured 100x off counts as `clip`, a near one
    as its relative error; without a clip the loss is the mean |log| error."""
    from meshplan.planner import calibration as cal

    sc = cal.Scenario(id="s", model=LLAMA70, model_key="llama", gpu=H100, engine="vllm", weight_dtype="fp8",
                      kv_dtype="fp8", isl=1024, osl=512, concurrency=8,
                      mapping=ReplicaMapping(attn_tp=4, moe_tp=4))
    ttft, _ = cal.predict_scenario(sc, FITTED_PARAMS)
    near = dataclasses.replace(sc, measured_ttft_ms=ttft / 1.2)      # predicted 20% high
    far = dataclasses.replace(sc, measured_ttft_ms=ttft * 100.0)     # predicted 99% low
    both = [near, far]
    plain = cal.loss(both, FITTED_PARAMS, tpot_weight=0.0, ttft_weight=1.0)
    clipped = cal.loss(both, FITTED_PARAMS, tpot_weight=0.0, ttft_weight=1.0, clip=0.7)
    assert plain == pytest.approx((math.log(1.2) + math.log(100.0)) / 2)
    assert clipped == pytest.approx((0.2 + 0.7) / 2)


def _smeared_tpot(model, gpu, layout, isl, osl, conc, weight_dtype):
    """TPOT if the other requests' prefill were spread evenly over every decode step."""
    m = perf.as_mapping(layout)
    st = perf._stage(model, gpu, m, weight_dtype, "fp8")
    d = conc / m.attn_dp
    return perf.iteration_ms(model, st, m, FITTED_PARAMS, d, isl + osl / 2, d * isl / osl, isl / 2)


def test_other_requests_prompts_land_as_whole_prompts_not_spread_over_every_step():
    # Sparse MoE at 4 sequences: a step with a whole 8,192-token prompt touches every expert,
    # but most steps carry none and touch ~30 of 256; spreading 32 prompt tokens over every
    # step would make each of them touch ~170 experts.
    moe = _p(model=DS, gpu=B200, layout=Layout(tp=4), isl=8192, osl=1024, conc=4, weight_dtype="fp4",
             engine="trtllm")
    moe_smeared = _smeared_tpot(DS, B200, Layout(tp=4), 8192, 1024, 4, "fp4")
    assert moe.tpot_ms < 0.8 * moe_smeared
    # Dense and memory-bound: a few spread tokens would ride free in every step, but the
    # steps that carry a whole prompt are compute-bound, so the true mean is higher.
    dense = _p(isl=8192, osl=256, conc=8, engine="trtllm")
    dense_smeared = _smeared_tpot(LLAMA70, H100, Layout(tp=4), 8192, 256, 8, "fp8")
    assert dense.tpot_ms > 1.05 * dense_smeared


def test_all_to_all_latency_grows_with_the_peers_it_signals():
    """Dispatch and combine signal every peer EP rank: each MoE layer pays 2 x a2a_peer_us per peer."""
    q0 = FITTED_PARAMS.with_values(a2a_peer_us=0.0)
    q1 = FITTED_PARAMS.with_values(a2a_peer_us=2.0)
    extra = {}
    for ep in (8, 64):
        m = ReplicaMapping(attn_tp=1, attn_dp=ep, moe_tp=1, moe_ep=ep)
        st = perf._stage(DS, B200, m, "fp4", "fp8")
        extra[ep] = (perf.iteration_ms(DS, st, m, q1, 4, 2048, 0, 0)
                     - perf.iteration_ms(DS, st, m, q0, 4, 2048, 0, 0))
    assert extra[8] == pytest.approx(DS.moe_layers * 2 * 2.0e-3 * 7)
    assert extra[64] == pytest.approx(DS.moe_layers * 2 * 2.0e-3 * 63)
    assert FITTED_PARAMS.a2a_peer_us > 0


def test_single_request_long_prompt_decodes_without_prompt_landing():
    """Issue 20: at concurrency 1 no other request exists, so no other prompt lands in the decode steps.
    The old model priced a share of the steps as carrying a whole prompt anyway and put a lone
    100k-token request on Llama-3.1-8B / H100 at 23.9 ms TPOT, about twice what reading the weights and
    its KV cache costs. Decode-only physics: going from a 128-token to a 100,000-token context adds the
    extra KV reads, (100,000 - 128) x 128 KiB / (HBM x attn_eff) = 5.6 ms, and nothing else."""
    from meshplan.catalog.gpus import get_gpu
    from meshplan.planner import memory as mem
    from meshplan.planner.calibration import FITTED_PARAMS
    from meshplan.planner.perf import predict
    from meshplan.planner.types import Layout, Workload

    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100_sxm")

    def tpot(isl, concurrency):
        return predict(model, gpu, Layout(tp=1), Workload(isl=isl, osl=512), weight_dtype="bf16",
                       kv_dtype="bf16", engine="vllm", concurrency=concurrency).tpot_ms

    short, long = tpot(128, 1), tpot(100_000, 1)
    kv_tok = mem.kv_bytes_per_token(model, Layout(tp=1), "bf16")
    assert kv_tok == 32 * 8 * 128 * 2 * 2                  # 32 layers x 8 KV heads x 128 dims x K,V x bf16
    kv_read_ms = (100_000 - 128) * kv_tok / (gpu.hbm_tb_s * 1e12 * FITTED_PARAMS.attn_eff) * 1e3
    assert long - short == pytest.approx(kv_read_ms, rel=0.05), (short, long, kv_read_ms)
    assert long < 1.5 * short + kv_read_ms                  # nowhere near the old 2x
    # with other requests running, their prompts do land in the steps and lengthen TPOT
    assert tpot(100_000, 2) > long * 1.05


def test_a_gpu_familys_layer_overhead_adds_to_every_layer_of_every_step_on_that_family_only():
    """calibration.FAMILY_LAYER_US (CDNA3, CDNA4: families the calibration set never measured) is added to each
    layer of each step on a GPU of the family, so a lone request's TPOT grows by exactly it times the model's
    layers (a deeper model pays more; two pipeline stages split it); an NVIDIA GPU is priced as fitted."""
    from meshplan.planner.calibration import FAMILY_LAYER_US

    mi300x = get_gpu("mi300x")
    assert mi300x.family == "cdna3"
    kw = dict(model=DS, gpu=mi300x, layout=Layout(tp=8), conc=1)
    committed = _p(**kw)
    bare = _p(**kw, params=FITTED_PARAMS)
    assert DS.num_layers == 61
    assert committed.tpot_ms == pytest.approx(bare.tpot_ms + FAMILY_LAYER_US["cdna3"] * 61 / 1000.0)
    assert committed.ttft_ms > bare.ttft_ms
    assert any("per-layer serving overhead" in n for n in committed.notes)
    gpt = get_model("gpt-oss-120b")
    one = dict(model=gpt, gpu=mi300x, layout=Layout(tp=1), conc=1)
    assert _p(**one).tpot_ms - _p(**one, params=FITTED_PARAMS).tpot_ms == pytest.approx(
        FAMILY_LAYER_US["cdna3"] * gpt.num_layers / 1000.0)
    assert gpt.num_layers < DS.num_layers
    assert _p(model=DS, gpu=B200, layout=Layout(tp=8), conc=1).tpot_ms == pytest.approx(
        _p(model=DS, gpu=B200, layout=Layout(tp=8), conc=1, params=FITTED_PARAMS).tpot_ms)
    # an explicit family table on explicit parameters is honoured, and a family without an entry adds nothing
    q = FITTED_PARAMS.with_values(family_layer_us=(("cdna4", 20.0),))
    assert _p(**kw, params=q).tpot_ms == pytest.approx(bare.tpot_ms)
    q3 = FITTED_PARAMS.with_values(family_layer_us=(("cdna3", 100.0),))
    assert _p(**kw, params=q3).tpot_ms == pytest.approx(bare.tpot_ms + 6.1)


def test_the_steady_state_median_ttft_is_a_fixed_cost_a_few_steps_and_the_own_prefill_without_the_wave():
    """`ttft_p50_ms` (perf._core): base + iters x step + the request's own prefill; no arrival wave, so it stays
    below the closed-loop mean (`ttft_ms`) as concurrency grows, and it is exactly the formula at concurrency 1
    (no other request's prefill)."""
    from meshplan.planner.calibration import TTFT_P50

    q = FITTED_PARAMS.with_values(ttft_p50_base_ms=TTFT_P50["base_ms"], ttft_p50_iters=TTFT_P50["iters"])
    one = _p(model=DS, gpu=H200, layout=Layout(tp=8), isl=1024, osl=1024, conc=1, engine="sglang", params=q)
    assert one.ttft_p50_ms == pytest.approx(TTFT_P50["base_ms"] + TTFT_P50["iters"] * one.tpot_ms + one.prefill_ms)
    for c in (4, 16, 64):
        p = _p(model=DS, gpu=H200, layout=Layout(tp=8), isl=8192, osl=1024, conc=c, engine="sglang", params=q)
        assert p.ttft_p50_ms < p.ttft_ms
    hi = _p(model=DS, gpu=H200, layout=Layout(tp=8), isl=8192, osl=1024, conc=64, engine="sglang", params=q)
    lo = _p(model=DS, gpu=H200, layout=Layout(tp=8), isl=8192, osl=1024, conc=4, engine="sglang", params=q)
    # the mean grows with the wave (x several), the median only with the step and the batch's decode tokens
    assert hi.ttft_ms / lo.ttft_ms > 3.0 and hi.ttft_p50_ms / lo.ttft_p50_ms < 1.5
    # the committed parameters carry the committed constants
    assert perf.committed_params().ttft_p50_base_ms == TTFT_P50["base_ms"]


def test_requests_in_step_wait_for_the_whole_rounds_prompts():
    """Issue 20: a closed loop with fixed lengths (dstack's `--random-range-ratio 1`) keeps its requests in step,
    so every round arrives at once and each request's first token waits for all of the round's prompts: the
    mean TTFT grows by one prompt's prefill per request in flight, whatever the scheduler's fitted wave share.
    Every round being a wave, the median grows the same way (its steady state is the wave). Decode and a lone
    request are untouched."""
    from meshplan.catalog.gpus import get_gpu
    from meshplan.planner.perf import predict
    from meshplan.planner.types import Layout, Workload

    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100_sxm")

    def run(engine, c, synchronized):
        return predict(model, gpu, Layout(tp=8), Workload(isl=3200, osl=800, synchronized=synchronized),
                       weight_dtype="fp8", kv_dtype="fp8", engine=engine, concurrency=c)

    for engine in ("vllm", "sglang", "trtllm"):
        free = {c: run(engine, c, False) for c in (1, 8, 16, 32)}
        step = {c: run(engine, c, True) for c in (1, 8, 16, 32)}
        assert step[1].ttft_ms == pytest.approx(free[1].ttft_ms)
        assert step[1].ttft_p50_ms == pytest.approx(free[1].ttft_p50_ms)
        one = free[1].prefill_ms                                   # one prompt's prefill alone
        for lo, hi in ((8, 16), (16, 32)):
            assert step[hi].ttft_ms - step[lo].ttft_ms == pytest.approx((hi - lo) * one, rel=0.15), engine
            assert step[hi].ttft_p50_ms - step[lo].ttft_p50_ms == pytest.approx((hi - lo) * one, rel=0.15), engine
            # out of step the median grows only by its wait for the prefills ahead of it on the rank
            # (`perf.prefill_queue_ms`), far less than a whole round's prompts
            assert free[hi].ttft_p50_ms - free[lo].ttft_p50_ms < 0.1 * (hi - lo) * one, engine
        for c in (8, 16, 32):
            assert step[c].ttft_ms > free[c].ttft_ms, (engine, c)
            assert step[c].tpot_ms == pytest.approx(free[c].tpot_ms)
            assert step[c].tokens_per_s_per_gpu == pytest.approx(free[c].tokens_per_s_per_gpu)
            assert step[c].ttft_p50_ms > free[c].ttft_p50_ms + (c - 2) * one, (engine, c)
            assert any("in step" in n for n in step[c].notes)


def test_the_prefill_queue_wait_is_the_md1_wait_of_a_closed_loop():
    """`perf.prefill_queue_ms`: Pollaczek-Khinchine for deterministic service, wait = rho S / (2 (1 - rho)), with
    the arrival rate of `others` requests that each come back once per cycle + wait. No other request, no wait;
    the load stays below 1 however many run; the wait grows with them and with the prompt's prefill."""
    assert perf.prefill_queue_ms(0.0, 300.0, 30_000.0) == 0.0
    assert perf.prefill_queue_ms(5.0, 0.0, 30_000.0) == 0.0
    for n, s_, c in ((3.0, 300.0, 30_000.0), (63.0, 300.0, 36_000.0), (63.0, 60.0, 20_000.0), (500.0, 300.0, 30_000.0)):
        w = perf.prefill_queue_ms(n, s_, c)
        rho = n * s_ / (c + w)
        assert 0.0 < rho < 1.0
        assert w == pytest.approx(rho * s_ / (2.0 * (1.0 - rho)), rel=1e-9)
    waits = [perf.prefill_queue_ms(n, 300.0, 30_000.0) for n in (1, 8, 32, 64, 128)]
    assert waits == sorted(waits) and waits[0] < 5.0 < waits[-1]
    assert perf.prefill_queue_ms(63.0, 600.0, 30_000.0) > perf.prefill_queue_ms(63.0, 300.0, 30_000.0)


def test_the_median_ttft_waits_for_the_prompts_ahead_where_long_prompts_keep_the_rank_busy():
    """Issue 20: InferenceX's median TTFT at 8k-token prompts grows with concurrency (MI355X SGLang DeepSeek-R1
    TP8 FP8: 292 ms measured at concurrency 4, 488 ms at 64), a request's own prefill does not. The median is
    its own prefill plus `prefill_queue_ms`: at concurrency 64 with 8k prompts the wait is tens of ms, at 1k
    prompts a few, and a lone request waits for nothing."""
    from meshplan.planner.calibration import TTFT_P50
    from meshplan.planner.types import Layout, Workload

    model, gpu = get_model("deepseek-r1"), get_gpu("mi355x")

    def run(isl, c):
        return predict(model, gpu, Layout(tp=8), Workload(isl=isl, osl=1024), weight_dtype="fp8", kv_dtype="fp8",
                       engine="sglang", concurrency=c)

    def wait_of(p):
        running = p.tokens_per_s_per_gpu * 8 * p.tpot_ms / 1000.0
        return perf.prefill_queue_ms(running - 1.0, p.prefill_ms, p.ttft_p50_ms + 1024 * p.tpot_ms)

    for isl in (1024, 8192):        # alone: the fixed cost, the fitted steps and its own prefill, no wait
        lone = run(isl, 1)
        assert lone.ttft_p50_ms == pytest.approx(TTFT_P50["base_ms"] + TTFT_P50["iters"] * lone.tpot_ms
                                                 + lone.prefill_ms, rel=1e-9)
    long64, short64 = run(8192, 64), run(1024, 64)
    wait = wait_of(long64)
    assert 20.0 < wait < long64.prefill_ms
    assert wait_of(short64) < 10.0 < wait
    assert long64.ttft_p50_ms - run(8192, 4).ttft_p50_ms > 30.0


def test_a_disaggregated_median_waits_for_the_prompts_ahead_at_its_prefill_rank():
    """The same wait on a prefill worker (`perf.predict_disagg`): a lone request's median is its prefill and the
    KV transfer alone; with 64 requests cycling through one TP8 prefill worker at 8k prompts it is later by the
    `prefill_queue_ms` of the others."""
    from meshplan.planner.types import Workload

    model, gpu = get_model("deepseek-r1"), get_gpu("b200_sxm")

    def run(c):
        return perf.predict_disagg(model, gpu, ReplicaMapping(attn_tp=8, moe_tp=8), ReplicaMapping(attn_tp=8, moe_tp=8),
                                   Workload(isl=8192, osl=1024), weight_dtype="fp8", kv_dtype="fp8", concurrency=c,
                                   engine="sglang")

    lone, busy = run(1), run(64)
    wait = perf.prefill_queue_ms(63.0, lone.prefill_ms, busy.ttft_p50_ms + 1024 * busy.tpot_ms)
    assert 20.0 < wait
    assert busy.ttft_p50_ms - lone.ttft_p50_ms == pytest.approx(wait, rel=0.25)
