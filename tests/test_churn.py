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

    made = tcd.plan_for_spec(model.spec, sim.topology().to_fleet())
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
