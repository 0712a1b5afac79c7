"""Topology churn (issue 17, finding 9): make-before-break replacement of a group that cannot keep its
nodes, and the incumbent's priority for capacity it had.

Driven through `decide` round by round with the `Sim` of test_controller_decide (it plays the API
server, scheduler and kubelet: no real cluster runs in these unit tests; the e2e counterpart is
e2e/reliability/test_redteam_churn.py). Node fixtures are the repository's GFD-labelled fleets.
"""

from __future__ import annotations

from test_controller_decide import Sim, converge, llmd  # noqa: E402  (tests/ is on sys.path)

from meshplan.controller.decide import live_groups
from meshplan.topology import LABEL_CLIQUE


def _node(sim: Sim, name: str) -> dict:
    return next(n for n in sim.nodes if n["metadata"]["name"] == name)


def _set_allocatable(sim: Sim, name: str, gpus: int) -> None:
    n = _node(sim, name)
    for key in ("allocatable", "capacity"):
        if key in n.get("status", {}):
            n["status"][key]["nvidia.com/gpu"] = str(gpus)


def _nodes_of_groups(sim: Sim) -> dict[int, set[str]]:
    return {i: {p.obj["spec"].get("nodeName") for p in g.pods.values()} for i, g in live_groups(sim.pods()).items()}


def _rounds_until_moved(sim: Sim, model, away_from: set[str], rounds: int = 12):
    """Step until every group is off `away_from`; record ready groups and deletes of each round."""
    history = []
    for _ in range(rounds):
        out = sim.step(model)
        history.append((sim.ready_groups(), [d for d in out.delete if d[1] == "Pod"], out))
        if all(not (nodes & away_from) for nodes in _nodes_of_groups(sim).values()) and sim.ready_groups() >= 1:
            break
    return history


def test_allocatable_drop_replaces_the_group_before_removing_it():
    """HGX H100, TP8 = one 8-GPU pod: its node's allocatable drops 8 -> 4. The replacement is created
    on a spare node and becomes ready while the old group still serves; only then is the old one
    deleted. Ready groups never drop below 1."""
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    converge(sim, model)
    assert sim.ready_groups() == 1
    (old_node,), = _nodes_of_groups(sim).values()
    _set_allocatable(sim, old_node, 4)
    history = _rounds_until_moved(sim, model, {old_node})
    ready_counts = [h[0] for h in history]
    assert min(ready_counts) >= 1, ready_counts
    first = history[0][2]
    created = [d for d, live in first.apply if d["kind"] == "Pod" and live is None]
    assert created and not history[0][1], "round 1 must create the replacement and delete nothing"
    assert any(e[1] == "ReplicaMoving" for e in first.events), first.events
    assert sim.condition("Degraded")["status"] in ("True", "False")
    # The old group is deleted only in a round where the replacement was already ready.
    delete_rounds = [k for k, h in enumerate(history) if h[1]]
    assert delete_rounds, "the old group was never removed"
    assert history[delete_rounds[0] - 1][0] >= 1
    reasons = [e[1] for h in history for e in h[2].events]
    assert "ReplicaMoved" in reasons, reasons
    converge(sim, model)
    (nodes,), = _nodes_of_groups(sim).values()
    assert old_node not in nodes and sim.ready_groups() == 1
    assert sim.condition("Available")["status"] == "True"
    assert sim.condition("Degraded")["status"] == "False"


def test_clique_relabel_replaces_the_group_before_removing_it():
    """GB200 NVL72, TP8 = two 4-GPU trays in one NVLink domain: one tray is relabelled into another
    `nvidia.com/gpu.clique`, so the group now spans two domains. It keeps serving until its
    replacement (inside one domain) is ready."""
    sim, model = Sim("gb200-nvl72"), llmd("NVIDIA-GB200", tensor=8, replicas=2)
    converge(sim, model)
    assert sim.ready_groups() == 2
    groups = _nodes_of_groups(sim)
    victim_group = min(groups)
    tray = sorted(groups[victim_group])[0]
    _node(sim, tray)["metadata"]["labels"][LABEL_CLIQUE] = "9a8f6c1e-0000-4000-8000-00000000a001.9"
    ready, deletes = [], 0
    for _ in range(12):
        out = sim.step(model)
        deletes += len([d for d in out.delete if d[1] == "Pod"])
        # ready groups not being deleted, after this round's writes: never below the 2 that served
        ready.append(sim.ready_groups())
    assert min(ready) >= 2, ready
    assert deletes == 2, f"the misplaced group's 2 pods are deleted once its replacement is ready ({deletes})"
    placed = sim.previous_status["placement"]
    assert len(placed) == 2 and all("," not in r["nvlinkDomain"] for r in placed), placed
    assert all(tray not in nodes for nodes in _nodes_of_groups(sim).values())


def test_no_room_for_a_replacement_keeps_the_group_serving_and_says_so(monkeypatch):
    """Two HGX nodes, two TP8 groups (one per node): one node's allocatable drops 8 -> 4 and the
    other node is full. Nothing is deleted, the group keeps serving, Placed=False/NoRoomToReplace
    names the replica, the reason and the free GPUs; Degraded=True/ReplicaMisplaced. When the
    GPUs come back, the group is kept where it is."""
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2)
    sim.nodes = sim.nodes[:2]
    converge(sim, model)
    assert sim.ready_groups() == 2
    # The reconciler keeps the running plan when only the fleet shrank and the spec no longer fits
    # whole (`Reconciler._plan`); Sim re-plans every round, so pin the plan made on the healthy fleet.
    import test_controller_decide as tcd

    made = tcd.plan_for_spec(model.spec, sim.topology())
    monkeypatch.setattr(tcd, "plan_for_spec", lambda spec, fleet: made)
    node = sim.pods()[0]["spec"]["nodeName"]
    _set_allocatable(sim, node, 4)
    for _ in range(4):
        out = sim.step(model)
        assert not [d for d in out.delete if d[1] == "Pod"], out.delete
        assert not [d for d, live in out.apply if d["kind"] == "Pod" and live is None]
    assert sim.ready_groups() == 2
    placed = sim.condition("Placed")
    assert placed["status"] == "False" and placed["reason"] == "NoRoomToReplace", placed
    assert "no room left" in placed["message"] and "free GPUs per NVLink domain" in placed["message"], placed
    assert sim.condition("Available")["status"] == "True"
    degraded = sim.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReplicaMisplaced", degraded
    _set_allocatable(sim, node, 8)
    out = sim.step(model)
    assert not out.delete and sim.condition("Placed")["status"] == "True"
    assert sim.condition("Degraded")["status"] == "False"



def test_a_group_on_a_not_ready_node_is_replaced_at_once_not_kept():
    """A node goes NotReady while its pods still read Ready (the node controller marks them a few
    seconds later): its kubelet is gone, the group serves nobody, so it is not kept as misplaced
    but removed whole at once, as before (then re-placed)."""
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    converge(sim, model)
    (node,), = _nodes_of_groups(sim).values()
    _node(sim, node).setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "False"}]
    out = sim.step(model)
    assert {d[2] for d in out.delete if d[1] == "Pod"} == {p["metadata"]["name"] for p in sim.pods()}
    assert not any(e[1] == "ReplicaMoving" for e in out.events)
    converge(sim, model)
    (nodes,), = _nodes_of_groups(sim).values()
    assert node not in nodes and sim.ready_groups() == 1


# ----------------------------------------------------------------------------- the node watch


def _gfd_node(fleet: str = "hgx-h100", i: int = 0) -> dict:
    import copy

    from meshplan.devcluster.fleets import fleet_nodes, load_fleet

    node = copy.deepcopy(fleet_nodes(load_fleet(fleet))[i])
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


def test_node_index_reports_label_and_allocatable_changes_but_not_the_gfd_timestamp(monkeypatch):
    from meshplan.controller import indexes

    seen: list[str] = []
    monkeypatch.setattr(indexes, "on_node_change", seen.append)
    monkeypatch.setattr(indexes, "_shapes", {})
    node = _gfd_node("gb200-nvl72")
    name = node["metadata"]["name"]
    assert indexes.index_node(name, node) is not None and seen == []          # first sight: nothing
    node["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1764547200"
    indexes.index_node(name, node)
    assert seen == [], "a GFD relabelling pass that changed nothing queued reconciles"
    node["metadata"]["labels"][LABEL_CLIQUE] = "9a8f6c1e-0000-4000-8000-00000000a001.9"
    indexes.index_node(name, node)
    assert seen == [name]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    indexes.index_node(name, node)
    assert seen == [name, name]
    indexes.index_node(name, node)                                             # a heartbeat: unchanged
    assert seen == [name, name]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert indexes.index_node(name, node) is None
    assert seen == [name] * 3, "losing every GPU is a change too"
    node["spec"] = {"unschedulable": True}
    node["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    indexes.index_node(name, node)          # seen again after losing its GPUs: a first sight
    node["spec"] = {}
    indexes.index_node(name, node)
    assert seen == [name] * 4, "uncordon"


def test_node_change_queues_the_deployments_on_the_node_first():
    import asyncio

    from meshplan.controller import indexes
    from meshplan.controller.handlers import NODE_EVENT_DELAY_S, State

    assert indexes.deployments_on([("a", "x", "n1", 8), ("b", None, "n1", 8), ("a", "y", "n2", 4),
                                   ("a", "x", "n1", 8)], "n1") == [("a", "x")]

    async def run() -> list:
        st = State(queue=asyncio.Queue(), loop=asyncio.get_running_loop())
        st.llmds_index = {indexes.ALL_KEY: [("ns", "first"), ("ns", "placed"), ("ns", "waiting")]}
        st.pods_index = {indexes.USAGE_KEY: [("ns", "placed", "n1", 8), ("ns", "first", "n2", 8)]}
        st.node_changed("n1")
        await asyncio.sleep(2 * NODE_EVENT_DELAY_S + 0.3)
        out = []
        while not st.queue.empty():
            out.append(st.queue.get_nowait())
        return out

    order = asyncio.run(run())
    assert order[0] == ("ns", "placed") and sorted(order) == [("ns", "first"), ("ns", "placed"), ("ns", "waiting")]


# ----------------------------------------------------------------------------- incumbency


def test_incumbency_rank_orders_served_before_never_served_then_by_time():
    from meshplan.placement import incumbency_rank

    served_early = incumbency_rank("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "ns/a")
    served_late = incumbency_rank("2026-02-01T00:00:00Z", "2025-01-01T00:00:00Z", "ns/b")
    old_newcomer = incumbency_rank(None, "2024-01-01T00:00:00Z", "ns/c")
    young_newcomer = incumbency_rank(None, "2026-03-01T00:00:00Z", "ns/d")
    assert sorted([young_newcomer, served_late, old_newcomer, served_early]) == [
        served_early, served_late, old_newcomer, young_newcomer]


def test_held_for_claims_leaves_the_incumbents_gpus_free_and_never_takes_running_ones():
    from meshplan.placement import Claim, PlacementRequest, held_for_claims, incumbency_rank
    from meshplan.topology import build_topology

    topo = build_topology(Sim("hgx-h100").nodes, ready_if_unknown=True)        # 4 nodes x 8 H100
    tp8 = PlacementRequest(replicas=1, gpus_per_pod=8, product="NVIDIA-H100-80GB-HBM3")
    incumbent = Claim("ns/a", incumbency_rank("2026-01-01T00:00:00Z", None, "ns/a"), tp8)
    newcomer = incumbency_rank(None, "2025-01-01T00:00:00Z", "ns/b")
    held, owners = held_for_claims(topo, [incumbent], newcomer)
    assert owners == ["ns/a"] and sum(g for _, g in held) == 8
    # the claim ranks after the asking deployment: nothing held for it
    assert held_for_claims(topo, [incumbent], incumbency_rank("2025-12-01T00:00:00Z", None, "ns/z")) == ([], [])
    # the newcomer's own running pods are charged first: the claim never lands on them
    nodes = sorted(topo.nodes)
    own = [(n, 8) for n in nodes[:3]]
    held, _ = held_for_claims(topo, [incumbent], newcomer, own)
    assert held == [(nodes[3], 8)]
    # a claim that cannot fit holds nothing
    assert held_for_claims(topo, [incumbent], newcomer, [(n, 8) for n in nodes]) == ([], [])


def _body(name: str, uid: str, created: str, serving_since: str | None = None) -> dict:
    m = llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1).to_manifest()
    m["metadata"] = {"name": name, "namespace": "ns", "uid": uid, "generation": 1, "creationTimestamp": created}
    if serving_since:
        m["status"] = {"servingSince": serving_since}
    return m


def _scenario(a_serving_since: str | None) -> tuple:
    """One HGX node. `a` runs there; the node goes NotReady, `a`'s group is gone; `b` (created before
    `a`) waits as well. The node comes back and `b` is reconciled first. Returns (b's outcome, a's)."""
    from meshplan.controller.reconcile import Reconciler, World
    from meshplan.topology import node_info

    node = _gfd_node("hgx-h100")
    infos = [node_info(node)]
    r = Reconciler(kube=None, world=World(nodes=lambda: list(infos)), compute_domains=False)
    a = _body("a", "u-a", "2026-01-01T00:00:00Z", a_serving_since)
    b = _body("b", "u-b", "2025-06-01T00:00:00Z")
    first = r._decide_in_thread("ns", "a", a, [], [], [])
    assert [d for d, _ in first.apply if d["kind"] == "Pod"], "a is placed on the healthy node"
    r.world.forget("ns", "a")                                    # its pods are gone with the node
    node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    infos[:] = [node_info(node)]
    r._decide_in_thread("ns", "a", a, [], [], [])
    r._decide_in_thread("ns", "b", b, [], [], [])
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    infos[:] = [node_info(node)]
    out_b = r._decide_in_thread("ns", "b", b, [], [], [])
    out_a = r._decide_in_thread("ns", "a", a, [], [], [])
    return out_b, out_a, r


def _pods_created(out) -> list:
    return [d for d, live in out.apply if d["kind"] == "Pod" and live is None]


def test_a_deployment_that_served_gets_its_capacity_back_before_a_waiting_newcomer():
    out_b, out_a, r = _scenario("2026-01-01T00:05:00Z")
    assert not _pods_created(out_b), "the newcomer took the GPUs the incumbent was waiting for"
    assert _pods_created(out_a), "the incumbent stayed unplaced"
    assert ("ns", "a") not in r.claims, "a placed: its claim is dropped"
    status_b = {c["type"]: c for c in out_b.status["conditions"]}
    assert status_b["Planned"]["status"] == "False" or status_b["Placed"]["status"] == "False", status_b
    assert out_a.status["servingSince"] == "2026-01-01T00:05:00Z"


def test_without_incumbency_the_older_waiting_deployment_goes_first():
    """The same scenario with `a` never having served: `b`, created first, is placed (so the test
    above is decided by the incumbency, not by the order of the reconciles)."""
    out_b, out_a, _ = _scenario(None)
    assert _pods_created(out_b) and not _pods_created(out_a)
