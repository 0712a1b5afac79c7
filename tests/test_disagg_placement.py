"""Prefill/decode disaggregation, placement (issue 19, Build 3): `placement.place_disagg` places each serving
unit (the decode groups and the prefill groups that feed them, the plan's P:D ratio) as a whole inside the
scope the plan's KV path needs: one NVLink domain, one network block, or anywhere for TCP. Node fixtures are
GFD label sets plus the RDMA shared device plugin's `rdma/ib` (tests/_gpu_nodes.py, tests/test_network_blocks.py)."""

from __future__ import annotations

import pytest
from _gpu_nodes import gb200_nvl72, gpu_node, hgx_h100

from meshplan.placement import place, place_disagg, request_for_layout
from meshplan.planner.types import Layout
from meshplan.topology import build_topology

H200 = "NVIDIA-H200"


def ib_node(name: str, zone: str) -> dict:
    n = gpu_node(name, H200, 8, memory_mib=143771, zone=zone)
    n["status"]["allocatable"]["rdma/ib"] = "8"
    return n


def two_blocks() -> list[dict]:
    """4 H200 nodes in zone-a and 2 in zone-b, all with rdma/ib: two network blocks (32 and 16 GPUs)."""
    return [ib_node(f"a{i}", "zone-a") for i in range(4)] + [ib_node(f"b{i}", "zone-b") for i in range(2)]


def _req(layout: Layout, replicas: int, per_node: int = 8, product: str | None = H200):
    return request_for_layout(layout, per_node, replicas=replicas, product=product)


def _unit_nodes(res, unit) -> list[str]:
    return [n for i in unit.prefill for n in res.prefill.replica(i).nodes] + \
           [n for i in unit.decode for n in res.decode.replica(i).nodes]


def test_each_unit_sits_in_one_network_block_when_the_kv_moves_over_rdma():
    topo = build_topology(two_blocks())
    res = place_disagg(_req(Layout(tp=8), 3), _req(Layout(tp=8), 3), topo, ratio=(1, 1), tier="ib")
    assert res.ok, res.message()
    assert len(res.units) == 3 and len(res.prefill.placed) == 3 and len(res.decode.placed) == 3
    for u in res.units:
        blocks = {topo.domain_of(n).block for n in _unit_nodes(res, u)}
        assert blocks == {u.scope}, (u, blocks)
    # best-fit: the first unit fills the smaller block exactly, the next two share the larger one
    assert [u.scope for u in res.units] == ["zone-b", "zone-a", "zone-a"]
    # every GPU is used once
    assert sorted(n for n, _ in res.usage()) == ["a0", "a1", "a2", "a3", "b0", "b1"]


def test_a_unit_is_all_or_nothing_and_never_split_over_blocks():
    """Two units of (2 x prefill TP8 + 1 x decode EP16) = 32 GPUs each: only zone-a holds one. The second unit
    is not placed at all (zone-b's 16 GPUs stay free), where placing the roles apart would have put a decode group
    in zone-b whose prefill groups sit in zone-a (its KV over no shared fabric) and run half a unit."""
    topo = build_topology(two_blocks())
    pre, dec = _req(Layout(tp=8), 4), _req(Layout(tp=1, ep=16), 2)
    res = place_disagg(pre, dec, topo, ratio=(2, 1), tier="ib")
    assert not res.ok
    assert [u.index for u in res.units] == [0] and [u for u, _ in res.unplaced_units] == [1]
    assert len(res.prefill.placed) == 2 and len(res.decode.placed) == 1
    assert {r.index for r in res.prefill.unplaced} == {2, 3} and {r.index for r in res.decode.unplaced} == {1}
    assert not {n for n, _ in res.usage()} & {"b0", "b1"}
    why = res.unplaced_units[0][1]
    assert "1 decode group(s) x 16 GPUs and 2 prefill group(s) x 8 GPUs = 32 GPUs in one network block" in why
    assert "zone-b=16" in why and "zone-a=0" in why
    # the roles placed apart: the second decode group lands in zone-b, away from the prefill groups' block
    apart = place(dec, topo)
    assert apart.ok and {topo.domain_of(n).block for r in apart.placed for n in r.nodes} == {"zone-a", "zone-b"}


def test_each_unit_sits_in_one_nvlink_domain_when_the_kv_moves_over_nvlink():
    topo = build_topology(gb200_nvl72(racks=2))
    pre, dec = _req(Layout(tp=4), 16, per_node=4, product="NVIDIA-GB200"), \
        _req(Layout(tp=8), 8, per_node=4, product="NVIDIA-GB200")
    res = place_disagg(pre, dec, topo, ratio=(2, 1), tier="nvlink")
    assert res.ok, res.message()
    assert len(res.units) == 8
    for u in res.units:
        doms = {topo.domain_of(n).name for n in _unit_nodes(res, u)}
        assert doms == {u.scope}, (u, doms)
    # 144 GPUs, 8 units of 16: the first four fill one rack (64 of 72) before the other is touched
    assert len({u.scope for u in res.units[:4]}) == 1


def test_tcp_lets_a_unit_spread_and_an_rdma_plan_refuses_a_fleet_without_rdma():
    topo = build_topology(hgx_h100(4))                     # no RDMA resource: no network block
    pre, dec = _req(Layout(tp=8), 2, product=None), _req(Layout(tp=8), 2, product=None)
    ok = place_disagg(pre, dec, topo, ratio=(1, 1), tier="tcp")
    assert ok.ok and len(ok.units) == 2 and all(u.scope == "" for u in ok.units)
    refused = place_disagg(pre, dec, topo, ratio=(1, 1), tier="ib")
    assert not refused.ok and not refused.units and refused.usage() == []
    assert "in one network block (the KV path the plan priced: ib); free GPUs: none eligible" in refused.message()


def test_units_keep_their_nodes_and_only_a_broken_unit_moves():
    nodes = two_blocks()
    topo = build_topology(nodes)
    pre, dec = _req(Layout(tp=8), 2), _req(Layout(tp=8), 2)
    first = place_disagg(pre, dec, topo, ratio=(1, 1), tier="ib")
    assert first.ok and not any(u.kept for u in first.units)
    ex_p = {r.index: r.nodes for r in first.prefill.placed}
    ex_d = {r.index: r.nodes for r in first.decode.placed}
    again = place_disagg(pre, dec, topo, ratio=(1, 1), tier="ib", existing_prefill=ex_p, existing_decode=ex_d)
    assert again.ok and all(u.kept for u in again.units)
    assert {r.index: r.nodes for r in again.prefill.placed} == ex_p
    assert {r.index: r.nodes for r in again.decode.placed} == ex_d
    # one node of unit 1 is cordoned: unit 1 moves (whole, still in one block), unit 0 keeps its nodes
    u1 = set(_unit_nodes(first, first.units[1]))
    gone = sorted(u1)[0]
    for n in nodes:
        if n["metadata"]["name"] == gone:
            n["spec"]["unschedulable"] = True
    moved = place_disagg(pre, dec, build_topology(nodes), ratio=(1, 1), tier="ib", existing_prefill=ex_p,
                         existing_decode=ex_d)
    assert moved.ok
    assert moved.units[0].kept and not moved.units[1].kept
    assert gone not in _unit_nodes(moved, moved.units[1])
    assert any(note.startswith("unit 1 moves") for note in moved.notes)
    assert len({moved_topo_block for moved_topo_block in
                (build_topology(nodes).domain_of(n).block for n in _unit_nodes(moved, moved.units[1]))}) == 1


def test_counts_off_whole_units_place_the_rest_as_one_last_unit_in_one_block():
    # per-role autoscaling: 3 prefill + 2 decode of P:D 2:1 = one whole unit (2 + 1) and a partial one (1 + 1)
    topo = build_topology(two_blocks())
    res = place_disagg(_req(Layout(tp=8), 3), _req(Layout(tp=8), 2), topo, ratio=(2, 1), tier="ib")
    assert res.ok, res
    assert [(u.prefill, u.decode) for u in res.units] == [((0, 1), (0,)), ((2,), (1,))]
    for u in res.units:
        assert len({build_topology(two_blocks()).domain_of(n).block for n in _unit_nodes(res, u)}) == 1
    # only one role beyond the whole units: the partial unit holds just that role's groups
    res = place_disagg(_req(Layout(tp=8), 1), _req(Layout(tp=8), 3), topo, ratio=(1, 1), tier="ib")
    assert res.ok and [(u.prefill, u.decode) for u in res.units] == [((0,), (0,)), ((), (1, 2))]
    res = place_disagg(_req(Layout(tp=8), 2), _req(Layout(tp=8), 2), topo, ratio=(1, 2), tier="ib")
    assert [(u.prefill, u.decode) for u in res.units] == [((0,), (0, 1)), ((1,), ())]
    # 3 whole units (16 GPUs each) fill both blocks (32 + 16 GPUs): the partial unit (one prefill group) has no place
    res = place_disagg(_req(Layout(tp=8), 4), _req(Layout(tp=8), 3), topo, ratio=(1, 1), tier="ib")
    assert not res.ok and [u for u, _ in res.unplaced_units] == [3]
    assert [r.index for r in res.prefill.unplaced] == [3] and res.decode.unplaced == ()
    with pytest.raises(ValueError, match="must be >= 0"):
        place_disagg(_req(Layout(tp=8), -1), _req(Layout(tp=8), 2), topo, ratio=(2, 1), tier="ib")
    with pytest.raises(ValueError, match="both sides must be >= 1"):
        place_disagg(_req(Layout(tp=8), 0), _req(Layout(tp=8), 2), topo, ratio=(0, 1), tier="ib")
    with pytest.raises(ValueError, match="KV path tier 'smoke'"):
        place_disagg(_req(Layout(tp=8), 1), _req(Layout(tp=8), 1), topo, ratio=(1, 1), tier="smoke")


def test_a_new_group_never_lands_on_the_nodes_of_kept_groups_of_its_own_or_a_later_unit():
    # per-role scaling makes units that mix kept and new groups: 4 prefill running (a0..a3) and 1 decode (a4) of
    # P:D 2:1, the decode role grows to 2: unit 1 keeps prefill 2 and 3 and gets a new decode group, which must
    # not be put on a2 or a3 (their GPUs are taken by the kept prefill groups: the pod would be Unschedulable)
    topo = build_topology([ib_node(f"a{i}", "zone-a") for i in range(8)])
    ex_p = {0: ["a0"], 1: ["a1"], 2: ["a2"], 3: ["a3"]}
    res = place_disagg(_req(Layout(tp=8), 4), _req(Layout(tp=8), 2), topo, ratio=(2, 1), tier="ib",
                       existing_prefill=ex_p, existing_decode={0: ["a4"]})
    assert res.ok, res
    assert [list(res.prefill.replica(i).nodes) for i in range(4)] == [["a0"], ["a1"], ["a2"], ["a3"]]
    assert list(res.decode.replica(0).nodes) == ["a4"]
    assert res.decode.replica(1).nodes[0] not in {"a0", "a1", "a2", "a3", "a4"}, res.decode.replica(1).nodes
    # and a kept group of a later unit is not taken by a new group of an earlier one
    res = place_disagg(_req(Layout(tp=8), 4), _req(Layout(tp=8), 2), topo, ratio=(2, 1), tier="ib",
                       existing_prefill={2: ["a0"], 3: ["a1"]}, existing_decode={1: ["a2"]})
    assert res.ok, res
    used = [n for i in range(4) for n in res.prefill.replica(i).nodes] + \
           [n for i in range(2) for n in res.decode.replica(i).nodes]
    assert len(used) == len(set(used)) == 6, used
