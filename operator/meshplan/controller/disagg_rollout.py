"""A disaggregated deployment's rolling update that never mixes revisions (pure; issue 19).

A disaggregated deployment serves through one InferencePool (`render.inference_pool`) whose selector names one
serving revision: every prefill and decode group of that revision, nothing else. A prefill worker hands its KV
cache to a decode worker, so a prefill group of one revision must never feed a decode group of another (other
weights, dtype or layout: the KV cache would not fit or would be wrong). An aggregated rollout (`decide.py` rule
5) can serve old and new replicas side by side; a disaggregated one cannot, because the router pairs any prefill
endpoint with any decode endpoint. So the rollout is blue/green per revision, surged per role:

`rollout_step(live, desired, new_revision, room, served=...) -> Step`, one reconcile's decision:
1. Groups of a revision that is neither the new one nor the served one serve nobody (an abandoned rollout): they
   are deleted at once.
2. New-revision groups beyond the desired count of their role go (not-ready first, then the highest index).
3. Switch: the pool moves to the new revision only when its ready groups make at least one whole unit (rp
   prefill + rd decode groups, the plan's P:D ratio) and at least as many units as the served revision has ready
   now (capped at the desired units), so the served capacity does not drop when there is room to surge.
4. Drain: once the new revision is served, every group of another revision is deleted; never before.
5. Surge per role: new-revision groups are created (lowest free index of their role, at most `max_surge` not
   ready per role), the role furthest behind its share of the ratio first, while `room.free_gpus` holds them
   (GPUs of groups deleted in this step count as free: their pods are terminating, the new pods wait gated).
   While the old revision is served and the rest of the new one does not fit in the free GPUs, only groups the
   next new unit lacks are created (a group ahead of it could take the GPUs its other role needs).
6. No room: when the next group of a role does not fit and the old revision is still served, old groups are
   deleted first, but only when the new group then fits and the whole new revision fits in the GPUs this
   deployment holds plus the free ones (not-ready first, then those whose loss costs the fewest served units);
   the served capacity drops and an event says by how much. Old groups make room only for a group the next new
   unit lacks, and a deletion that lowers the served units waits while new groups are starting (they may make
   the switch possible without the loss). When it would not fit
   even then, or
   the old revision is already drained, nothing is deleted and the event says how many GPUs it needs and has.

Without room the served capacity can drop (to zero for a one-unit deployment without a GPU to spare): there is
no other way to replace a unit in place without serving two revisions at once, which rule (a) forbids.

`room` is the caller's count of GPUs free for this deployment (placement's view: topology scope and node
fragmentation are placement's to check, as `placement.place_disagg` does per unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class RoleGroup:
    """One live group: a prefill or decode replica (`index` within its role) of a serving revision."""

    role: str
    index: int
    revision: str
    ready: bool
    gpus: int = 0


@dataclass(frozen=True)
class Desired:
    """The new revision's groups: `prefill` and `decode` counts (at least one unit of `ratio` (rp, rd); per-role
    autoscaling may leave them off whole units, e.g. 3 prefill + 2 decode of 1:1: the groups beyond the whole
    units serve beside them but count toward no unit), and the GPUs one new group of each role takes."""

    prefill: int
    decode: int
    ratio: tuple[int, int]
    gpus: Mapping[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})

    def count(self, role: str) -> int:
        return self.prefill if role == "prefill" else self.decode

    @property
    def units(self) -> int:
        return min(self.prefill // self.ratio[0], self.decode // self.ratio[1])


@dataclass(frozen=True)
class Room:
    free_gpus: int


@dataclass(frozen=True)
class Step:
    create: tuple[tuple[str, int], ...]      # (role, index) of new-revision groups to create
    delete: tuple[RoleGroup, ...]
    serve: str | None                        # the revision the pool selects after this step
    served_units: int                        # whole ready units of `serve` after this step
    events: tuple[tuple[str, str, str], ...] = ()   # (type, reason, message)

    @property
    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]


def units(groups: Sequence[RoleGroup], revision: str | None, ratio: tuple[int, int]) -> int:
    """Whole units of `revision` among the ready `groups`."""
    if revision is None:
        return 0
    rp, rd = ratio
    n = {r: sum(1 for g in groups if g.role == r and g.revision == revision and g.ready) for r in ROLES}
    return min(n["prefill"] // rp, n["decode"] // rd)


# The rules as small functions (the tests break each one and watch the invariant it keeps fail).


def _need(served_units: int, target_units: int) -> int:
    """Units the new revision must have ready before it is served: what is served now (capped at the target)."""
    return max(1, min(served_units, target_units))


def _serve_now(ready: Mapping[str, int], ratio: tuple[int, int], need: int) -> bool:
    """Both roles ready in whole units, as many as needed."""
    return min(ready["prefill"] // ratio[0], ready["decode"] // ratio[1]) >= need


def _drain(others: Sequence[RoleGroup], serving_new: bool) -> list[RoleGroup]:
    """Groups of other revisions go only once the new revision is served."""
    return list(others) if serving_new else []


def _fits(free: int, freed: int, need: int) -> bool:
    return free + freed >= need


def _may_build_ahead(next_unit: bool, free: int, rest: int) -> bool:
    """While the old revision serves, a group beyond the next new unit is created only when the rest of the new
    revision fits in the free GPUs (else it could take the GPUs the unit's other role needs)."""
    return next_unit or free >= rest


def _may_lower(before: int, after: int, starting: int, next_unit: bool) -> bool:
    """Without room, served groups make room only for a group the next new unit lacks (GPUs spent ahead of the
    unit would be missed by its other role), and served units are given up only while no new group is starting
    (those may make the switch possible without the loss)."""
    return next_unit and (after >= before or starting == 0)


def rollout_step(live: Sequence[RoleGroup], desired: Desired, new_revision: str, room: Room, *,
                 served: str | None = None, served_ratio: tuple[int, int] | None = None,
                 max_surge: int = 1, moving: Sequence[RoleGroup] = ()) -> Step:
    """One reconcile's rollout decision (see the module docstring). `served` is the revision the pool selects
    now (None: no pool yet), `served_ratio` its P:D ratio (default: the desired one), `max_surge` the new groups
    per role that may be not ready at once. `moving`: groups being replaced make-before-break (their nodes no
    longer hold them, `decide_disagg`): not counted, never deleted here, but their indexes are taken."""
    rp, rd = desired.ratio
    old_ratio = served_ratio or desired.ratio
    if rp < 1 or rd < 1:
        raise ValueError(f"P:D ratio {rp}:{rd}: both sides must be >= 1")
    if desired.prefill < rp or desired.decode < rd:
        raise ValueError(f"{desired.prefill} prefill and {desired.decode} decode group(s) are less than one whole "
                         f"unit of P:D {rp}:{rd}")
    if max_surge < 1:
        raise ValueError("max_surge must be >= 1")
    bad = [g for g in live if g.role not in ROLES]
    if bad:
        raise ValueError(f"unknown role(s): {sorted({g.role for g in bad})}")
    R, S = new_revision, served
    events: list[tuple[str, str, str]] = []
    deleted: list[RoleGroup] = []
    free = room.free_gpus
    freed = 0

    def drop(gs: Sequence[RoleGroup]) -> None:
        nonlocal freed
        for g in gs:
            if g not in deleted:
                deleted.append(g)
                freed += g.gpus

    def alive() -> list[RoleGroup]:
        return [g for g in live if g not in deleted]

    # 1. abandoned revisions
    abandoned = [g for g in live if g.revision not in (R, S)]
    if abandoned:
        drop(abandoned)
        revs = ", ".join(sorted({g.revision for g in abandoned}))
        events.append(("Normal", "RevisionAbandoned", f"deleting {len(abandoned)} group(s) of revision(s) {revs}, "
                                                       f"neither served nor desired"))
    # 2. new-revision groups beyond the desired count
    for role in ROLES:
        mine = sorted((g for g in alive() if g.revision == R and g.role == role),
                      key=lambda g: (g.ready, -g.index))
        extra = len(mine) - desired.count(role)
        if extra > 0:
            drop(mine[:extra])
            events.append(("Normal", "ScaledDown", f"deleting {extra} {role} group(s) of revision {R} "
                                                   f"beyond the desired {desired.count(role)}"))
    # 3. switch
    if S != R:
        need = _need(units(alive(), S, old_ratio), desired.units)
        ready = {r: sum(1 for g in alive() if g.revision == R and g.role == r and g.ready) for r in ROLES}
        if _serve_now(ready, desired.ratio, need):
            events.append(("Normal", "RevisionServed",
                           f"pool selects revision {R} ({ready['prefill']} prefill + {ready['decode']} decode "
                           f"group(s) ready, {need} unit(s) needed)" + (f"; was {S}" if S else "")))
            S = R
    # 4. drain
    others = [g for g in alive() if g.revision != R]
    drained = _drain(others, S == R)
    if drained:
        drop(drained)
        events.append(("Normal", "RevisionDrained", f"deleting {len(drained)} group(s) of the previous revision "
                                                    f"now that {R} is served"))
    # 5./6. create, surge per role
    creates: list[tuple[str, int]] = []
    blocked: set[str] = set()
    while True:
        cur = alive()
        count = {r: sum(1 for g in cur if g.revision == R and g.role == r) + sum(1 for c in creates if c[0] == r)
                 for r in ROLES}
        flying = {r: sum(1 for g in cur if g.revision == R and g.role == r and not g.ready)
                  + sum(1 for c in creates if c[0] == r) for r in ROLES}
        todo = [r for r in ROLES if r not in blocked and count[r] < desired.count(r) and flying[r] < max_surge]
        if not todo:
            break
        share = {"prefill": rp, "decode": rd}
        role = min(todo, key=lambda r: (count[r] / share[r], 0 if r == "decode" else 1))
        need_gpus = desired.gpus.get(role, 0)
        next_unit = count[role] < (min(count["prefill"] // rp, count["decode"] // rd) + 1) * share[role]
        rest = sum((desired.count(r) - count[r]) * desired.gpus.get(r, 0) for r in ROLES)
        if S != R and not _may_build_ahead(next_unit, free + freed, rest):
            # short of room, GPUs go to the next new unit first (a group ahead of it could starve its other role)
            blocked.add(role)
            events.append(("Normal", "NoRoomWaiting",
                           f"the rest of revision {R} needs {rest} GPU(s), {free + freed} free: the next new unit "
                           f"gets its other role before another {role} group"))
            continue
        if not _fits(free, freed, need_gpus):
            reach = room.free_gpus + sum(g.gpus for g in live)      # free + every GPU this deployment holds
            whole = sum(desired.count(r) * desired.gpus.get(r, 0) for r in ROLES)
            if S != R and not _fits(reach, 0, whole):
                blocked.add(role)
                events.append(("Warning", "NoRoom",
                               f"revision {R} needs {whole} GPU(s) for {desired.prefill} prefill + "
                               f"{desired.decode} decode group(s); this deployment can hold at most {reach} "
                               f"(free and its own): nothing of revision {S} is deleted"))
                continue
            make = _room_from_old(cur, S, R, old_ratio) if S != R else []
            take: list[RoleGroup] = []
            extra = 0
            for g in make:
                if _fits(free, freed + extra, need_gpus):
                    break
                take.append(g)
                extra += g.gpus
            if not take or not _fits(free, freed + extra, need_gpus):
                blocked.add(role)
                why = (f"a new {role} group of revision {R} needs {need_gpus} GPU(s), {free + freed} free"
                       + (f" and {free + freed + extra} with every old group gone" if make else
                          ("; the old revision is already drained" if S == R else "")))
                events.append(("Warning", "NoRoom", why))
                continue
            before = units(cur, S, old_ratio)
            after = units([g for g in cur if g not in take], S, old_ratio)
            starting = sum(flying.values())
            if not _may_lower(before, after, starting, next_unit):
                blocked.add(role)
                events.append(("Normal", "NoRoomWaiting",
                               f"no room for a new {role} group without lowering the served capacity ({before} -> "
                               f"{after} unit(s)) while {starting} new group(s) are starting"
                               if next_unit else
                               f"no room for a new {role} group: the next new unit needs its other role first; "
                               f"old groups make room only for that"))
                continue
            drop(take)
            events.append(("Warning", "NoRoomToSurge",
                           f"no room for a surge {role} group ({need_gpus} GPU(s), {free + freed - extra} free): "
                           f"deleting {', '.join(f'{g.role} r{g.index}' for g in take)} of revision {S} first; "
                           f"served capacity {before} -> {after} unit(s)"))
        used = {g.index for g in (*live, *moving) if g.role == role} | {i for r, i in creates if r == role}
        index = next(i for i in range(len(used) + 1) if i not in used)
        creates.append((role, index))
        free -= need_gpus
    served_units = units(alive(), S, desired.ratio if S == R else old_ratio)
    return Step(create=tuple(creates), delete=tuple(deleted), serve=S, served_units=served_units,
                events=tuple(events))


def _room_from_old(cur: Sequence[RoleGroup], served: str | None, new: str,
                   ratio: tuple[int, int]) -> list[RoleGroup]:
    """Old groups in the order they may make room: not ready first, then the one whose loss leaves the most
    served units, then the highest index."""
    old = [g for g in cur if g.revision != new]
    order: list[RoleGroup] = []
    pool = list(old)
    while pool:
        def cost(g: RoleGroup) -> tuple:
            rest = [x for x in cur if x is not g and x not in order]
            return (g.ready, -units(rest, served, ratio), -g.index)
        nxt = min(pool, key=cost)
        order.append(nxt)
        pool.remove(nxt)
    return order


__all__ = ["Desired", "ROLES", "RoleGroup", "Room", "Step", "rollout_step", "units"]
