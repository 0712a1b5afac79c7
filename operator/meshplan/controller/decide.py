"""One reconcile's decisions, as a pure function of what was read (no client, no clock).

`decide(inputs) -> Outcome` takes the LLMDeployment, the GPU topology WITHOUT
this deployment's own pods, its live children and the plan, and returns the
objects to apply, the objects to delete, the status and the events. The
reconciler (`reconcile.py`) only reads, calls this, and writes.

Replica groups
A DP replica is one group of pods `<name>-r<i>-<rank>` (see meshplan.render).
Live groups are read from the pods' labels (`meshplan.dev/replica`, `rank`,
`plan-hash`). A group is
- current  when its pods carry the plan hash of what the spec renders now;
- stale    otherwise (spec, plan or options changed);
- complete when every rank exists and none is terminating;
- released when no pod still has the gang scheduling gate;
- ready    when complete, released and every pod is Ready.

Rules, in order
1. No plan (invalid spec, nothing feasible): change nothing, report. A wrong
   new spec never deletes a running workload.
2. Broken groups are restarted whole: a released group that lost a member (a
   pod deleted, failed or terminating) is deleted and created again, because a
   TP/PP group with a missing rank cannot serve (never left half-running). An
   engine container that restarted in place (`restartCount` > 0) counts as a
   lost member too, as LWS's RecreateGroupOnPodRestart does: its peers' NCCL
   communicators died with it. Pods are rendered `restartPolicy: Never`, so a
   crash makes the pod Failed; the restart count covers pods rendered with
   `Always` (before POD_TEMPLATE_VERSION 3) until the roll replaces them.
3. Placement: current groups keep their nodes (`placement.place(existing=)`);
   stale groups still hold their GPUs, so they are charged to the topology
   used for placement. A current group that cannot keep its nodes (a node went
   NotReady, was cordoned or tainted, its NVLink domain was relabelled, its
   allocatable GPUs dropped) is replaced make-before-break when it is ready
   (`misplaced_groups`): it keeps serving and holding its GPUs like a stale group
   of a rolling update (rule 5, surge) while its replacement is created, and is
   deleted only once the replacement is ready (event ReplicaMoved). Without room
   for the replacement nothing is deleted and Placed=False/NoRoomToReplace says
   why. A group that is not ready serves nobody: it is deleted and placed again
   whole at once.
4. All-or-nothing creation: a new group's pods are created with the scheduling
   gate (`Outcome.apply`), and the gate is removed from all of them in the same
   reconcile once every member exists (`Outcome.release`: the reconciler applies
   it only after every create before it succeeded; a reconcile interrupted in
   between leaves gated pods, which the next one completes and releases). A
   group whose placement fails gets no pods at all. Gated and released pods alike
   carry their assigned node, so their GPUs are reserved from creation on.
5. Rolling update, one group at a time with surge: while stale groups exist,
   at most one current group is in flight; a new group is created next to the
   old ones when capacity allows (surge); once every current group is ready,
   stale groups beyond the desired count are deleted (not-ready ones first).
   Without room for a surge group one stale group is removed first, but only
   when the new group then fits (otherwise nothing is touched and the status
   says why).
6. Scale: more current groups than desired -> the highest indices (not-ready
   first) go; fewer -> new groups at the lowest free indices.
7. Services: the client Service and one headless Service per group that
   exists; Services and ComputeDomains of groups that are gone are deleted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from meshplan.controller import status as st
from meshplan.placement import PlacementResult, place, request_for_layout
from meshplan.planner.types import Plan
from meshplan.render import NetworkOptions, Owner, PodOptions, Rendered, render_deployment
from meshplan.render.engine_args import ServingOptions
from meshplan.render.pipeline import product_for_gpu
from meshplan.render.workloads import (
    GANG_GATE,
    LABEL_DEPLOYMENT,
    LABEL_PLAN_HASH,
    LABEL_RANK,
    LABEL_REPLICA,
    LABEL_ROLE,
)
from meshplan.topology import ASSIGNED_NODE_ANNOTATION, Topology, pod_gpus

# Status keys the reconciler owns (the autoscaler owns `autoscaling`, and will own desiredReplicas'
# source through it; see controller.handlers.desired_replicas).
OWNED_STATUS_KEYS = ("observedGeneration", "conditions", "plan", "alternatives", "placement", "replicas",
                     "readyReplicas", "desiredReplicas", "selector", "servingSince")

# Seconds until the next reconcile when nothing else will trigger one.
REQUEUE_WAITING_S = 10.0      # waiting for capacity or a plan: retry soon, cheaply
REQUEUE_PROGRESSING_S = 30.0  # pods starting or a rollout: their events trigger reconciles; this is a backstop
REQUEUE_STEADY_S = 120.0
# A released group whose pod the scheduler cannot bind this long (the GPUs were taken by
# something placement did not know of) is placed again whole.
UNSCHEDULABLE_GRACE_S = 60.0      # periodic drift check (child events catch most drift at once)


# ----------------------------------------------------------------------------- live children


@dataclass(frozen=True)
class LivePod:
    name: str
    uid: str
    replica: int
    rank: int
    plan_hash: str
    node: str | None          # the node placement assigned (annotation), else the bound node
    gated: bool
    ready: bool
    finished: bool            # phase Succeeded/Failed, or terminating
    terminating: bool
    gpus: int
    group_size: int           # pods in its group when it was rendered (MESHPLAN_NNODES)
    obj: Mapping[str, Any]
    unschedulable_since: str | None = None    # PodScheduled=False/Unschedulable since (RFC 3339)
    restarted: bool = False                   # a container restarted in place (restartCount > 0)


@dataclass(frozen=True)
class LiveGroup:
    index: int
    pods: Mapping[int, LivePod]             # rank -> pod

    @property
    def hashes(self) -> set[str]:
        return {p.plan_hash for p in self.pods.values()}

    @property
    def released(self) -> bool:
        return bool(self.pods) and not any(p.gated for p in self.pods.values())

    @property
    def any_released(self) -> bool:
        return any(not p.gated for p in self.pods.values())

    @property
    def size(self) -> int:
        return max(p.group_size for p in self.pods.values())

    @property
    def terminating(self) -> bool:
        return any(p.terminating for p in self.pods.values())

    def complete(self, pods_per_replica: int | None = None) -> bool:
        n = self.size if pods_per_replica is None else pods_per_replica
        return sorted(self.pods) == list(range(n)) and not any(p.finished for p in self.pods.values())

    def ready(self, pods_per_replica: int | None = None) -> bool:
        return self.complete(pods_per_replica) and self.released and all(p.ready for p in self.pods.values())

    def nodes(self) -> list[str | None]:
        return [self.pods[r].node for r in sorted(self.pods)]


def _int(v: Any, default: int = -1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def live_pod(obj: Mapping[str, Any]) -> LivePod | None:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    replica, rank = _int(labels.get(LABEL_REPLICA)), _int(labels.get(LABEL_RANK))
    if replica < 0 or rank < 0:
        return None
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    restarted = container_restarted(status)
    finished = (status.get("phase") in ("Succeeded", "Failed") or bool(meta.get("deletionTimestamp"))
                or restarted)
    node = (meta.get("annotations") or {}).get(ASSIGNED_NODE_ANNOTATION) or spec.get("nodeName")
    size = 1
    for c in spec.get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == "MESHPLAN_NNODES":
                size = max(size, _int(e.get("value"), 1))
    unsched = next((c.get("lastTransitionTime") or "" for c in status.get("conditions") or []
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"
                    and c.get("reason") == "Unschedulable"), None)
    return LivePod(
        name=meta.get("name", ""), uid=meta.get("uid", ""), replica=replica, rank=rank,
        plan_hash=labels.get(LABEL_PLAN_HASH, ""), node=node,
        gated=any(g.get("name") == GANG_GATE for g in spec.get("schedulingGates") or []),
        ready=ready and not finished, finished=finished, terminating=bool(meta.get("deletionTimestamp")),
        gpus=pod_gpus(obj), group_size=size, obj=obj, unschedulable_since=unsched, restarted=restarted,
    )


def container_restarted(status: Mapping[str, Any]) -> bool:
    """A container of the pod restarted in place (`containerStatuses[].restartCount` > 0, kubelet's count).

    Init containers are not counted (a rendered pod has none). A restarted engine rejoins no group: vLLM,
    SGLang and TensorRT-LLM build their NCCL/torch.distributed groups once at start-up, so the peers hang or
    fail, and the group must be recreated whole (LWS RecreateGroupOnPodRestart, docs/reliability.md)."""
    return any(_int(cs.get("restartCount"), 0) > 0 for cs in status.get("containerStatuses") or [])


def live_groups(pods: Sequence[Mapping[str, Any]]) -> dict[int, LiveGroup]:
    by_index: dict[int, dict[int, LivePod]] = {}
    for o in pods:
        p = live_pod(o)
        if p is not None:
            by_index.setdefault(p.replica, {})[p.rank] = p
    return {i: LiveGroup(i, ranks) for i, ranks in sorted(by_index.items())}


# ----------------------------------------------------------------------------- inputs and outcome


@dataclass(frozen=True)
class Target:
    """What the current spec renders to, minus placement: options, request and hash."""

    plan: Plan
    serving: ServingOptions
    network: NetworkOptions
    pods: PodOptions
    product: str | None
    gpus_per_node: int


@dataclass(frozen=True)
class Inputs:
    name: str
    namespace: str
    uid: str
    generation: int | None
    desired_replicas: int
    topology: Topology                       # GPU nodes, WITHOUT this deployment's pods
    pods: Sequence[Mapping[str, Any]]        # live pods with our deployment label
    services: Sequence[Mapping[str, Any]]
    compute_domains: Sequence[Mapping[str, Any]] = ()
    target: Target | None = None             # None: no plan (see planned_*)
    planned_reason: str = "PlanChosen"       # when target is None: InvalidSpec | InsufficientCapacity | NoFeasiblePlan
    planned_message: str = ""
    previous_status: Mapping[str, Any] = field(default_factory=dict)
    now: datetime = datetime(1970, 1, 1)
    # (type, status, reason, message) from the autoscaler (e.g. ScalingActive), merged into ours
    extra_conditions: tuple[tuple[str, bool | str, str, str], ...] = ()
    # Deployments ranked before this one (`placement.incumbency_rank`) whose waiting replicas hold
    # some of the free GPUs (already charged to `topology`): named when this one lacks capacity.
    held_for: tuple[str, ...] = ()
    # where desired_replicas comes from (render.pipeline.replicas_and_why), for the plan's explanation
    replicas_why: str = ""


@dataclass
class Outcome:
    apply: list[tuple[dict[str, Any], Mapping[str, Any] | None]] = field(default_factory=list)   # (desired, live)
    delete: list[tuple[str, str, str, str]] = field(default_factory=list)    # (apiVersion, kind, name, uid)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)         # (type Normal|Warning, reason, message)
    requeue_after_s: float | None = None
    # Per new group, its pods without the scheduling gate: to apply after every object of `apply`
    # was written (then all the group's pods exist), never when an earlier write failed (rule 4).
    release: list[list[dict[str, Any]]] = field(default_factory=list)
    rendered: Rendered | None = None
    placement: PlacementResult | None = None
    # Desired replicas no existing or new group covers after this round (unplaced, waiting for old
    # pods to go, misplaced without a replacement): what the reconciler claims (`placement.Claim`).
    waiting: int = 0

    def delete_group(self, group: LiveGroup) -> None:
        for p in group.pods.values():
            if not p.obj.get("metadata", {}).get("deletionTimestamp"):
                self.delete.append(("v1", "Pod", p.name, p.uid))


# ----------------------------------------------------------------------------- the decision


def target_for(spec: Any, plan: Plan, topology: Topology, compute_domains: bool = False) -> Target:
    """The options, GPU product and GPUs per node the current spec renders with (see render.pipeline)."""
    from meshplan.render.options import options_from_spec

    serving, network, pods = options_from_spec(spec)
    network = dataclasses.replace(network, compute_domains=compute_domains)
    product, per_node = (None, 0)
    if plan.choice is not None:
        product, per_node = product_for_gpu(topology.select(dict(pods.node_selector)), plan.choice.gpu)
        if product is None:
            from meshplan.catalog.gpus import get_gpu

            per_node = get_gpu(plan.choice.gpu).gpus_per_node if plan.choice.gpu else \
                plan.choice.layout.gpus_per_stage
    return Target(plan, serving, network, pods, product, per_node or 1)


def replicas_that_fit(target: Target, topology: Topology, replicas: int) -> int:
    """How many of `replicas` whole groups of `target` fit `topology` (which leaves out the
    deployment's own pods, so the GPUs its groups hold count as free) when placed afresh."""
    from meshplan.autoscale.capacity import count_fitting

    if target.plan.choice is None or replicas <= 0:
        return 0
    selector = dict(target.pods.node_selector)
    layout = dataclasses.replace(target.plan.choice.layout, dp=1)
    request = request_for_layout(layout, target.gpus_per_node or 1, replicas=0, product=target.product,
                                 node_selector=selector)
    fits, _ = count_fitting(request, topology.select(selector), current=0, upper=replicas)
    return fits


def fallback_target(spec: Any, target: Target, topology: Topology, replicas: int, plan_fn: Any,
                    compute_domains: bool = False) -> Target | None:
    """The plan for another GPU product, when the planned one cannot hold `replicas` whole groups.

    A spec may allow several products (`spec.gpus.products`, or none named: whatever the
    selected nodes have). The plan picks one of them for its objective; all replica groups
    run that product's layout. When that product has no room for the desired count but
    another allowed product has room for all of it, waiting (Placed=False) while allowed
    GPUs stand idle serves nobody: this returns the target of the plan made on that
    product's free GPUs alone (`plan_fn(spec, fleet)`, `planner.plan_for_spec`), the first
    product, most free GPUs first, that fits every replica. The caller adopts it as the
    deployment's plan, so the running groups are replaced by a rolling update (surge: new
    groups on the other product first, old ones removed once the new ones are ready) and
    scaling back down later does not move them again. None when the planned product fits,
    or when no other product fits all `replicas` (then Placed=False says what is free).
    A mix of products within one deployment is not made: one layout, one engine config,
    one per-replica capacity for the autoscaler.
    """
    from meshplan.topology import LABEL_PRODUCT

    if replicas <= 0 or target.plan.choice is None or replicas_that_fit(target, topology, replicas) >= replicas:
        return None
    selector = dict(target.pods.node_selector)
    selected = topology.select(selector)
    free: dict[str, int] = {}
    label_of: dict[str, str] = {}
    for d in selected.domains:
        same = d.gpu is not None and d.gpu == target.plan.choice.gpu
        if d.product and d.product_label and d.product != target.product and not same:
            free[d.product] = free.get(d.product, 0) + d.free_gpus
            label_of[d.product] = d.product_label
    for product in sorted((p for p, f in free.items() if f > 0), key=lambda p: (-free[p], p)):
        only = selected.select({**selector, label_of.get(product, LABEL_PRODUCT): product})
        try:
            plan = plan_fn(spec, only)
        except ValueError:
            continue
        if plan.choice is None:
            continue
        alt = target_for(spec, plan, only, compute_domains)
        if alt.product == product and replicas_that_fit(alt, topology, replicas) >= replicas:
            return alt
    return None


def _selector(name: str) -> str:
    return f"{LABEL_DEPLOYMENT}={name},{LABEL_ROLE}=leader"


def _no_plan(inp: Inputs, groups: Mapping[int, LiveGroup]) -> Outcome:
    out = Outcome(requeue_after_s=REQUEUE_WAITING_S)
    prev = list(inp.previous_status.get("conditions") or [])
    ready = sum(1 for g in groups.values() if g.released and all(p.ready for p in g.pods.values()))
    values = [("Planned", False, inp.planned_reason, inp.planned_message)]
    if groups:
        values.append(("Progressing", False, "PlanBlocked",
                       f"{len(groups)} running replica group(s) left as they are until the spec can be planned"))
    values.append(("Available", ready >= max(1, inp.desired_replicas), "ReplicasReady" if ready else "NoReplicas",
                   f"{ready} of {inp.desired_replicas} replica(s) ready"))
    values = st.merge_values(values, inp.extra_conditions)
    status = dict(inp.previous_status)
    status.update({
        "observedGeneration": inp.generation,
        "conditions": st.conditions(prev, values, inp.generation, inp.now),
        "replicas": len(groups), "readyReplicas": ready, "desiredReplicas": inp.desired_replicas,
        "selector": _selector(inp.name),
    })
    out.status = {k: v for k, v in status.items() if k in OWNED_STATUS_KEYS and v is not None}
    for c in out.status["conditions"]:
        if c["type"] == "Planned" and st.transitioned(prev, c):
            out.events.append(("Warning", inp.planned_reason, inp.planned_message))
    return out


def _age_s(rfc3339: str, now: datetime) -> float:
    try:
        t = datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return 0.0
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return (now - t).total_seconds()


def _lowest_free(used: set[int], n: int) -> list[int]:
    out, i = [], 0
    while len(out) < n:
        if i not in used:
            out.append(i)
        i += 1
    return out


def decide(inp: Inputs) -> Outcome:
    groups = live_groups(inp.pods)
    if inp.target is None or inp.target.plan.choice is None:
        return _no_plan(inp, groups)

    t = inp.target
    choice = t.plan.choice
    selector = dict(t.pods.node_selector)
    topo_all = inp.topology.select(selector)
    # dp is not part of a replica's shape: normalise it so scaling never changes the plan hash.
    candidate = dataclasses.replace(choice, layout=dataclasses.replace(choice.layout, dp=1))
    req0 = request_for_layout(candidate.layout, t.gpus_per_node or 1, replicas=0, product=t.product,
                              node_selector=selector)
    n_pods = req0.pods_per_replica
    owner = Owner(inp.name, inp.namespace, inp.uid)
    network = t.network
    probe = render_deployment(owner, candidate, PlacementResult(req0), topo_all, t.serving, network, t.pods)
    new_hash = probe.plan_hash

    out = Outcome()
    R = max(0, inp.desired_replicas)
    current = {i: g for i, g in groups.items() if g.hashes == {new_hash}}
    stale = {i: g for i, g in groups.items() if i not in current}

    # Rule 2: restart broken groups whole.
    restarted: list[int] = []
    for i, g in list(current.items()):
        if g.any_released and not g.complete(n_pods):
            out.delete_group(g)
            restarted.append(i)
            del current[i]
    # A released group the scheduler cannot bind: our view of free GPUs was wrong; place it again.
    unschedulable: list[int] = []
    for i, g in list(current.items()):
        since = [p.unschedulable_since for p in g.pods.values() if p.unschedulable_since is not None]
        if g.released and since and _age_s(min(since), inp.now) >= UNSCHEDULABLE_GRACE_S:
            out.delete_group(g)
            unschedulable.append(i)
            restarted.append(i)
            del current[i]
    # Stale groups that are broken serve nobody either: remove them now.
    for i, g in list(stale.items()):
        if g.any_released and not g.complete():
            out.delete_group(g)
    # Pods still terminating hold their GPUs and their names: wait for them before creating more.
    terminating = any(g.terminating for g in groups.values())

    # Rule 3, make-before-break: a ready current group that cannot keep its nodes (a relabelled
    # NVLink domain, allocatable GPUs dropped, a cordoned node) keeps serving where it is, like a
    # stale group of a rolling update, until its replacement is ready (`misplaced`).
    misplaced = misplaced_groups(current, req0, topo_all.with_usage(
        [(p.node, p.gpus) for g in stale.values() for p in g.pods.values() if p.node]), n_pods)
    for i in misplaced:
        stale[i] = current.pop(i)

    # Rule 6 (scale down): drop the highest not-ready current groups first.
    if len(current) > R:
        order = sorted(current, key=lambda i: (current[i].ready(n_pods), -i))
        for i in order[:len(current) - R]:
            out.delete_group(current.pop(i))

    # Rule 3: stale groups still hold their GPUs.
    stale_usage = [(p.node, p.gpus) for g in stale.values() for p in g.pods.values() if p.node]
    topo = topo_all.with_usage(stale_usage)

    in_flight = [i for i, g in current.items() if not g.ready(n_pods)]
    # Groups deleted this round still hold their GPUs and names: create new ones next round.
    want_new = 0 if (terminating or restarted) else R - len(current)
    if stale and want_new > 0:
        # Rolling: one group in flight at a time, never more than one group above the desired count.
        want_new = 0 if in_flight else min(want_new, max(0, R + 1 - len(current) - len(stale)))

    keep_order = sorted(current)
    existing = {pos: [n or "" for n in current[i].nodes()] for pos, i in enumerate(keep_order)}
    request = dataclasses.replace(req0, replicas=len(keep_order) + max(0, want_new))
    placement = place(request, topo, existing)

    # Rule 3: current groups that could not keep their nodes are replaced whole.
    placed_by_pos = {r.index: r for r in placement.placed}
    moved = []
    for pos, i in enumerate(keep_order):
        r = placed_by_pos.get(pos)
        if r is None or list(r.nodes) != existing[pos]:
            moved.append(i)
    for i in moved:
        out.delete_group(current.pop(i))
    in_use = set(current) | set(stale) | set(restarted) | set(moved)
    new_positions = [] if moved else [r.index for r in placement.placed if r.index >= len(keep_order)]
    new_indices = _lowest_free(in_use, len(new_positions))
    remap = {pos: keep_order[pos] for pos in range(len(keep_order)) if keep_order[pos] in current}
    remap.update(dict(zip(new_positions, new_indices)))
    placed = tuple(dataclasses.replace(r, index=remap[r.index]) for r in placement.placed if r.index in remap)
    unplaced = placement.unplaced
    if moved or restarted or terminating:
        unplaced = ()     # not a capacity problem: the replacement waits for the old pods to go

    # Rule 5 without surge room: free one stale group if the new group then fits.
    freed_for_roll = False
    # A misplaced group is never removed before its replacement is ready (the condition says why it waits).
    replaceable = [i for i in stale if i not in misplaced]
    if replaceable and R > len(current) and not new_positions and not in_flight and not terminating \
            and len(current) + len(stale) <= R:
        victim = sorted(replaceable, key=lambda i: (stale[i].ready(), -i))[0]
        usage_wo = [(p.node, p.gpus) for j, g in stale.items() if j != victim for p in g.pods.values() if p.node]
        trial = place(dataclasses.replace(request, replicas=len(keep_order) + 1), topo_all.with_usage(usage_wo),
                      existing)
        if len(trial.placed) > len(keep_order):
            out.delete_group(stale.pop(victim))
            freed_for_roll = True
            out.events.append(("Normal", "RollingUpdate",
                               f"no free GPUs for a surge group: replacing replica {victim} in place"))

    # Rule 5: retire stale groups once every current group is ready.
    current_ready = [i for i, g in current.items() if g.ready(n_pods)]
    deleting = {d[2] for d in out.delete}
    live_stale = {i: g for i, g in stale.items()
                  if not g.terminating and not any(p.name in deleting for p in g.pods.values())}
    if live_stale and len(current_ready) == len(current) and not freed_for_roll:
        excess = len(current) + len(live_stale) - R
        order = sorted(live_stale, key=lambda i: (live_stale[i].ready(), -i))
        for i in order[:max(0, excess)]:
            out.delete_group(stale.pop(i))
            if i in misplaced:
                out.events.append(("Normal", "ReplicaMoved", f"replica {i} removed from nodes that no longer fit "
                                   f"({misplaced[i]}): its replacement is ready (make-before-break)"))
            else:
                out.events.append(("Normal", "ReplicaReplaced", f"replica {i} (old plan) removed"))
    if misplaced and new_positions:
        out.events.append(("Normal", "ReplicaMoving", "replica(s) " + ", ".join(map(str, sorted(misplaced)))
                           + " cannot keep their nodes and keep serving until their replacement "
                           + ", ".join(str(remap[p]) for p in new_positions) + " is ready"))

    placement = PlacementResult(request=dataclasses.replace(request, replicas=len(placed)), placed=placed,
                                unplaced=unplaced, notes=placement.notes)
    gated = render_deployment(owner, candidate, placement, topo, t.serving, network, t.pods, gated=True)
    ungated = render_deployment(owner, candidate, placement, topo, t.serving, network, t.pods, gated=False)
    out.rendered, out.placement = ungated, placement
    live_pods = {p.name: p for g in groups.values() for p in g.pods.values()}
    live_svcs = {(s.get("metadata") or {}).get("name"): s for s in inp.services}
    live_cds = {(c.get("metadata") or {}).get("name"): c for c in inp.compute_domains}

    out.apply.append((ungated.client_service, live_svcs.get(ungated.client_service["metadata"]["name"])))
    wanted_svcs = {ungated.client_service["metadata"]["name"]}
    wanted_cds: set[str] = set()
    for g_gated, g_open in zip(gated.groups, ungated.groups):
        live = current.get(g_open.index)
        names = [p["metadata"]["name"] for p in g_open.pods]
        exists = [n for n in names if n in live_pods]
        released = live is not None and live.any_released
        complete_after = len(exists) == len(names)
        if g_open.compute_domain:
            cd = g_open.compute_domain
            wanted_cds.add(cd["metadata"]["name"])
            out.apply.append((cd, live_cds.get(cd["metadata"]["name"])))
        wanted_svcs.add(g_open.service["metadata"]["name"])
        out.apply.append((g_open.service, live_svcs.get(g_open.service["metadata"]["name"])))
        # An explicit empty list: server-side apply then removes the gate we own, and the
        # comparison with the live pod sees the difference.
        open_pods = [{**pod, "spec": {**pod["spec"], "schedulingGates": []}} for pod in g_open.pods]
        if released or complete_after:
            # Released groups keep their pods ungated; a complete gated group is released now, all at once.
            for pod in open_pods:
                out.apply.append((pod, live_pods[pod["metadata"]["name"]].obj if pod["metadata"]["name"] in live_pods
                                  else None))
            if complete_after and not released:
                out.events.append(("Normal", "ReplicaReleased",
                                   f"replica {g_open.index}: all {len(names)} pod(s) exist; scheduling gates removed"))
        else:
            # Create the missing members gated, then release the whole group once they all exist.
            for pod in g_gated.pods:
                name = pod["metadata"]["name"]
                out.apply.append((pod, live_pods[name].obj if name in live_pods else None))
            out.release.append(open_pods)
            r = placement.replica(g_open.index)
            out.events.append(("Normal", "ReplicaCreated",
                               f"replica {g_open.index}: {len(names)} pod(s) on {', '.join(r.domains)}"
                               f" ({', '.join(r.nodes)}); scheduling gates removed once all exist"
                               if not exists else
                               f"replica {g_open.index}: {len(names) - len(exists)} missing pod(s) created; "
                               "scheduling gates removed once all exist"))
    # Services and ComputeDomains of groups whose pods still exist stay (stale groups keep serving).
    pods_left = {i for i, g in groups.items()
                 if any(p.name not in {d[2] for d in out.delete} for p in g.pods.values())} | set(restarted)
    for svc_name, svc in live_svcs.items():
        if svc_name not in wanted_svcs and _int(((svc.get("metadata") or {}).get("labels") or {}).get(
                LABEL_REPLICA)) not in pods_left:
            out.delete.append(("v1", "Service", svc_name, (svc.get("metadata") or {}).get("uid", "")))
    for cd_name, cd in live_cds.items():
        if cd_name not in wanted_cds and _int(((cd.get("metadata") or {}).get("labels") or {}).get(
                LABEL_REPLICA)) not in pods_left:
            out.delete.append((cd.get("apiVersion", ""), "ComputeDomain", cd_name,
                               (cd.get("metadata") or {}).get("uid", "")))
    for i in restarted:
        crashed = sorted(p.name for p in groups[i].pods.values() if p.restarted)
        why = (f"a pod stayed unschedulable for {UNSCHEDULABLE_GRACE_S:.0f}s (its GPUs are used by something "
               "else): the whole group is placed again") if i in unschedulable else \
            (f"engine container of {', '.join(crashed)} restarted: the whole group is recreated" if crashed else
             "lost a pod after it was released: the whole group is restarted")
        out.events.append(("Warning", "ReplicaRestarted", f"replica {i} {why}"))
    for i in moved:
        out.events.append(("Warning", "ReplicaMoved",
                           f"replica {i} cannot keep its nodes ({'; '.join(placement.notes) or 'nodes changed'}): "
                           "re-placed whole"))

    out.status = _status(inp, t, candidate, current, stale, groups, placement, n_pods, R, freed_for_roll,
                         restarted, moved, out, misplaced)
    gone = {d[2] for d in out.delete}
    covering = [i for i, g in stale.items() if i not in misplaced and not g.terminating
                and not any(p.name in gone for p in g.pods.values())]
    out.waiting = max(0, R - len(current) - len(covering) - len(new_positions))
    return out


def misplaced_groups(current: Mapping[int, LiveGroup], req0: Any, topology: Topology,
                     n_pods: int, ready: bool = True) -> dict[int, str]:
    """The ready groups of `current` that cannot keep their nodes on `topology` -> why (placement's note).

    Pure. `topology` leaves out the deployment's own pods and charges its stale groups; the
    groups are checked in index order, as `place(existing=)` keeps them. Groups that are not
    ready serve nobody and are not returned (decide replaces them whole at once, rule 3); nor are
    groups with a pod on a node that is not Ready: its kubelet is gone, so the pods' Ready
    condition is stale until the node controller marks them (seconds), and they serve nobody.
    With `ready=False`: the groups that are NOT ready and cannot keep their nodes (any node), the ones a
    caller replaces whole at once (`decide_disagg`, rule 3c).
    """
    lost = {n for n, why in topology.excluded if "Ready" in why}
    order = sorted(current)
    existing = {pos: [n or "" for n in current[i].nodes()] for pos, i in enumerate(order)}
    check = place(dataclasses.replace(req0, replicas=len(order)), topology, existing)
    notes = {int(n.split()[1]): n.split(": ", 1)[-1] for n in check.notes if n.startswith("replica ")}
    out: dict[int, str] = {}
    for pos, i in enumerate(order):
        r = check.replica(pos)
        if r is not None and list(r.nodes) == existing[pos]:
            continue
        if (current[i].ready(n_pods) and not lost & set(existing[pos])) if ready else not current[i].ready(n_pods):
            out[i] = notes.get(pos, "nodes changed")
    return out


def _status(inp: Inputs, t: Target, candidate: Any, current: Mapping[int, LiveGroup],
            stale: Mapping[int, LiveGroup], groups: Mapping[int, LiveGroup], placement: PlacementResult,
            n_pods: int, R: int, freed_for_roll: bool, restarted: list[int], moved: list[int],
            out: Outcome, misplaced: Mapping[int, str] | None = None) -> dict[str, Any]:
    plan = t.plan
    prev = list(inp.previous_status.get("conditions") or [])
    ready_current = sorted(i for i, g in current.items() if g.ready(n_pods))
    deleting = {d[2] for d in out.delete}
    ready_stale = [i for i, g in stale.items() if g.ready() and not any(p.name in deleting for p in g.pods.values())]
    ready = len(ready_current) + len(ready_stale)
    req = placement.request
    short = len(placement.unplaced)
    # What is deployed (the layout at R replicas) and, separately, what the SLO search saw (plan.reason:
    # its own DP for spec.workload), so that the explanation never describes replicas that do not run.
    from meshplan.planner.objectives import describe_deployed

    deployed = describe_deployed(plan.choice, R, inp.replicas_why, t.product)
    values: list[tuple[str, bool | str, str, str]] = [
        ("Planned", True, "PlanChosen", deployed + (f". The SLO search: {plan.reason}" if plan.reason else "")),
    ]
    misplaced = dict(misplaced or {})
    why_misplaced = "; ".join(f"replica {i}: {w}" for i, w in sorted(misplaced.items()))
    if short and misplaced:
        free = placement.unplaced[0].free_gpus_by_domain
        free_txt = ", ".join(f"{d}={f}" for d, f in free[:8]) or "none"
        values.append(("Placed", False, "NoRoomToReplace",
                       f"{len(misplaced)} replica(s) cannot keep their nodes ({why_misplaced}) and keep serving "
                       f"there: no place for a replacement of {req.gpus_per_replica or '?'} GPUs "
                       f"({placement.unplaced[0].reason}); free GPUs per NVLink domain: {free_txt}. The "
                       "replacement is created as soon as capacity allows, then the old group is removed"))
        values.append(("ScalingLimited", False, "WithinCapacity",
                       f"{R} desired replica(s) running, {len(misplaced)} of them on nodes that no longer fit"))
    elif short:
        free = placement.unplaced[0].free_gpus_by_domain
        free_txt = ", ".join(f"{d}={f}" for d, f in free[:8]) or "none"
        held = (f"; GPUs held for {', '.join(inp.held_for[:5])} (serving or waiting before this deployment)"
                if inp.held_for else "")
        values.append(("Placed", False, "InsufficientCapacity",
                       f"{short} of {R} replica(s) have no place: each needs {req.gpus_per_replica or '?'} GPUs "
                       f"({placement.unplaced[0].reason}); free GPUs per NVLink domain: {free_txt}{held}"))
        values.append(("ScalingLimited", True, "InsufficientCapacity",
                       f"running {len(placement.placed)} of {R} desired replica(s): not enough free GPUs"))
    else:
        values.append(("Placed", True, "AllReplicasPlaced",
                       f"{len(placement.placed)} replica(s) placed, each inside "
                       f"{'one NVLink domain' if all(r.single_domain for r in placement.placed) else 'one zone'}"))
        values.append(("ScalingLimited", False, "WithinCapacity", f"{R} desired replica(s) fit"))
    available = R >= 1 and ready >= R
    values.append(("Available", available, "ReplicasReady" if available else "ReplicasNotReady",
                   f"{ready} of {R} replica(s) ready"))
    pending = [i for i in current if i not in ready_current]
    if stale and set(stale) <= set(misplaced):
        prog = ("Progressing", True, "ReplacingMisplaced",
                f"replacing {len(stale)} replica group(s) that cannot keep their nodes, make-before-break "
                f"({len(ready_current)} of {R} replacement replica(s) ready, {ready} of {R} ready in all)")
    elif stale:
        prog = ("Progressing", True, "RollingUpdate",
                f"replacing {len(stale)} replica group(s) of an older plan one at a time "
                f"({len(ready_current)} of {R} new replica(s) ready)")
    elif pending or len(placement.placed) > len(current) or restarted or moved:
        prog = ("Progressing", True, "CreatingReplicas",
                f"{len(ready_current)} of {R} replica(s) ready; starting {max(len(pending), 1)}")
    elif len(groups) > len(current) + len(stale) or any(k[1] == "Pod" for k in out.delete):
        prog = ("Progressing", True, "ScalingDown", f"removing replica groups down to {R}")
    elif short:
        # Nothing more can happen until GPUs free up: not progressing, and not "complete" either
        # (issue 17 finding 10: "Complete: 10000 replica(s) running" with 18 ready).
        prog = ("Progressing", False, "InsufficientCapacity",
                f"{len(placement.placed)} of {R} replica(s) of {candidate.layout.label()} placed, {ready} ready; "
                f"{short} wait for free GPUs")
    else:
        prog = ("Progressing", False, "Complete",
                f"{ready} of {R} replica(s) of {candidate.layout.label()} ready")
    values.append(prog)
    starting = bool(stale or pending or len(placement.placed) > len(current))
    n_starting = max(len(placement.placed) - len(ready_current), 0) + len(stale)
    degraded = bool(restarted or moved or misplaced) or (ready < R and not starting)
    values.append(("Degraded", degraded, "ReplicaRestarted" if restarted or moved else
                   "ReplicaMisplaced" if misplaced else
                   ("MissingReplicas" if degraded else "ReplicasStarting" if ready < R else "AsPlanned"),
                   f"{ready} of {R} replica(s) ready"
                   + (f"; restarted {restarted + moved}" if restarted or moved else "")
                   + (f"; on nodes that no longer fit: {why_misplaced}" if misplaced else "")
                   + (f"; {short} without a place (not enough free GPUs)" if short else "")
                   + (f"; {n_starting} starting or being replaced" if starting and ready < R
                      else "")))
    conds = st.conditions(prev, st.merge_values(values, inp.extra_conditions), inp.generation, inp.now)
    for c in conds:
        if c["type"] in ("Placed", "Degraded", "Available") and st.transitioned(prev, c):
            warn = (c["type"] == "Placed" and c["status"] == "False") or (c["type"] == "Degraded" and c["status"] == "True")
            out.events.append(("Warning" if warn else "Normal", c["reason"], c["message"][:1024]))
    if inp.previous_status.get("plan", {}).get("layout") != candidate.layout.label() or not prev:
        out.events.append(("Normal", "Planned", (plan.reason or candidate.layout.label())[:1024]))

    nodes_per_replica = len(set(placement.placed[0].nodes)) if placement.placed else None
    status: dict[str, Any] = {
        "observedGeneration": inp.generation,
        "conditions": conds,
        "plan": {**st.plan_summary(dataclasses.replace(candidate, layout=dataclasses.replace(
            candidate.layout, dp=max(1, R))), deployed, nodes_per_replica=nodes_per_replica,
            gpu_product=t.product), **({"searchReason": plan.reason[:4096]} if plan.reason else {})},
        "alternatives": [st.plan_summary(a) for a in plan.alternatives[:8]],
        "placement": [
            {"index": r.index, "nvlinkDomain": r.domains[0] if r.single_domain else ",".join(r.domains)[:253],
             "nodes": list(r.nodes), "gpus": req.gpus_per_pod * len(r.pods),
             "ready": r.index in ready_current}
            for r in placement.placed
        ],
        "replicas": len(current),
        "readyReplicas": ready,
        "desiredReplicas": R,
        "selector": _selector(inp.name),
    }
    serving_since = inp.previous_status.get("servingSince") or (st.rfc3339(inp.now) if ready else None)
    if serving_since:
        status["servingSince"] = serving_since       # incumbency: kept once set (placement.incumbency_rank)
    out.requeue_after_s = (REQUEUE_WAITING_S if short else
                           REQUEUE_PROGRESSING_S if (stale or pending) else REQUEUE_STEADY_S)
    return status


__all__ = ["fallback_target", "replicas_that_fit", "target_for", "Inputs", "LiveGroup", "LivePod", "OWNED_STATUS_KEYS", "Outcome", "Target", "decide", "live_groups",
           "live_pod"]
