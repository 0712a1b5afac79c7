"""EPLB's redundant experts: one count per engine (the engine module's `redundant_experts` rule) that the planner's
memory fit holds, the performance model prices and the renderer spells (issue 15 "EPLB gets redundant experts or
is not rendered", issue 18 "EPLB's redundant experts (memory and balance)").

Before the eplb branch: the memory fit held no redundant experts (SGLang rendered `--ep-num-redundant-experts EP`
anyway, TensorRT-LLM num_slots = experts + EP), vLLM rendered no EPLB, and the performance model had no balance
term. Each test below fails on that code (checked: missing rule / field, or the numbers below differ).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import meshplan.planner  # noqa: F401  (first: meshplan.engines imports the planner's types)
from meshplan.api.models import LLMDeployment
from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import sglang, trtllm, vllm
from meshplan.engines.base import one_per_rank
from meshplan.planner import perf, plan_for_spec
from meshplan.planner.engines import redundant_experts
from meshplan.planner.memory import GIB, ReplicaMapping, memory_fit, redundant_expert_bytes_per_gpu
from meshplan.planner.search import SearchSpace, search
from meshplan.planner.types import Layout, Workload
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

MIXED = build_topology(fleet_nodes(load_fleet("mixed")), [], ready_if_unknown=True)
R1 = get_model("deepseek-r1")
H200 = get_gpu("NVIDIA-H200")


def _llmd(model: str, kind: str, **spec) -> LLMDeployment:
    m = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "t"},
         "spec": {"model": {"name": model}, "engine": {"kind": kind},
                  "workload": {"inputTokens": 1024, "outputTokens": 256, "concurrency": 32},
                  "gpus": {"maxGpus": 8, "products": ["NVIDIA-H200"]}, "replicas": 1,
                  "parallelism": {"tensor": 1, "expert": 8, "pipeline": 1}}}
    for k, v in spec.items():
        m["spec"].setdefault(k, {}).update(v)
    return LLMDeployment.from_manifest(m)


def _args(res) -> list[str]:
    return list(res.rendered.groups[0].pods[0]["spec"]["containers"][0]["args"])


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# ---- the rule ---------------------------------------------------------------------------------


def test_one_redundant_expert_per_rank_and_the_total_divides_by_the_ep_size():
    assert one_per_rank(256, 32) == 32          # DeepSeek-R1 EP32: 288 physical experts, 9 per GPU
    assert one_per_rank(256, 8) == 8
    assert one_per_rank(8, 3) == 4 and (8 + 4) % 3 == 0    # topped up: vLLM and SGLang need an even spread
    assert one_per_rank(160, 6) == 8 and (160 + 8) % 6 == 0
    assert one_per_rank(256, 1) == 0 and one_per_rank(0, 8) == 0


def test_each_engine_has_its_rule():
    ep8 = Layout(tp=1, ep=8)
    assert redundant_experts("vllm", ep8, R1, "auto") == 8
    assert redundant_experts("vllm", Layout(tp=2, ep=4), R1, "auto") == 8     # vLLM's EP group is TP x DP
    assert redundant_experts("sglang", Layout(tp=2, ep=4), R1, "auto") == 4   # SGLang's is --ep-size
    assert redundant_experts("trtllm", ep8, R1, "auto") == 0                  # TensorRT-LLM: only when enabled
    assert redundant_experts("trtllm", ep8, R1, "enabled") == 8
    for engine in ("vllm", "sglang", "trtllm", "nim", "deepspeed"):
        assert redundant_experts(engine, ep8, R1, "disabled") == 0
        assert redundant_experts(engine, Layout(tp=8), R1, "enabled") == 0   # no EP group
    assert redundant_experts("sglang", Layout(tp=1, ep=8), get_model("mixtral-8x7b"), "auto") == 0
    assert redundant_experts("vllm", Layout(tp=1, ep=8), get_model("gpt-oss-120b"), "auto") == 0
    assert redundant_experts("vllm", Layout(tp=1, ep=8), get_model("mixtral-8x7b"), "auto") == 8


# ---- memory -----------------------------------------------------------------------------------


def test_memory_fit_holds_the_redundant_experts_and_the_kv_cache_shrinks_by_them():
    base = ReplicaMapping(attn_dp=8, moe_ep=8)
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", context_tokens=2048, chunk_size=1024)
    off = memory_fit(R1, H200, base, **kw)
    on = memory_fit(R1, H200, dataclasses.replace(base, redundant_experts=8), **kw)
    # one expert per GPU per MoE layer: 58 layers x 3 x 7168 x 2048 parameters x 1 byte (FP8)
    one_expert = R1.moe_layers * R1.expert_params * 1.0 * R1.weight_scale
    assert on.redundant_expert_bytes == pytest.approx(one_expert)
    assert on.weights_bytes - off.weights_bytes == pytest.approx(one_expert)
    assert 2.3 * GIB < one_expert < 2.5 * GIB
    lost = (off.kv_capacity_tokens - on.kv_capacity_tokens) / 8      # per attention-DP rank
    assert lost == pytest.approx(one_expert / off.kv_bytes_per_token, abs=2)
    assert off.redundant_expert_bytes == 0.0


def test_a_layout_that_fitted_without_redundant_experts_no_longer_fits():
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", context_tokens=2048, chunk_size=128, max_num_seqs=1,
              engine="sglang")
    fixed = memory_fit(R1, H200, Layout(tp=1, ep=8), memory_fraction=0.9, **kw)
    need = fixed.weights_bytes + fixed.activation_bytes + fixed.runtime_bytes
    fraction = round((need + 1.0 * GIB) / H200.memory_bytes, 4)     # 1 GiB of KV room, less than one expert
    space = SearchSpace(tensor=1, expert=8, pipeline=1, weight_dtype="fp8", kv_dtype="fp8", memory_fraction=fraction)
    wl = Workload(isl=1024, osl=1024)
    off = search(R1, H200, 8, wl, engine="sglang", space=dataclasses.replace(space, expert_load_balancing="disabled"))
    assert off.candidates
    on = search(R1, H200, 8, wl, engine="sglang", space=space)
    assert not on.candidates
    assert any("redundant experts" in r.reason for r in on.rejected), [r.reason for r in on.rejected]


def test_sglang_plans_hold_the_experts_they_render():
    on = plan_place_render(_llmd("deepseek-r1", "sglang"), MIXED)
    off = plan_place_render(_llmd("deepseek-r1", "sglang", engine={"expertLoadBalancing": "disabled"}), MIXED)
    args = _args(on)
    assert "--enable-eplb" in args and _arg(args, "--ep-num-redundant-experts") == "8"
    mem = on.plan.choice.memory
    assert mem.redundant_expert_bytes == pytest.approx(
        redundant_expert_bytes_per_gpu(R1, ReplicaMapping(attn_dp=8, moe_ep=8, redundant_experts=8), "fp8"))
    assert mem.weights_bytes - off.plan.choice.memory.weights_bytes == pytest.approx(mem.redundant_expert_bytes)
    assert mem.kv_capacity_tokens < off.plan.choice.memory.kv_capacity_tokens
    assert "--enable-eplb" not in _args(off)


def test_mixtral_on_sglang_stays_without_eplb_and_plans_no_redundant_experts():
    res = plan_place_render(_llmd("mixtral-8x7b", "sglang", parallelism={"tensor": 1, "expert": 2, "pipeline": 1},
                                  gpus={"maxGpus": 2}), MIXED)
    assert res.plan.choice is not None, res.plan.reason
    assert "--enable-eplb" not in _args(res) and "--ep-num-redundant-experts" not in _args(res)
    assert res.plan.choice.memory.redundant_expert_bytes == 0.0
    assert "eplb" not in res.plan.extra


# ---- render -----------------------------------------------------------------------------------


def test_vllm_renders_eplb_with_the_planned_redundant_experts_and_explains_them():
    res = plan_place_render(_llmd("deepseek-r1", "vllm"), MIXED)
    args = _args(res)
    assert "--enable-eplb" in args
    cfg = json.loads(_arg(args, "--eplb-config"))
    assert cfg == {"num_redundant_experts": 8, "window_size": 1000, "step_interval": 3000}
    line = next(e for e in res.rendered.explain if e.subject == "--eplb-config")
    gib = res.plan.choice.memory.redundant_expert_bytes / GIB
    assert f"{gib:.2f} GiB per GPU" in line.reason and "33 physical experts per GPU" in line.reason
    assert "balance" in line.reason
    off = plan_place_render(_llmd("deepseek-r1", "vllm", engine={"expertLoadBalancing": "disabled"}), MIXED)
    assert "--enable-eplb" not in _args(off) and "--eplb-config" not in _args(off)


def test_vllm_gpt_oss_is_not_balanced_and_says_why():
    res = plan_place_render(_llmd("gpt-oss-120b", "vllm", gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]},
                                  parallelism={"tensor": 1, "expert": 4, "pipeline": 1},
                                  engine={"expertLoadBalancing": "enabled"}), MIXED)
    assert res.plan.choice is not None, res.plan.reason
    assert "--enable-eplb" not in _args(res)
    why = next(e for e in res.rendered.explain if e.subject == "--enable-eplb")
    assert why.level == "warning" and "MixtureOfExperts" in why.reason


def test_trtllm_slots_are_the_rule_and_the_memory_fit_holds_them():
    res = plan_place_render(_llmd("deepseek-r1", "trtllm", engine={"expertLoadBalancing": "enabled"}), MIXED)
    assert res.plan.choice.memory.redundant_expert_bytes > 0
    line = next(e for e in res.rendered.explain if e.subject == "moe_config.load_balancer")
    assert line.value == "num_slots 264"
    auto = plan_place_render(_llmd("deepseek-r1", "trtllm"), MIXED)
    assert auto.plan.choice.memory.redundant_expert_bytes == 0.0


# ---- balance ----------------------------------------------------------------------------------


def test_balance_model():
    assert perf.eplb_balance(1, 0) == 1.0
    assert perf.eplb_balance(32, 0) == pytest.approx(1 / 1.5)              # I0(32) = 1 + 0.1 x 5
    assert perf.eplb_balance(32, 32) == pytest.approx(1 / 1.25)            # one per rank halves the excess
    assert perf.eplb_balance(8, 0) < perf.eplb_balance(8, 8) < perf.eplb_balance(8, 16) < 1.0
    assert perf.eplb_balance(64, 0) < perf.eplb_balance(8, 0)              # worse with EP size
    assert perf.eplb_gain(8, 0) == 1.0 and perf.eplb_gain(1, 8) == 1.0
    assert perf.eplb_gain(32, 32) == pytest.approx(1.25 / 1.5)


def test_eplb_off_predictions_are_unchanged_and_eplb_on_speeds_the_busy_step():
    wl = Workload(isl=1024, osl=256, concurrency=256)
    kw = dict(weight_dtype="fp8", kv_dtype="fp8")
    lay = ReplicaMapping(attn_dp=8, moe_ep=8)
    a = perf.predict(R1, H200, lay, wl, **kw)
    b = perf.predict(R1, H200, Layout(tp=1, ep=8), wl, **kw)          # the same mapping as a Layout
    assert (a.ttft_ms, a.tpot_ms) == (b.ttft_ms, b.tpot_ms)
    on = perf.predict(R1, H200, dataclasses.replace(lay, redundant_experts=8), wl, **kw)
    assert on.tpot_ms < a.tpot_ms and on.ttft_ms < a.ttft_ms
    # a lone request reads more expert weights and gains nothing from balance: EPLB costs there
    one = Workload(isl=128, osl=256, concurrency=1)
    assert (perf.predict(R1, H200, dataclasses.replace(lay, redundant_experts=8), one, **kw).tpot_ms
            >= perf.predict(R1, H200, lay, one, **kw).tpot_ms)


def test_the_plan_explains_redundant_experts_gib_and_gain():
    p = plan_for_spec(_llmd("deepseek-r1", "sglang").spec, MIXED)
    e = p.extra["eplb"]
    assert e["redundant_experts"] == 8 and e["ep_size"] == 8
    assert e["gib_per_gpu"] == pytest.approx(p.choice.memory.redundant_expert_bytes / GIB, abs=1e-3)
    assert e["balance_without"] < e["balance_with"]
    assert any(n.startswith("EPLB") and "GiB per GPU" in n and "shorter" in n for n in p.extra["notes"])
    off = plan_for_spec(_llmd("deepseek-r1", "sglang", engine={"expertLoadBalancing": "disabled"}).spec, MIXED)
    assert "eplb" not in off.extra


def test_engine_modules_spell_the_rule_they_export():
    # the renderer and the planner read the same function of each module
    assert vllm.redundant_experts is not None and sglang.redundant_experts is not None
    assert trtllm.redundant_experts(Layout(tp=1, ep=16), R1, "enabled") == 16


def test_vllm_plans_no_eplb_for_int4_moe_checkpoints():
    """vLLM 0.32.0's int4/int8 MoE methods have supports_eplb False (FusedMoE raises 'EPLB is not supported'):
    Kimi-K2.5 (its real config.json: INT4 compressed-tensors experts) gets no redundant experts from vLLM."""
    from pathlib import Path

    from meshplan.catalog.models import from_hf_config
    from meshplan.planner.types import Candidate, MemoryFit, Prediction
    from meshplan.render.engine_args import PodRole, ServingOptions, engine_command

    cfg = json.loads((Path(__file__).parent / "fixtures/models/moonshotai--Kimi-K2.5_config.json").read_text())
    kimi = from_hf_config(cfg, "moonshotai/Kimi-K2.5")
    assert kimi.native_dtype == "int4" and kimi.num_experts == 384
    assert redundant_experts("vllm", Layout(tp=1, ep=8), kimi, "enabled") == 0
    assert redundant_experts("sglang", Layout(tp=1, ep=8), kimi, "auto") == 8
    cand = Candidate(Layout(tp=1, ep=8), "int4", "fp8", 1024, 256,
                     MemoryFit(True, 0, 0, 0, 0, 0, 0, 0), Prediction(0, 0, 0, 0, 0), "vllm")
    serving = ServingOptions(engine="vllm", model="moonshotai/Kimi-K2.5", checkpoint_dtype="int4", num_experts=384,
                             model_name=kimi.name, expert_load_balancing="enabled")
    cmd = engine_command(cand, serving, PodRole(gpus_per_pod=8))
    argv, explain = list(cmd.args), list(cmd.explain)
    assert "--enable-eplb" not in argv and "--eplb-config" not in argv
    why = next(e for e in explain if e.subject == "--enable-eplb")
    assert why.level == "warning" and "int4" in why.reason
