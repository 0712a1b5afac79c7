"""The resync's safety net (docs/reliability.md, L1): which listed LLMDeployments are queued.

`listed_keys` keeps what a LIST returned in the served namespaces;
`due_for_resync` keeps what was not reconciled within the period.
"""

from __future__ import annotations

from meshplan.controller.indexes import due_for_resync, is_glob, listed_keys, served_namespace


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
