"""DeepEP all-to-all pricing (issue 18 Build 2): across NVLink domains, an EP group on a DeepEP backend is
priced with DeepEP's published kernel bandwidths (github.com/deepseek-ai/DeepEP docs/legacy.md, H800 + CX7
400 Gb/s); inside a domain, and on other backends, the model is unchanged (benchmarks/accuracy.py)."""

from __future__ import annotations

import pytest

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner.memory import ReplicaMapping
from meshplan.planner.perf import deepep_a2a_s, predict
from meshplan.planner.types import Workload

H = 7168       # DeepSeek-V3/R1 hidden size, the tables' setting
# DeepEP low-latency table (128 tokens, top-8, FP8 dispatch, BF16 combine): latency in µs by EP size
PUBLISHED_LL = {16: (118, 195), 32: (155, 273), 64: (173, 314)}


@pytest.mark.parametrize("ep", sorted(PUBLISHED_LL))
def test_low_latency_kernel_reproduces_the_published_latencies(ep):
    dispatch, kernel = deepep_a2a_s(128, 8, H, 1.0, 0.0, ep, 50.0)
    combine, _ = deepep_a2a_s(128, 8, H, 0.0, 2.0, ep, 50.0)
    want_d, want_c = PUBLISHED_LL[ep]
    assert kernel == "low-latency"
    assert dispatch * 1e6 == pytest.approx(want_d, rel=0.05)
    assert combine * 1e6 == pytest.approx(want_c, rel=0.05)


def test_normal_kernel_for_large_steps_and_nic_scaling():
    t50, kernel = deepep_a2a_s(4096, 8, H, 1.0, 2.0, 32, 50.0)
    assert kernel == "normal"
    # 4096 x 8 x 7168 B at 58 GB/s dispatch + 2 B at 57 GB/s combine
    assert t50 == pytest.approx(4096 * 8 * H * (1 / 58e9 + 2 / 57e9), rel=1e-9)
    t100, _ = deepep_a2a_s(4096, 8, H, 1.0, 2.0, 32, 100.0)      # an 800 Gb/s XDR NIC: twice the bandwidth
    assert t100 == pytest.approx(t50 / 2)


def _tpot(ep: int, a2a: str | None) -> float:
    m = ReplicaMapping(attn_tp=1, attn_dp=ep, moe_tp=1, moe_ep=ep, pp=1)
    p = predict(get_model("deepseek-r1"), get_gpu("h200"), m, Workload(isl=1024, osl=1024),
                weight_dtype="fp8", kv_dtype="fp8", engine="sglang", concurrency=64 * ep, a2a_backend=a2a)
    return p.tpot_ms


def test_deepep_changes_only_groups_that_cross_the_domain():
    assert _tpot(8, "deepep") == _tpot(8, None)              # inside one 8-GPU HGX domain: unchanged
    assert _tpot(16, "deepep") != _tpot(16, None)            # EP16 over two nodes: DeepEP's tables
