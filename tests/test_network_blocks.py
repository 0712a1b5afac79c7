"""The second tier of the one cluster model (issue 18, Build 1): NVLink domains inside RDMA network blocks.

Nodes are NVIDIA GFD label sets (tests/_gpu_nodes.py, k8s-device-plugin docs/gpu-feature-discovery) with
the RDMA resources the device plugins advertise in allocatable: `rdma/ib` / `rdma/roce_*` (RDMA shared
device plugin, github.com/Mellanox/k8s-rdma-shared-dev-plugin), `vpc.amazonaws.com/efa` (AWS EFA device
plugin). The block label `cloud.google.com/gce-topology-block` is GKE's (GKE docs "compact placement /
topology labels"); EKS writes `topology.k8s.aws/network-node-layer-*`.
"""

from __future__ import annotations

import pytest
from _gpu_nodes import gpu_node, gpu_pod

from meshplan.topology import (
    DEFAULT_RDMA_RESOURCES,
    NetworkConfig,
    build_topology,
    network_config_from_env,
    node_info,
)


def rdma_node(name: str, resource: str = "rdma/ib", count: int = 8, zone: str = "zone-a",
              labels: dict | None = None, product: str = "NVIDIA-H200", memory_mib: int = 143771) -> dict:
    n = gpu_node(name, product, 8, memory_mib=memory_mib, zone=zone)
    if resource:
        n["status"]["allocatable"][resource] = str(count)
    n["metadata"]["labels"].update(labels or {})
    return n


def test_nodes_with_one_rdma_resource_in_one_zone_form_one_block():
    topo = build_topology([rdma_node(f"h{i}") for i in range(4)] + [rdma_node("tcp", resource="")])
    assert build_topology([rdma_node("h0")], name="f").name == "f"
    assert [(b.name, b.fabric, b.resource, b.domains, b.total_gpus) for b in topo.blocks] == [
        ("zone-a", "ib", "rdma/ib", ("h0", "h1", "h2", "h3"), 32)]
    assert topo.domain("tcp").block == "" and topo.domain("h0").rdma_per_node == 8
    # the RDMA resource is read from allocatable, not from a label
    assert dict(node_info(rdma_node("x", "rdma/ib", 4)).extended)["rdma/ib"] == 4


def test_zones_and_fabrics_separate_blocks():
    nodes = [rdma_node("a0"), rdma_node("a1"), rdma_node("b0", zone="zone-b"),
             rdma_node("r0", resource="rdma/roce_a", zone="zone-b"), rdma_node("e0", "vpc.amazonaws.com/efa", 32, "zone-c")]
    topo = build_topology(nodes)
    assert {b.name: (b.fabric, b.domains) for b in topo.blocks} == {
        "zone-a": ("ib", ("a0", "a1")),
        "zone-b/rdma/ib": ("ib", ("b0",)),              # one zone, two fabrics: two blocks, both named
        "zone-b/rdma/roce_a": ("roce", ("r0",)),        # rdma/roce* matches by prefix
        "zone-c": ("efa", ("e0",)),
    }


def test_the_block_label_is_configurable():
    blk = "cloud.google.com/gce-topology-block"
    nodes = [rdma_node("a0", labels={blk: "b1"}), rdma_node("a1", labels={blk: "b1"}),
             rdma_node("a2", labels={blk: "b2"})]
    by_zone = build_topology(nodes)
    assert [b.domains for b in by_zone.blocks] == [("a0", "a1", "a2")]
    by_label = build_topology(nodes, network=NetworkConfig(block_label=blk))
    assert {b.name: b.domains for b in by_label.blocks} == {"b1": ("a0", "a1"), "b2": ("a2",)}
    # a selection that regroups keeps the configuration
    assert [b.name for b in by_label.select({blk: "b1"}).blocks] == ["b1"]


def test_rdma_resource_names_are_configurable_and_checked():
    cfg = network_config_from_env({"MESHPLAN_RDMA_RESOURCES": "rdma/rdma_shared_device_a=roce",
                                   "MESHPLAN_NETWORK_BLOCK_LABEL": "topology.k8s.aws/network-node-layer-3"})
    assert cfg.rdma_resources == (("rdma/rdma_shared_device_a", "roce"),) and cfg.label.endswith("layer-3")
    topo = build_topology([rdma_node("a", "rdma/rdma_shared_device_a"), rdma_node("b", "rdma/ib")], network=cfg)
    assert [(d.name, d.fabric) for d in topo.domains] == [("a", "roce"), ("b", "")]
    assert network_config_from_env({}).rdma_resources == DEFAULT_RDMA_RESOURCES
    with pytest.raises(ValueError, match="MESHPLAN_RDMA_RESOURCES"):
        network_config_from_env({"MESHPLAN_RDMA_RESOURCES": "rdma/ib"})
    with pytest.raises(ValueError, match="fabric must be one of ib, roce, efa"):
        network_config_from_env({"MESHPLAN_RDMA_RESOURCES": "rdma/ib=omnipath"})


def test_tiers_carry_sourced_bandwidth_and_latency():
    topo = build_topology([rdma_node("h0"), rdma_node("h1")])
    nv, ib = topo.domain("h0").tier, topo.blocks[0].tier
    assert (nv.kind, nv.gb_s) == ("nvlink", 450.0)        # H200: 900 GB/s bidirectional NVLink4 per GPU
    assert (ib.kind, ib.gb_s) == ("ib", 50)               # one 400 Gb/s NDR NIC per GPU
    assert nv.latency_us < ib.latency_us
    assert "tuning.cc" in nv.source and "nic_gb_s" in ib.source


def test_a_stage_larger_than_every_domain_spans_one_block_only():
    two_blocks = [rdma_node("a0"), rdma_node("a1"), rdma_node("b0", zone="zone-b"), rdma_node("b1", zone="zone-b")]
    topo = build_topology(two_blocks)
    assert topo.replica_slots(16, 1) == 2                 # one 16-GPU EP group per block
    assert topo.replica_slots(32, 1) == 0                 # never across blocks
    assert "block with the most free GPUs (zone-a, ib) has 16 free" in topo.why_no_room(32, 1)
    assert topo.replica_slots(16, 1, span_blocks=False) == 0
    # a stage that fits one domain stays inside one: 8-GPU stages count per node
    assert topo.replica_slots(8, 1) == 4
    # usage lowers the block's free GPUs; a half-used node offers no whole 8-GPU pod
    used = build_topology(two_blocks, [gpu_pod("p", "a0", 4)])
    assert used.blocks[0].free_gpus == 12 and used.replica_slots(16, 1) == 1
    # nodes without RDMA never span
    assert build_topology([rdma_node("t0", ""), rdma_node("t1", "")]).replica_slots(16, 1) == 0
