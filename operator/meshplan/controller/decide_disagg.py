"""A disaggregated deployment's decisions, pure (issue 19), beside `controller.decide`'s aggregated path.

`decide.py` is untouched: an LLMDeployment without `spec.serving`, or with `disaggregation: disabled`, or whose
`auto` plan keeps aggregated serving, goes through it exactly as before. This module holds what the operator adds
for a disaggregated plan (`planner.disagg.DisaggPlan` with `disaggregated` True).

`disaggregation_status(dplan)`: the `status.disaggregation` document (`api.models.DisaggregationStatus`): the
mode, whether it is disaggregated, the roles compactly (the `Roles` printer column), the P:D ratio, per role the
layout, group count and predicted latency (TTFT for prefill, ITL for decode), the KV path's tier, the aggregated
plan it was compared with, and the planner's reason.

`decide_disagg(inputs) -> decide.Outcome`: one reconcile of a disaggregated deployment, pure like `decide.decide`.

Groups: per role, `<name>-prefill-r<i>-<rank>` and `<name>-decode-r<i>-<rank>` (rendered by `render_deployment`
with the role's name `<name>-<role>` and then given back the deployment's own label and owner, so
`child_name`'s 63-character rule and hash cut apply as to any group). Every pod carries
`meshplan.dev/serving-role` and `meshplan.dev/serving-revision` (`render.inference_pool.serving_revision` of
both roles' plan hashes). Rules, as `decide.py`'s where they are the same:
1. No plan: `decide._no_plan` (nothing is deleted).
2. Broken groups (a released group that lost a member or whose engine restarted) are deleted whole and created
   again on a later reconcile.
3. Rollout: `disagg_rollout.rollout_step` over the live groups (role, index, revision, ready, GPUs) decides the
   groups to create, to delete and the revision the pool serves; a revision is served only once at least one
   whole unit (rp prefill + rd decode groups) of it is ready, and the previous one is drained only then.
   The groups per role are `role_targets`' (the reconciler passes them): decode = spec.replicas (the scale
   subresource; HPA/KEDA) or the autoscaler's decode decision, prefill = the autoscaler's prefill decision or
   the plan's ratio applied to decode. When a role has fewer groups than one plan unit needs (1 prefill beside 1
   decode of a 2:1 plan, inside the autoscaler's ratio bounds) the unit shrinks to what the roles have; groups
   beyond the whole units (3 prefill + 2 decode of 1:1) serve beside them (`placement.place_disagg` places them
   as one last partial unit).
3b. Moves, make-before-break: a ready group of the current revision whose nodes no longer hold it (cordoned,
   tainted, its NVLink domain relabelled, allocatable GPUs dropped; `decide.misplaced_groups` judges it as for an
   aggregated group) keeps serving, holding its GPUs and its index, while the rollout creates a replacement of its
   role; it is deleted once its role has its desired count of ready groups without it (event ReplicaMoved).
   Progressing=True/MovingReplicas names it meanwhile.
3c. A not-ready group of the current revision whose nodes no longer hold it serves nobody: it is deleted whole
   (ReplicaReplaced) and placed again on a later reconcile, as `decide.py` does for an aggregated one; the other
   groups keep their nodes.
4. Placement: the new revision's groups are placed as units with `placement.place_disagg` (the KV path's scope:
   one NVLink domain, one network block or anywhere), existing groups keeping their nodes, on the topology
   charged with the groups of other revisions. A group to create that has no place waits (Placed=False).
5. All-or-nothing per group: created gated, released in the same reconcile once every member exists.
6. Router (`controller.routing.decide_router`, spec.serving.router.kind): an InferencePool selecting exactly the
   served revision's leaders, its endpoint picker (Deployment, Service) and the picker's RBAC; or the engine's own
   PD router listing the served revision's ready prefill and decode leaders; all owned by the deployment. Without
   the InferencePool CRD in the cluster: condition Routed=False/InferencePoolCRDMissing naming the CRD; the
   groups are deployed all the same.
7. Available: at least one whole unit of the served revision is ready.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from meshplan.controller import status as st
from meshplan.controller.decide import (OWNED_STATUS_KEYS, REQUEUE_PROGRESSING_S, REQUEUE_STEADY_S,
                                        REQUEUE_WAITING_S, Inputs, LiveGroup, Outcome, _no_plan, live_pod)
from meshplan.controller.disagg_rollout import Desired, RoleGroup, Room, rollout_step, units
from meshplan.controller.routing import POOL_CRD, RouterInputs, decide_router, router_endpoints
from meshplan.render.inference_pool import LABEL_SERVING_REVISION, LABEL_SERVING_ROLE, ROLES, serving_revision
from meshplan.render.workloads import LABEL_DEPLOYMENT, LABEL_REPLICA, owner_reference

REASON_MAX = 4096
DISAGG_STATUS_KEYS = (*OWNED_STATUS_KEYS, "disaggregation")


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(max(0.0, float(x)), nd)


def disaggregation_status(dplan: Any) -> dict[str, Any]:
    """`status.disaggregation` for a `planner.types.DisaggPlan` (camelCase, no None values)."""
    out: dict[str, Any] = {"mode": dplan.mode, "disaggregated": bool(dplan.disaggregated), "label": dplan.label()[:256]}
    c = dplan.choice
    if c is not None:
        out["ratio"] = c.ratio
        out["prefill"] = {"layout": c.prefill.layout.label(), "replicas": c.prefill_workers,
                          "ttftMs": _round(c.prefill.prediction.ttft_ms)}
        out["decode"] = {"layout": c.decode.layout.label(), "replicas": c.decode_workers,
                         "itlMs": _round(c.decode.prediction.tpot_ms, 3)}
        out["kvPath"] = {"tier": str(c.kv_path.tier)[:64]}
    a = dplan.aggregated.choice if dplan.aggregated is not None else None
    if a is not None:
        out["aggregated"] = {
            "label": (a.layout.label() + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else ""))[:256],
            "tokensPerSecondPerGpu": _round(a.prediction.tokens_per_s_per_gpu),
            "tokensPerSecondPerUser": _round(a.prediction.tokens_per_s_per_user)}
    if dplan.reason:
        out["reason"] = dplan.reason[:REASON_MAX]
    return out


@dataclass(frozen=True)
class DisaggTarget:
    """What the current spec renders for a disaggregated plan: the plan, options, GPU product, router."""

    dplan: Any                      # planner.types.DisaggPlan, disaggregated, with a choice
    serving: Any                    # render.engine_args.ServingOptions (aggregated; the role is added per role)
    network: Any
    pods: Any
    product: str | None
    gpus_per_node: int
    router_image: str
    pool_crd: bool = True           # the InferencePool CRD exists in the cluster
    router_kind: str = "inferencePool"   # spec.serving.router.kind (api.models.RouterSpec)


@dataclass(frozen=True)
class DisaggInputs:
    base: Inputs                    # name, namespace, uid, pods, services, topology, previous status, ...
    target: DisaggTarget
    routers: Sequence[Mapping[str, Any]] = ()    # live pool, EPP Deployment/Service, RBAC (owned)
    # prefill groups to run (`role_targets`); None: the plan's ratio applied to base.desired_replicas (decode)
    prefill_replicas: int | None = None


@dataclass(frozen=True)
class RoleTargets:
    """The groups per role a disaggregated deployment drives toward, and where they come from (one sentence).
    Unpacks as (prefill, decode)."""

    prefill: int
    decode: int
    why: str = ""

    def __iter__(self):
        return iter((self.prefill, self.decode))


def role_targets(spec: Any, status: Mapping[str, Any] | None, plan: Any) -> RoleTargets:
    """(prefill, decode) groups for a disaggregated plan (`planner.types.DisaggPlan` or its `DisaggCandidate`).

    - decode = what `render.pipeline.replicas_and_why` says (spec.replicas, the scale subresource's field, or with
      spec.autoscaling.enabled the autoscaler's status.autoscaling.toReplicas clamped to [minReplicas,
      maxReplicas]): spec.replicas counts decode groups.
    - prefill = with spec.autoscaling.enabled, the autoscaler's prefill decision
      (status.autoscaling.roles.prefill.toReplicas) clamped into the plan's P:D bounds around that decode count
      (`autoscale.roles.RatioBounds.around`, [r/2, 2r]: a decode count changed by hand since the decision still
      gets a prefill side it can use); otherwise, or before the first decision, `prefill_for_decode(decode)`,
      ceil(decode x rp / rd).
    - no decode group: no prefill group either (scaled to zero)."""
    from meshplan.autoscale.roles import RatioBounds, prefill_for_decode
    from meshplan.render.pipeline import replicas_and_why

    c = getattr(plan, "choice", plan)
    ratio = (max(1, c.prefill_workers), max(1, c.decode_workers))
    d, why = replicas_and_why(spec, status)
    d = max(0, int(d))
    if d == 0:
        return RoleTargets(0, 0, f"{why}: no decode group, so no prefill group")
    follow = prefill_for_decode(d, ratio)
    auto = ((status or {}).get("autoscaling") or {}) if spec.autoscaling.enabled else {}
    decided = ((auto.get("roles") or {}).get("prefill") or {}).get("toReplicas")
    if isinstance(decided, bool) or not isinstance(decided, int) or decided < 0:
        return RoleTargets(follow, d, f"decode groups: {why}; prefill groups follow at the plan's P:D "
                                      f"{ratio[0]}:{ratio[1]} (ceil({d} x {ratio[0]} / {ratio[1]}) = {follow})")
    lo, hi = RatioBounds.around(*ratio).prefill_range(d)
    p = max(lo, min(hi, decided))
    clamp = "" if p == decided else f", clamped into the P:D bounds [{lo}, {hi}] beside {d} decode group(s)"
    return RoleTargets(p, d, f"decode groups: {why}; prefill groups: the autoscaler's last decision, {decided}{clamp}")


def role_of(obj: Mapping[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_SERVING_ROLE, "")


def revision_of(obj: Mapping[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_SERVING_REVISION, "")


def role_groups(pods: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, LiveGroup]]:
    """Live groups per role (pods without a role label are left out: an aggregated deployment's)."""
    out: dict[str, dict[int, dict[int, Any]]] = {r: {} for r in ROLES}
    for o in pods:
        r = role_of(o)
        p = live_pod(o)
        if r in out and p is not None:
            out[r].setdefault(p.replica, {})[p.rank] = p
    return {r: {i: LiveGroup(i, ranks) for i, ranks in sorted(g.items())} for r, g in out.items()}


def _group_revision(g: LiveGroup) -> str:
    revs = {revision_of(p.obj) for p in g.pods.values()}
    return revs.pop() if len(revs) == 1 else ""


def unit_ratio(prefill_workers: int, decode_workers: int) -> tuple[tuple[int, int], int]:
    """((rp, rd), units): the plan's workers as whole units of the smallest ratio."""
    g = math.gcd(max(prefill_workers, 1), max(decode_workers, 1))
    return (max(prefill_workers, 1) // g, max(decode_workers, 1) // g), g


def _relabel(obj: dict[str, Any], name: str, uid: str, role: str, revision: str) -> dict[str, Any]:
    """A role's rendered object as a child of deployment `name`: its labels, owner and selectors."""
    obj = {**obj, "metadata": {**obj["metadata"]}}
    meta = obj["metadata"]
    labels = {**(meta.get("labels") or {}), LABEL_DEPLOYMENT: name, "app.kubernetes.io/instance": name,
              LABEL_SERVING_ROLE: role, LABEL_SERVING_REVISION: revision}
    meta["labels"] = labels
    meta["ownerReferences"] = [owner_reference(name, uid)]
    if obj.get("kind") == "Service":
        sel = dict((obj.get("spec") or {}).get("selector") or {})
        sel.update({LABEL_DEPLOYMENT: name, LABEL_SERVING_ROLE: role})
        obj["spec"] = {**obj["spec"], "selector": sel}
    return obj


def render_role(name: str, namespace: str, uid: str, role: str, candidate: Any, placement: Any, topology: Any,
                serving: Any, network: Any, pods: Any, revision: str, *, gated: bool) -> Any:
    """The role's groups, rendered (`render_deployment` under the name `<name>-<role>`) and relabelled."""
    from meshplan.engines.base import Disaggregation
    from meshplan.render import Owner, render_deployment

    s = dataclasses.replace(serving, disagg=Disaggregation(role))
    r = render_deployment(Owner(f"{name}-{role}", namespace, uid), candidate, placement, topology, s, network, pods,
                          gated=gated)
    groups = tuple(dataclasses.replace(
        g, service=_relabel(g.service, name, uid, role, revision),
        pods=tuple(_relabel(p, name, uid, role, revision) for p in g.pods),
        compute_domain=_relabel(g.compute_domain, name, uid, role, revision) if g.compute_domain else None)
        for g in r.groups)
    return dataclasses.replace(r, groups=groups)


def role_hash(name: str, namespace: str, uid: str, role: str, candidate: Any, gpus_per_node: int, product: str | None,
              topology: Any, serving: Any, network: Any, pods: Any) -> str:
    """The plan hash of one role's pods (what its groups carry; nodes are not part of it)."""
    from meshplan.placement import PlacementResult, request_for_layout

    req = request_for_layout(candidate.layout, gpus_per_node or 1, replicas=0, product=product,
                             node_selector=dict(pods.node_selector))
    return render_role(name, namespace, uid, role, candidate, PlacementResult(req), topology, serving, network,
                       pods, "x", gated=True).plan_hash


def decide_disagg(inp: DisaggInputs) -> Outcome:
    """One reconcile of a disaggregated deployment (see the module doc)."""
    from meshplan.placement import PlacementResult, place_disagg, request_for_layout

    b, t = inp.base, inp.target
    c = t.dplan.choice
    if c is None:
        return _no_plan(b, {})
    name, ns, uid = b.name, b.namespace, b.uid
    selector = dict(t.pods.node_selector)
    topo_all = b.topology.select(selector)
    cands = {"prefill": dataclasses.replace(c.prefill, layout=dataclasses.replace(c.prefill.layout, dp=1)),
             "decode": dataclasses.replace(c.decode, layout=dataclasses.replace(c.decode.layout, dp=1))}
    hashes = {r: role_hash(name, ns, uid, r, cands[r], t.gpus_per_node, t.product, topo_all, t.serving, t.network,
                           t.pods) for r in ROLES}
    revision = serving_revision(hashes)
    reqs0 = {r: request_for_layout(cands[r].layout, t.gpus_per_node or 1, replicas=0, product=t.product,
                                   node_selector=selector) for r in ROLES}
    n_pods = {r: reqs0[r].pods_per_replica for r in ROLES}
    gpus = {r: cands[r].layout.gpus_per_replica for r in ROLES}
    plan_ratio, _ = unit_ratio(c.prefill_workers, c.decode_workers)
    # per role: decode = base.desired_replicas (spec.replicas counts decode groups), prefill = role_targets'
    from meshplan.autoscale.roles import prefill_for_decode

    R = want_d = max(0, b.desired_replicas)
    want_p = prefill_for_decode(R, plan_ratio) if inp.prefill_replicas is None else max(0, inp.prefill_replicas)
    # no prefill group without a decode group (scaled to zero), and at least one beside any decode group
    want_p = 0 if R == 0 else max(1, want_p)
    # the unit the rollout and the placement count in: the plan's ratio, or less while a role has fewer groups
    # than one plan unit (e.g. 1 prefill beside 1 decode of a 2:1 plan, inside the autoscaler's ratio bounds)
    ratio = (max(1, min(plan_ratio[0], want_p)), max(1, min(plan_ratio[1], want_d)))
    want_units = min(want_p // ratio[0], want_d // ratio[1])
    out = Outcome()
    groups = role_groups(b.pods)
    prev_d = dict(b.previous_status.get("disaggregation") or {})
    served = prev_d.get("servedRevision") or None

    # Rule 2: broken groups are deleted whole (any revision); they are created again later.
    restarted: list[str] = []
    live: dict[str, dict[int, LiveGroup]] = {r: {} for r in ROLES}
    for r in ROLES:
        for i, g in groups[r].items():
            rev = _group_revision(g)
            size = n_pods[r] if rev == revision else None
            if (g.any_released and not g.complete(size)) or not rev:
                out.delete_group(g)
                restarted.append(f"{r} r{i}")
            elif not g.terminating:
                live[r][i] = g
    # Rule 3c: a not-ready group of this revision whose nodes no longer hold it serves nobody: deleted whole now,
    # placed again on a later reconcile (the other groups keep their nodes).
    stranded = misplaced_role_groups(live, revision, reqs0, topo_all, n_pods, ready=False)
    for r in ROLES:
        for i, why in sorted(stranded[r].items()):
            if live[r][i].terminating:
                continue
            out.delete_group(live[r].pop(i))
            restarted.append(f"{r} r{i}")
            out.events.append(("Normal", "ReplicaReplaced", f"{r} replica {i} is not ready and its nodes no longer "
                               f"hold it ({why}): deleted whole, placed again"))
    terminating = any(g.terminating for r in ROLES for g in groups[r].values())
    # Rule 3b, make-before-break moves: a ready group of this revision whose nodes no longer hold it (cordoned,
    # tainted, relabelled, allocatable GPUs dropped) keeps serving and holding its GPUs while a replacement of its
    # role is created; it is deleted once enough groups of its role are ready without it.
    moving = misplaced_role_groups(live, revision, reqs0, topo_all, n_pods)
    moving_groups = {r: {i: live[r].pop(i) for i in moving[r]} for r in ROLES}
    role_live = [RoleGroup(r, i, _group_revision(g), g.ready(n_pods[r] if _group_revision(g) == revision else None),
                           sum(p.gpus for p in g.pods.values()))
                 for r in ROLES for i, g in sorted(live[r].items())]
    role_moving = [RoleGroup(r, i, revision, True, sum(p.gpus for p in g.pods.values()))
                   for r in ROLES for i, g in sorted(moving_groups[r].items())]
    held = sum(g.gpus for g in (*role_live, *role_moving))
    free = max(0, topo_all.free_gpus - held)
    if want_units >= 1:
        step = rollout_step(role_live, Desired(want_p, want_d, ratio, gpus), revision, Room(free), served=served,
                            moving=role_moving)
    else:      # scaled to zero: everything goes
        from meshplan.controller.disagg_rollout import Step

        step = Step(create=(), delete=tuple(role_live), serve=None, served_units=0)
    for g in step.delete:
        out.delete_group(live[g.role].pop(g.index))
    # a moving group goes once its role has its desired count of ready groups without it (its replacement is up)
    want_role = {"prefill": want_p, "decode": want_d}
    for r in ROLES:
        ready_r = sum(1 for g in live[r].values() if _group_revision(g) == revision and g.ready(n_pods[r]))
        surplus = ready_r + len(moving_groups[r]) - want_role[r]
        for i in sorted(moving_groups[r])[:max(0, surplus)]:
            out.delete_group(moving_groups[r].pop(i))
            out.events.append(("Normal", "ReplicaMoved", f"{r} replica {i} removed from nodes that no longer hold "
                               f"it ({moving[r][i]}): its replacement is ready"))
    if step.create or step.delete or step.serve != served:
        out.events += list(step.events)      # a step that changes nothing is not re-announced every reconcile
    creates = [] if (terminating or restarted) else list(step.create)

    # Rule 4: place the new revision's groups as units (old revisions' groups hold their GPUs).
    new_idx = {r: sorted([i for i, g in live[r].items() if _group_revision(g) == revision]
                         + [i for rr, i in creates if rr == r]) for r in ROLES}
    others = [(p.node, p.gpus) for r in ROLES for g in live[r].values() if _group_revision(g) != revision
              for p in g.pods.values() if p.node]
    others += [(p.node, p.gpus) for r in ROLES for g in moving_groups[r].values() for p in g.pods.values() if p.node]
    topo = topo_all.with_usage(others)
    existing = {r: {pos: [n or "" for n in live[r][i].nodes()] for pos, i in enumerate(new_idx[r]) if i in live[r]}
                for r in ROLES}
    placement = None
    if want_units >= 1:
        placement = place_disagg(dataclasses.replace(reqs0["prefill"], replicas=want_p),
                                 dataclasses.replace(reqs0["decode"], replicas=want_d), topo,
                                 ratio=ratio, tier=_tier(c.kv_path.tier), existing_prefill=existing["prefill"],
                                 existing_decode=existing["decode"])
    live_pods = {p.name: p for r in ROLES for g in groups[r].values() for p in g.pods.values()}
    live_svcs = {(s.get("metadata") or {}).get("name"): s for s in b.services}
    wanted_svcs: set[str] = set()
    unplaced: list[str] = []
    placed_now: dict[str, list[Any]] = {r: [] for r in ROLES}
    for r in ROLES:
        res = placement.prefill if placement is not None and r == "prefill" else \
            placement.decode if placement is not None else None
        by_pos = {x.index: x for x in res.placed} if res is not None else {}
        chosen = []
        for pos, i in enumerate(new_idx[r]):
            x = by_pos.get(pos)
            if i in live[r]:
                # a kept group is rendered where it runs (its own nodes), whatever placement now says
                if x is None or list(x.nodes) != existing[r][pos]:
                    continue
                chosen.append(dataclasses.replace(x, index=i))
            elif x is None:
                unplaced.append(f"{r} r{i}")
            else:
                chosen.append(dataclasses.replace(x, index=i))
        placed_now[r] = chosen
        if not chosen:
            continue
        pr = PlacementResult(request=dataclasses.replace(reqs0[r], replicas=len(chosen)), placed=tuple(chosen))
        gated = render_role(name, ns, uid, r, cands[r], pr, topo, t.serving, t.network, t.pods, revision, gated=True)
        opened = render_role(name, ns, uid, r, cands[r], pr, topo, t.serving, t.network, t.pods, revision,
                             gated=False)
        for g_gated, g_open in zip(gated.groups, opened.groups):
            lg = live[r].get(g_open.index)
            names = [p["metadata"]["name"] for p in g_open.pods]
            exists = [n for n in names if n in live_pods]
            wanted_svcs.add(g_open.service["metadata"]["name"])
            out.apply.append((g_open.service, live_svcs.get(g_open.service["metadata"]["name"])))
            if g_open.compute_domain:
                out.apply.append((g_open.compute_domain, None))
            open_pods = [{**p, "spec": {**p["spec"], "schedulingGates": []}} for p in g_open.pods]
            released = lg is not None and lg.any_released
            if released or len(exists) == len(names):
                for p in open_pods:
                    lp = live_pods.get(p["metadata"]["name"])
                    out.apply.append((p, lp.obj if lp else None))
                if not released:
                    out.events.append(("Normal", "ReplicaReleased", f"{r} replica {g_open.index}: all "
                                       f"{len(names)} pod(s) exist; scheduling gates removed"))
            else:
                for p in g_gated.pods:
                    lp = live_pods.get(p["metadata"]["name"])
                    out.apply.append((p, lp.obj if lp else None))
                out.release.append(open_pods)
                out.events.append(("Normal", "ReplicaCreated", f"{r} replica {g_open.index} (revision {revision}): "
                                   f"{len(names)} pod(s) on {', '.join(g_open_nodes(g_open))}; scheduling gates "
                                   "removed once all exist"))
    # Groups being moved still serve: the router, the status and the served units count them again.
    for r in ROLES:
        live[r].update(moving_groups[r])
    # Services of groups that still exist (any revision) stay; the others go.
    keep_svc = {(r, i) for r in ROLES for i, g in groups[r].items()
                if any(p.name not in {d[2] for d in out.delete} for p in g.pods.values())}
    for sname, svc in live_svcs.items():
        labels = (svc.get("metadata") or {}).get("labels") or {}
        r = labels.get(LABEL_SERVING_ROLE)
        if sname in wanted_svcs or r not in ROLES:
            continue
        try:
            idx = int(labels.get(LABEL_REPLICA, "-1"))
        except ValueError:
            idx = -1
        if (r, idx) not in keep_svc:
            out.delete.append(("v1", "Service", sname, (svc.get("metadata") or {}).get("uid", "")))

    # Rule 6: the router (one rule for every router kind and for aggregated deployments: controller.routing).
    # the served revision's ready groups per role (moving ones included): the router's endpoints and status
    served_ready = {r: [g for _, g in sorted(live[r].items()) if step.serve and _group_revision(g) == step.serve
                        and g.ready(n_pods[r] if step.serve == revision else None)] for r in ROLES}
    leaders = {r: router_endpoints(served_ready[r], ns, t.serving.port) for r in ROLES}
    from meshplan.engines.base import Disaggregation

    rout = decide_router(RouterInputs(
        name=name, namespace=ns, uid=uid, engine=t.serving.engine, kind=t.router_kind, image=t.router_image,
        port=t.serving.port, pool_crd=t.pool_crd, disaggregated=True, serve=step.serve,
        served_units=step.served_units, ratio=ratio, revision=revision, prefill=leaders["prefill"],
        decode=leaders["decode"], disagg=Disaggregation("decode"), service_account=t.pods.service_account,
        live=inp.routers))
    out.apply += rout.apply
    out.delete += rout.delete
    routed = rout.condition

    # Rule 7: status.
    served_units = step.served_units if step.serve is not None else 0
    if step.serve == revision and any(moving_groups[r] for r in ROLES):
        served_units = units([RoleGroup(r, i, _group_revision(g), g.ready(n_pods[r]), 0)
                              for r in ROLES for i, g in live[r].items()], revision, ratio)
    ready_new = {r: sum(1 for g in live[r].values() if _group_revision(g) == revision and g.ready(n_pods[r]))
                 for r in ROLES}
    short = bool(unplaced)
    stale = [g for g in role_live if g.revision != revision and g not in step.delete]
    values: list[tuple[str, bool | str, str, str]] = [
        ("Planned", True, "PlanChosen", (t.dplan.reason or c.label())[:4096]),
    ]
    if short:
        values.append(("Placed", False, "InsufficientCapacity",
                       f"{len(unplaced)} group(s) have no place ({', '.join(unplaced[:8])}): "
                       + (placement.message() if placement is not None else "")))
    else:
        values.append(("Placed", True, "AllReplicasPlaced",
                       f"{sum(len(new_idx[r]) for r in ROLES)} group(s) of revision {revision} placed in units of "
                       f"P:D {ratio[0]}:{ratio[1]} over {c.kv_path.tier}"))
    available = served_units >= 1
    values.append(("Available", available, "ReplicasReady" if available else "ReplicasNotReady",
                   f"{served_units} of {want_units} unit(s) of the served revision ready "
                   f"({step.serve or 'none served'})"))
    if stale:
        prog = ("Progressing", True, "RollingUpdate",
                f"revision {revision} replaces {len(stale)} group(s) of another revision "
                f"({ready_new['prefill']} prefill + {ready_new['decode']} decode group(s) of it ready); the pool "
                f"serves {step.serve or 'nothing'}")
    elif any(moving_groups[r] for r in ROLES):
        prog = ("Progressing", True, "MovingReplicas", "; ".join(
            f"{r} replica {i} keeps serving on nodes that no longer hold it ({moving[r][i]}) until a replacement "
            "is ready" for r in ROLES for i in sorted(moving_groups[r]))[:4096])
    elif served_units < want_units or creates or restarted or any(len(new_idx[r]) != w for r, w in
                                                                  (("prefill", want_p), ("decode", want_d))):
        prog = ("Progressing", True, "CreatingReplicas",
                f"{ready_new['prefill']} of {want_p} prefill and {ready_new['decode']} of "
                f"{want_d} decode group(s) ready")
    else:
        prog = ("Progressing", False, "Complete", f"{served_units} unit(s) of {c.label()} ready")
    values.append(prog)
    degraded = bool(restarted) or (short and not available)
    values.append(("Degraded", degraded, "ReplicaRestarted" if restarted else
                   "MissingReplicas" if degraded else "AsPlanned",
                   f"{served_units} of {want_units} unit(s) ready" + (f"; restarted {restarted}" if restarted else "")))
    if routed is not None:
        values.append(routed)
    prev = list(b.previous_status.get("conditions") or [])
    conds = st.conditions(prev, st.merge_values(values, b.extra_conditions), b.generation, b.now)
    for cond in conds:
        if cond["type"] in ("Placed", "Degraded", "Available", "Routed") and st.transitioned(prev, cond):
            warn = (cond["type"] in ("Placed", "Routed") and cond["status"] == "False" and
                    cond["reason"] != "NoRevisionReady") or (cond["type"] == "Degraded" and cond["status"] == "True")
            out.events.append(("Warning" if warn else "Normal", cond["reason"], cond["message"][:1024]))
    dstatus = disaggregation_status(t.dplan)
    if step.serve:
        dstatus["servedRevision"] = step.serve
    ready_served = {r: len(served_ready[r]) for r in ROLES}
    for r, w in (("prefill", want_p), ("decode", want_d)):
        if r in dstatus:
            dstatus[r] = {**dstatus[r], "desiredReplicas": w, "readyReplicas": ready_served[r]}
    status: dict[str, Any] = {
        "observedGeneration": b.generation,
        "conditions": conds,
        "plan": st.plan_summary(cands["decode"], c.label(), gpu_product=t.product),
        "alternatives": [],
        "placement": placement_status(live, placed_now, revision, n_pods, gpus),
        # the scale subresource's statusReplicasPath / selector count decode groups, as spec.replicas does
        "replicas": len(new_idx["decode"]),
        "readyReplicas": ready_served["decode"],
        "desiredReplicas": R,
        "selector": f"{LABEL_DEPLOYMENT}={name},{LABEL_SERVING_ROLE}=decode",
        "disaggregation": dstatus,
    }
    status["plan"]["layout"] = c.label()
    since = b.previous_status.get("servingSince") or (st.rfc3339(b.now) if served_units else None)
    if since:
        status["servingSince"] = since
    out.status = status
    out.requeue_after_s = REQUEUE_WAITING_S if short else (REQUEUE_PROGRESSING_S if prog[1] is True
                                                          else REQUEUE_STEADY_S)
    return out


def placement_status(live: Mapping[str, Mapping[int, LiveGroup]], placed_now: Mapping[str, Sequence[Any]],
                     revision: str, n_pods: Mapping[str, int], gpus: Mapping[str, int]) -> list[dict[str, Any]]:
    """status.placement of a disaggregated deployment: one entry per group, prefill then decode, by index; the
    groups of this revision where placement put them this reconcile (created or kept), those of another revision
    (still serving or draining) where their pods run."""
    rows: list[dict[str, Any]] = []
    for r in ROLES:
        seen: set[int] = set()
        entries: list[tuple[int, dict[str, Any]]] = []
        for x in placed_now.get(r, ()):
            g = live.get(r, {}).get(x.index)
            entries.append((x.index, {
                "index": x.index, "role": r, "revision": revision,
                "nvlinkDomain": (x.domains[0] if x.single_domain else ",".join(x.domains))[:253],
                "nodes": list(x.nodes), "gpus": gpus[r],
                "ready": bool(g is not None and _group_revision(g) == revision and g.ready(n_pods[r]))}))
            seen.add(x.index)
        for i, g in live.get(r, {}).items():
            if i in seen:
                continue
            rev = _group_revision(g)
            entries.append((i, {"index": i, "role": r, "revision": rev or None,
                                "nodes": [n for n in g.nodes() if n], "gpus": sum(p.gpus for p in g.pods.values()),
                                "ready": g.ready(n_pods[r] if rev == revision else None)}))
        rows += [{k: v for k, v in e.items() if v is not None} for _, e in sorted(entries, key=lambda t: t[0])]
    return rows


def misplaced_role_groups(live: Mapping[str, Mapping[int, LiveGroup]], revision: str, reqs0: Mapping[str, Any],
                          topology: Any, n_pods: Mapping[str, int], ready: bool = True) -> dict[str, dict[int, str]]:
    """Per role, the ready (`ready=False`: the not-ready) groups of `revision` that cannot keep their nodes (-> why),
    as `decide.misplaced_groups` judges an aggregated group: on the topology without this deployment, charged with
    every other group of it (the other role's, other revisions')."""
    from meshplan.controller.decide import misplaced_groups

    out: dict[str, dict[int, str]] = {}
    for r in ROLES:
        mine = {i: g for i, g in live[r].items() if _group_revision(g) == revision}
        rest = [(p.node, p.gpus) for rr in ROLES for i, g in live[rr].items() if not (rr == r and i in mine)
                for p in g.pods.values() if p.node]
        out[r] = dict(misplaced_groups(mine, reqs0[r], topology.with_usage(rest), n_pods[r], ready)) if mine else {}
    return out


def g_open_nodes(g: Any) -> list[str]:
    return sorted({(p["metadata"].get("annotations") or {}).get("meshplan.dev/assigned-node", "?") for p in g.pods})


def _tier(tier: str) -> str:
    from meshplan.placement import KV_TIERS

    return tier if tier in KV_TIERS else "rdma" if "rdma" in KV_TIERS and tier not in ("nvlink", "tcp") else tier


def is_disaggregated_spec(spec: Any) -> bool:
    """spec.serving.disaggregation is auto or enabled (the planner decides whether it is disaggregated)."""
    return spec.serving is not None and spec.serving.disaggregation != "disabled"


__all__ = ["DISAGG_STATUS_KEYS", "DisaggInputs", "DisaggTarget", "POOL_CRD", "RoleTargets", "decide_disagg",
           "disaggregation_status", "is_disaggregated_spec", "render_role", "role_groups", "role_hash", "role_targets",
           "unit_ratio"]
