"""RDMA rendering (issue 18 Build 4; issue 15 finding "NCCL is told to use InfiniBand while no RDMA device
is requested"): multi-node groups on an RDMA network block request the nodes' RDMA resource, get IPC_LOCK
and the fabric's NCCL variables; without a requested device no IB variable is forced.

Nodes: GFD label sets (tests/_gpu_nodes.py) with the RDMA resources in allocatable as the RDMA shared device
plugin (`rdma/ib`, `rdma/roce_a`) and the AWS EFA device plugin (`vpc.amazonaws.com/efa`, 32 per p5.48xlarge,
AWS EC2 P5 docs) advertise them. The plans are fixed (`fixed_plan`): these tests are about rendering.
"""

from __future__ import annotations

import dataclasses

from _gpu_nodes import gpu_node
from test_render_pipeline import fixed_plan, llmd

from meshplan.planner.types import Layout
from meshplan.render.nccl import GroupTopology, nvshmem_env, rdma_request
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import NetworkConfig, build_topology

DS = {"name": "deepseek-r1"}


def h200(name: str, rdma: str | None = "rdma/ib", count: int = 8, zone: str = "zone-a") -> dict:
    n = gpu_node(name, "NVIDIA-H200", 8, memory_mib=143771, zone=zone)
    if rdma:
        n["status"]["allocatable"][rdma] = str(count)
    return n


def _pods(res):
    return [p for g in res.rendered.groups for p in g.pods]


def _env(pod) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def _render(nodes, layout, *, engine="sglang", network=None, engine_spec=None, **spec):
    topo = build_topology(nodes, network=network)
    d = llmd(model=DS, engine={"kind": engine, **(engine_spec or {})}, **spec)
    res = plan_place_render(d, topo, plan=fixed_plan(layout, "h200_sxm", engine))
    assert res.rendered is not None and res.rendered.groups, res
    return res


def _devices(container):
    """The container's device limits (extended resources: GPUs, RDMA), without its memory limit."""
    return {k: v for k, v in container["resources"]["limits"].items() if "/" in k}


def test_wide_ep_pods_request_the_rdma_resource_and_nccl_uses_ib():
    res = _render([h200("a"), h200("b")], Layout(1, 16, 1))
    pods = _pods(res)
    assert len(pods) == 2
    for p in pods:
        c = p["spec"]["containers"][0]
        assert _devices(c) == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
        assert c["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}
        env = _env(p)
        assert env["NCCL_IB_DISABLE"] == "0" and "NCCL_IB_GID_INDEX" not in env
        assert "spec.nccl.transport=auto -> infiniband" in p["metadata"]["annotations"]["meshplan.dev/explain"]


def test_without_an_rdma_resource_ib_is_not_forced():
    # a pipeline across two plain HGX nodes of one zone, spec.nccl.transport pinned to infiniband
    res = _render([h200("a", None), h200("b", None)], Layout(8, 1, 2), engine="vllm",
                  nccl={"transport": "infiniband"})
    for p in _pods(res):
        c = p["spec"]["containers"][0]
        assert set(_devices(c)) == {"nvidia.com/gpu"}
        assert "capabilities" not in c["securityContext"]
        assert "NCCL_IB_DISABLE" not in _env(p)
        assert "the nodes advertise no RDMA resource" in p["metadata"]["annotations"]["meshplan.dev/explain"]


def test_a_group_inside_one_node_requests_nothing():
    res = _render([h200("a"), h200("b")], Layout(1, 8, 1))
    for p in _pods(res):
        c = p["spec"]["containers"][0]
        assert set(_devices(c)) == {"nvidia.com/gpu"} and "capabilities" not in c["securityContext"]
        assert "NCCL_IB_DISABLE" not in _env(p)


def test_roce_sets_the_gid_index_and_efa_the_libfabric_provider():
    roce = _pods(_render([h200("a", "rdma/roce_a"), h200("b", "rdma/roce_a")], Layout(1, 16, 1)))
    assert _env(roce[0])["NCCL_IB_GID_INDEX"] == "3"
    assert roce[0]["spec"]["containers"][0]["resources"]["limits"]["rdma/roce_a"] == "1"
    efa = _pods(_render([h200("a", "vpc.amazonaws.com/efa", 32), h200("b", "vpc.amazonaws.com/efa", 32)],
                        Layout(1, 16, 1)))
    env = _env(efa[0])
    assert env["FI_PROVIDER"] == "efa" and "NCCL_IB_DISABLE" not in env
    assert efa[0]["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"


def test_multus_networks_are_attached_when_configured():
    cfg = dataclasses.replace(NetworkConfig(), multus_networks=("rdma/ib-net-a", "ib-net-b"))
    pods = _pods(_render([h200("a"), h200("b")], Layout(1, 16, 1), network=cfg))
    assert all(p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma/ib-net-a,ib-net-b"
               for p in pods)
    plain = _pods(_render([h200("a"), h200("b")], Layout(1, 16, 1)))
    assert all("k8s.v1.cni.cncf.io/networks" not in p["metadata"]["annotations"] for p in plain)


def test_deepep_across_nodes_gets_nvshmem_ibgda():
    res = _render([h200("a", "rdma/roce_a"), h200("b", "rdma/roce_a")], Layout(1, 16, 1),
                  engine_spec={"extraArgs": ["--moe-a2a-backend", "deepep"]}, nccl={"ibHca": "mlx5_0,mlx5_1"})
    env = _env(_pods(res)[0])
    assert env["NVSHMEM_IB_ENABLE_IBGDA"] == "1" and env["NVSHMEM_IB_GID_INDEX"] == "3"
    assert env["NVSHMEM_HCA_LIST"] == "mlx5_0,mlx5_1"
    g = GroupTopology(nodes=2, nvlink=True, multi_node_nvlink=False, spans_domains=True, rdma_fabric="ib",
                      rdma_resource="rdma/ib")
    assert nvshmem_env(g, ["--tp", "1"]) == ([], [])              # no DeepEP: nothing
    env, why = nvshmem_env(dataclasses.replace(g, rdma_fabric="efa"), ["--moe-a2a-backend", "deepep"])
    assert env == [] and why[0].level == "warning"


def test_rdma_request_counts():
    assert rdma_request("rdma/ib", 1000, 8, 8) == 1             # shared device plugin: one share
    assert rdma_request("nvidia.com/hostdev", 8, 4, 8) == 4      # exclusive: the pod's GPU share
    assert rdma_request("vpc.amazonaws.com/efa", 32, 8, 8) == 32
    assert rdma_request("vpc.amazonaws.com/efa", 1, 1, 8) == 1


def test_a_pinned_tp_across_domains_is_planned_rendered_and_warned():
    from meshplan.planner import plan_for_spec

    spec = llmd(model=DS, engine={"kind": "sglang"}, parallelism={"tensor": 16, "pipeline": 1},
                gpus={"products": ["NVIDIA-H200"], "maxGpus": 16}).spec
    topo = build_topology([h200("a"), h200("b")])
    p = plan_for_spec(spec, topo)
    assert p.choice is not None and p.choice.layout.tp == 16
    assert any("TP16 is pinned and crosses the 8-GPU NVLink domain" in n for n in p.extra["notes"])
    res = _render([h200("a"), h200("b")], Layout(16, 1, 1))
    warn = [e for e in res.rendered.explain if e.subject == "spec.parallelism.tensor"]
    assert warn and warn[0].level == "warning" and "crosses NVLink domains" in warn[0].reason
