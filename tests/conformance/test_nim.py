"""NVIDIA NIM for LLMs 1.8 conformance: what meshplan renders for engine.kind nim is what NIM documents.

NIM has no package to install (its containers come from nvcr.io behind an NGC key, and their
entrypoint is not published source), so no NIM code can run here. What stands in: every environment
variable the renderer sets for NIM is in `engines.nim.DOCUMENTED_ENV`, each with the NIM document or
NVIDIA repository that names it (NIM docs "Configure Your NIM", NVIDIA/k8s-nim-operator,
NVIDIA/nim-deploy), and its value is the plan's (NIM_TENSOR_PARALLEL_SIZE x NIM_PIPELINE_PARALLEL_SIZE =
the pod's GPUs); the container has no command or args (the image's entrypoint reads the environment);
the probes use NIM's documented health routes; the layouts NIM cannot be told (EP, a tensor-parallel
group over several pods, FP8 KV, precisions, extraArgs) are refused by the planner or the API with the reason.
Multi-node (NIM 1.x, MPI over ssh: NIM docs 1.8.0 "Multi-Node Deployment", the NIM Operator's
spec.multiNode.mpi rendering) puts one pipeline stage on each pod; every multi-node variable is in
`engines.nim.MULTI_NODE_ENV` with the NIM Operator source that sets it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import meshplan.planner  # noqa: F401  (first: meshplan.engines.base imports the planner's types)
from meshplan.api.extra_args import extra_args_problems
from meshplan.api.models import LLMDeployment
from meshplan.autoscale.promql import ENGINE_METRICS
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import nim
from meshplan.planner import plan_for_spec
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0"
HGX = build_topology(fleet_nodes(load_fleet(str(ROOT / "operator/meshplan/fleets/hgx-h100.yaml"))), [],
                     ready_if_unknown=True)
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# what the operator itself sets on every engine pod (not NIM's): bootstrap, NCCL, weights credentials
NOT_NIM = ("MESHPLAN_", "NCCL_", "HF_TOKEN", "HF_HOME", "NVSHMEM_", "AWS_", "GOOGLE_")


def _manifest(example: str, **patch) -> dict:
    m = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    eng = m["spec"].setdefault("engine", {})
    if eng.get("kind") != "nim":
        eng.clear()
    eng.update(kind="nim", image=IMAGE)
    eng.pop("env", None)           # valueFrom needs the admin's enginePolicy; not what is checked here
    m["spec"].setdefault("gpus", {}).pop("products", None)
    for key, value in patch.items():
        m["spec"].setdefault(key, {}).update(value)
    return m


def _check_pods(res) -> int:
    pods = 0
    layout = res.plan.choice.layout
    for g in res.rendered.groups:
        # one pod per replica, or NIM 1.x multi-node: one pod per pipeline stage (NIM_NUM_COMPUTE_NODES = PP)
        assert len(g.pods) in (1, layout.pp), (len(g.pods), layout.label())
        multi = len(g.pods) > 1
        for rank, pod in enumerate(g.pods):
            c = pod["spec"]["containers"][0]
            assert "command" not in c and "args" not in c
            env = {e["name"]: e.get("value") for e in c["env"]}
            nim_env = {k: v for k, v in env.items() if not k.startswith(NOT_NIM)}
            assert set(nim_env) <= set(nim.DOCUMENTED_ENV), set(nim_env) - set(nim.DOCUMENTED_ENV)
            gpus = int(next(v for k, v in c["resources"]["limits"].items() if k.endswith("/gpu")))
            assert int(env["NIM_TENSOR_PARALLEL_SIZE"]) == layout.tp
            assert int(env["NIM_PIPELINE_PARALLEL_SIZE"]) == layout.pp
            assert layout.tp * layout.pp == gpus * len(g.pods)
            assert env["NIM_SERVER_PORT"] == "8000"
            if multi:
                assert (env["NIM_MULTI_NODE"], env["NIM_NODE_RANK"]) == ("1", str(rank))
                assert env["NIM_NUM_COMPUTE_NODES"] == str(len(g.pods)) and gpus == layout.tp
                assert env["NIM_LEADER_ROLE"] == ("1" if rank == 0 else "0")
            else:
                assert not set(nim.MULTI_NODE_ENV) & set(env)
            if rank == 0:
                assert env["NIM_SERVER_PORT"] == str(c["ports"][0]["containerPort"])
                assert c["readinessProbe"]["httpGet"]["path"] == "/v1/health/ready"
                assert c["livenessProbe"]["httpGet"]["path"] == "/v1/health/live"
            else:           # a worker hosts MPI ranks over ssh; the leader serves the API
                assert "readinessProbe" not in c and [p["name"] for p in c["ports"]] == ["ssh"]
            pods += 1
    return pods


def test_every_documented_name_has_a_source():
    assert all(src.strip() for src in nim.DOCUMENTED_ENV.values())
    # NIM's own names, and the multi-node launcher's (Open MPI MCA parameters, the LWS-derived names the NIM
    # image's entrypoint reads), each as the NIM Operator's NIM 1.x (spec.multiNode.mpi) rendering sets it
    assert all(name.startswith(("NIM_", "NGC_")) or name in nim.MULTI_NODE_ENV for name in nim.DOCUMENTED_ENV)
    assert all("k8s-nim-operator" in src and "nimservice_types.go" in src for src in nim.MULTI_NODE_ENV.values())


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_as_nim_renders_documented_env_or_is_refused_with_the_reason(path):
    llmd = LLMDeployment.from_manifest(_manifest(path.stem))
    plan = plan_for_spec(llmd.spec, HGX)
    if plan.choice is None:
        reasons = plan.reason + " ".join(r.reason for r in plan.rejected)
        assert "NVIDIA NIM" in reasons or "memory" in reasons or "exceed" in reasons, plan.reason
        return
    res = plan_place_render(llmd, HGX, plan=plan)
    assert res.rendered is not None, res.message
    assert _check_pods(res) >= 1


@pytest.mark.parametrize("patch", [
    {"parallelism": {"tensor": 1}},
    {"parallelism": {"tensor": 2}, "gpus": {"maxGpus": 8}},
    {"parallelism": {"tensor": 8}, "gpus": {"maxGpus": 8}},
    {"precision": {"weights": "bf16", "kvCache": "bf16"}},
    {"precision": {"weights": "fp16", "kvCache": "fp16"}},
    {"engine": {"prefixCaching": False}},
    {"engine": {"schedulingPolicy": "priority", "cudaGraphs": "disabled", "expertLoadBalancing": "enabled"}},
    {"workload": {"maxContext": 16384}},
    # NIM 1.x multi-node (MPI): one pipeline stage per pod, inside one node or over two
    {"parallelism": {"tensor": 4, "pipeline": 2}, "gpus": {"maxGpus": 8}},
], ids=["one-gpu", "tp2", "tp8", "bf16", "fp16", "prefix-off", "toggles", "max-context", "pp-in-one-node"])
def test_layout_families_render_as_nim_env(patch):
    llmd = LLMDeployment.from_manifest(_manifest("llama-3.1-8b-nim", **patch))
    res = plan_place_render(llmd, HGX)
    assert res.rendered is not None, res.message
    assert _check_pods(res) >= 1
    env = {e["name"]: e.get("value") for e in res.rendered.groups[0].pods[0]["spec"]["containers"][0]["env"]}
    assert env["NIM_ENABLE_KV_CACHE_REUSE"] == ("0" if patch.get("engine", {}).get("prefixCaching") is False else "1")
    if "workload" in patch:
        assert env["NIM_MAX_MODEL_LEN"] == "16384"


@pytest.mark.parametrize("example,patch,why", [
    ("mixtral-8x7b-l40s", {"precision": {"weights": "bf16", "kvCache": "bf16"},
                           "parallelism": {"expert": 2, "tensor": 1}}, "expert parallelism"),
    # NIM 1.x multi-node gives every pod GPUS_PER_NODE = TP: a tensor-parallel group cannot span nodes
    ("llama-3.1-70b-hgx-h100", {"precision": {"weights": "bf16", "kvCache": "bf16"},
                                "parallelism": {"tensor": 16, "pipeline": 1}, "gpus": {"maxGpus": 16}},
     "tensor-parallel group cannot span pods"),
    ("llama-3.1-8b-nim", {"precision": {"kvCache": "fp8"}}, "fp8 KV cache"),
    ("llama-3.1-8b-nim", {"precision": {"weights": "fp8", "kvCache": "bf16"}}, "fp8 weights"),
], ids=["ep", "tp-across-nodes", "kv-fp8", "weights-fp8"])
def test_what_nim_cannot_be_told_is_refused_by_the_planner(example, patch, why):
    llmd = LLMDeployment.from_manifest(_manifest(example, **patch))
    plan = plan_for_spec(llmd.spec, HGX)
    assert plan.choice is None
    assert why in plan.reason or any(why in r.reason for r in plan.rejected), plan.reason


def test_tp_x_pp_across_nodes_renders_nim_multi_node_leader_and_worker():
    """Was refused ("MPI bootstrap ... which meshplan does not provision") before NIM multi-node was rendered."""
    llmd = LLMDeployment.from_manifest(_manifest("llama-3.1-70b-hgx-h100", **{
        "precision": {"weights": "bf16", "kvCache": "bf16"}, "parallelism": {"tensor": 8, "pipeline": 2},
        "gpus": {"maxGpus": 16}, "slo": {"ttftMs": 5000, "itlMs": 100}}))
    res = plan_place_render(llmd, HGX)
    assert res.rendered is not None, res.message
    assert res.plan.choice.layout.label() == "TP8·PP2"
    assert _check_pods(res) == 2 * len(res.rendered.groups)            # two pods per replica
    leader, worker = res.rendered.groups[0].pods
    hostfile = leader["metadata"]["annotations"][nim.MPI_HOSTFILE_ANNOTATION].splitlines()
    assert hostfile == ["localhost slots=8", f'{worker["spec"]["hostname"]}.{worker["spec"]["subdomain"]}.'
                        f'{worker["metadata"]["namespace"]}.svc slots=8']


def test_extra_args_are_refused_nim_takes_environment():
    problems = extra_args_problems("nim", ["--max-model-len", "8192"])
    assert problems and "spec.engine.env" in problems[0]
    assert extra_args_problems("nim", []) == []


def test_the_image_is_required():
    m = _manifest("llama-3.1-8b-nim")
    del m["spec"]["engine"]["image"]
    with pytest.raises(Exception, match="spec.engine.image is required for engine nim"):
        LLMDeployment.from_manifest(m)


def test_autoscaler_reads_nim_s_documented_metric_names():
    names = ENGINE_METRICS["nim"]
    assert names.ttft_histograms == ("time_to_first_token_seconds",)
    assert names.itl_histograms == ("time_per_output_token_seconds",)
    assert names.running_gauges == ("num_requests_running",) and names.queue_gauges == ("num_requests_waiting",)
    assert nim.METRICS_PATH == "/v1/metrics"
