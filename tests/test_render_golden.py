"""Golden files: every engine x fleet renders exactly the reviewed manifests.

    pytest tests/test_render_golden.py                              # compare
    MESHPLAN_UPDATE_GOLDEN=1 pytest tests/test_render_golden.py     # rewrite tests/golden/*.yaml

A rewrite is a change to review in the diff: the files are the contract of
what meshplan applies (engine flags, bootstrap, NCCL env, affinity, gates).
The plan is built directly (types.Candidate) so these tests do not move when
the planner's model does.
"""

from __future__ import annotations


import pytest
from _golden import GOLDEN, check_golden
from _gpu_nodes import gb200_nvl72, hgx_h100, l40s

from meshplan.catalog.models import get_model
from meshplan.placement import place, request_for_layout
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
from meshplan.render import NetworkOptions, Owner, PodOptions, render_deployment
from meshplan.render.engine_args import ServingOptions
from meshplan.topology import build_topology


_MEM = MemoryFit(fits=True, weights_bytes=0, kv_bytes_per_token=0, activation_bytes=0, runtime_bytes=0,
                 usable_bytes=0, kv_capacity_tokens=0, max_concurrency=0)
_PRED = Prediction(ttft_ms=0, tpot_ms=0, tokens_per_s_per_gpu=0, tokens_per_s_per_user=0, concurrency=0)

# fleet -> (nodes, gpus per node, product, layout, weight dtype, kv dtype, chunk, max seqs, model, checkpoint dtype, network)
SCENARIOS = {
    # Llama-3.1-405B FP8, TP8 x PP2 over two HGX nodes (stages in two NVLink domains, InfiniBand between).
    "hgx-h100": (hgx_h100(4), 8, "NVIDIA-H100-80GB-HBM3", Layout(tp=8, pp=2, dp=2), "fp8", "fp8", 2048, 128,
                 "meta-llama/Llama-3.1-405B-Instruct", "bf16",
                 NetworkOptions(transport="infiniband", socket_ifname="eth0", ib_hca="mlx5_0,mlx5_1")),
    # DeepSeek-R1 (FP8 checkpoint), TP4 x EP4 over four GB200 trays of one NVL72 clique (MNNVL + ComputeDomain).
    "gb200-nvl72": (gb200_nvl72(1, 18), 4, "NVIDIA-GB200", Layout(tp=4, ep=4, dp=2), "fp8", "fp8", 1024, 256,
                    "deepseek-ai/DeepSeek-R1", "fp8", NetworkOptions(compute_domains=True)),
    # Mixtral-8x7B on PCIe L40S: TP2 per replica, three replicas packed best-fit on two 4-GPU nodes.
    "l40s": (l40s(2, gpus=4), 4, "NVIDIA-L40S", Layout(tp=2, dp=3), "fp8", "bf16", 512, 64,
             "mistralai/Mixtral-8x7B-Instruct-v0.1", "bf16", NetworkOptions(transport="tcp")),
}


# The engines that run only part of the layouts above (no EP: NIM, DeepSpeed-MII; no PP, one pod per replica,
# 16-bit only): Llama-3.1-8B TP2 x 2 replicas on one HGX H100 node, at DeepSpeed-MII's fixed step budget and
# batch limit (768 / 512). Neither engine has an image meshplan pins: the scenario names one.
NEW_ENGINE_SCENARIOS = {
    "hgx-h100-tp2": (hgx_h100(1), 8, "NVIDIA-H100-80GB-HBM3", Layout(tp=2, dp=2), "bf16", "bf16", 768, 512,
                     "meta-llama/Llama-3.1-8B-Instruct", "bf16", NetworkOptions(transport="tcp")),
}
NEW_ENGINE_IMAGES = {"nim": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0",
                     "deepspeed": "registry.example.com/serving/deepspeed-mii:0.3.3"}


# NVIDIA NIM 1.x multi-node (MPI over ssh, one pipeline stage per node): DeepSeek-R1 (its FP8 checkpoint) TP8 x PP2
# over two HGX H100 nodes on InfiniBand, as examples/deepseek-r1-nim-multinode.yaml plans it.
NIM_MULTINODE_SCENARIOS = {
    "hgx-h100-tp8-pp2": (hgx_h100(2), 8, "NVIDIA-H100-80GB-HBM3", Layout(tp=8, pp=2), "fp8", "bf16", 2048, 32,
                         "deepseek-ai/DeepSeek-R1", "fp8",
                         NetworkOptions(transport="infiniband", socket_ifname="eth0", ib_hca="mlx5_0,mlx5_1")),
}


def render_scenario(engine: str, fleet: str) -> list[dict]:
    scenario = SCENARIOS.get(fleet) or NEW_ENGINE_SCENARIOS.get(fleet) or NIM_MULTINODE_SCENARIOS[fleet]
    nodes, per_node, product, layout, wd, kvd, chunk, seqs, model, ckpt, network = scenario
    topo = build_topology(nodes)
    placement = place(request_for_layout(layout, per_node, product=product), topo)
    assert placement.ok, placement.message()
    cand = Candidate(layout=layout, weight_dtype=wd, kv_dtype=kvd, chunk_size=chunk, max_num_seqs=seqs,
                     memory=_MEM, prediction=_PRED, engine=engine)
    # max_model_len: what options_from_spec always renders (spec.workload ISL + OSL by default, 1024 + 256)
    # num_experts / model_name: what options_from_spec gives the renderer from the catalogue (the EPLB rule)
    arch = get_model(model)
    serving = ServingOptions(engine=engine, model=model, served_name=model.split("/")[-1].lower(),
                             checkpoint_dtype=ckpt, max_model_len=1280, num_experts=arch.num_experts,
                             model_name=arch.name)
    pods = PodOptions(weights_secret=("hf-token", "token"), image=NEW_ENGINE_IMAGES.get(engine))
    out = render_deployment(Owner("llm", "serving", "0b9e4c1a-5f6d-4e1a-9c1b-1234567890ab"), cand, placement,
                            topo, serving, network, pods)
    return out.objects


@pytest.mark.parametrize("fleet", sorted(SCENARIOS))
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_golden(engine: str, fleet: str) -> None:
    check_golden(render_scenario(engine, fleet), GOLDEN / f"{engine}-{fleet}.yaml", __file__)


@pytest.mark.parametrize("fleet", sorted(NEW_ENGINE_SCENARIOS))
@pytest.mark.parametrize("engine", sorted(NEW_ENGINE_IMAGES))
def test_golden_new_engines(engine: str, fleet: str) -> None:
    check_golden(render_scenario(engine, fleet), GOLDEN / f"{engine}-{fleet}.yaml", __file__)


@pytest.mark.parametrize("fleet", sorted(NIM_MULTINODE_SCENARIOS))
def test_golden_nim_multinode(fleet: str) -> None:
    check_golden(render_scenario("nim", fleet), GOLDEN / f"nim-{fleet}.yaml", __file__)


@pytest.mark.parametrize("fleet", sorted(SCENARIOS))
@pytest.mark.parametrize("engine", sorted(NEW_ENGINE_IMAGES))
def test_new_engines_refuse_the_layouts_they_cannot_run(engine: str, fleet: str) -> None:
    # TP8 x PP2 over two pods, TP4 x EP4 over four pods, FP8 KV / FP8 weights, DeepSpeed-MII's fixed batch
    # limits: each refused with the reason
    from meshplan.render import RenderError

    with pytest.raises((RenderError, ValueError)) as err:
        render_scenario(engine, fleet)
    assert any(w in str(err.value) for w in ("expert parallelism", "pipeline", "pods", "KV", "weights",
                                          "no option for the step token budget")), err.value
