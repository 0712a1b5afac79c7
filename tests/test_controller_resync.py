"""The resync's safety net (docs/reliability.md, L1): which listed LLMDeployments are queued.

`listed_keys` keeps what a LIST returned in the served namespaces;
`due_for_resync` keeps what was not reconciled within the period;
`unwatched_namespaces`, `gpu_node_infos` and `gpu_usage` say what to read past
kopf's watches while they miss a namespace.
"""

from __future__ import annotations

from meshplan.controller.indexes import (
    due_for_resync,
    gpu_node_infos,
    gpu_usage,
    is_glob,
    listed_keys,
    served_namespace,
    unwatched_namespaces,
)
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.render.workloads import LABEL_DEPLOYMENT


def _llmd(ns: str | None, name: str | None) -> dict:
    meta = {}
    if ns is not None:
        meta["namespace"] = ns
    if name is not None:
        meta["name"] = name
    return {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": meta}


def test_served_namespace_follows_the_operators_globs():
    assert served_namespace("anything", ())                   # cluster-wide
    assert served_namespace("mp-op-1a2b", ("mp-op-*",))
    assert not served_namespace("mp-other", ("mp-op-*",))
    assert served_namespace("team-a", ("llm-*", "team-a"))
    assert not served_namespace("team-ab", ("team-a",))
    assert is_glob("mp-op-*") and is_glob("team-?") and not is_glob("team-a")


def test_listed_keys_keep_only_served_namespaces_and_complete_names():
    items = [_llmd("mp-op-new", "llm"), _llmd("mp-op-new", "llm"), _llmd("other", "llm"),
             _llmd("mp-op-x", None), _llmd(None, "cluster-scoped?"), _llmd("mp-op-x", "b")]
    assert listed_keys(items, ("mp-op-*",)) == {("mp-op-new", "llm"), ("mp-op-x", "b")}
    assert listed_keys(items, ()) == {("mp-op-new", "llm"), ("other", "llm"), ("mp-op-x", "b")}
    assert listed_keys([], ("mp-op-*",)) == set()


def test_due_for_resync_queues_the_never_and_the_long_ago_reconciled_only():
    period_s, now_s = 60.0, 1000.0
    last = {("ns", "recent"): now_s - 5, ("ns", "old"): now_s - 61, ("ns", "edge"): now_s - period_s,
            ("ns", "not-listed"): now_s - 500}
    keys = [("ns", "recent"), ("ns", "old"), ("ns", "edge"), ("ns", "missed-by-the-watch"), ("ns", "old")]
    assert due_for_resync(keys, last, now_s, period_s) == [("ns", "edge"), ("ns", "missed-by-the-watch"),
                                                            ("ns", "old")]
    # one period later, with nothing reconciled meanwhile, the recent one is due too
    assert ("ns", "recent") in due_for_resync(keys, last, now_s + period_s, period_s)
    assert due_for_resync([], last, now_s, period_s) == []


def test_unwatched_namespaces_are_only_those_kopf_surely_does_not_watch():
    missed = {("new-ns", "a"), ("new-ns", "b"), ("busy-ns", "late"), ("fresh-ns", "just-created")}
    known = {("busy-ns", "other")}                     # kopf watches busy-ns: its pods are in the index
    before = {("new-ns", "a")}                         # the previous LIST missed new-ns/a too
    assert unwatched_namespaces(missed, known, before, nodes_watched=True) == {"new-ns"}
    # kopf watching no node at all means it watches no namespace: every missed one counts at once
    assert unwatched_namespaces(missed, set(), set(), nodes_watched=False) == {"new-ns", "busy-ns", "fresh-ns"}
    assert unwatched_namespaces(set(), known, before, nodes_watched=False) == set()


def test_gap_reads_match_what_the_indexes_would_hold():
    nodes = fleet_nodes(load_fleet("hgx-h100"))
    cpu_only = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0", "labels": {}},
                "status": {"allocatable": {"cpu": "8"}}}
    infos = gpu_node_infos([*nodes, cpu_only])
    assert [i.name for i in infos] == [n["metadata"]["name"] for n in nodes]
    assert all(i.gpus == 8 for i in infos)

    def pod(name, node, gpus, phase="Running", deployment="llm"):
        return {"metadata": {"name": name, "namespace": "new-ns", "labels": {LABEL_DEPLOYMENT: deployment}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]},
                "status": {"phase": phase}}

    usage = gpu_usage([pod("a", "hgx-h100-0", 8), pod("b", "hgx-h100-1", 0),
                       pod("c", "hgx-h100-1", 4, phase="Succeeded"), pod("d", "hgx-h100-1", 4, deployment="x")])
    assert sorted(usage) == [("new-ns", "llm", "hgx-h100-0", 8), ("new-ns", "x", "hgx-h100-1", 4)]


def test_a_standby_skips_the_resync_list_only_where_it_knows_it_is_paused(monkeypatch):
    import asyncio

    from meshplan.controller import handlers

    paused: set[str] = set()
    asked: list[str] = []

    async def may_act(namespace: str) -> bool:
        asked.append(namespace)
        return namespace not in paused

    monkeypatch.setattr(handlers, "may_act", may_act)

    def acts(**options) -> bool:
        monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(**options))
        return asyncio.run(handlers._acts_anywhere())

    assert acts() and asked == []                             # no peering: always acts, asks nothing
    assert acts(peering="p")                                  # cluster-wide peering, not paused
    paused.add("")
    assert not acts(peering="p")                              # cluster-wide standby: no LIST
    paused.update({"a", "b"})
    assert not acts(peering="p", namespaces=("a", "b"))       # standby in every named namespace
    assert acts(peering="p", namespaces=("a", "b", "c"))      # acts in one of them
    assert acts(peering="p", namespaces=("a", "team-*"))      # globs: unknown before the LIST


def test_autoscaled_keys_are_the_listed_objects_with_autoscaling_enabled_in_served_namespaces():
    from meshplan.controller.indexes import autoscaled_keys

    def item(ns: str, name: str, autoscaling) -> dict:
        return {**_llmd(ns, name), "spec": {} if autoscaling is None else {"autoscaling": autoscaling}}

    items = [item("team-a", "on", {"enabled": True}), item("team-a", "off", {"enabled": False}),
             item("team-a", "unset", None), item("team-a", "truthy", {"enabled": "true"}),
             item("other", "on", {"enabled": True})]
    assert autoscaled_keys(items, ("team-*",)) == {("team-a", "on")}
    assert autoscaled_keys(items, ()) == {("team-a", "on"), ("other", "on")}
