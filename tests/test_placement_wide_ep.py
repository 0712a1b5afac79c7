"""Placement of wide expert-parallel groups (issue 18, Build 3): a stage larger than every NVLink domain
spreads over the FEWEST domains of ONE network block, all-or-nothing, stable across reconciles; and the
planner's closed-form count (`Topology.replica_slots`) agrees with what placement places.

Nodes: GFD label sets (tests/_gpu_nodes.py) with `rdma/ib` in allocatable as the RDMA shared device plugin
advertises it (github.com/Mellanox/k8s-rdma-shared-dev-plugin).
"""

from __future__ import annotations

import os

from _gpu_nodes import gpu_node, gpu_pod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.placement import PlacementRequest, place, request_for_layout
from meshplan.planner.types import Layout
from meshplan.topology import build_topology

FAST = settings(max_examples=int(os.environ.get("MESHPLAN_PROP_EXAMPLES", "25")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def ib(name: str, zone: str = "zone-a", rdma: str | None = "rdma/ib") -> dict:
    n = gpu_node(name, "NVIDIA-H200", 8, memory_mib=143771, zone=zone)
    if rdma:
        n["status"]["allocatable"][rdma] = "8"
    return n


def test_dp32_ep_group_takes_four_nodes_of_one_block():
    topo = build_topology([ib(f"h{i}") for i in range(4)])
    req = request_for_layout(Layout(1, 32, 1), 8)
    assert (req.gpus_per_pod, req.pods_per_stage) == (8, 4)
    res = place(req, topo)
    assert res.ok and res.placed[0].block == "zone-a"
    assert sorted(res.placed[0].nodes) == ["h0", "h1", "h2", "h3"]
    assert [p.rank for p in res.placed[0].pods] == [0, 1, 2, 3]


def test_the_fewest_domains_are_used():
    # 16-GPU stage in 4-GPU pods: h0 has only 4 free, h1 and h2 have 8: two domains suffice
    topo = build_topology([ib("h0"), ib("h1"), ib("h2")], [gpu_pod("x", "h0", 4)])
    res = place(PlacementRequest(replicas=1, gpus_per_pod=4, pods_per_stage=4), topo)
    assert res.ok and set(res.placed[0].domains) == {"h1", "h2"}


def test_never_across_blocks_or_onto_nodes_without_rdma():
    topo = build_topology([ib("a0"), ib("b0", zone="zone-b"), ib("t0", rdma=None), ib("t1", rdma=None)])
    res = place(request_for_layout(Layout(1, 16, 1), 8), topo)
    assert not res.ok
    assert "spread over the NVLink domains of one network block" in res.message()
    assert "zone-a=8" in res.message() and "zone-b=8" in res.message()
    # two RDMA nodes in one block: placed there, never on the TCP-only nodes
    topo = build_topology([ib("a0"), ib("a1"), ib("t0", rdma=None), ib("t1", rdma=None)])
    res = place(request_for_layout(Layout(1, 16, 1), 8), topo)
    assert res.ok and set(res.placed[0].nodes) == {"a0", "a1"}


def test_all_or_nothing_per_group():
    topo = build_topology([ib(f"h{i}") for i in range(3)])
    res = place(request_for_layout(Layout(1, 16, 1), 8, replicas=2), topo)
    assert len(res.placed) == 1 and len(res.unplaced) == 1
    assert len(res.placed[0].pods) == 2 and not any(u.index == res.placed[0].index for u in res.unplaced)


def test_wide_groups_keep_their_nodes_across_reconciles():
    topo = build_topology([ib(f"h{i}") for i in range(4)])
    req = request_for_layout(Layout(1, 16, 1), 8, replicas=2)
    first = place(req, topo)
    # what the controller passes back on the next reconcile: index -> nodes by rank (here reversed groups)
    existing = {0: first.placed[1].nodes, 1: first.placed[0].nodes}
    again = place(req, topo, existing)
    assert again.ok and all(r.kept for r in again.placed)
    assert {r.index: r.nodes for r in again.placed} == existing
    assert place(req, topo, {r.index: r.nodes for r in again.placed}) == again


def test_a_kept_group_split_over_two_blocks_moves_whole():
    topo = build_topology([ib("a0"), ib("a1"), ib("b0", zone="zone-b"), ib("b1", zone="zone-b")])
    req = request_for_layout(Layout(1, 16, 1), 8)
    res = place(req, topo, {0: ("a0", "b0")})
    assert res.ok and not res.placed[0].kept
    assert res.placed[0].block in ("zone-a", "zone-b") and len({n[0] for n in res.placed[0].nodes}) == 1
    assert any("one network block" in n for n in res.notes)


nodes_st = st.lists(st.tuples(st.sampled_from(("za", "zb")), st.booleans(), st.sampled_from((0, 2, 4, 8))),
                    min_size=1, max_size=8)


@FAST
@given(nodes_st, st.sampled_from((16, 24, 32, 64)))
def test_planner_count_equals_what_placement_places(cluster, stage):
    nodes, pods = [], []
    for i, (zone, rdma, used) in enumerate(cluster):
        nodes.append(ib(f"n{i}", zone, "rdma/ib" if rdma else None))
        if used:
            pods.append(gpu_pod(f"p{i}", f"n{i}", used))
    topo = build_topology(nodes, pods)
    slots = topo.replica_slots(stage, 1)
    req = request_for_layout(Layout(1, stage, 1), 8, replicas=slots + 1)
    res = place(req, topo)
    assert len(res.placed) == slots
    for r in res.placed:
        assert r.block and {topo.domain(d).block for d in r.domains} == {r.block}
