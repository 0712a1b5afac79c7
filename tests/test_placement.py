"""Placement: NVLink-domain rules, best-fit, stability, zones, all-or-nothing."""

from __future__ import annotations

import pytest
from _gpu_nodes import gb200_nvl72, gpu_node, gpu_pod, hgx_h100, l40s

from meshplan.placement import PlacementRequest, gpus_per_pod_for, place, request_for_layout
from meshplan.planner.types import Layout
from meshplan.topology import build_topology

H100 = "NVIDIA-H100-80GB-HBM3"


def _stage_domains(result, req):
    """For each placed replica, the set of domains of each stage."""
    out = []
    for r in result.placed:
        stages = {}
        for p in r.pods:
            stages.setdefault(p.stage, set()).add(p.domain)
        out.append(stages)
    return out


def test_request_for_layout_splits_stages_into_node_sized_pods():
    assert gpus_per_pod_for(16, 4) == 4 and gpus_per_pod_for(12, 8) == 6 and gpus_per_pod_for(2, 8) == 2
    req = request_for_layout(Layout(tp=4, ep=4, pp=2, dp=3), gpus_per_node=4)
    assert (req.replicas, req.gpus_per_pod, req.pods_per_stage, req.stages) == (3, 4, 4, 2)
    assert req.gpus_per_replica == 32 and req.pods_per_replica == 8
    with pytest.raises(ValueError, match="gpus_per_pod"):
        PlacementRequest(replicas=1, gpus_per_pod=0)


def test_tp8_replicas_fill_hgx_nodes_one_each():
    topo = build_topology(hgx_h100(4))
    res = place(request_for_layout(Layout(tp=8, dp=4), 8), topo)
    assert res.ok
    assert sorted(r.nodes[0] for r in res.placed) == ["hgx-0", "hgx-1", "hgx-2", "hgx-3"]
    assert all(r.single_domain for r in res.placed)


def test_stage_never_crosses_a_domain_and_all_or_nothing_when_too_big():
    # TP16 needs 16 GPUs of one NVLink domain; HGX domains hold 8.
    topo = build_topology(hgx_h100(4))
    res = place(request_for_layout(Layout(tp=16, dp=1), 8), topo)
    assert not res.ok and res.placed == ()
    u = res.unplaced[0]
    assert u.gpus_per_stage == 16 and "largest eligible domain holds 8" in u.reason


def test_gb200_replica_pinned_to_one_clique():
    topo = build_topology(gb200_nvl72(racks=2, nodes_per_rack=18))
    res = place(request_for_layout(Layout(tp=4, ep=4, pp=2, dp=4), 4), topo)
    assert res.ok
    for r in res.placed:
        assert len(r.pods) == 8 and r.single_domain
        assert len(set(r.nodes)) == 8           # 4-GPU trays: one pod per node


def test_pipeline_stages_span_domains_in_one_zone_never_across_zones():
    # TP8 PP2 = 16 GPUs; no domain holds 16, so stages spread over nodes of one zone.
    nodes = hgx_h100(1, zone="z1", prefix="a") + hgx_h100(2, zone="z2", prefix="b")
    topo = build_topology(nodes)
    req = request_for_layout(Layout(tp=8, pp=2, dp=2), 8)
    res = place(req, topo)
    assert len(res.placed) == 1 and len(res.unplaced) == 1
    r = res.placed[0]
    assert r.zone == "z2" and set(r.nodes) == {"b-0", "b-1"}
    assert all(len(d) == 1 for stages in _stage_domains(res, req) for d in stages.values())
    # the second replica would need z1's single node plus another zone: refused, with numbers
    assert "free GPUs per domain" in res.unplaced[0].reason
    assert dict(res.unplaced[0].free_gpus_by_domain)["a-0"] == 8


def test_replica_that_fits_a_domain_waits_rather_than_spreading():
    # A PP2 replica of 2x4 GPUs fits one 8-GPU node; with 4+4 free on two nodes it must not spread.
    nodes = hgx_h100(2)
    pods = [gpu_pod("x", "hgx-0", 4), gpu_pod("y", "hgx-1", 4)]
    topo = build_topology(nodes, pods)
    req = request_for_layout(Layout(tp=4, pp=2, dp=1), 8)
    assert not place(req, topo).ok
    spread = place(PlacementRequest(1, req.gpus_per_pod, req.pods_per_stage, req.stages, single_domain=False), topo)
    assert spread.ok and set(spread.placed[0].nodes) == {"hgx-0", "hgx-1"}


def test_best_fit_leaves_the_big_domain_for_the_big_group():
    # hgx-0 has 8 free, hgx-1 has 4 free. A 4-GPU replica then an 8-GPU replica
    # (another deployment). First-fit by name would put the 4 on hgx-0 and starve the 8.
    nodes = hgx_h100(2)
    topo = build_topology(nodes, [gpu_pod("busy", "hgx-1", 4)])
    small = place(request_for_layout(Layout(tp=4, dp=1), 8), topo)
    assert small.placed[0].nodes == ("hgx-1",)
    after = topo.with_usage(small.usage())
    big = place(request_for_layout(Layout(tp=8, dp=1), 8), after)
    assert big.ok and big.placed[0].nodes == ("hgx-0",)
    # what first-fit would have done: the 4 on hgx-0 leaves no 8-GPU domain
    first_fit = topo.with_usage([("hgx-0", 4)])
    assert not place(request_for_layout(Layout(tp=8, dp=1), 8), first_fit).ok


def test_best_fit_packs_small_groups_on_few_nodes():
    topo = build_topology(l40s(2, gpus=4))
    res = place(request_for_layout(Layout(tp=2, dp=3), 4), topo)
    assert res.ok
    assert [r.nodes for r in res.placed] == [("l40s-0",), ("l40s-0",), ("l40s-1",)]


def test_pcie_stage_stays_inside_one_node():
    topo = build_topology(l40s(2, gpus=4))
    res = place(request_for_layout(Layout(tp=8, dp=1), 4), topo)   # 8 GPUs > 4 per PCIe node
    assert not res.ok and "largest eligible domain holds 4" in res.unplaced[0].reason


def test_existing_replicas_keep_their_place():
    topo = build_topology(hgx_h100(4))
    req = request_for_layout(Layout(tp=8, dp=2), 8)
    res = place(req, topo, existing={0: ["hgx-3"], 1: ["hgx-2"]})
    assert [r.nodes for r in res.placed] == [("hgx-3",), ("hgx-2",)]
    assert all(r.kept for r in res.placed)
    # scaling up keeps both and adds a third elsewhere
    req3 = request_for_layout(Layout(tp=8, dp=3), 8)
    res3 = place(req3, topo, existing={0: ["hgx-3"], 1: ["hgx-2"]})
    assert [r.nodes for r in res3.placed][:2] == [("hgx-3",), ("hgx-2",)]
    assert res3.placed[2].nodes[0] in {"hgx-0", "hgx-1"} and not res3.placed[2].kept


def test_invalid_existing_replica_is_moved_with_a_note():
    nodes = hgx_h100(3)
    nodes[2]["spec"]["unschedulable"] = True
    topo = build_topology(nodes)
    res = place(request_for_layout(Layout(tp=8, dp=2), 8), topo, existing={0: ["hgx-2"], 1: ["hgx-1"]})
    assert res.ok
    assert res.replica(1).kept and res.replica(1).nodes == ("hgx-1",)
    assert not res.replica(0).kept and res.replica(0).nodes == ("hgx-0",)
    assert any("hgx-2" in n for n in res.notes)


def test_existing_replica_with_wrong_shape_is_replaced():
    topo = build_topology(hgx_h100(2))
    req = request_for_layout(Layout(tp=4, pp=2, dp=1), 8)     # 2 pods per replica now
    res = place(req, topo, existing={0: ["hgx-1"]})
    assert res.ok and not res.placed[0].kept and len(res.placed[0].pods) == 2
    assert "needs 2" in res.notes[0]


def test_all_or_nothing_partial_capacity_places_no_pod_of_that_replica():
    # Replica needs 4 pods x 4 GPUs in one clique; only 3 nodes have room.
    nodes = gb200_nvl72(racks=1, nodes_per_rack=4)
    topo = build_topology(nodes, [gpu_pod("busy", "nvl72-0-00", 1)])
    res = place(request_for_layout(Layout(tp=16, dp=1), 4), topo)
    assert res.placed == () and len(res.unplaced) == 1
    u = res.unplaced[0]
    assert u.needed_gpus == 16 and dict(u.free_gpus_by_domain) == {nodes[0]["metadata"]["labels"]
                                                                   ["nvidia.com/gpu.clique"]: 15}
    assert "15" in u.reason and "16 GPUs in one NVLink domain" in u.reason


def test_product_and_node_selector_restrict_eligible_nodes():
    nodes = hgx_h100(1) + l40s(1, gpus=8)
    nodes[0]["metadata"]["labels"]["pool"] = "serving"
    topo = build_topology(nodes)
    req = request_for_layout(Layout(tp=8), 8, product="NVIDIA-L40S")
    assert place(req, topo).placed[0].nodes == ("l40s-0",)
    req = request_for_layout(Layout(tp=8), 8, product=H100, node_selector={"pool": "serving"})
    assert place(req, topo).placed[0].nodes == ("hgx-0",)
    req = request_for_layout(Layout(tp=8), 8, product=H100, node_selector={"pool": "batch"})
    res = place(req, topo)
    assert not res.ok and "no schedulable nodes with product" in res.unplaced[0].reason


def test_mixed_products_never_share_a_replica():
    nodes = [gpu_node("h", H100, 4), gpu_node("l", "NVIDIA-L40S", 4, memory_mib=46068)]
    topo = build_topology(nodes)
    req = PlacementRequest(1, 4, 1, 2, single_domain=False, product=H100)
    assert not place(req, topo).ok
