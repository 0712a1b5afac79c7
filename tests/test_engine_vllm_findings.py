"""Issue 15's vLLM findings, checked without the engine venv (tests/conformance/test_vllm.py runs the same
renders through vLLM 0.32.0's own parser and config).

Each test failed before its fix (vllm-conf branch): max_num_seqs was rendered per replica although vLLM
counts it per DP rank; pinned int4/int8/fp4 weights planned and rendered no flag; int8/fp4 KV rendered
nothing; EPLB was not rendered (now: with the redundant experts the memory fit holds); online FP8 was the deprecated `--quantization fp8`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

import meshplan.planner  # noqa: F401  (first: meshplan.engines imports the planner's types)
from meshplan.api.models import LLMDeployment
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import vllm
from meshplan.planner.engines import engine_knobs, engine_layout
from meshplan.planner.types import Layout
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

ROOT = Path(__file__).resolve().parents[1]
FLEETS = {n: build_topology(fleet_nodes(load_fleet(n)), [], ready_if_unknown=True)
          for n in ("hgx-h100", "mixed", "gb200-nvl72")}


def _llmd(model: str, **spec) -> LLMDeployment:
    m = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "t"},
         "spec": {"model": {"name": model}, "engine": {"kind": "vllm"},
                  "workload": {"inputTokens": 1024, "outputTokens": 256, "concurrency": 32},
                  "gpus": {"maxGpus": 8}, "replicas": 1}}
    for k, v in spec.items():
        m["spec"].setdefault(k, {}).update(v) if isinstance(v, dict) else m["spec"].__setitem__(k, v)
    return LLMDeployment.from_manifest(m)


def _args(res) -> list[str]:
    return list(res.rendered.groups[0].pods[0]["spec"]["containers"][0]["args"])


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_max_num_seqs_is_rendered_per_dp_rank():
    # vllm/config/scheduler.py (0.32.0): max_num_seqs applies per data-parallel rank
    k = engine_knobs("vllm", Layout(tp=1, ep=8), 256, 64)
    assert (k.max_num_seqs, k.replica_max_num_seqs, k.ranks) == (8, 64, 8)
    assert engine_layout(Layout(tp=1, ep=8), "vllm", chunk_size=256, max_num_seqs=64).flags["--max-num-seqs"] == 8
    # dense / no DP: unchanged; a limit the ranks do not divide runs what the ranks hold (priced as such)
    assert engine_knobs("vllm", Layout(tp=8), 256, 64).max_num_seqs == 64
    assert engine_knobs("vllm", Layout(tp=1, ep=3), 256, 64).replica_max_num_seqs == 63
    # other engines keep their own meaning
    assert engine_knobs("sglang", Layout(tp=1, ep=8), 256, 64).max_num_seqs == 64


def test_the_planned_batch_limit_is_what_the_dp_ranks_run_together():
    res = plan_place_render(_llmd("deepseek-r1", parallelism={"tensor": 1, "expert": 8, "pipeline": 1},
                                  gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}), FLEETS["mixed"])
    c = res.plan.choice
    args = _args(res)
    assert int(_arg(args, "--data-parallel-size")) == 8
    assert int(_arg(args, "--max-num-seqs")) * 8 == c.max_num_seqs
    assert all(x.max_num_seqs % 8 == 0 for x in res.plan.frontier)


def test_the_issues_chunk_case_is_planned_and_accepted_per_rank():
    """examples/deepseek-r1-h200.yaml as vLLM on `mixed` with chunkSize 128: the search only proposes batch
    limits whose per-rank value vLLM accepts (max_num_batched_tokens >= max_num_seqs per engine core)."""
    m = yaml.safe_load((ROOT / "examples" / "deepseek-r1-h200.yaml").read_text())
    m["spec"]["engine"]["kind"] = "vllm"
    m["spec"]["parallelism"]["chunkSize"] = 128
    res = plan_place_render(LLMDeployment.from_manifest(m), FLEETS["mixed"])
    assert res.plan.choice is not None, res.plan.reason
    args = _args(res)
    assert int(_arg(args, "--max-num-batched-tokens")) == 128
    assert int(_arg(args, "--max-num-seqs")) <= 128
    assert vllm.check_knobs(128, int(_arg(args, "--max-num-seqs"))) is None
    assert "must be >= max_num_seqs" in vllm.check_knobs(128, 256)


def test_pinned_weights_vllm_cannot_produce_are_refused_with_the_reason():
    for dtype in ("int4", "int8", "fp4"):
        res = plan_place_render(_llmd("llama-3.1-8b", precision={"weights": dtype}, gpus={"maxGpus": 1}),
                                FLEETS["gb200-nvl72"])
        assert res.plan.choice is None, dtype
        assert "spec.precision.weights" in res.plan.reason and "vLLM 0.32.0" in res.plan.reason, res.plan.reason
    # what vLLM can: the checkpoint's own dtype, and FP8 from 16-bit online with the 0.32 spelling
    res = plan_place_render(_llmd("llama-3.1-8b", precision={"weights": "fp8"}, gpus={"maxGpus": 1}),
                            FLEETS["hgx-h100"])
    assert _arg(_args(res), "--quantization") == "fp8_per_tensor"
    res = plan_place_render(_llmd("deepseek-r1", gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}), FLEETS["mixed"])
    assert "--quantization" not in _args(res)            # the FP8 checkpoint's own quantization_config


def test_kv_cache_dtypes_render_vllms_flag_or_are_refused():
    res = plan_place_render(_llmd("llama-3.1-8b", precision={"weights": "bf16", "kvCache": "int8"},
                                  gpus={"maxGpus": 1}), FLEETS["hgx-h100"])
    assert _arg(_args(res), "--kv-cache-dtype") == "int8_per_token_head"
    res = plan_place_render(_llmd("llama-3.1-8b", precision={"weights": "bf16", "kvCache": "fp4"},
                                  gpus={"maxGpus": 1}), FLEETS["gb200-nvl72"])
    assert _arg(_args(res), "--kv-cache-dtype") == "nvfp4"
    res = plan_place_render(_llmd("llama-3.1-8b", precision={"weights": "bf16", "kvCache": "fp4"},
                                  gpus={"maxGpus": 1}), FLEETS["hgx-h100"])
    assert res.plan.choice is None and "kvCache fp4" in res.plan.reason
    res = plan_place_render(_llmd("deepseek-r1", precision={"kvCache": "int8"},
                                  gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}), FLEETS["mixed"])
    assert res.plan.choice is None and any("MLA" in r.reason for r in res.plan.rejected)


def test_eplb_is_rendered_with_the_planned_redundant_experts():
    # before the eplb branch vLLM rendered no EPLB at all (the memory fit held no redundant experts); now auto and
    # enabled render --enable-eplb with one redundant expert per EP rank, the count the memory fit holds
    for setting in ("auto", "enabled"):
        res = plan_place_render(_llmd("deepseek-r1", parallelism={"tensor": 1, "expert": 8, "pipeline": 1},
                                      gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]},
                                      engine={"kind": "vllm", "expertLoadBalancing": setting}), FLEETS["mixed"])
        args = _args(res)
        assert "--enable-eplb" in args
        assert yaml.safe_load(_arg(args, "--eplb-config"))["num_redundant_experts"] == 8
        assert res.plan.choice.memory.redundant_expert_bytes > 0


def test_image_and_memory_fraction_default_are_the_pinned_versions():
    assert vllm.DEFAULT_IMAGE == "vllm/vllm-openai:v0.32.0"
    res = plan_place_render(_llmd("llama-3.1-8b", gpus={"maxGpus": 1}), FLEETS["hgx-h100"])
    assert _arg(_args(res), "--gpu-memory-utilization") == "0.9"
    lines = [e.line() for e in res.rendered.explain if e.subject == "--gpu-memory-utilization"]
    assert any("0.92" in ln and "v0.32.0" in ln for ln in lines)


def test_search_prices_the_replica_limit_it_renders():
    from meshplan.planner import plan_for_spec

    llmd = _llmd("deepseek-r1", parallelism={"tensor": 2, "expert": 4, "pipeline": 1, "maxNumSeqs": 66},
                 gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]})
    plan = plan_for_spec(llmd.spec, FLEETS["mixed"])
    assert plan.choice is not None
    assert plan.choice.max_num_seqs == 64          # 66 // 4 = 16 per DP rank, 64 per replica
    res = plan_place_render(llmd, FLEETS["mixed"], plan=dataclasses.replace(plan))
    assert int(_arg(_args(res), "--max-num-seqs")) == 16
