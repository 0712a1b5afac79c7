"""Rendering invariants: gang gates, GPUs, affinity, bootstrap, NCCL, extraArgs, hashes."""

from __future__ import annotations

import dataclasses

import pytest
from _gpu_nodes import gb200_nvl72, hgx_h100, l40s

from meshplan.placement import place, request_for_layout
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
from meshplan.render import NetworkOptions, Owner, PodOptions, RenderError, render_deployment
from meshplan.render.engine_args import ServingOptions, norm_flag, parse_args
from meshplan.render.nccl import GroupTopology, nccl_env
from meshplan.render.workloads import GANG_GATE, child_name
from meshplan.topology import build_topology

MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)
PRED = Prediction(0, 0, 0, 0, 0)
OWNER = Owner("chat", "team-a", "uid-123")


def cand(layout: Layout, engine: str = "vllm", **kw) -> Candidate:
    base = dict(layout=layout, weight_dtype="bf16", kv_dtype="bf16", chunk_size=1024, max_num_seqs=64,
                memory=MEM, prediction=PRED, engine=engine)
    base.update(kw)
    return Candidate(**base)


def render(nodes, layout, engine="vllm", per_node=8, serving=None, network=NetworkOptions(), gated=True, **ckw):
    topo = build_topology(nodes)
    placement = place(request_for_layout(layout, per_node), topo)
    assert placement.ok, placement.message()
    serving = serving or ServingOptions(engine=engine, model="org/model")
    return render_deployment(OWNER, cand(layout, engine, **ckw), placement, topo, serving, network, PodOptions(),
                             gated=gated), placement


def pods_of(rendered):
    return [p for g in rendered.groups for p in g.pods]


def arg(pod, flag):
    args = pod["spec"]["containers"][0]["args"]
    return args[args.index(flag) + 1] if flag in args else None


def env(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_pod_is_gated_owned_sized_and_has_shm(engine):
    out, placement = render(gb200_nvl72(1, 8), Layout(tp=8, dp=2), engine, per_node=4)
    pods = pods_of(out)
    assert len(pods) == 4 == sum(len(r.pods) for r in placement.placed)
    for p in pods:
        spec = p["spec"]
        assert spec["schedulingGates"] == [{"name": GANG_GATE}]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert p["metadata"]["ownerReferences"][0]["uid"] == "uid-123"
        assert p["metadata"]["ownerReferences"][0]["controller"] is True
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
        assert p["metadata"]["labels"]["meshplan.dev/plan-hash"] == out.plan_hash
    for g in out.groups:
        roles = [p["metadata"]["labels"]["meshplan.dev/role"] for p in g.pods]
        assert roles == ["leader", "worker"]
        leader, worker = g.pods
        assert leader["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"
        assert "readinessProbe" not in worker["spec"]["containers"][0]
    assert out.client_service["spec"]["selector"] == {"meshplan.dev/deployment": "chat", "meshplan.dev/role": "leader"}


def test_ungated_render_for_released_groups():
    out, _ = render(hgx_h100(1), Layout(tp=8), gated=False)
    assert "schedulingGates" not in pods_of(out)[0]["spec"]


def test_affinity_pins_pods_to_their_domain():
    out, placement = render(gb200_nvl72(2, 18), Layout(tp=4, ep=4), per_node=4)
    domain = placement.placed[0].domains[0]
    for p in pods_of(out):
        exprs = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"]
        assert {"key": "nvidia.com/gpu.clique", "operator": "In", "values": [domain]} in exprs
        preferred = p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred[0]["preference"]["matchExpressions"][0]["values"] == [
            p["metadata"]["annotations"]["meshplan.dev/assigned-node"]]
    hgx, _ = render(hgx_h100(2), Layout(tp=8, pp=2))
    for p in pods_of(hgx):
        exprs = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"]
        assert exprs[0] == {"key": "kubernetes.io/hostname", "operator": "In",
                            "values": [p["metadata"]["annotations"]["meshplan.dev/assigned-node"]]}


def test_vllm_multinode_bootstrap_points_workers_at_leader():
    out, _ = render(hgx_h100(2), Layout(tp=8, pp=2))
    leader, worker = out.groups[0].pods
    addr = f"{leader['metadata']['name']}.{out.groups[0].service['metadata']['name']}.team-a.svc"
    assert leader["spec"]["hostname"] == leader["metadata"]["name"]
    assert leader["spec"]["subdomain"] == out.groups[0].service["metadata"]["name"]
    assert out.groups[0].service["spec"]["clusterIP"] == "None"
    assert out.groups[0].service["spec"]["publishNotReadyAddresses"] is True
    for rank, p in enumerate((leader, worker)):
        assert arg(p, "--master-addr") == addr and arg(p, "--nnodes") == "2" and arg(p, "--node-rank") == str(rank)
    assert "--headless" in worker["spec"]["containers"][0]["args"]
    assert "--headless" not in leader["spec"]["containers"][0]["args"]


def test_vllm_expert_parallel_across_pods_uses_data_parallel_ranks():
    out, _ = render(gb200_nvl72(1, 4), Layout(tp=2, ep=8), per_node=4)
    pods = out.groups[0].pods
    assert [arg(p, "--data-parallel-size-local") for p in pods] == ["2"] * 4
    assert [arg(p, "--data-parallel-start-rank") for p in pods] == [None, "2", "4", "6"]
    assert arg(pods[0], "--data-parallel-size") == "8"


def test_vllm_refuses_dp_ranks_straddling_pods():
    with pytest.raises(RenderError, match="tensor"):
        render(gb200_nvl72(1, 4), Layout(tp=8, ep=2), per_node=4)


def test_sglang_and_trtllm_multinode():
    out, _ = render(hgx_h100(2), Layout(tp=8, pp=2), "sglang")
    leader, worker = out.groups[0].pods
    assert arg(worker, "--dist-init-addr").startswith(leader["metadata"]["name"] + ".")
    assert arg(worker, "--node-rank") == "1" and arg(leader, "--tp-size") == "8" and arg(leader, "--pp-size") == "2"
    out, _ = render(hgx_h100(2), Layout(tp=8, pp=2), "trtllm")
    leader, worker = out.groups[0].pods
    script, *argv = leader["spec"]["containers"][0]["args"]
    line = " ".join(argv)   # the command line follows the script as its arguments ("$@")
    assert "mpirun" not in script and script.rstrip().endswith('exec "$$@"')
    assert "mpirun" in line and "-np 16" in line and worker["metadata"]["name"] in line
    assert "-x NCCL_P2P_LEVEL" in line
    assert worker["spec"]["containers"][0]["command"] == ["/bin/sh", "-c"]
    assert "exec /usr/sbin/sshd -D" in worker["spec"]["containers"][0]["args"][0]


def test_single_pod_has_no_bootstrap_flags():
    out, _ = render(hgx_h100(1), Layout(tp=4))
    args = pods_of(out)[0]["spec"]["containers"][0]["args"]
    assert not {"--nnodes", "--master-addr", "--headless", "--data-parallel-address"} & set(args)
    assert arg(pods_of(out)[0], "--tensor-parallel-size") == "4"


def test_extra_args_merge_rules():
    base = ServingOptions(engine="vllm", model="m", extra_args=(
        "--tensor-parallel-size=2", "-tp", "2", "--max_num_seqs", "8", "--master-addr", "x",
        "--gpu-memory-utilization", "0.8", "--trust-remote-code"))
    out, _ = render(hgx_h100(1), Layout(tp=4), serving=base)
    pod = pods_of(out)[0]
    args = pod["spec"]["containers"][0]["args"]
    assert arg(pod, "--tensor-parallel-size") == "4" and "-tp" not in args   # plan owns it
    assert arg(pod, "--max-num-seqs") == "64" and "--max_num_seqs" not in args
    assert "x" not in args                                                    # bootstrap flags never
    assert arg(pod, "--gpu-memory-utilization") == "0.8" and args.count("--gpu-memory-utilization") == 1
    assert args[-1] == "--trust-remote-code"
    warnings = [e.subject for e in out.explain if e.level == "warning"]
    assert {"--tensor-parallel-size", "-tp", "--max_num_seqs", "--master-addr", "--gpu-memory-utilization"} <= set(
        warnings)
    allowed = dataclasses.replace(base, allow_plan_override=True)
    out, _ = render(hgx_h100(1), Layout(tp=4), serving=allowed)
    pod = pods_of(out)[0]
    assert arg(pod, "--max_num_seqs") == "8" and "--max-num-seqs" not in pod["spec"]["containers"][0]["args"]


def test_flag_parsing_and_normalisation():
    assert parse_args(["--a", "1", "--b", "--c=2", "--d", "-1"]) == [("--a", ["1"]), ("--b", []), ("--c", ["2"]),
                                                                      ("--d", ["-1"])]
    assert norm_flag("--Max_Num_Seqs") == "max-num-seqs" and norm_flag("-tp") == "tensor-parallel-size"
    assert norm_flag("--no-enable-prefix-caching") == "enable-prefix-caching"


def test_precision_and_features_flags():
    serving = ServingOptions(engine="vllm", model="m", prefix_caching=False, scheduling_policy="priority",
                             cuda_graphs="disabled")
    out, _ = render(hgx_h100(1), Layout(tp=8), serving=serving, weight_dtype="fp8", kv_dtype="fp8")
    pod = pods_of(out)[0]
    args = pod["spec"]["containers"][0]["args"]
    assert arg(pod, "--quantization") == "fp8_per_tensor" and arg(pod, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-prefix-caching" in args and "--enforce-eager" in args
    assert arg(pod, "--scheduling-policy") == "priority"
    sg = ServingOptions(engine="sglang", model="m", prefix_caching=False, scheduling_policy="priority")
    out, _ = render(hgx_h100(1), Layout(tp=8), "sglang", serving=sg, kv_dtype="fp8")
    args = pods_of(out)[0]["spec"]["containers"][0]["args"]
    assert "--disable-radix-cache" in args and "--enable-priority-scheduling" in args
    assert "--enable-metrics" in args  # the autoscaler's sglang:* histograms are off by default
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"


def test_nccl_rules_by_topology_and_transport():
    one_node = nccl_env(GroupTopology(nodes=1, nvlink=True, multi_node_nvlink=False), "infiniband", ib_hca="mlx5_0")
    names = {e["name"] for e in one_node.env}
    assert names == {"NCCL_P2P_LEVEL"}          # nothing network-related inside one node
    ib = nccl_env(GroupTopology(nodes=2, nvlink=True, multi_node_nvlink=False, spans_domains=True,
                                rdma_fabric="roce", rdma_resource="rdma/roce_a"), "roce",
                  ib_hca="mlx5_0", socket_ifname="eth0")
    got = {e["name"]: e["value"] for e in ib.env}
    assert got["NCCL_IB_HCA"] == "mlx5_0" and got["NCCL_IB_GID_INDEX"] == "3" and got["NCCL_SOCKET_IFNAME"] == "eth0"
    # issue 15 finding: no RDMA resource requested -> IB is not forced, and the explanation warns
    unforced = nccl_env(GroupTopology(nodes=2, nvlink=True, multi_node_nvlink=False, spans_domains=True), "roce",
                        ib_hca="mlx5_0")
    assert not {"NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"} & {e["name"] for e in unforced.env}
    assert any("no RDMA resource" in e.reason and e.level == "warning" for e in unforced.explain)
    tcp = {e["name"]: e["value"] for e in nccl_env(GroupTopology(2, True, False, True), "tcp").env}
    assert tcp["NCCL_IB_DISABLE"] == "1" and tcp["NCCL_NET"] == "Socket"
    efa = {e["name"] for e in nccl_env(GroupTopology(2, True, False, True, "efa", "vpc.amazonaws.com/efa"),
                                       "efa").env}
    assert {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"} <= efa
    pcie = nccl_env(GroupTopology(1, False, False), "auto")
    assert pcie.env == ()
    mnnvl = nccl_env(GroupTopology(4, True, True), "auto", compute_domain_available=True)
    got = {e["name"]: e["value"] for e in mnnvl.env}
    assert got == {"NCCL_P2P_LEVEL": "NVL", "NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1",
                   "NCCL_NVLS_ENABLE": "1"}
    assert mnnvl.needs_compute_domain
    assert not nccl_env(GroupTopology(4, True, True), "auto").needs_compute_domain
    with pytest.raises(ValueError, match="spec.nccl.transport"):
        nccl_env(GroupTopology(1, True, False), "carrier-pigeon")


def test_user_nccl_env_wins_and_is_reported():
    res = nccl_env(GroupTopology(2, True, False, True, "ib", "rdma/ib"), "infiniband",
                   user_env=[{"name": "NCCL_IB_DISABLE", "value": "1"}, {"name": "NCCL_ALGO", "value": "Tree"}])
    got = {e["name"]: e["value"] for e in res.env}
    assert got["NCCL_IB_DISABLE"] == "1" and got["NCCL_ALGO"] == "Tree"
    assert [e["name"] for e in res.env].count("NCCL_IB_DISABLE") == 1
    assert any(e.subject == "env NCCL_IB_DISABLE" and e.level == "warning" for e in res.explain)


def test_compute_domain_only_for_multi_node_nvlink_groups():
    out, _ = render(gb200_nvl72(1, 8), Layout(tp=8), per_node=4, network=NetworkOptions(compute_domains=True))
    g = out.groups[0]
    assert g.compute_domain["kind"] == "ComputeDomain" and g.compute_domain["spec"]["numNodes"] == 2
    template = g.compute_domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for p in g.pods:
        assert p["spec"]["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": template}]
    # one tray is one node: no MNNVL, no ComputeDomain
    single, _ = render(gb200_nvl72(1, 2), Layout(tp=4), per_node=4, network=NetworkOptions(compute_domains=True))
    assert single.groups[0].compute_domain is None
    assert "NCCL_MNNVL_ENABLE" not in env(single.groups[0].pods[0])
    pcie, _ = render(l40s(1), Layout(tp=2), per_node=4)
    assert "NCCL_P2P_LEVEL" not in env(pods_of(pcie)[0])


def test_plan_hash_follows_plan_not_placement():
    a, _ = render(hgx_h100(4), Layout(tp=8, dp=2))
    b, _ = render(hgx_h100(4)[::-1], Layout(tp=8, dp=2))
    c, _ = render(hgx_h100(4), Layout(tp=8, dp=2), chunk_size=2048)
    assert a.plan_hash == b.plan_hash != c.plan_hash


def test_user_env_overrides_and_secret_token():
    topo = build_topology(hgx_h100(1))
    placement = place(request_for_layout(Layout(tp=8), 8), topo)
    pods = PodOptions(env=({"name": "NCCL_P2P_LEVEL", "value": "SYS"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}),
                      weights_secret=("hf", "token"), image="my/vllm:1")
    out = render_deployment(OWNER, cand(Layout(tp=8)), placement, topo, ServingOptions(model="m"), NetworkOptions(),
                            pods)
    c = pods_of(out)[0]["spec"]["containers"][0]
    e = {x["name"]: x for x in c["env"]}
    assert e["NCCL_P2P_LEVEL"]["value"] == "SYS" and e["VLLM_LOGGING_LEVEL"]["value"] == "DEBUG"
    assert e["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert c["image"] == "my/vllm:1"


def test_child_names_are_dns_labels():
    long = "a" * 63
    for suffix in ("", "r12", "r12-7"):
        n = child_name(long, suffix)
        assert len(n) <= 63 and n.endswith(suffix) and n[0].isalpha()
    assert child_name(long, "r1-0") != child_name(long, "r1-1")
    assert child_name("7b", "r0") == "m7b-r0"


def test_spec_disabled_toggles_reach_the_engine_flags():
    """The API spells serving toggles auto|enabled|disabled; `disabled` must turn features off."""
    from pathlib import Path

    import yaml

    from meshplan.api.models import LLMDeployment
    from meshplan.render.options import options_from_spec

    manifest = yaml.safe_load((Path(__file__).parent.parent / "examples" / "llama-3.1-8b-1gpu.yaml").read_text())
    manifest["spec"].setdefault("engine", {})["cudaGraphs"] = "disabled"
    serving, _, _ = options_from_spec(LLMDeployment.from_manifest(manifest).spec)
    assert serving.cuda_graphs == "disabled"
    out, _ = render(hgx_h100(1), Layout(tp=1), serving=serving)
    assert "--enforce-eager" in pods_of(out)[0]["spec"]["containers"][0]["args"]
