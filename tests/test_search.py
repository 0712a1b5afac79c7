"""Layout enumeration and evaluation, with simple injected predictors and the real memory model."""

from __future__ import annotations

import dataclasses

from meshplan.catalog.gpus import BLOG_GPU, get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner import memory
from _gpu_nodes import gpu_node, gpu_pod

from meshplan.topology import build_topology
from meshplan.planner.search import SearchSpace, basic_layouts, enumerate_shapes, search
from meshplan.planner.types import Layout, MemoryFit, Prediction, Workload

GPT = get_model("gpt-moe-1.8t")
GB200 = get_gpu("gb200")
H100 = get_gpu("h100")
LLAMA8 = get_model("llama-3.1-8b")


def fake_predictor(calls=None):
    """tokens/s/user falls and tokens/s/GPU rises with the batch: enough to test the search plumbing."""
    def predict(model, gpu, layout, workload, *, weight_dtype, kv_dtype, chunk_size, max_num_seqs, engine,
                concurrency, memory):
        if calls is not None:
            calls.append((layout, workload, chunk_size, max_num_seqs, concurrency))
        b = concurrency or workload.concurrency or 1
        tpot = 10.0 + b / 8
        return Prediction(ttft_ms=100.0 + chunk_size / 10, tpot_ms=tpot, tokens_per_s_per_gpu=b * 1000 / tpot / 8,
                          tokens_per_s_per_user=1000 / tpot, concurrency=b)
    return predict


def always_fits(model, gpu, layout, **kw):
    return MemoryFit(True, 0, 0, 0, 0, 0, 10**6, 100)


def test_blog_count_of_basic_layouts_is_in_range():
    layouts = basic_layouts(GPT, BLOG_GPU, 64, weight_dtype="fp4", memory_fn=memory.memory_fit)
    assert 70 <= len(layouts) <= 80
    assert all(lay.total_gpus == 64 for lay in layouts)
    # the blog's named layouts are among them
    for lay in (Layout(1, 8, 1, 8), Layout(1, 16, 1, 4), Layout(1, 16, 4, 1), Layout(4, 4, 4, 1),
                Layout(64, 1, 1, 1), Layout(2, 16, 2, 1), Layout(8, 8, 1, 1)):
        assert lay in layouts, lay
    # FP4 weights need >= 5 GPUs, so no replica of 4 GPUs or fewer survives the memory rule
    assert min(lay.gpus_per_replica for lay in layouts) >= 5


def test_rejections_carry_reasons():
    never = SearchSpace(cross_domain="never")
    shapes, rejected = enumerate_shapes(GPT, H100, 64, weight_dtype="fp8", kv_dtype="fp8",
                                        memory_fn=memory.memory_fit, space=never)
    reasons = {r.layout: r.reason for r in rejected}
    assert "exceeds the 8-GPU NVLink domain" in reasons[Layout(4, 4, 2)]
    assert "does not divide the 16 experts" in reasons[Layout(1, 32, 1)]
    assert reasons[Layout(8, 1, 1)].startswith("memory:")            # 1.8T in FP8 on 8 x 80 GB
    assert all(s.gpus_per_stage <= 8 for s, _ in shapes)
    # the default rule (issue 18): an EP stage may span NVLink domains (over RDMA), a TP group may not
    shapes_x, rejected_x = enumerate_shapes(GPT, H100, 64, weight_dtype="fp8", kv_dtype="fp8",
                                            memory_fn=memory.memory_fit)
    assert Layout(4, 4, 2) in [s for s, _ in shapes_x]
    assert all(s.tp <= 8 for s, _ in shapes_x)
    assert "TP16 exceeds the 8-GPU NVLink domain" in {r.layout: r.reason for r in rejected_x}[Layout(16, 1, 4)]
    # pinned, TP may cross (priced over the NIC)
    pinned, _ = enumerate_shapes(GPT, H100, 64, weight_dtype="fp8", kv_dtype="fp8", memory_fn=memory.memory_fit,
                                 space=SearchSpace(tensor=16))
    assert any(s.tp == 16 for s, _ in pinned)


def test_engine_rules_apply():
    _, rejected = enumerate_shapes(GPT, BLOG_GPU, 64, engine="vllm")
    assert any(r.layout == Layout(64, 1, 1) and "96 attention heads" in r.reason for r in rejected)
    assert any(r.layout == Layout(2, 16, 2) and "vLLM" in r.reason for r in rejected)
    shapes, _ = enumerate_shapes(GPT, BLOG_GPU, 64, engine="sglang")
    assert Layout(2, 16, 2) in [s for s, _ in shapes]


def test_pinned_sizes_restrict_the_search():
    shapes, _ = enumerate_shapes(GPT, BLOG_GPU, 64, space=SearchSpace(tensor=4, pipeline=4))
    assert {(s.tp, s.pp) for s, _ in shapes} == {(4, 4)}
    assert {s.ep for s, _ in shapes} == {1, 2, 4}


def test_dense_model_has_no_expert_parallelism():
    shapes, _ = enumerate_shapes(LLAMA8, H100, 16)
    assert {s.ep for s, _ in shapes} == {1}


def test_saturated_sweep_fills_the_budget_and_uses_the_batch_as_concurrency():
    calls: list = []
    res = search(LLAMA8, H100, 16, Workload(isl=512, osl=128), engine="vllm",
                 space=SearchSpace(chunk_sizes=(512, 2048), max_num_seqs=(1, 8, 64), weight_dtype="bf16",
                                   kv_dtype="bf16"),
                 predictor=fake_predictor(calls), memory_fn=always_fits)
    assert res.candidates
    assert all(c.layout.total_gpus <= 16 for c in res.candidates)
    assert all(c.layout.total_gpus > 8 for c in res.candidates)      # dp fills 16 GPUs for every shape
    assert {c.max_num_seqs for c in res.candidates} == {1, 8, 64}
    assert all(conc == seqs for (_, _, _, seqs, conc) in calls)      # saturated: concurrency = batch limit
    assert res.evaluated == len(res.candidates) == len(calls)
    assert {c.gpu for c in res.candidates} == {"h100_sxm"}


def test_min_dp_policy_uses_one_replica():
    res = search(LLAMA8, H100, 16, Workload(), dp="min",
                 space=SearchSpace(chunk_sizes=(512,), max_num_seqs=(8,), weight_dtype="bf16", kv_dtype="bf16"),
                 predictor=fake_predictor(), memory_fn=always_fits)
    assert {c.layout.dp for c in res.candidates} == {1}


def test_a_load_is_split_over_replicas():
    calls: list = []
    res = search(LLAMA8, H100, 16, Workload(isl=512, osl=128, concurrency=64),
                 space=SearchSpace(chunk_sizes=(512,), max_num_seqs=(256,), weight_dtype="bf16",
                                   kv_dtype="bf16"),
                 predictor=fake_predictor(calls), memory_fn=always_fits)
    for layout, wl, _, _, conc in calls:
        assert conc is None                                            # the model derives it from the load
    per_dp = {(c.layout.tp, c.layout.dp) for c in res.candidates}
    assert (1, 1) in per_dp and (1, 16) in per_dp and (2, 8) in per_dp
    by_dp = {c.layout.dp: c.prediction.concurrency for c in res.candidates if c.layout.tp == 1 and c.layout.pp == 1}
    assert by_dp[1] == 64 and by_dp[4] == 16 and by_dp[16] == 4


def test_batch_limits_beyond_the_kv_cache_are_replaced_by_the_cache_limit():
    def small_cache(model, gpu, layout, **kw):
        return MemoryFit(True, 0, 0, 0, 0, 0, 1000, 48)
    res = search(LLAMA8, H100, 8, Workload(), space=SearchSpace(chunk_sizes=(512,), max_num_seqs=(16, 32, 64, 128),
                                                                weight_dtype="bf16", kv_dtype="bf16"),
                 predictor=fake_predictor(), memory_fn=small_cache)
    assert {c.max_num_seqs for c in res.candidates} == {16, 32, 48}


def test_pinned_batch_limits_are_used_as_given():
    def small_cache(model, gpu, layout, **kw):
        return MemoryFit(True, 0, 0, 0, 0, 0, 1000, 48)
    res = search(LLAMA8, H100, 8, Workload(), space=SearchSpace(chunk_sizes=(512,), max_num_seqs=(512,),
                                                                max_num_seqs_pinned=True,
                                                                weight_dtype="bf16", kv_dtype="bf16"),
                 predictor=fake_predictor(), memory_fn=small_cache)
    assert res.candidates and {c.max_num_seqs for c in res.candidates} == {512}


def test_vllm_is_never_offered_fewer_batched_tokens_than_sequences():
    """Found while fixing issue 16: vLLM refuses to start with --max-num-batched-tokens below --max-num-seqs
    (chunk 128 with 400 sequences was planned for GPT-MoE-1.8T on GB200)."""
    def roomy(model, gpu, layout, **kw):               # room for 1,000 sequences
        return MemoryFit(True, 0, 0, 0, 0, 0, 10**7, 1000)

    space = SearchSpace(chunk_sizes=(128, 1024), max_num_seqs=(16, 256, 512), weight_dtype="bf16", kv_dtype="bf16")
    vllm = search(LLAMA8, H100, 8, Workload(), engine="vllm", space=space, predictor=fake_predictor(),
                  memory_fn=roomy)
    assert vllm.candidates and all(c.chunk_size >= c.max_num_seqs for c in vllm.candidates)
    assert any(c.chunk_size == 128 for c in vllm.candidates)
    sglang = search(LLAMA8, H100, 8, Workload(), engine="sglang", space=space, predictor=fake_predictor(),
                    memory_fn=roomy)
    assert any(c.chunk_size < c.max_num_seqs for c in sglang.candidates)
    pinned = dataclasses.replace(space, chunk_sizes=(256,), max_num_seqs=(512,), max_num_seqs_pinned=True)
    res = search(LLAMA8, H100, 8, Workload(), engine="vllm", space=pinned, predictor=fake_predictor(),
                 memory_fn=roomy)
    assert not res.candidates
    assert all("--max-num-batched-tokens 256 below --max-num-seqs 512" in r.reason for r in res.rejected
               if r.reason.startswith("engine:"))
    assert any(r.reason.startswith("engine:") for r in res.rejected)


def test_fleet_limits_replicas_and_rejects_with_numbers():
    fleet = build_topology([gpu_node("n0"), gpu_node("n1")], [gpu_pod("p0", "n0", 2), gpu_pod("p1", "n1", 5)])
    shapes, rejected = enumerate_shapes(LLAMA8, H100, 64, fleet=fleet)
    got = {s: dp for s, dp in shapes}
    assert got[Layout(4, 1, 1)] == 1            # one 4-GPU stage fits n0's 6 free GPUs, none fits n1's 3
    assert got[Layout(2, 1, 1)] == 4            # 3 + 1
    assert got[Layout(1, 1, 1)] == 9
    assert Layout(8, 1, 1) in [r.layout for r in rejected]
    why = {r.layout: r.reason for r in rejected}[Layout(8, 1, 1)]
    assert "largest free domain (n0) has 6 free GPUs" in why


def test_fleet_files_become_domains():
    from meshplan.planner.fleet import load_fleet

    hgx = load_fleet("hgx-h100")
    assert hgx.gpus() == ("h100_sxm",) and hgx.free_gpus == 32 and len(hgx.domains) == 4
    assert hgx.replica_slots(8, 2) == 2 and hgx.replica_slots(16, 1) == 0
    # a 16-GPU stage is larger than every 8-GPU domain: it may span domains only inside an RDMA network
    # block, and the hgx-h100 fleet's nodes advertise no RDMA resource
    assert hgx.replica_slots(16, 1, span_blocks=True) == 0
    assert "no node advertises an RDMA resource" in hgx.why_no_room(16, 1)
    nvl = load_fleet("gb200-nvl72")
    assert [d.free_gpus for d in nvl.domains] == [72, 72]          # one domain per rack (gpu.clique)
    mixed = load_fleet("mixed")
    assert set(mixed.gpus()) == {"gb200", "h200_sxm", "l40s"}
    assert mixed.for_gpu("h200_sxm").free_gpus == 16
    zone_b = load_fleet("mixed", node_selector={"topology.kubernetes.io/zone": "zone-b"})
    assert zone_b.gpus() == ("gb200",)


def test_load_mode_dp_steps_are_at_most_half():
    res = search(LLAMA8, H100, 16, Workload(concurrency=100),
                 space=SearchSpace(tensor=1, pipeline=1, chunk_sizes=(512,), max_num_seqs=(256,),
                                   weight_dtype="bf16", kv_dtype="bf16"),
                 predictor=fake_predictor(), memory_fn=always_fits)
    assert sorted({c.layout.dp for c in res.candidates}) == [1, 2, 3, 4, 6, 8, 12, 16]


def test_fleet_from_objects_counts_pods_and_honours_the_node_selector():
    from meshplan.planner.fleet import fleet_from_objects

    def node(name, zone, clique=None):
        labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "topology.kubernetes.io/zone": zone,
                  "kubernetes.io/hostname": name}
        if clique:
            labels["nvidia.com/gpu.clique"] = clique
        return {"metadata": {"name": name, "labels": labels},
                "status": {"allocatable": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    def pod(node_name, gpus, phase="Running"):
        return {"spec": {"nodeName": node_name,
                         "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
                "status": {"phase": phase}}

    nodes = [node("a0", "za"), node("a1", "za"), node("b0", "zb")]
    pods = [pod("a0", 6), pod("a1", 8, phase="Succeeded"), pod("b0", 1)]
    f = fleet_from_objects(nodes, pods)
    assert {d.name: d.free_gpus for d in f.domains} == {"a0": 2, "a1": 8, "b0": 7}
    assert f.replica_slots(4, 2) == 1            # zone za: 0 + 2 stages -> one PP2 replica; zone zb: 1 stage
    only_b = fleet_from_objects(nodes, pods, node_selector={"topology.kubernetes.io/zone": "zb"})
    assert [d.name for d in only_b.domains] == ["b0"]
