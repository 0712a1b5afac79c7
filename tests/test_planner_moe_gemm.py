"""The routed experts' two op kinds: weight reads (`moe_eff`) and grouped GEMMs
(`moe_gemm_eff`). A decode step of a few tokens reads experts and hardly computes
them, a prefill chunk computes them: the GEMM efficiency must move prefill and
leave small decode steps alone, and it is fitted in the TTFT stage."""

from __future__ import annotations

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner import perf
from meshplan.planner.calibration import FITTED_PARAMS, TTFT_ONLY
from meshplan.planner.memory import ReplicaMapping
from meshplan.planner.perf import PerfParams

H200 = get_gpu("h200_sxm")
DS = get_model("deepseek-v3")
LLAMA70 = get_model("llama-3.1-70b")
EP8 = ReplicaMapping(attn_tp=8, moe_tp=1, moe_ep=8)
TP4 = ReplicaMapping(attn_tp=4, moe_tp=4)


def _iter_ms(model, mapping, params, *, d, p):
    st = perf._stage(model, H200, mapping, "fp8", "fp8")
    return perf.iteration_ms(model, st, mapping, params, d, 2048.0, p, 1024.0)


def test_grouped_gemm_efficiency_slows_prefill_not_small_decode_steps():
    # the physical starting guesses, not the fitted values, so a refit cannot move the margin
    fast = PerfParams().with_values(moe_gemm_eff=1.0)
    slow = PerfParams().with_values(moe_gemm_eff=0.2)
    # a prefill chunk of 8192 tokens is compute-bound in the experts
    assert _iter_ms(DS, EP8, slow, d=0, p=8192) > 1.5 * _iter_ms(DS, EP8, fast, d=0, p=8192)
    # a decode step of 4 sequences reads a few experts: the GEMM rate does not matter
    assert _iter_ms(DS, EP8, slow, d=4, p=0) == _iter_ms(DS, EP8, fast, d=4, p=0)


def test_dense_models_ignore_the_expert_gemm_efficiency():
    a = _iter_ms(LLAMA70, TP4, FITTED_PARAMS.with_values(moe_gemm_eff=1.0), d=16, p=4096)
    b = _iter_ms(LLAMA70, TP4, FITTED_PARAMS.with_values(moe_gemm_eff=0.1), d=16, p=4096)
    assert a == b


def test_zero_means_the_same_as_moe_eff():
    tied = FITTED_PARAMS.with_values(moe_eff=0.6, moe_gemm_eff=0.0)
    explicit = FITTED_PARAMS.with_values(moe_eff=0.6, moe_gemm_eff=0.6)
    assert _iter_ms(DS, EP8, tied, d=8, p=4096) == _iter_ms(DS, EP8, explicit, d=8, p=4096)


def test_fitted_in_the_ttft_stage_and_physical():
    assert "moe_gemm_eff" in TTFT_ONLY
    assert 0.0 < FITTED_PARAMS.moe_gemm_eff <= 1.0
