"""TensorRT-LLM 1.2.1 conformance: every trtllm-serve command line meshplan renders parses, and its
--extra_llm_api_options YAML validates.

STAND-IN, NOT THE ENGINE'S CODE: TensorRT-LLM 1.2.1 cannot be installed or imported here (its PyPI
package is a wheel-stub that downloads from pypi.nvidia.com, unreachable; the tagged source is not
reachable either). tests/conformance/trtllm_standin.py says exactly what checks instead: a real
click command with trtllm-serve's option names (extracted from its serve.py) and the rendered
options' types, and strict pydantic models of the LLM-API fields meshplan writes, plus the
start-up rules a plan can break. It runs in the project's venv (click and pydantic are there), so no
engine venv is built for TensorRT-LLM.

Pods are rendered the way `meshplan render` renders them (render.pipeline.plan_place_render) for
every example as `engine.kind: trtllm` on every shipped fleet where it plans, and directly
(render_deployment, as tests/test_render.py does) for the layout families and toggles; every
container of every pod (leader and workers) is parsed. Models: the catalogue's, built from the
real config.json files of tests/fixtures/models (SOURCES.md).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import click
import pytest
import yaml
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpu_nodes import gb200_nvl72, hgx_h100, l40s  # noqa: E402
from trtllm_standin import (  # noqa: E402
    STANDIN,
    DisaggServerConfig,
    TorchLlmArgsSubset,
    configuration_problems,
    disagg_router_problems,
    parse_disaggregated,
    parse_serve,
)

from meshplan.api.models import LLMDeployment  # noqa: E402
from meshplan.catalog.models import get_model  # noqa: E402
from meshplan.devcluster.fleets import fleet_nodes, load_fleet  # noqa: E402
from meshplan.engines import trtllm  # noqa: E402
from meshplan.engines.base import Disaggregation  # noqa: E402
from meshplan.placement import place, request_for_layout  # noqa: E402
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction, Speculative  # noqa: E402
from meshplan.render import NetworkOptions, Owner, PodOptions, render_deployment  # noqa: E402
from meshplan.render.engine_args import ServingOptions  # noqa: E402
from meshplan.render.pipeline import plan_place_render  # noqa: E402
from meshplan.topology import build_topology  # noqa: E402

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FLEETS = sorted((ROOT / "operator" / "meshplan" / "fleets").glob("*.yaml"))
MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)
PRED = Prediction(0, 0, 0, 0, 0)


def _leader_argv(pod: dict) -> tuple[list[str], str]:
    """(trtllm-serve argv after the program name, the LLM-API YAML) of a leader pod."""
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["/bin/sh", "-c"]
    script, name, *argv = [a.replace("$$", "$") for a in c["args"]]
    assert name == trtllm.TRTLLM_SCRIPT_NAME
    body = script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    if argv[0] == "mpirun":
        argv = argv[argv.index("trtllm-llmapi-launch") + 1:]
    assert argv[0] == "trtllm-serve"
    return argv[1:], body


def _check_pods(pods: list[dict], *, experts: int, heads: int) -> list[str]:
    """Problems of one replica group's pods as the stand-in sees them ([] when it accepts them)."""
    problems: list[str] = []
    leaders = [p for p in pods if p["metadata"]["labels"].get("meshplan.dev/role") == "leader"]
    assert len(leaders) == 1
    world = sum(int(p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)) for p in pods)
    for pod in pods:
        c = pod["spec"]["containers"][0]
        if pod is not leaders[0]:
            # a worker: the fixed sshd script, nothing of the user's
            assert c["command"] == ["/bin/sh", "-c"] and c["args"][1] == trtllm.TRTLLM_SSHD_SCRIPT_NAME
            assert c["args"][0].replace("$$", "$") == trtllm.SSHD_SCRIPT
            continue
        argv, body = _leader_argv(pod)
        try:
            params = parse_serve(argv)
        except click.UsageError as exc:
            problems.append(f"trtllm-serve refuses {shlex.join(argv)}: {exc.format_message()} [{STANDIN}]")
            continue
        try:
            args = TorchLlmArgsSubset.model_validate(yaml.safe_load(body))
        except ValidationError as exc:
            problems.append(f"LlmArgs refuses the --extra_llm_api_options YAML:\n{body}\n{exc} [{STANDIN}]")
            continue
        problems += [f"{p} [{STANDIN}]" for p in configuration_problems(params, args, world=world,
                                                                          experts=experts, heads=heads)]
        if len(pods) > 1:
            line = " ".join(c["args"])
            assert f"-np {world}" in line and "trtllm-llmapi-launch" in line
    return problems


# ---- every example, as `meshplan render` renders it -------------------------------------------

def _examples_rendered():
    cases = []
    for path in EXAMPLES:
        m = yaml.safe_load(path.read_text())
        m["spec"].setdefault("engine", {})["kind"] = "trtllm"
        m["spec"]["engine"].pop("extraArgs", None)      # other engines' spellings (the API refuses them)
        m["spec"].setdefault("gpus", {}).pop("products", None)
        for fleet in FLEETS:
            cases.append(pytest.param(m, fleet, id=f"{path.stem}-{fleet.stem}"))
    return cases


@pytest.mark.parametrize("manifest,fleet", _examples_rendered())
def test_every_example_renders_what_trtllm_accepts(manifest, fleet):
    llmd = LLMDeployment.from_manifest(manifest)
    topology = build_topology(fleet_nodes(load_fleet(str(fleet))), [], ready_if_unknown=True)
    result = plan_place_render(llmd, topology)
    if result.plan.choice is None:
        # refused by the planner: then it says why (e.g. pinned weights TensorRT-LLM cannot run)
        assert result.plan.reason
        return
    if result.rendered is None:
        assert result.message
        return
    model = get_model(llmd.spec.model.name)
    for group in result.rendered.groups:
        assert not _check_pods(list(group.pods), experts=model.num_experts, heads=model.num_attention_heads)


def test_the_examples_render_at_least_one_trtllm_group_per_example_that_pins_no_foreign_dtype():
    rendered = set()
    for param in _examples_rendered():
        manifest, fleet = param.values
        llmd = LLMDeployment.from_manifest(manifest)
        topology = build_topology(fleet_nodes(load_fleet(str(fleet))), [], ready_if_unknown=True)
        res = plan_place_render(llmd, topology)
        if res.rendered is not None and res.rendered.groups:
            rendered.add(llmd.spec.model.name)
    # llama-3.1-70b pins fp8 on a BF16 checkpoint: refused for TensorRT-LLM (tests/test_trtllm_findings.py)
    assert rendered >= {"llama-3.1-8b", "deepseek-r1", "gpt-moe-1.8t", "mixtral-8x7b"}, rendered


# ---- the layout families and toggles, rendered directly -----------------------------------------

def _h200_ib(n: int) -> list[dict]:
    """`n` nodes of the hgx-h200-ib fleet (8 x H200, 8 x rdma/ib, one InfiniBand block)."""
    from meshplan.devcluster.fleets import fleet_nodes as _nodes, load_fleet as _load

    nodes = _nodes(_load("hgx-h200-ib"))[:n]
    for node in nodes:      # as a running kubelet reports them (the fleet file leaves readiness to the dev cluster)
        node.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]
    return nodes


def _render(nodes, layout: Layout, per_node: int, *, model: str, **kw):
    serving_kw = {k: kw.pop(k) for k in list(kw) if k in {f.name for f in dataclasses.fields(ServingOptions)}}
    arch = get_model(model)
    serving = ServingOptions(engine="trtllm", model=f"org/{model}", num_experts=arch.num_experts,
                             max_model_len=8192, **serving_kw)
    cand = Candidate(**{**dict(layout=layout, weight_dtype="bf16", kv_dtype="fp8", chunk_size=2048,
                               max_num_seqs=256, memory=MEM, prediction=PRED, engine="trtllm"), **kw})
    topo = build_topology(nodes)
    placement = place(request_for_layout(layout, per_node), topo)
    assert placement.ok, placement.message()
    out = render_deployment(Owner("llm", "ns", "uid-1"), cand, placement, topo, serving, NetworkOptions(),
                            PodOptions())
    return out, arch


FAMILIES = {
    "one-gpu": (lambda: hgx_h100(1), Layout(), 8, "llama-3.1-8b", {}),
    "tp-in-node": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {}),
    "tp-x-pp-across-nodes": (lambda: hgx_h100(2), Layout(tp=8, pp=2), 8, "llama-3.1-70b", {}),
    "ep-attention-dp-in-node": (lambda: hgx_h100(1), Layout(tp=1, ep=8), 8, "deepseek-r1",
                                {"weight_dtype": "fp8", "checkpoint_dtype": "fp8"}),
    "ep-attention-dp-nvl72": (lambda: gb200_nvl72(1, 4), Layout(tp=1, ep=16), 4, "deepseek-r1",
                              {"weight_dtype": "fp8", "checkpoint_dtype": "fp8"}),
    "tp-x-ep-mixed": (lambda: gb200_nvl72(1, 4), Layout(tp=4, ep=4), 4, "deepseek-r1",
                      {"weight_dtype": "fp8", "checkpoint_dtype": "fp8"}),
    "kv-bf16": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {"kv_dtype": "bf16"}),
    "weights-fp16": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {"weight_dtype": "fp16"}),
    "l40s-tp2": (lambda: l40s(1, gpus=4), Layout(tp=2), 4, "mixtral-8x7b", {}),
    "prefix-caching-off": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {"prefix_caching": False}),
    "priority-scheduling": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {"scheduling_policy": "priority"}),
    "cuda-graphs-off": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b", {"cuda_graphs": "disabled"}),
    "eplb-on": (lambda: gb200_nvl72(1, 4), Layout(tp=1, ep=16), 4, "deepseek-r1",
                {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "expert_load_balancing": "enabled"}),
    "eplb-off": (lambda: gb200_nvl72(1, 4), Layout(tp=1, ep=16), 4, "deepseek-r1",
                 {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "expert_load_balancing": "disabled"}),
    # wide EP over InfiniBand (issue 18): EP16 over two HGX H200 nodes, DeepEP kernels through the WIDEEP backend,
    # with and without EPLB's slots in the same moe_config
    "wide-ep-deepep-ib": (lambda: _h200_ib(2), Layout(tp=1, ep=16), 8, "deepseek-r1",
                          {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "a2a_backend": "deepep-low-latency"}),
    "wide-ep-deepep-eplb-ib": (lambda: _h200_ib(2), Layout(tp=1, ep=16), 8, "deepseek-r1",
                               {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "a2a_backend": "deepep-normal",
                                "expert_load_balancing": "enabled"}),
    "mtp-3": (lambda: hgx_h100(1), Layout(tp=8), 8, "deepseek-r1",
              {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "speculative": Speculative("mtp", 3, 0.8)}),
    # prefill/decode disaggregation (issue 19): DeepSeek-R1 context server TP8 on one H200 node, generation server
    # EP16 (attention DP) over two; dense Llama-3.1-8B on one GPU per role; UCX (meshplan's default) and NIXL
    "pd-r1-prefill-tp8": (lambda: _h200_ib(1), Layout(tp=8), 8, "deepseek-r1",
                          {"weight_dtype": "fp8", "checkpoint_dtype": "fp8", "disagg": Disaggregation("prefill")}),
    "pd-r1-decode-ep16": (lambda: _h200_ib(2), Layout(tp=1, ep=16), 8, "deepseek-r1",
                          {"weight_dtype": "fp8", "checkpoint_dtype": "fp8",
                           "disagg": Disaggregation("decode", ib_devices=("mlx5_0", "mlx5_1"))}),
    "pd-llama-prefill-nixl": (lambda: hgx_h100(1), Layout(), 8, "llama-3.1-8b",
                              {"disagg": Disaggregation("prefill", "nixl")}),
    "pd-llama-decode-nixl": (lambda: hgx_h100(1), Layout(), 8, "llama-3.1-8b",
                             {"disagg": Disaggregation("decode", "nixl")}),
    "extra-args": (lambda: hgx_h100(1), Layout(tp=8), 8, "llama-3.1-70b",
                   {"extra_args": ("--trust_remote_code", "--num_postprocess_workers", "2", "--max_seq_len=4096",
                                   "--log_level", "info")}),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layout_families_and_toggles_render_what_trtllm_accepts(family):
    nodes, layout, per_node, model, kw = FAMILIES[family]
    out, arch = _render(nodes(), layout, per_node, model=model, **kw)
    for group in out.groups:
        assert not _check_pods(list(group.pods), experts=arch.num_experts, heads=arch.num_attention_heads)
    leader = out.groups[0].pods[0]
    argv, body = _leader_argv(leader)
    params, args = parse_serve(argv), TorchLlmArgsSubset.model_validate(yaml.safe_load(body))
    if family == "eplb-on":
        assert args.moe_config.load_balancer.num_slots == 256 + 16
    if family.startswith("ep-attention-dp"):
        assert args.enable_attention_dp and params["max_batch_size"] == 256 // layout.ep
    if family == "extra-args":
        assert params["trust_remote_code"] is True and params["num_postprocess_workers"] == 2
        assert params["max_seq_len"] == 4096
    if family.startswith("wide-ep-deepep"):
        assert args.moe_config.backend == "WIDEEP" and args.enable_attention_dp
        env = {e["name"]: e.get("value") for e in leader["spec"]["containers"][0]["env"]}
        assert env["TRTLLM_FORCE_ALLTOALL_METHOD"] in ("DeepEP", "DeepEPLowLatency")
        if family == "wide-ep-deepep-eplb-ib":
            assert args.moe_config.load_balancer.num_slots == 256 + 16
    if family.startswith("pd-"):   # issue 19: each role's cache transceiver; context servers without overlap
        want = "NIXL" if family.endswith("-nixl") else "UCX"
        assert args.cache_transceiver_config.backend == want
        assert args.cache_transceiver_config.max_tokens_in_buffer == 8192      # the context length
        assert args.disable_overlap_scheduler is ("-prefill-" in family)
    else:
        assert args.cache_transceiver_config is None and not args.disable_overlap_scheduler
    if family == "cuda-graphs-off":
        assert args.cuda_graph_config is None
    if family == "prefix-caching-off":
        assert args.kv_cache_config.enable_block_reuse is False
    if family == "mtp-3":   # spec.engine.speculative: the plan's draft tokens as MTP layers
        assert args.speculative_config.decoding_type == "MTP"
        assert args.speculative_config.num_nextn_predict_layers == 3
    else:
        assert args.speculative_config is None


# ---- the stand-in can fail ----------------------------------------------------------------------

def test_the_standin_refuses_what_trtllm_serve_refuses():
    # the spelling the issue quotes: trtllm-serve has no --max-seq-len (click: "No such option")
    with pytest.raises(click.UsageError, match="No such option '--max-seq-len'"):
        parse_serve(["org/m", "--max-seq-len", "8192"])
    with pytest.raises(click.UsageError, match="not a valid integer"):
        parse_serve(["org/m", "--max_batch_size", "many"])
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TorchLlmArgsSubset.model_validate({"kv_cache_config": {"block_reuse": True}})
    with pytest.raises(ValidationError):
        TorchLlmArgsSubset.model_validate({"moe_config": {"load_balancer": {"num_slots": "many"}}})
    with pytest.raises(ValidationError):   # MTPDecodingConfig: PositiveInt, and the discriminator
        TorchLlmArgsSubset.model_validate({"speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 0}})
    with pytest.raises(ValidationError):
        TorchLlmArgsSubset.model_validate({"speculative_config": {"num_nextn_predict_layers": 2}})
    args = TorchLlmArgsSubset.model_validate({"moe_expert_parallel_size": 16, "moe_tensor_parallel_size": 1,
                                              "enable_attention_dp": True,
                                              "moe_config": {"load_balancer": {"num_slots": 260}}})
    problems = configuration_problems({"tensor_parallel_size": 16}, args, world=16, experts=256, heads=128)
    assert any("does not divide by the EP size 16" in p for p in problems)


def test_the_disaggregated_router_renders_what_trtllm_serve_disaggregated_accepts():
    """Issue 19: `engines.trtllm.router_command` writes disagg_config.yaml and runs `trtllm-serve disaggregated -c`
    on it; the stand-in parses the argv (click) and the YAML (pydantic, extra keys forbidden) and finds every
    instance's URL; a wrong key or a URL with a scheme is refused."""
    prefill = ["llm-prefill-r0-0.llm-prefill-r0.ns.svc:8000", "llm-prefill-r1-0.llm-prefill-r1.ns.svc:8000"]
    decode = ["llm-decode-r0-0.llm-decode-r0.ns.svc:8000"]
    cmd, args = trtllm.router_command(prefill, decode, port=8080)
    assert cmd == ("/bin/sh", "-c")
    script, name, *argv = args
    assert name == trtllm.TRTLLM_ROUTER_SCRIPT_NAME and argv[:2] == ["trtllm-serve", "disaggregated"]
    params = parse_disaggregated(argv[2:])
    assert params["config_file"] == trtllm.TRTLLM_DISAGG_CONFIG_PATH
    assert f"cat > {params['config_file']} <<'EOF'" in script
    body = script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    cfg = DisaggServerConfig.model_validate(yaml.safe_load(body))
    assert not disagg_router_problems(cfg)
    assert cfg.port == 8080 and cfg.context_servers.urls == prefill and cfg.generation_servers.urls == decode
    assert cfg.context_servers.num_instances == 2 and cfg.generation_servers.num_instances == 1
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        DisaggServerConfig.model_validate({**yaml.safe_load(body), "ctx_servers": {}})
    bad = DisaggServerConfig.model_validate({**yaml.safe_load(body), "generation_servers":
                                             {"num_instances": 1, "urls": ["http://d:8000"]}})
    assert disagg_router_problems(bad)
    with pytest.raises(click.UsageError, match="No such option"):
        parse_disaggregated(["--config", "x.yaml"])
    with pytest.raises(ValidationError):
        TorchLlmArgsSubset.model_validate({"cache_transceiver_config": {"backend": "ucx"}})     # upper case only


# ---- environment names ------------------------------------------------------------------------

# Variables meshplan may set on a TensorRT-LLM pod, each with the documentation that defines it.
# TensorRT-LLM reads none of meshplan's; its pods carry NCCL's (docs.nvidia.com/deeplearning/nccl/
# user-guide/docs/env.html), libfabric's for EFA (FI_PROVIDER, FI_EFA_USE_DEVICE_RDMA: aws-ofi-nccl
# docs), PyTorch's GLOO_SOCKET_IFNAME (torch.distributed docs), huggingface_hub's HF_TOKEN / HF_HOME,
# and the operator's own MESHPLAN_* bootstrap variables (render/__init__.py).
DOCUMENTED_ENV = {
    "NCCL_P2P_LEVEL", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NET",
    "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_MNNVL_ENABLE", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA",
    "GLOO_SOCKET_IFNAME", "HF_TOKEN", "HF_HOME",
    # wide EP: TensorRT-LLM's all-to-all override (tensorrt_llm/_torch/modules/fused_moe/fused_moe_wide_ep.py
    # select_alltoall_method_type) and NVSHMEM's IBGDA switch (docs.nvidia.com/nvshmem/api/gen/env.html)
    "TRTLLM_FORCE_ALLTOALL_METHOD", "NVSHMEM_IB_ENABLE_IBGDA",
}


def test_every_environment_name_on_a_trtllm_pod_is_documented():
    names = set()
    for family in sorted(FAMILIES):
        nodes, layout, per_node, model, kw = FAMILIES[family]
        out, _ = _render(nodes(), layout, per_node, model=model, **kw)
        for group in out.groups:
            for pod in group.pods:
                names |= {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    undocumented = {n for n in names if n not in DOCUMENTED_ENV and not n.startswith("MESHPLAN_")}
    assert not undocumented, undocumented
    assert {"NCCL_P2P_LEVEL", "MESHPLAN_NODE_RANK"} <= names       # the check saw real pods
