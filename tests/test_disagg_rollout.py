"""A disaggregated deployment's rollout never mixes revisions (issue 19): `controller.disagg_rollout.rollout_step`
driven step by step against a simulated cluster (groups become ready after seeded random delays), with the
InferencePool's selector (`render.inference_pool.pool_selector`) matched against each group's pod labels to list
the endpoints the pool serves at every step. At every step:
(a) the served endpoints never hold a prefill group of one revision beside a decode group of another;
(b) the new revision is served only with ready groups of both roles, at least one unit at the plan's ratio;
(c) with room to surge, the served capacity (units) never drops below what was served before the rollout;
(d) with room, no group of the served revision is deleted before the new one is served;
(e) without room, a served group is deleted only in a step that creates a new group that then fits, no step
    holds more GPUs than the cluster has, and a group that cannot fit is explained (NoRoom) with nothing deleted;
    a deployment of two or more units keeps at least one served throughout where an old and a new unit fit side
    by side (served units are given up only for a group the next new unit lacks, and only while no new group is
    starting).
The last tests break each rule in the module and watch its invariant fail."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from meshplan.controller import disagg_rollout as dr
from meshplan.controller.disagg_rollout import Desired, RoleGroup, Room, rollout_step
from meshplan.render import inference_pool as ip
from meshplan.render.workloads import LABEL_ROLE

NAME = "r1"
OLD, NEW = "rev-a", "rev-b"


@dataclass
class Sim:
    role: str
    index: int
    revision: str
    gpus: int
    ready_at: int


def _labels(g: Sim) -> dict[str, str]:
    return {**ip.role_pod_labels(NAME, g.revision, g.role), LABEL_ROLE: "leader"}


def endpoints(state: list[Sim], serve: str | None, t: int) -> list[Sim]:
    """The pool's endpoints: ready leaders its selector matches (no pool before anything is served)."""
    if serve is None:
        return []
    sel = ip.pool_selector(NAME, serve)
    return [g for g in state if g.ready_at <= t and ip.selects(sel, _labels(g))]


def _units(eps: list[Sim], ratio: tuple[int, int]) -> int:
    revs = {g.revision for g in eps}
    return max((min(sum(1 for g in eps if g.role == "prefill" and g.revision == r) // ratio[0],
                    sum(1 for g in eps if g.role == "decode" and g.revision == r) // ratio[1]) for r in revs),
               default=0)


@dataclass(frozen=True)
class Scenario:
    old: tuple[int, int, tuple[int, int], int, int]     # prefill, decode, ratio, GPUs per prefill, per decode
    new: tuple[int, int, tuple[int, int], int, int]
    capacity: int

    def old_gpus(self) -> int:
        p, d, _, gp, gd = self.old
        return p * gp + d * gd

    def new_gpus(self) -> int:
        p, d, _, gp, gd = self.new
        return p * gp + d * gd

    @staticmethod
    def unit_gpus(shape: tuple[int, int, tuple[int, int], int, int]) -> int:
        _, _, (rp, rd), gp, gd = shape
        return rp * gp + rd * gd

    @property
    def room(self) -> bool:
        """Room to surge the whole new revision next to the old one."""
        return self.capacity >= self.old_gpus() + self.new_gpus()


ROOM = {
    "same-shape": Scenario((2, 4, (1, 2), 8, 8), (2, 4, (1, 2), 8, 8), 96),
    "new-ratio": Scenario((4, 2, (2, 1), 4, 8), (3, 3, (1, 1), 4, 8), 64),
    "scale-up": Scenario((1, 1, (1, 1), 8, 8), (3, 3, (1, 1), 8, 8), 64),
    "ratio-flip": Scenario((4, 2, (2, 1), 4, 8), (2, 4, (1, 2), 4, 8), 72),   # old units count at the old ratio
}
NO_ROOM = {
    "exact-fit": Scenario((2, 4, (1, 2), 8, 8), (2, 4, (1, 2), 8, 8), 48),
    "one-spare-group": Scenario((2, 4, (1, 2), 8, 8), (2, 4, (1, 2), 8, 8), 56),
    "bigger-decode": Scenario((2, 4, (1, 2), 4, 4), (2, 2, (1, 1), 4, 8), 24),
    "one-unit": Scenario((1, 1, (1, 1), 8, 8), (1, 1, (1, 1), 8, 8), 16),
    "ratio-change-tight": Scenario((2, 2, (1, 1), 4, 8), (4, 2, (2, 1), 4, 4), 24),
}
SEEDS = range(6)


def simulate(sc: Scenario, seed: int, max_ticks: int = 300, *, max_surge: int = 1):
    """Run the rollout to the end; return the trace (one line per step) and the steps. Asserts (a)-(e)."""
    rng = random.Random(seed)
    op, od, oratio, ogp, ogd = sc.old
    np_, nd, nratio, ngp, ngd = sc.new
    desired = Desired(prefill=np_, decode=nd, ratio=nratio, gpus={"prefill": ngp, "decode": ngd})
    state = [Sim("prefill", i, OLD, ogp, 0) for i in range(op)] + [Sim("decode", i, OLD, ogd, 0) for i in range(od)]
    served: str | None = OLD
    before = _units(endpoints(state, served, 0), oratio)
    floor = min(before, desired.units)
    trace: list[str] = [f"t=0 serve={served} endpoints={_fmt(endpoints(state, served, 0))}"]
    steps = []
    for t in range(1, max_ticks):
        live = [RoleGroup(g.role, g.index, g.revision, g.ready_at <= t, g.gpus) for g in state]
        free = sc.capacity - sum(g.gpus for g in state)
        step = rollout_step(live, desired, NEW, Room(free), served=served, served_ratio=oratio,
                            max_surge=max_surge)
        steps.append(step)
        gone = {(g.role, g.index, g.revision) for g in step.delete}
        was_served = served
        state = [g for g in state if (g.role, g.index, g.revision) not in gone]
        for role, index in step.create:
            state.append(Sim(role, index, NEW, ngp if role == "prefill" else ngd, t + rng.randint(1, 5)))
        served = step.serve
        eps = endpoints(state, served, t)
        line = f"t={t} serve={served} endpoints={_fmt(eps)}"
        if step.create or step.delete:
            line += f" create={list(step.create)} delete={[(g.role, g.index, g.revision) for g in step.delete]}"
        trace.append(line + (f" events={step.reasons}" if step.events else ""))
        ctx = "\n".join(trace)
        # (d) / (e)
        old_served_deleted = [g for g in step.delete if g.revision == was_served and was_served != NEW]
        if old_served_deleted and served != NEW:
            assert not sc.room, f"(d) a served {was_served} group deleted before {NEW} serves, with room\n{ctx}"
            assert step.create and "NoRoomToSurge" in step.reasons, \
                f"(e) served group deleted without a new group that then fits at t={t}\n{ctx}"
        assert sum(g.gpus for g in state) <= sc.capacity, f"(e) more GPUs held than the cluster has at t={t}\n{ctx}"
        # (a)
        revs = {g.revision for g in eps if g.role == "prefill"} | {g.revision for g in eps if g.role == "decode"}
        assert len(revs) <= 1, f"(a) mixed revisions at t={t}\n{ctx}"
        # (b)
        if served == NEW:
            assert _units(eps, nratio) >= 1, f"(b) {NEW} served without a whole ready unit at t={t}\n{ctx}"
        # (c)
        if sc.room:
            assert _units(eps, nratio if served == NEW else oratio) >= floor, \
                f"(c) served units below {floor} with room at t={t}\n{ctx}"
        # (e') without room, a deployment of two or more units keeps serving at least one throughout where one
        # old unit and one new unit fit side by side
        if not sc.room and before >= 2 and sc.capacity >= sc.unit_gpus(sc.old) + sc.unit_gpus(sc.new):
            assert _units(eps, nratio if served == NEW else oratio) >= 1, f"(gap) nothing served at t={t}\n{ctx}"
        done = (served == NEW and all(g.revision == NEW and g.ready_at <= t for g in state)
                and sum(1 for g in state if g.role == "prefill") == np_
                and sum(1 for g in state if g.role == "decode") == nd)
        if done and not step.create and not step.delete:
            return trace, steps
    raise AssertionError("rollout did not finish\n" + "\n".join(trace))


def _fmt(eps: list[Sim]) -> str:
    return "[" + ", ".join(f"{g.role[0]}{g.index}@{g.revision[-1]}" for g in
                           sorted(eps, key=lambda g: (g.role != "prefill", g.index))) + "]"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(ROOM))
def test_rollout_with_room_keeps_capacity_and_never_mixes(name, seed):
    trace, steps = simulate(ROOM[name], seed)
    assert not any("NoRoomToSurge" in s.reasons for s in steps), "\n".join(trace)
    switch = [i for i, s in enumerate(steps) if "RevisionServed" in s.reasons]
    drained = [i for i, s in enumerate(steps) if "RevisionDrained" in s.reasons]
    assert len(switch) == 1 and drained and drained[0] == switch[0], "\n".join(trace)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(NO_ROOM))
def test_rollout_without_room_frees_old_groups_only_for_new_ones_that_fit(name, seed):
    trace, steps = simulate(NO_ROOM[name], seed)
    squeezed = [s for s in steps if "NoRoomToSurge" in s.reasons]
    assert squeezed, "\n".join(trace)
    assert all("served capacity" in m for s in squeezed for _, r, m in s.events if r == "NoRoomToSurge")


def test_random_shapes_keep_every_invariant():
    """Seeded random old/new shapes (ratios, units, GPUs per group), capacities from none spare to full surge,
    max_surge 1 or 2: (a)-(e) at every step, and each rollout finishes."""
    rng = random.Random(19)
    ratios = [(1, 1), (1, 2), (2, 1), (1, 3), (3, 2)]
    runs = 0
    while runs < 150:
        ro, rn = rng.choice(ratios), rng.choice(ratios)
        uo, un = rng.randint(1, 3), rng.randint(1, 3)
        old = (ro[0] * uo, ro[1] * uo, ro, rng.choice([4, 8]), rng.choice([4, 8]))
        new = (rn[0] * un, rn[1] * un, rn, rng.choice([4, 8]), rng.choice([4, 8]))
        bare = Scenario(old, new, 0)
        cap = rng.choice([max(bare.old_gpus(), bare.new_gpus()), bare.old_gpus() + bare.new_gpus(),
                          max(bare.old_gpus(), bare.new_gpus()) + 8, bare.old_gpus() + Scenario.unit_gpus(new)])
        if cap < bare.new_gpus():
            continue
        simulate(Scenario(old, new, cap), rng.randrange(1 << 16), max_surge=rng.choice([1, 2]))
        runs += 1


def test_the_trace_lists_the_pools_endpoints_at_each_step():
    """One small rollout, the pool's endpoints at each step (p0@a: prefill group 0 of rev-a)."""
    trace, _ = simulate(Scenario((1, 1, (1, 1), 8, 8), (1, 1, (1, 1), 8, 8), 32), seed=0)
    lines = [ln.split(" create=")[0].split(" events=")[0] for ln in trace]
    assert lines[0] == "t=0 serve=rev-a endpoints=[p0@a, d0@a]"
    assert "create=[('decode', 1), ('prefill', 1)]" in trace[1]
    served_b = [ln for ln in lines if "serve=rev-b" in ln]
    assert served_b and served_b[0].endswith("endpoints=[p1@b, d1@b]")
    assert all(ln.endswith("endpoints=[p0@a, d0@a]") for ln in lines[:lines.index(served_b[0])])


def test_a_group_that_can_never_fit_deletes_nothing_and_says_why():
    live = [RoleGroup("prefill", 0, OLD, True, 8), RoleGroup("decode", 0, OLD, True, 8)]
    desired = Desired(prefill=1, decode=1, ratio=(1, 1), gpus={"prefill": 8, "decode": 32})
    step = rollout_step(live, desired, NEW, Room(0), served=OLD)
    assert step.serve == OLD and step.served_units == 1
    assert step.delete == () and step.create == ()
    msg = next(m for _, r, m in step.events if r == "NoRoom")
    assert "needs 40 GPU(s)" in msg and "at most 16" in msg and "nothing of revision rev-a is deleted" in msg
    # when the whole new revision fits in what the old one frees, the old groups make room
    step = rollout_step(live, Desired(1, 1, (1, 1), {"prefill": 4, "decode": 12}), NEW, Room(0), served=OLD)
    assert step.delete and "NoRoomToSurge" in step.reasons


def test_first_deployment_serves_once_a_unit_is_ready():
    desired = Desired(prefill=2, decode=2, ratio=(1, 1), gpus={"prefill": 4, "decode": 4})
    s1 = rollout_step([], desired, NEW, Room(64), served=None)
    assert s1.serve is None and sorted(s1.create) == [("decode", 0), ("prefill", 0)]
    live = [RoleGroup("prefill", 0, NEW, True, 4), RoleGroup("decode", 0, NEW, False, 4)]
    assert rollout_step(live, desired, NEW, Room(56), served=None).serve is None
    live[1] = RoleGroup("decode", 0, NEW, True, 4)
    s3 = rollout_step(live, desired, NEW, Room(56), served=None)
    assert s3.serve == NEW and s3.served_units == 1 and sorted(s3.create) == [("decode", 1), ("prefill", 1)]


def test_an_abandoned_revision_is_deleted_at_once():
    live = [RoleGroup("prefill", 0, OLD, True, 8), RoleGroup("decode", 0, OLD, True, 8),
            RoleGroup("prefill", 1, "rev-x", False, 8)]
    step = rollout_step(live, Desired(1, 1, (1, 1), {"prefill": 8, "decode": 8}), NEW, Room(0), served=OLD)
    assert [g.revision for g in step.delete if g.revision == "rev-x"] == ["rev-x"]
    assert "RevisionAbandoned" in step.reasons and step.serve == OLD


def test_at_least_one_whole_unit_is_desired():
    with pytest.raises(ValueError, match="less than one whole unit of P:D 2:1"):
        rollout_step([], Desired(prefill=1, decode=2, ratio=(2, 1)), NEW, Room(0))
    with pytest.raises(ValueError, match="less than one whole unit of P:D 1:2"):
        rollout_step([], Desired(prefill=3, decode=1, ratio=(1, 2)), NEW, Room(0))


def test_per_role_counts_off_whole_units_are_created_and_counted_in_whole_units():
    # per-role autoscaling: 3 prefill + 2 decode of P:D 1:1 (2 whole units, one extra prefill group)
    desired = Desired(prefill=3, decode=2, ratio=(1, 1), gpus={"prefill": 8, "decode": 8})
    assert desired.units == 2
    live = [RoleGroup("prefill", 0, NEW, True, 8), RoleGroup("decode", 0, NEW, True, 8),
            RoleGroup("prefill", 1, NEW, True, 8), RoleGroup("decode", 1, NEW, True, 8)]
    step = rollout_step(live, desired, NEW, Room(64), served=NEW)
    assert step.create == (("prefill", 2),) and step.delete == () and step.served_units == 2
    # and back down: the extra prefill group goes, the units stay
    live3 = live + [RoleGroup("prefill", 2, NEW, True, 8)]
    down = rollout_step(live3, Desired(2, 2, (1, 1), {"prefill": 8, "decode": 8}), NEW, Room(0), served=NEW)
    assert [(g.role, g.index) for g in down.delete] == [("prefill", 2)] and down.create == ()


# ------------------------------------------------------------------ each rule, broken, fails its invariant


def _runs_all(scenarios: dict[str, Scenario]) -> None:
    for sc in scenarios.values():
        for seed in SEEDS:
            simulate(sc, seed)


def test_a_breaks_when_the_pool_ignores_the_revision(monkeypatch):
    monkeypatch.setattr(ip, "pool_selector", lambda name, revision=None: {"meshplan.dev/deployment": name})
    with pytest.raises(AssertionError, match=r"\(a\)"):
        _runs_all(ROOM)


def test_b_breaks_when_one_ready_role_is_enough(monkeypatch):
    monkeypatch.setattr(dr, "_serve_now", lambda ready, ratio, need: sum(ready.values()) > 0)
    with pytest.raises(AssertionError, match=r"\(b\)"):
        _runs_all(ROOM)


def test_c_breaks_when_one_unit_is_enough_to_switch(monkeypatch):
    monkeypatch.setattr(dr, "_need", lambda served_units, target_units: 1)
    with pytest.raises(AssertionError, match=r"\(c\)"):
        _runs_all(ROOM)


def test_d_breaks_when_the_old_revision_drains_early(monkeypatch):
    monkeypatch.setattr(dr, "_drain", lambda others, serving_new: list(others))
    with pytest.raises(AssertionError, match=r"\(d\)"):
        _runs_all(ROOM)


def test_the_gap_returns_when_old_units_go_while_new_groups_start(monkeypatch):
    monkeypatch.setattr(dr, "_may_lower", lambda before, after, starting, next_unit: True)
    with pytest.raises(AssertionError, match=r"\(gap\)"):
        _runs_all(NO_ROOM)


def test_the_gap_returns_when_groups_are_built_ahead_of_the_next_unit(monkeypatch):
    monkeypatch.setattr(dr, "_may_build_ahead", lambda next_unit, free, rest: True)
    with pytest.raises(AssertionError, match=r"\(gap\)"):
        _runs_all(NO_ROOM)


def test_e_breaks_when_old_groups_go_for_a_group_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(dr, "_fits", lambda free, freed, need: freed > 0 or free >= need)
    with pytest.raises(AssertionError, match=r"\(e\)"):
        _runs_all(NO_ROOM)
