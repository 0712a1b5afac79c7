"""Speculative decoding (MTP): spec.engine.speculative is priced, fitted, refused where it cannot run, rendered.

Pricing (planner.perf, `_core` "speculative"): a step of a running sequence feeds k + 1 tokens to the model,
the MTP drafts add one MTP module pass per draft token, and a step yields E = (1 - a^(k+1)) / (1 - a) tokens
(Leviathan et al. 2023), so TPOT = step / E. The goldens render the example examples/deepseek-r1-mtp-h200.yaml
(its spec's serving options, a fixed TP8 candidate on one HGX H200 node) for vLLM, SGLang and TensorRT-LLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _golden import GOLDEN, check_golden
from _gpu_nodes import gpu_node
from pydantic import ValidationError

from meshplan.api.models import LLMDeployment
from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model, load_hf_config
from meshplan.placement import place, request_for_layout
from meshplan.planner import perf, plan_for_spec
from meshplan.planner import memory as mem
from meshplan.planner.calibration import FITTED_PARAMS
from meshplan.planner.memory import ReplicaMapping
from meshplan.planner.types import (Candidate, Layout, MemoryFit, Prediction, Speculative, Workload,
                                    acceptance_rate_for_length, expected_tokens_per_step)
from meshplan.render import Owner, render_deployment
from meshplan.render.options import options_from_spec
from meshplan.topology import build_topology

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
EXAMPLE = ROOT / "examples" / "deepseek-r1-mtp-h200.yaml"


def _manifest(model: str = "deepseek-r1", kind: str = "vllm", **speculative) -> dict:
    return {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "mtp"},
            "spec": {"model": {"name": model}, "engine": {"kind": kind, "speculative": speculative},
                     "workload": {"inputTokens": 1024, "outputTokens": 1024, "concurrency": 8},
                     "gpus": {"products": ["NVIDIA-H200"], "maxGpus": 8}, "replicas": 1,
                     "parallelism": {"tensor": 8, "pipeline": 1}}}


# ---- the formula ------------------------------------------------------------------------------------------

def test_expected_tokens_per_step_is_leviathans_formula():
    assert expected_tokens_per_step(1, 0.85) == pytest.approx(1.85)
    assert expected_tokens_per_step(3, 0.8) == pytest.approx((1 - 0.8 ** 4) / (1 - 0.8))   # 2.952
    assert expected_tokens_per_step(3, 0.8) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert expected_tokens_per_step(4, 1.0) == 5.0 and expected_tokens_per_step(0, 0.9) == 1.0
    assert expected_tokens_per_step(2, 0.0) == 1.0
    # a published acceptance length converts back to the rate (TensorRT-LLM blog: MTP 3 at 2.82 tokens/step)
    a = acceptance_rate_for_length(3, 2.82)
    assert expected_tokens_per_step(3, a) == pytest.approx(2.82, abs=1e-9) and 0.7 < a < 0.8


# ---- pricing: a worked example --------------------------------------------------------------------------

def test_mtp_step_is_the_verify_step_plus_the_drafts_over_expected_tokens():
    """DeepSeek-R1 TP8 on H200, one request (no prompt lands in its steps): the step verifies k + 1 = 3 tokens
    (`iteration_ms` with 3 decode tokens, KV read once) and runs 2 MTP passes; TPOT = step / E(2, 0.7)."""
    model, gpu, q = get_model("deepseek-r1"), get_gpu("h200_sxm"), FITTED_PARAMS
    m = ReplicaMapping(attn_tp=8, moe_tp=8)
    wl = Workload(isl=1024, osl=1024)
    spec = Speculative("mtp", 2, 0.7)
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", engine="vllm", concurrency=1)
    with_mtp = perf.predict(model, gpu, m, wl, speculative=spec, **kw)
    plain = perf.predict(model, gpu, m, wl, **kw)
    st = perf._stage(model, gpu, m, "fp8", "fp8", None)
    ctx = 1024 + 1024 / 2.0
    verify = perf.iteration_ms(model, st, m, q, 3, ctx, 0.0, 512.0, 3)
    draft = perf._draft_ms(model, st, m, q, 1, ctx, spec)
    e = (1 - 0.7 ** 3) / (1 - 0.7)
    assert with_mtp.tpot_ms == pytest.approx((verify + draft) / e)
    assert plain.tpot_ms == pytest.approx(perf.iteration_ms(model, st, m, q, 1, ctx, 0.0, 512.0))
    # verifying 3 tokens costs more than decoding 1 (compute, more experts touched) but far less than 3 steps
    assert plain.tpot_ms < verify < 2 * plain.tpot_ms
    assert 0 < draft < plain.tpot_ms / 4            # one MTP layer per draft token, of 61 layers
    assert with_mtp.tpot_ms < 0.7 * plain.tpot_ms
    assert any("tokens per step" in n and "2.19" in n for n in with_mtp.notes)


def test_a_draft_that_is_never_accepted_only_costs():
    model, gpu = get_model("deepseek-r1"), get_gpu("h200_sxm")
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", engine="sglang", concurrency=16)
    m = ReplicaMapping(attn_tp=8, moe_tp=8)
    plain = perf.predict(model, gpu, m, Workload(isl=1024, osl=1024), **kw)
    never = perf.predict(model, gpu, m, Workload(isl=1024, osl=1024), speculative=Speculative("mtp", 1, 0.0), **kw)
    assert never.tpot_ms > plain.tpot_ms


def test_speculative_off_prices_exactly_as_before():
    model, gpu = get_model("deepseek-r1"), get_gpu("h200_sxm")
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", engine="sglang", concurrency=64)
    a = perf.predict(model, gpu, Layout(tp=8), Workload(isl=2048, osl=512), **kw)
    b = perf.predict(model, gpu, Layout(tp=8), Workload(isl=2048, osl=512), speculative=Speculative("off"), **kw)
    assert a == b


# ---- memory -----------------------------------------------------------------------------------------------

def test_the_mtp_module_weights_and_kv_are_in_the_memory_fit():
    """One MTP module of DeepSeek-R1 is one more MoE layer (~11.3B parameters: 256 experts x 3 x 7168 x 2048
    plus MLA attention) and a 2h x h projection: FP8 over TP8 about 1.4 GiB per GPU, and one layer more of KV."""
    model, gpu = get_model("deepseek-r1"), get_gpu("h200_sxm")
    args = dict(weight_dtype="fp8", kv_dtype="fp8", context_tokens=2048)
    plain = mem.memory_fit(model, gpu, Layout(tp=8), **args)
    mtp = mem.memory_fit(model, gpu, Layout(tp=8), mtp_layers=1, **args)
    extra = (mtp.weights_bytes - plain.weights_bytes) / 2**30
    assert 1.25 < extra < 1.6, extra
    assert mtp.kv_bytes_per_token == pytest.approx(plain.kv_bytes_per_token * 62 / 61)
    assert mtp.kv_capacity_tokens < plain.kv_capacity_tokens


def test_the_planner_fits_and_prices_mtp_and_says_so():
    spec = LLMDeployment.from_manifest(_manifest(method="mtp", tokens=1, acceptanceRate=0.8)).spec
    p = plan_for_spec(spec)
    assert p.choice is not None
    assert "1.80 tokens per step" in p.reason and "ITL" in p.reason and "acceptanceRate" in p.reason
    plain = plan_for_spec(LLMDeployment.from_manifest(_manifest()).spec)
    assert "tokens per step" not in plain.reason
    assert p.choice.memory.weights_bytes > plain.choice.memory.weights_bytes     # the MTP module is held
    assert p.choice.prediction.tpot_ms < plain.choice.prediction.tpot_ms


def test_the_default_acceptance_rate_names_its_source():
    spec = LLMDeployment.from_manifest(_manifest(method="mtp")).spec
    p = plan_for_spec(spec)
    assert "0.85" in p.reason and "arXiv:2412.19437" in p.reason


# ---- refusals ---------------------------------------------------------------------------------------------

def test_a_model_without_mtp_layers_is_refused_naming_the_field():
    assert load_hf_config(FIXTURES / "deepseek-ai--DeepSeek-R1_config.json").mtp_layers == 1
    assert load_hf_config(FIXTURES / "moonshotai--Kimi-K2.5_config.json").mtp_layers == 0
    assert get_model("llama-3.1-70b").mtp_layers == 0 and get_model("deepseek-v3").mtp_layers == 1
    for kind in ("vllm", "sglang", "trtllm"):
        m = _manifest("llama-3.1-70b", kind, method="mtp")
        p = plan_for_spec(LLMDeployment.from_manifest(m).spec)
        assert p.choice is None, kind
        assert "num_nextn_predict_layers" in p.reason and "spec.engine.speculative.method" in p.reason, p.reason


@pytest.mark.parametrize("kind", ["nim", "deepspeed"])
def test_engines_that_cannot_be_told_are_refused_by_the_api(kind):
    m = _manifest("llama-3.1-8b", kind, method="mtp")
    m["spec"]["engine"]["image"] = "registry.example.com/x:1"
    with pytest.raises(ValidationError, match="speculative.method"):
        LLMDeployment.from_manifest(m)


@pytest.mark.parametrize("bad", [{"method": "eagle"}, {"method": "mtp", "tokens": 0}, {"method": "mtp", "tokens": 8},
                                 {"method": "mtp", "acceptanceRate": 1.0}, {"method": "mtp", "acceptanceRate": -0.1}])
def test_the_schema_bounds_the_fields(bad):
    with pytest.raises(ValidationError):
        LLMDeployment.from_manifest(_manifest(**bad))


def test_the_crd_carries_the_enum_bounds_and_the_engine_rule():
    crd = yaml.safe_load((ROOT / "crds" / "meshplan.dev_llmdeployments.yaml").read_text())
    eng = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"]
    sp = eng["properties"]["speculative"]["properties"]
    assert sp["method"]["enum"] == ["off", "mtp"]
    assert (sp["tokens"]["minimum"], sp["tokens"]["maximum"]) == (1, 7)
    assert sp["acceptanceRate"]["maximum"] == 0.99
    assert any("speculative.method" in r.get("fieldPath", "") for r in eng["x-kubernetes-validations"])


# ---- rendering ----------------------------------------------------------------------------------------------

def _h200_node():
    # NVIDIA GPU feature discovery labels of an 8 x H200 141GB node (memory 143771 MiB)
    return gpu_node("hgx-h200-0", product="NVIDIA-H200", memory_mib=143771)


def render_example(kind: str) -> list[dict]:
    m = yaml.safe_load(EXAMPLE.read_text())
    m["spec"]["engine"]["kind"] = kind
    spec = LLMDeployment.from_manifest(m).spec
    serving, network, pods = options_from_spec(spec)
    layout = Layout(tp=8)
    topo = build_topology([_h200_node()])
    placement = place(request_for_layout(layout, 8, product="NVIDIA-H200"), topo)
    assert placement.ok, placement.message()
    cand = Candidate(layout=layout, weight_dtype="fp8", kv_dtype="fp8", chunk_size=2048, max_num_seqs=32,
                     memory=MemoryFit(True, 0, 0, 0, 0, 0, 0, 0), prediction=Prediction(0, 0, 0, 0, 0),
                     engine=kind, gpu="h200_sxm")
    out = render_deployment(Owner("deepseek-r1-mtp", "serving", "0b9e4c1a-5f6d-4e1a-9c1b-1234567890ab"), cand,
                            placement, topo, serving, network, pods)
    return out.objects


def _args(objects: list[dict]) -> list[str]:
    for o in objects:
        for c in (o.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or
                  o.get("spec", {}).get("containers") or []):
            if c.get("args"):
                return list(c["args"])
    raise AssertionError("no container args rendered")


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
def test_golden_mtp_example(kind):
    check_golden(render_example(kind), GOLDEN / f"{kind}-deepseek-r1-mtp-h200.yaml", __file__)


def test_each_engine_spells_mtp_its_own_way():
    v = _args(render_example("vllm"))
    assert json.loads(v[v.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    s = _args(render_example("sglang"))
    got = {f: s[s.index(f) + 1] for f in ("--speculative-algorithm", "--speculative-num-steps",
                                          "--speculative-eagle-topk", "--speculative-num-draft-tokens")}
    assert got == {"--speculative-algorithm": "NEXTN", "--speculative-num-steps": "2", "--speculative-eagle-topk": "1",
                   "--speculative-num-draft-tokens": "3"}
    t = _args(render_example("trtllm"))
    options = yaml.safe_load(t[0].split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0])
    assert options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}


def test_without_speculative_nothing_is_rendered():
    m = yaml.safe_load(EXAMPLE.read_text())
    m["spec"]["engine"].pop("speculative")
    spec = LLMDeployment.from_manifest(m).spec
    serving, _, _ = options_from_spec(spec)
    assert serving.speculative is None


# ---- against published runs (benchmarks/evidence: the speculative rows, kept apart) -----------------------

def _evidence():
    import importlib.util
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("meshplan_evidence", ROOT / "benchmarks" / "evidence.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def test_the_mtp_speed_up_matches_two_published_sources():
    """TensorRT-LLM's DeepSeek-R1 B200 min-latency table (MTP 0-5) and LMSYS's SGLang DeepSeek-V3 H200 decode run:
    the TPOT ratio with MTP over the same source's run without it is predicted within 10% on every row (median
    2.3%), while the same rows priced without MTP miss by 7-45%."""
    ev = _evidence()
    runs = ev.priced_spec_runs(ev.load())
    assert len({r.source for r in runs}) >= 2 and sum(r.spec_tokens > 0 for r in runs) >= 7
    base = {r.source: (ev.predict_spec_run(r, FITTED_PARAMS)["tpot_ms"], r.measured["tpot_ms"])
            for r in runs if r.spec_tokens == 0}
    assert set(base) == {r.source for r in runs}
    ratio_err, plain_err = [], []
    for r in runs:
        if r.spec_tokens == 0:
            continue
        pb, mb = base[r.source]
        pred = ev.predict_spec_run(r, FITTED_PARAMS)["tpot_ms"]
        ratio_err.append(abs((pred / pb) / (r.measured["tpot_ms"] / mb) - 1.0))
        plain_err.append(abs(ev.predict_spec_run(r, FITTED_PARAMS, with_spec=False)["tpot_ms"] / pb
                             / (r.measured["tpot_ms"] / mb) - 1.0))
    assert max(ratio_err) < 0.10, ratio_err
    assert sorted(ratio_err)[len(ratio_err) // 2] < 0.05
    assert min(plain_err) > 0.25        # without the MTP term the speed-up is missed entirely


def test_an_explicit_architecture_carries_its_mtp_layers():
    """`meshplan architecture config.json` writes config.json num_nextn_predict_layers as spec.model.architecture
    .mtpLayers, and the planner reads it back: with it MTP plans, without it MTP is refused naming the field."""
    from meshplan.catalog.models import architecture_manifest
    from meshplan.planner import model_from_spec

    arch = architecture_manifest(load_hf_config(FIXTURES / "deepseek-ai--DeepSeek-R1_config.json"))
    assert arch["mtpLayers"] == 1
    m = _manifest(method="mtp")
    m["spec"]["model"] = {"name": "deepseek-ai/DeepSeek-R1", "architecture": arch}
    spec = LLMDeployment.from_manifest(m).spec
    assert model_from_spec(spec.model).mtp_layers == 1
    assert plan_for_spec(spec).choice is not None
    m["spec"]["model"]["architecture"] = {k: v for k, v in arch.items() if k != "mtpLayers"}
    refused = plan_for_spec(LLMDeployment.from_manifest(m).spec)
    assert refused.choice is None and "num_nextn_predict_layers" in refused.reason


def test_the_operator_reports_a_refused_mtp_as_a_condition_with_the_field():
    """What the schema cannot see (the model's MTP modules) the operator reports: Planned False, NoFeasiblePlan,
    with the planner's reason naming config.json num_nextn_predict_layers and spec.engine.speculative.method."""
    from meshplan.controller.reconcile import _capacity_message
    from meshplan.devcluster.fleets import fleet_nodes, load_fleet

    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), [], ready_if_unknown=True)
    m = _manifest("llama-3.1-70b", "vllm", method="mtp")
    m["spec"]["gpus"] = {"maxGpus": 8}
    spec = LLMDeployment.from_manifest(m).spec
    p = plan_for_spec(spec, topo)
    assert p.choice is None
    reason, message = _capacity_message(spec, topo, p.reason, topo)
    assert reason == "NoFeasiblePlan"
    assert "num_nextn_predict_layers" in message and "spec.engine.speculative.method" in message


def test_verified_tokens_read_their_sequences_kv_cache_once():
    """k + 1 tokens of ONE sequence read its KV cache once (the attention kernel takes them as one query block); three
    sequences read three caches (MLA decode attention also computes per token, so the saving is the KV reads only)."""
    model, gpu, q = get_model("deepseek-r1"), get_gpu("h200_sxm"), FITTED_PARAMS
    m = ReplicaMapping(attn_tp=8, moe_tp=8)
    st = perf._stage(model, gpu, m, "fp8", "fp8", None)
    one_token = perf.iteration_ms(model, st, m, q, 1, 65536, 0.0, 0.0)
    one_seq_three_tokens = perf.iteration_ms(model, st, m, q, 3, 65536, 0.0, 0.0, 3)
    three_seqs = perf.iteration_ms(model, st, m, q, 3, 65536, 0.0, 0.0)
    assert one_token < one_seq_three_tokens < 0.9 * three_seqs


def test_sglang_never_plans_pipeline_stages_with_mtp():
    """SGLang 0.5.23's start-up check (found by its conformance probe: TP8 x PP2 with NEXTN was refused) — "PP +
    speculative decoding (MTP) is only supported on prefill nodes": the search drops PP > 1 for SGLang with MTP,
    a pinned PP2 is refused with that reason, and the renderer refuses it too. vLLM 0.32.0 builds TP8 x PP2 with
    MTP (tests/conformance/test_vllm.py case deepseek-r1-mtp-pp2), so it keeps them."""
    from meshplan.engines.base import RenderError, ServingOptions
    from meshplan.render.engine_args import PodRole, engine_command

    def spec_of(kind, pipeline):
        m = _manifest("deepseek-r1", kind, method="mtp")
        m["spec"]["parallelism"] = {"pipeline": pipeline} if pipeline else {}
        m["spec"]["gpus"]["maxGpus"] = 16
        return LLMDeployment.from_manifest(m).spec

    free = plan_for_spec(spec_of("sglang", None))
    assert free.choice is not None and all(c.layout.pp == 1 for c in free.frontier)
    pinned = plan_for_spec(spec_of("sglang", 2))
    assert pinned.choice is None and "PP + speculative decoding" in pinned.reason
    assert plan_for_spec(spec_of("vllm", 2)).choice is not None
    cand = Candidate(layout=Layout(tp=8, pp=2), weight_dtype="fp8", kv_dtype="fp8", chunk_size=2048, max_num_seqs=32,
                     memory=MemoryFit(True, 0, 0, 0, 0, 0, 0, 0), prediction=Prediction(0, 0, 0, 0, 0), engine="sglang")
    serving = ServingOptions(engine="sglang", model="deepseek-ai/DeepSeek-R1", checkpoint_dtype="fp8",
                             speculative=Speculative("mtp", 1, 0.85))
    with pytest.raises(RenderError, match="pipeline"):
        engine_command(cand, serving, PodRole(rank=0, pods=2, gpus_per_pod=8, leader_host="r1-0"))
