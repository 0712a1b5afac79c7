"""vLLM conformance: every `vllm serve` command line meshplan renders is accepted by vLLM's own code.

For each case, the pods are rendered the way `meshplan render` does it (`render.pipeline.plan_place_render`
on a shipped fleet): the examples/*.yaml run as vLLM, and the layout families (one GPU; TP inside a node;
TP x PP across nodes; EP with attention DP inside a node and across nodes; every weight and KV dtype the
planner can choose; prefix caching, scheduling policy, CUDA graphs and EPLB toggles; user extraArgs).
Every container's argv of every pod (leader and workers) then goes, in ONE subprocess in the engine venv
(tests/conformance/vllm_probe.py), through vLLM's `vllm serve` parser and `create_engine_config()`, with
the model's real config.json (tests/fixtures/models, SOURCES.md) in a local directory and vLLM's CUDA
platform answering the planned GPU's compute capability, name and memory. A refused flag or configuration
fails with vLLM's own message.

Only what a CPU machine forces changes in the argv: the model positional becomes that local directory.

The pinned version is `engines-venv/vllm-0.32.0.txt` (the image `engines.vllm.DEFAULT_IMAGE` pins); the
newest release is an opt-in run: `MESHPLAN_CONFORMANCE_NEWEST=1` (venv `vllm-0.33.0`, built by
`.venv/bin/python engines-venv/install.py vllm-0.33.0`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

import meshplan.planner  # noqa: F401  (first: meshplan.engines imports the planner's types)
from meshplan.api.models import LLMDeployment
from meshplan.catalog.gpus import get_gpu
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import vllm as vllm_engine
from meshplan.engines.base import Disaggregation
from meshplan.planner import model_from_spec
from meshplan.planner.engines import redundant_experts
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

import importlib.util as _ilu

_spec = _ilu.spec_from_file_location("conformance_conftest", Path(__file__).with_name("conftest.py"))
_conftest = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)   # type: ignore[union-attr]
run_in_venv = _conftest.run_in_venv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
PROBE = HERE / "vllm_probe.py"
NEWEST = os.environ.get("MESHPLAN_CONFORMANCE_NEWEST", "") not in ("", "0")
VENV = "vllm-0.33.0" if NEWEST else f"vllm-{vllm_engine.VERSION}"

# Compute capability per catalogue GPU (NVIDIA "CUDA GPUs - Compute Capability", developer.nvidia.com/cuda-gpus:
# A100/A800 8.0; A10/A40/A6000 8.6; L4/L40/L40S/RTX 6000 Ada 8.9; H100/H200/H20/GH200 9.0; B200/GB200 10.0;
# B300/GB300 10.3; RTX PRO 6000 Blackwell 12.0; T4 7.5).
CAPABILITY_BY_FAMILY = {"ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0),
                        "blackwell_ultra": (10, 3), "turing": (7, 5)}
CAPABILITY_BY_NAME = {"a10": (8, 6), "a10g": (8, 6), "a40": (8, 6), "a6000": (8, 6), "rtx_pro_6000": (12, 0)}

# The real config.json each catalogue model is checked with (SOURCES.md names each file's origin).
CONFIGS = {
    "llama-3.1-8b": "meta-llama--Meta-Llama-3.1-8B_config.json",
    "llama-3.1-70b": "meta-llama--Meta-Llama-3.1-70B_config.json",
    "deepseek-r1": "deepseek-ai--DeepSeek-R1_config.json",
    "qwen3-32b": "Qwen--Qwen3-32B_config.json",
    "qwen3-235b-a22b": "Qwen--Qwen3-235B-A22B-FP8_config.json",
    "gpt-oss-120b": "openai--gpt-oss-120b_config.json",
}
# Models with no config.json stored here: Mixtral-8x7B (no copy in the fixture source) and GPT-MoE-1.8T (the
# NVIDIA blog's hypothetical model: it has no checkpoint). Their config.json is WRITTEN here from the
# architecture meshplan plans with (the catalogue entry / the example's spec.model.architecture) in
# Mixtral's format (transformers MixtralConfig), so vLLM builds the same shapes; the test says so.
SYNTHESIZED = {"mixtral-8x7b", "gpt-moe-1.8t"}


def _mixtral_style_config(arch: Any, max_context: int) -> dict:
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
        "hidden_size": arch.hidden_size, "intermediate_size": arch.moe_intermediate_size or arch.intermediate_size,
        "num_hidden_layers": arch.num_layers, "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "num_local_experts": arch.num_experts, "num_experts_per_tok": arch.experts_per_token,
        "vocab_size": arch.vocab_size, "max_position_embeddings": max_context,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    }


FLEETS = {f.stem: build_topology(fleet_nodes(load_fleet(str(f))), [], ready_if_unknown=True)
          for f in sorted((ROOT / "operator" / "meshplan" / "fleets").glob("*.yaml"))}


def _example(name: str) -> dict:
    m = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    m["spec"].setdefault("engine", {})["kind"] = "vllm"
    return m


def _base(model: str, **spec: Any) -> dict:
    m = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "conf"},
         "spec": {"model": {"name": model}, "engine": {"kind": "vllm"},
                  "workload": {"inputTokens": 1024, "outputTokens": 256, "concurrency": 32},
                  "gpus": {"maxGpus": 8}, "replicas": 1}}
    for k, v in spec.items():
        if isinstance(v, dict):
            m["spec"].setdefault(k, {}).update(v)
        else:
            m["spec"][k] = v
    return m


def _engine(**kw: Any) -> dict:
    return {"engine": {"kind": "vllm", **kw}}


# (case id, manifest, fleet). Families of the issue; each pins what makes it that family.
CASES: list[tuple[str, dict, str]] = [
    ("example-llama-3.1-8b-1gpu", _example("llama-3.1-8b-1gpu"), "hgx-h100"),
    ("example-llama-3.1-70b-hgx-h100", _example("llama-3.1-70b-hgx-h100"), "hgx-h100"),
    ("example-mixtral-8x7b-l40s", _example("mixtral-8x7b-l40s"), "mixed"),
    # the issue's case: DeepSeek-R1 as vLLM on the mixed fleet (its H200 nodes), and with chunkSize 128 pinned
    ("example-deepseek-r1-h200-mixed", _example("deepseek-r1-h200"), "mixed"),
    ("deepseek-r1-chunk128-mixed", {**_example("deepseek-r1-h200"), "spec": {
        **_example("deepseek-r1-h200")["spec"], "parallelism": {"pipeline": 1, "chunkSize": 128}}}, "mixed"),
    ("example-gpt-moe-1.8t-gb200", _example("gpt-moe-1.8t-gb200-nvl72"), "gb200-nvl72"),
    # one GPU, every weight dtype vLLM can produce from a 16-bit checkpoint and every KV dtype
    ("1gpu-bf16-bf16", _base("llama-3.1-8b", gpus={"maxGpus": 1},
                             precision={"weights": "bf16", "kvCache": "bf16"}), "hgx-h100"),
    ("1gpu-fp8-fp8", _base("llama-3.1-8b", gpus={"maxGpus": 1},
                           precision={"weights": "fp8", "kvCache": "fp8"}), "hgx-h100"),
    ("1gpu-kv-int8", _base("llama-3.1-8b", gpus={"maxGpus": 1},
                           precision={"weights": "bf16", "kvCache": "int8"}), "hgx-h100"),
    ("1gpu-kv-fp4-gb200", _base("llama-3.1-8b", gpus={"maxGpus": 1},
                                precision={"weights": "bf16", "kvCache": "fp4"}), "gb200-nvl72"),
    # an FP4 checkpoint (gpt-oss MXFP4) as shipped
    ("gpt-oss-fp4-checkpoint", _base("gpt-oss-120b", gpus={"maxGpus": 8}), "gb200-nvl72"),
    # TP inside a node (8 GPUs, one pod)
    ("tp8-node", _base("llama-3.1-70b", parallelism={"tensor": 8, "pipeline": 1}), "hgx-h100"),
    # TP x PP across nodes: two pods, --nnodes / --node-rank / --headless worker
    ("tp8-pp2-2nodes", _base("llama-3.1-70b", parallelism={"tensor": 8, "pipeline": 2},
                             gpus={"maxGpus": 16}, precision={"weights": "bf16"}), "hgx-h100"),
    # EP with attention DP inside a node (TP1 x DP8 --enable-expert-parallel): DeepSeek-R1 (its FP8 checkpoint)
    # on one H200 node; prefix caching off, priority, CUDA graphs off, EPLB disabled, user extraArgs (one in
    # vLLM's underscore spelling, one with `=`)
    ("ep8-dp-attention-node", _base("deepseek-r1", parallelism={"tensor": 1, "expert": 8, "pipeline": 1},
                                    gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]},
                                    workload={"inputTokens": 1024, "outputTokens": 256, "concurrency": 32,
                                              "maxContext": 8192},
                                    **_engine(prefixCaching=False, schedulingPolicy="priority",
                                              cudaGraphs="disabled", expertLoadBalancing="disabled",
                                              extraArgs=["--max-logprobs", "5", "--long_prefill_token_threshold",
                                                         "64", "--seed=7"])), "mixed"),
    # EP across pods: DeepSeek-R1 EP16 (TP1 x DP16) on four 4-GPU GB200 nodes of one NVL72 domain,
    # --data-parallel-start-rank workers, EPLB enabled (16 redundant experts, one per EP rank: 272 = 17 per GPU)
    ("ep16-dp-4nodes", _base("deepseek-r1", parallelism={"tensor": 1, "expert": 16, "pipeline": 1},
                             gpus={"maxGpus": 16}, **_engine(expertLoadBalancing="enabled")), "gb200-nvl72"),
    # EPLB auto on the DeepSeek-R1 EP8 (TP1 x DP8) H200 node: 8 redundant experts (264 = 33 per GPU)
    ("ep8-eplb-h200", _base("deepseek-r1", parallelism={"tensor": 1, "expert": 8, "pipeline": 1},
                            gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}), "mixed"),
    # EP with TP inside the DP ranks (TP2 x DP4), EPLB auto
    ("tp2-ep4-node", _base("deepseek-r1", parallelism={"tensor": 2, "expert": 4, "pipeline": 1},
                           gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}), "mixed"),
    # MTP speculative decoding (spec.engine.speculative), DeepSeek-R1's one MTP module reused for 2 draft tokens,
    # and the MTP example
    ("deepseek-r1-mtp2-tp8", _base("deepseek-r1", parallelism={"tensor": 8, "pipeline": 1},
                                   gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]},
                                   **_engine(speculative={"method": "mtp", "tokens": 2})), "mixed"),
    ("example-deepseek-r1-mtp-h200", _example("deepseek-r1-mtp-h200"), "mixed"),
    # MTP with pipeline stages across two H200 nodes (vLLM keeps PP with MTP; SGLang refuses it) and with expert
    # parallelism and attention DP
    ("deepseek-r1-mtp-pp2", _base("deepseek-r1", parallelism={"tensor": 8, "pipeline": 2},
                                  gpus={"maxGpus": 16, "products": ["NVIDIA-H200"]},
                                  **_engine(speculative={"method": "mtp", "tokens": 1})), "hgx-h200-ib"),
    ("deepseek-r1-mtp-ep8", _base("deepseek-r1", parallelism={"tensor": 1, "expert": 8, "pipeline": 1},
                                  gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]},
                                  **_engine(speculative={"method": "mtp", "tokens": 3, "acceptanceRate": 0.7})),
     "mixed"),
] + [
    # wide EP over RDMA (issue 18): DeepSeek-R1 DP16+EP (2 x 8 H200) and DP32+EP (4 x 8 H200) on the
    # hgx-h200-ib fleet, DeepEP normal and low-latency pinned, dual-batch overlap on; and both left to the
    # planner (auto). Every pod (leader and --headless workers) is parsed and its VllmConfig built.
    (f"wide-dp{ep}-ep-{a2a}-dbo-{ov}", _base("deepseek-r1", parallelism={"tensor": 1, "expert": ep, "pipeline": 1},
                                            gpus={"maxGpus": ep, "products": ["NVIDIA-H200"]},
                                            **_engine(allToAll=a2a, batchOverlap=ov)), "hgx-h200-ib")
    for ep, a2a, ov in ((16, "deepep-normal", "on"), (16, "deepep-low-latency", "on"), (32, "deepep-normal", "on"),
                        (32, "deepep-low-latency", "on"), (16, "auto", "auto"), (32, "deepep-low-latency", "off"))
]
# meshplan's own choice for DeepSeek-R1 (the example, layout left open) on HGX H100 / H200 over InfiniBand
# (issue 18: "meshplan plan for DeepSeek-R1 on HGX H100 and H200 chooses a layout that renders")
CASES += [
    (f"auto-deepseek-r1-{fleet}", {**_example("deepseek-r1-h200"), "spec": {
        **_example("deepseek-r1-h200")["spec"], "parallelism": {},
        "gpus": {"products": [product], "maxGpus": 32}}}, fleet)
    for fleet, product in (("hgx-h100-ib", "NVIDIA-H100-80GB-HBM3"), ("hgx-h200-ib", "NVIDIA-H200"))
]

# Prefill/decode disaggregation (issue 19): each role's pods rendered by the same public path with
# `engines.base.Disaggregation` set (render.pipeline.plan_place_render(disagg=...), what the operator will pass),
# every pod's argv parsed and its VllmConfig (with the KVTransferConfig) built. DeepSeek-R1 prefill TP8 on one H200
# node and decode DP16+EP over two H200 nodes (the DeepSeek-style split), and dense Llama-3.1-8B on one GPU per role,
# with each connector vLLM 0.32.0 registers for PD (NIXL, Mooncake, LMCache).
_R1_PREFILL = _base("deepseek-r1", parallelism={"tensor": 8, "pipeline": 1},
                    gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]})
_R1_DECODE = _base("deepseek-r1", parallelism={"tensor": 1, "expert": 16, "pipeline": 1},
                   gpus={"maxGpus": 16, "products": ["NVIDIA-H200"]})
_LLAMA_1GPU = _base("llama-3.1-8b", gpus={"maxGpus": 1}, precision={"weights": "bf16", "kvCache": "bf16"})
_IB = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
DISAGG_CASES: list[tuple[str, dict, str, Disaggregation]] = [
    ("pd-r1-prefill-tp8", _R1_PREFILL, "hgx-h200-ib", Disaggregation("prefill", ib_devices=_IB)),
    ("pd-r1-decode-ep16", _R1_DECODE, "hgx-h200-ib", Disaggregation("decode", ib_devices=_IB)),
    ("pd-llama-prefill-nixl", _LLAMA_1GPU, "hgx-h100", Disaggregation("prefill")),
    ("pd-llama-decode-nixl", _LLAMA_1GPU, "hgx-h100", Disaggregation("decode")),
    ("pd-llama-prefill-mooncake", _LLAMA_1GPU, "hgx-h100", Disaggregation("prefill", "mooncake")),
    ("pd-llama-decode-lmcache", _LLAMA_1GPU, "hgx-h100", Disaggregation("decode", "lmcache")),
]

CASES_BY_ID = {case: (manifest, fleet) for case, manifest, fleet in CASES}
CASES_BY_ID.update({case: (manifest, fleet) for case, manifest, fleet, _ in DISAGG_CASES})


def test_eplb_cases_run_redundant_experts(conformance):
    """Issue 15 (EPLB gets redundant experts or is not rendered): vLLM's own config of the EP16-over-4-GB200 and
    the DeepSeek-R1 EP8 H200 cases has EPLB on with one redundant expert per EP rank, and 0 where disabled.
    Before the eplb branch vLLM rendered no EPLB (enable_eplb False in every case)."""
    ep16 = _leader(conformance, "ep16-dp-4nodes")
    ep8 = _leader(conformance, "ep8-eplb-h200")
    assert ep16["enable_eplb"] and ep16["num_redundant_experts"] == 16 and ep16["experts"]["physical_experts"] == 272
    assert ep8["enable_eplb"] and ep8["num_redundant_experts"] == 8 and ep8["experts"]["physical_experts"] == 264
    assert ep8["experts"]["window_size"] == vllm_engine.EPLB_WINDOW_SIZE
    assert ep8["experts"]["step_interval"] == vllm_engine.EPLB_STEP_INTERVAL
    off = _leader(conformance, "ep8-dp-attention-node")
    assert off["enable_eplb"] is False and off["num_redundant_experts"] == 0
    for i in range(len(conformance["rendered"]["ep16-dp-4nodes"].pods)):   # every pod: leader and workers
        assert conformance["results"][f"ep16-dp-4nodes/pod{i}"]["config"]["num_redundant_experts"] == 16


def _gpu_of(name: str, count: int) -> dict:
    g = get_gpu(name)
    cap = CAPABILITY_BY_NAME.get(g.name) or CAPABILITY_BY_FAMILY[g.family]
    product = g.product_labels[0] if g.product_labels else g.name
    return {"name": product.replace("-", " "), "major": cap[0], "minor": cap[1],
            "memory_bytes": int(g.memory_bytes), "count": count}


def _model_dir(tmp: Path, spec: Any) -> Path:
    name = spec.model.name
    d = tmp / name
    if d.exists():
        return d
    d.mkdir(parents=True)
    if name in CONFIGS:
        shutil.copy(FIXTURES / CONFIGS[name], d / "config.json")
    elif name in SYNTHESIZED:
        from meshplan.planner import model_from_spec

        # context: spec.model.architecture.maxContextTokens, else Mixtral-8x7B's 32768 (max_position_embeddings
        # of mistralai/Mixtral-8x7B-v0.1 config.json)
        ctx = getattr(spec.model.architecture, "max_context_tokens", None) or 32768
        (d / "config.json").write_text(json.dumps(_mixtral_style_config(model_from_spec(spec.model), ctx)))
    else:
        raise AssertionError(f"no config.json for {name}: add its real config.json to tests/fixtures/models")
    return d


@dataclasses.dataclass
class Rendered:
    case: str
    candidate: Any
    pods: list[dict]
    explain: list[Any]


def _render(case: str, manifest: dict, fleet: str, disagg: Disaggregation | None = None) -> Rendered:
    llmd = LLMDeployment.from_manifest(manifest)
    res = plan_place_render(llmd, FLEETS[fleet], disagg=disagg)
    assert res.plan.choice is not None, f"{case}: no plan on {fleet}: {res.plan.reason}"
    assert res.rendered is not None and res.placement.ok, f"{case}: {res.message}"
    pods = [p for g in res.rendered.groups for p in g.pods]
    return Rendered(case, res.plan.choice, pods, list(res.rendered.explain))


@pytest.fixture(scope="module")
def conformance(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("vllm-models")
    rendered: dict[str, Rendered] = {}
    cases, env_names = [], set()
    for case, manifest, fleet, disagg in [(*c, None) for c in CASES] + DISAGG_CASES:
        r = _render(case, manifest, fleet, disagg)
        rendered[case] = r
        model_dir = _model_dir(tmp, LLMDeployment.from_manifest(manifest).spec)
        for i, pod in enumerate(r.pods):
            for c in pod["spec"]["containers"]:
                env_names |= {e["name"] for e in c.get("env", [])}
                if list(c.get("command") or []) != ["vllm", "serve"]:
                    continue
                argv = list(c["args"])
                argv[0] = str(model_dir)          # the HF id / path -> the config-only directory
                gpus = int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 1))
                cases.append({"id": f"{case}/pod{i}", "argv": argv, "gpu": _gpu_of(r.candidate.gpu, gpus)})
    out = run_in_venv(VENV, PROBE, {"cases": cases, "env_names": sorted(env_names)})
    return {"rendered": rendered, "cases": {c["id"]: c for c in cases}, "out": out,
            "results": {r["id"]: r for r in out["results"]}}


def test_wide_ep_pods_run_the_planned_all_to_all_and_dbo(conformance):
    """Every pod of a wide-EP group: vLLM's own ParallelConfig has the planned DeepEP backend and DBO."""
    spelled = {"deepep-normal": "deepep_high_throughput", "deepep-low-latency": "deepep_low_latency"}
    wide = [c for c in conformance["rendered"] if c.startswith("wide-")]
    assert len(wide) == 6, wide
    # meshplan's own DeepSeek-R1 choice on HGX H100 is wide EP (no 8-GPU H100 domain holds it): its pods too
    auto = conformance["rendered"]["auto-deepseek-r1-hgx-h100-ib"].candidate
    assert auto.layout.gpus_per_stage > 8 and auto.a2a_backend in spelled, auto
    for case in wide:
        r = conformance["rendered"][case]
        c = r.candidate
        assert c.layout.ep in (16, 32) and len(r.pods) == c.layout.ep // 8, (case, c.layout, len(r.pods))
        assert "-ep-auto-" not in case or c.a2a_backend, case
        assert c.a2a_backend in spelled, (case, c.a2a_backend)     # auto chose DeepEP across the domains too
        if "-dbo-on" in case:
            assert c.batch_overlap, case
        if "-dbo-off" in case:
            assert not c.batch_overlap, case
        if "-deepep-" in case:
            assert c.a2a_backend in case, (case, c.a2a_backend)
        for i, _ in enumerate(r.pods):
            cfg = conformance["results"][f"{case}/pod{i}"]["config"]
            assert cfg["all2all_backend"] == spelled[c.a2a_backend], (case, i, cfg["all2all_backend"])
            assert cfg["enable_dbo"] is c.batch_overlap, (case, i)
            assert cfg["data_parallel_size"] == c.layout.ep and cfg["data_parallel_size_local"] == 8, (case, i)
            assert cfg["data_parallel_rank"] == 8 * i, (case, i)


def test_the_probe_ran_the_pinned_vllm(conformance):
    version = conformance["out"]["version"]
    want = "0.33.0" if NEWEST else vllm_engine.VERSION
    assert version.split("+")[0] == want, version
    assert vllm_engine.DEFAULT_IMAGE == f"vllm/vllm-openai:v{vllm_engine.VERSION}"
    # every case rendered pods, and every pod ran through vLLM
    for case, r in conformance["rendered"].items():
        assert any(k.startswith(case + "/") for k in conformance["cases"]), case


def test_every_rendered_argv_parses_and_builds_its_vllm_config(conformance):
    failed = [f"{r['id']} [{r['stage']}]: {r['error']}\n  argv: {' '.join(conformance['cases'][r['id']]['argv'])}"
              for r in conformance["results"].values() if not r["ok"]]
    assert not failed, "vLLM refused rendered command lines:\n" + "\n".join(failed)


def _leader(conformance, case: str) -> dict:
    return conformance["results"][f"{case}/pod0"]["config"]


def test_the_config_vllm_builds_is_the_plan(conformance):
    """What vLLM's own config says equals what the plan chose (per engine core where vLLM counts per DP rank)."""
    for case, r in conformance["rendered"].items():
        c = r.candidate
        ranks = c.layout.ep if c.layout.ep > 1 else 1
        for i, _ in enumerate(r.pods):
            cfg = conformance["results"][f"{case}/pod{i}"]["config"]
            assert cfg["tensor_parallel_size"] == c.layout.tp, case
            assert cfg["pipeline_parallel_size"] == c.layout.pp, case
            assert cfg["data_parallel_size"] == ranks, case
            assert cfg["enable_expert_parallel"] == (c.layout.ep > 1), case
            # finding: max_num_seqs is per DP rank in vLLM; the replica runs exactly the planned batch limit
            assert cfg["max_num_seqs"] * cfg["data_parallel_size"] == c.max_num_seqs, (case, cfg, c.max_num_seqs)
            assert cfg["max_num_batched_tokens"] == c.chunk_size, case
            assert cfg["max_num_batched_tokens"] >= cfg["max_num_seqs"], case
            # a rendered maximum length is what vLLM runs (render/options.py sets it from the planned context;
            # cases with workload.maxContext render it here)
            rendered_len = _flag(r.pods[i], "--max-model-len")
            if rendered_len is not None:
                assert cfg["max_model_len"] == rendered_len, case
            assert cfg["gpu_memory_utilization"] == pytest.approx(0.9), case
            want_kv = vllm_engine.KV_CACHE_DTYPES.get(c.kv_dtype, "auto")
            assert cfg["cache_dtype"] == want_kv, (case, c.kv_dtype)
            # EPLB: vLLM runs exactly the redundant experts the plan's memory fit holds (the engine module's rule)
            spec = LLMDeployment.from_manifest(dict(CASES_BY_ID[case][0])).spec
            want = redundant_experts("vllm", c.layout, model_from_spec(spec.model), spec.engine.expert_load_balancing)
            assert cfg["enable_eplb"] is (want > 0), (case, cfg)
            assert cfg["num_redundant_experts"] == want, (case, cfg["num_redundant_experts"], want)
            assert (c.memory.redundant_expert_bytes > 0) is (want > 0), case
            if want:
                placed = cfg["experts"]
                assert placed["physical_experts"] == placed["logical_experts"] + want, (case, placed)
                assert placed["even_over_ep"], (case, placed)     # FusedMoE's even-distribution rule


def test_mtp_reaches_vllms_speculative_config(conformance):
    """spec.engine.speculative renders a --speculative-config vLLM 0.32.0 resolves with DeepSeek-R1's real
    config.json (num_nextn_predict_layers 1) to MTP with the planned draft tokens; cases without it run none."""
    for case in ("deepseek-r1-mtp2-tp8", "example-deepseek-r1-mtp-h200", "deepseek-r1-mtp-pp2", "deepseek-r1-mtp-ep8"):
        spec = LLMDeployment.from_manifest(next(m for c, m, _ in CASES if c == case)).spec.engine.speculative
        for i, _ in enumerate(conformance["rendered"][case].pods):
            cfg = conformance["results"][f"{case}/pod{i}"]["config"]
            assert cfg["speculative_method"] == "mtp", (case, cfg)
            assert cfg["num_speculative_tokens"] == spec.tokens, (case, cfg)
            assert cfg["speculative_n_predict"] == 1, (case, cfg)   # the checkpoint's one MTP module
    assert _leader(conformance, "tp8-node")["speculative_method"] is None


def _flag(pod: dict, flag: str) -> int | None:
    args = pod["spec"]["containers"][0]["args"]
    return int(args[args.index(flag) + 1]) if flag in args else None


def test_a_planned_max_context_is_rendered_and_vllm_takes_it(conformance):
    r = conformance["rendered"]["ep8-dp-attention-node"]
    assert _flag(r.pods[0], "--max-model-len") == 8192
    assert _leader(conformance, "ep8-dp-attention-node")["max_model_len"] == 8192


def test_dp_attention_case_runs_the_planned_batch_per_rank(conformance):
    r = conformance["rendered"]["tp2-ep4-node"]
    cfg = _leader(conformance, "tp2-ep4-node")
    assert cfg["data_parallel_size"] == 4 and r.candidate.max_num_seqs == 4 * cfg["max_num_seqs"]


def test_features_and_extra_args_reach_vllms_config(conformance):
    cfg = _leader(conformance, "ep8-dp-attention-node")
    assert cfg["enable_prefix_caching"] is False
    assert cfg["policy"] == "priority"
    assert cfg["enforce_eager"] is True
    on = _leader(conformance, "tp8-node")
    assert on["enable_prefix_caching"] is True and on["policy"] == "fcfs" and on["enforce_eager"] is False
    args = conformance["rendered"]["ep8-dp-attention-node"].pods[0]["spec"]["containers"][0]["args"]
    assert "--long_prefill_token_threshold" in args      # the user's own spelling is kept; vLLM accepts it


def test_weights_and_kv_dtypes_are_the_planned_ones(conformance):
    fp8 = _leader(conformance, "1gpu-fp8-fp8")
    assert fp8["quantization"] == "fp8_per_tensor" and fp8["cache_dtype"] == "fp8"
    bf16 = _leader(conformance, "1gpu-bf16-bf16")
    assert bf16["quantization"] is None and bf16["dtype"] == "torch.bfloat16" and bf16["cache_dtype"] == "auto"
    assert _leader(conformance, "1gpu-kv-int8")["cache_dtype"] == "int8_per_token_head"
    assert _leader(conformance, "1gpu-kv-fp4-gb200")["cache_dtype"] == "nvfp4"
    ds = _leader(conformance, "example-deepseek-r1-h200-mixed")
    assert ds["quantization"] == "fp8"                    # the checkpoint's own FP8 (its quantization_config)
    assert _leader(conformance, "gpt-oss-fp4-checkpoint")["quantization"] in ("mxfp4", "gpt_oss_mxfp4")


def test_multi_node_workers_are_headless_with_their_ranks(conformance):
    res = conformance["results"]
    tp = [res[f"tp8-pp2-2nodes/pod{i}"]["config"] for i in range(2)]
    assert [c["nnodes"] for c in tp] == [2, 2] and [c["node_rank"] for c in tp] == [0, 1]
    assert all(c["world_size"] == 16 for c in tp)
    ep = [res[f"ep16-dp-4nodes/pod{i}"]["config"] for i in range(4)]
    assert [c["data_parallel_size_local"] for c in ep] == [4, 4, 4, 4]
    assert [c["data_parallel_rank"] for c in ep] == [0, 4, 8, 12]
    worker = conformance["rendered"]["ep16-dp-4nodes"].pods[1]["spec"]["containers"][0]["args"]
    assert "--headless" in worker and "--data-parallel-start-rank" in worker


# NCCL's documented variables the renderer may set (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
# NCCL 2.27: "Environment Variables"); render/nccl.py names the source of each value it sets.
NCCL_DOCUMENTED = {
    "NCCL_ALGO", "NCCL_CUMEM_ENABLE", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
    "NCCL_MNNVL_ENABLE", "NCCL_NET", "NCCL_NET_GDR_LEVEL", "NCCL_NVLS_ENABLE", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_PROTO", "NCCL_CROSS_NIC", "NCCL_IB_SL", "NCCL_IB_TC",
}


def test_env_names_are_vllms_or_nccls(conformance):
    out = conformance["out"]
    assert out["registry_size"] > 100                   # vllm/envs.py environment_variables was read
    for name in out["env"]["unknown"]:
        assert not name.startswith("VLLM_"), f"{name} is not in vllm/envs.py at {out['version']}"
        if name.startswith("NCCL_"):
            assert name in NCCL_DOCUMENTED, f"{name} is not a documented NCCL variable"


def test_the_memory_fraction_default_is_explained_with_the_version(conformance):
    assert conformance["out"]["facts"]["gpu_memory_utilization_default"] == 0.92
    lines = [e.line() for e in conformance["rendered"]["1gpu-fp8-fp8"].explain]
    assert any("--gpu-memory-utilization" in ln and "0.92" in ln and vllm_engine.VERSION in ln for ln in lines)


def test_the_extra_args_guard_table_is_vllms_own_parser(conformance):
    """api/extra_args.py checks spec.engine.extraArgs against catalog/engine_options.VLLM_OPTIONS: it must be
    exactly the pinned `vllm serve` parser's options (a stale table refuses valid flags and passes removed
    ones, e.g. --max-num-partial-prefills, gone in 0.32)."""
    from meshplan.catalog import engine_options

    real = {tuple(g) for g in conformance["out"]["options"]}
    names = {o for g in real for o in g}
    rendered = {t.split("=", 1)[0].replace("_", "-") for c in conformance["cases"].values() for t in c["argv"]
                if t.startswith("--") and not t.startswith("--no-")}
    assert rendered <= names, rendered - names       # every flag meshplan renders is an option of this parser
    if not NEWEST:                                   # the table is the pinned version's
        # the same option groups (the order of one option's spellings inside its group does not matter)
        assert {frozenset(g) for g in engine_options.VLLM_OPTIONS} == {frozenset(g) for g in real}
        assert engine_options.VERSIONS["vllm"] == vllm_engine.VERSION


def test_disaggregated_roles_run_the_kv_connector_vllm_builds(conformance):
    """Issue 19: every pod of a prefill role has vLLM's own KVTransferConfig with the planned connector as a KV
    producer, every decode pod as a consumer (NIXL warns kv_both is deprecated in 0.32.0); every connector meshplan
    offers is one vLLM 0.32.0 registers; the NIXL side channel is the pod's address; the R1 roles keep their layouts
    (prefill TP8, decode DP16 + EP over two pods)."""
    registered = set(conformance["out"]["facts"]["kv_connectors"])
    assert set(vllm_engine.DISAGG_TRANSFER_BACKENDS.values()) <= registered, registered
    assert "P2pNcclConnector" not in registered      # why meshplan does not offer it for 0.32.0
    for case, _, _, disagg in DISAGG_CASES:
        r = conformance["rendered"][case]
        want = vllm_engine.DISAGG_TRANSFER_BACKENDS[disagg.transfer_backend or vllm_engine.DISAGG_DEFAULT_BACKEND]
        for i, pod in enumerate(r.pods):
            cfg = conformance["results"][f"{case}/pod{i}"]["config"]
            assert cfg["kv_connector"] == want, (case, i, cfg["kv_connector"])
            assert cfg["kv_role"] == vllm_engine.KV_ROLES[disagg.role], (case, i, cfg["kv_role"])
            assert cfg["is_kv_producer"] is (disagg.role == "prefill") and \
                cfg["is_kv_consumer"] is (disagg.role == "decode"), (case, i)
            env = {e["name"]: e for e in pod["spec"]["containers"][0].get("env", [])}
            if want == "NixlConnector":
                assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
                assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(vllm_engine.NIXL_SIDE_CHANNEL_PORT)
            else:
                assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env, case
    prefill = conformance["results"]["pd-r1-prefill-tp8/pod0"]["config"]
    assert prefill["tensor_parallel_size"] == 8 and prefill["data_parallel_size"] == 1
    decode = conformance["rendered"]["pd-r1-decode-ep16"]
    assert len(decode.pods) == 2
    for i in range(2):
        cfg = conformance["results"][f"pd-r1-decode-ep16/pod{i}"]["config"]
        assert cfg["data_parallel_size"] == 16 and cfg["enable_expert_parallel"] and cfg["data_parallel_rank"] == 8 * i
    # the aggregated cases render no KV connector
    assert conformance["results"]["tp8-node/pod0"]["config"]["kv_connector"] is None


ROUTER_VENV = "vllm-router-0.1.17"
ROUTER_PROBE = Path(__file__).with_name("vllm_router_probe.py")


def test_the_pd_router_argv_parses_with_vllm_routers_own_parser():
    """Issue 19: `engines.vllm.router_command` (the engine's own PD router, spec.serving.router.kind engine) goes
    through vllm-router 0.1.17's own parse_router_args + _validate_router_args: PD mode on, the roles' KV connector,
    every prefill URL (with the Mooncake bootstrap port only for mooncake), every decode URL; a misspelt flag and a
    PD router without decode servers fail there (the router's own refusals are seen)."""
    prefill = ["conf-prefill-r0-0.conf-prefill-r0.default.svc:8000", "conf-prefill-r1-0.conf-prefill-r1.default.svc:8000"]
    decode = ["conf-decode-r0-0.conf-decode-r0.default.svc:8000"]
    cmd, nixl = vllm_engine.router_command(prefill, decode, port=8080)
    assert cmd == ("vllm-router",)
    _, mooncake = vllm_engine.router_command(prefill, decode, port=8080,
                                             disagg=Disaggregation(role="prefill", transfer_backend="mooncake"))
    no_decode = [a for a in nixl if a not in ("--decode", f"http://{decode[0]}")]
    cases = [{"id": "nixl", "argv": list(nixl)}, {"id": "mooncake", "argv": list(mooncake)},
             {"id": "misspelt", "argv": [a.replace("--vllm-pd-disaggregation", "--vllm-pd-disagregation") for a in nixl]},
             {"id": "no-decode", "argv": no_decode}]
    out = run_in_venv(ROUTER_VENV, ROUTER_PROBE, {"cases": cases})
    assert out["version"] == "0.1.17" == vllm_engine.VLLM_ROUTER_VERSION
    assert out["entry_point"] == ["vllm_router.launch_router:main"], out["entry_point"]
    r = {x["id"]: x for x in out["results"]}
    for case in ("nixl", "mooncake"):
        assert r[case]["ok"], r[case]
        assert r[case]["vllm_pd_disaggregation"] is True and r[case]["port"] == 8080 and r[case]["host"] == "0.0.0.0"
        assert r[case]["kv_connector"] == case
        assert r[case]["decode_urls"] == [f"http://{e}" for e in decode], r[case]
    assert r["nixl"]["prefill_urls"] == [[f"http://{e}", None] for e in prefill], r["nixl"]
    assert r["mooncake"]["prefill_urls"] == [[f"http://{e}", vllm_engine.MOONCAKE_BOOTSTRAP_PORT] for e in prefill]
    assert not r["misspelt"]["ok"] and "unrecognized arguments" in r["misspelt"]["error"], r["misspelt"]
    assert not r["no-decode"]["ok"] and "requires --decode" in r["no-decode"]["error"], r["no-decode"]
