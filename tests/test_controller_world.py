"""controller.reconcile.World: the topology a reconcile sees, from the indexes plus its own reservations."""

from __future__ import annotations

from _gpu_nodes import hgx_h100

from meshplan.controller.reconcile import RESERVATION_TTL_S, World
from meshplan.topology import node_info


def _world(index: list) -> tuple[World, list]:
    now = [0.0]
    infos = [node_info(n) for n in hgx_h100(3)]
    return World(nodes=lambda: infos, usage=lambda: list(index), clock_s=lambda: now[0]), now


def test_a_reservation_counts_for_others_until_the_index_shows_the_pod():
    index: list = []
    w, now = _world(index)
    w.reserve("ns", "a", [("a-r0-0", "hgx-1", 8)])
    assert w.topology_without("ns", "b").nodes["hgx-1"].free_gpus == 0      # the next placement sees it taken
    assert w.topology_without("ns", "a").nodes["hgx-1"].free_gpus == 8      # not charged to its own deployment
    index.append(("ns", "a", "hgx-1", 4))                                   # index shows less: the larger counts
    assert w.topology_without("ns", "b").nodes["hgx-1"].free_gpus == 0
    index[0] = ("ns", "a", "hgx-1", 8)                                      # the watch caught up: not twice
    assert w.topology_without("ns", "b").nodes["hgx-1"].free_gpus == 0
    assert not w.reserved                                                   # ... and the index alone counts now
    index.clear()                                                           # deleted by someone else: freed at once
    assert w.topology_without("ns", "b").nodes["hgx-1"].free_gpus == 8


def test_reservations_expire_and_go_with_their_deployment():
    w, now = _world([])
    w.reserve("ns", "a", [("a-r0-0", "hgx-1", 8)])
    w.reserve("ns", "c", [("c-r0-0", "hgx-2", 8)])
    now[0] = RESERVATION_TTL_S + 1                                          # never seen by the index: expires
    assert w.topology_without("ns", "b").nodes["hgx-1"].free_gpus == 8
    w.reserve("ns", "c", [("c-r1-0", "hgx-0", 8)])
    w.forget("ns", "c")                                                     # the LLMDeployment was deleted
    assert w.topology_without("ns", "b").free_gpus == 24
    assert not w.reserved


def test_deleting_a_reserved_pod_releases_its_gpus_and_the_fleet_is_built_once():
    w, _ = _world([])
    w.reserve("ns", "a", [("a-r0-0", "hgx-0", 8), ("a-r1-0", "hgx-2", 4)])
    w.reserve("ns", "a", [], deleted=["a-r0-0"])
    topo = w.topology_without("other", "b")
    assert (topo.nodes["hgx-0"].free_gpus, topo.nodes["hgx-2"].free_gpus) == (8, 4)
    assert w.fleet() is w.fleet()                      # unchanged nodes: the empty fleet is not rebuilt
    assert w.fleet().free_gpus == 24
