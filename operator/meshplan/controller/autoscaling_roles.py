"""Per-role autoscaling of a disaggregated deployment in the autoscaler loop (issue 19).

`controller.autoscaling.Autoscaler._evaluate` hands a deployment here when the reconciler deploys it
disaggregated (`spec.serving.disaggregation` enabled, or auto and the planner chose disaggregation: the
reconciler's cached `planner.disagg` plan says so). One evaluation (`evaluate`):

1. The counts now: `decide_disagg.role_targets(spec, status, plan)` (what the reconciler drives toward: decode
   from status.autoscaling.toReplicas within [minReplicas, maxReplicas], prefill from
   status.autoscaling.roles.prefill.toReplicas within the P:D bounds; spec.replicas and the plan's ratio before
   the first decision).
2. Queries per role (`role_queries`): `autoscaling.queries_for`'s PromQL, scoped by namespace, deployment and the
   role: the pods' label meshplan.dev/serving-role as Prometheus' Kubernetes discovery names it,
   `meshplan_dev_serving_role` (`ROLE_LABEL`; the chart's PodMonitor relabels it so). The prefill role reads TTFT,
   request rate and queue (its KV usage query is dropped: a prefill pod's KV pool empties after each hand-off);
   the decode role also ITL, running requests and the fullest pod's KV-cache usage (the engine's gauge,
   `promql.ENGINE_METRICS`, e.g. vllm:kv_cache_usage_perc).
3. The configuration (`roles_config`): `autoscaling.config_from_spec` (windows, thresholds, steps, cooldown,
   minReplicas / maxReplicas counting decode groups) split per role by `autoscale.roles.RolesConfig`: prefill
   keeps only the TTFT target and gets the bounds `prefill_replica_bounds` derives from the decode role's and
   the P:D bounds [r/2, 2r] around the plan's r; decode keeps only the ITL target and the KV high-watermark 0.9.
   spec.gpus.maxGpus does not cap the roles here (the planner already sized the plan inside it; not done yet).
4. Capacities per role (`role_capacities`): `autoscale.roles.role_capacity_from_plan` (the plan's requests/s
   per group; decode also its concurrency), and how many more whole groups of the role fit: the GPUs free
   beside this deployment's own pods (the reconciler's topology without this deployment, on the spec's node
   selector) over the role's GPUs per group, each with the other role at its count. Node fragmentation and the
   KV scope are the placement's to check (a group that does not fit waits with Placed=False).
5. `autoscale.roles.decide_roles` (pure), its `RolesState` kept per UID and in status.
6. Status (`status_document`): status.autoscaling with fromReplicas / toReplicas of the decode groups (so
   `render.pipeline.replicas_and_why`, `reconcile.desired_replicas` and the scale subresource keep counting
   decode groups) and `roles: {prefill, decode, ratio}`, each role an aggregated status.autoscaling document
   (the same fields, `autoscaling.status_document`, the policy's memory included so a restart resumes it:
   `autoscaling.state_from_status` per role).
7. Conditions ScalingActive / ScalingLimited: one per type for both roles (`combined_conditions`): False /
   True when either role says so, the message naming each role. Events `ScaledUp` / `ScaledDown` per role
   (`role_events`): "prefill groups scaled from 1 to 2 because ...".
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Mapping

from meshplan.autoscale.policy import (
    COND_SCALING_ACTIVE,
    COND_SCALING_LIMITED,
    AutoscaleConfigError,
    Decision,
    ReplicaCapacity,
)
from meshplan.autoscale.promql import LabelMatcher, QueryInputError, QuerySet
from meshplan.autoscale.roles import (
    ROLES,
    RatioBounds,
    RolesConfig,
    RolesDecision,
    RolesState,
    decide_roles,
    prefill_replica_bounds,
    role_capacity_from_plan,
)
from meshplan.autoscale.snapshot import METRICS_UNAVAILABLE, MetricsSnapshot

# The pod label meshplan.dev/serving-role (render.inference_pool.LABEL_SERVING_ROLE) as Prometheus' Kubernetes
# service discovery exposes it (any character a label name may not hold becomes '_'), relabelled to this name by
# the chart's PodMonitor, as meshplan.dev/deployment becomes meshplan_dev_deployment.
ROLE_LABEL = "meshplan_dev_serving_role"
DEFAULT_KV_HIGH_WATERMARK = 0.9


# ----------------------------------------------------------------------------- pure parts


def role_queries(spec: Any, namespace: str, name: str, role: str) -> QuerySet:
    """One role's PromQL: `autoscaling.queries_for`'s (engine names or spec.autoscaling.metrics, percentile, rate
    window) with the role label as a further matcher; prefill without the KV usage query."""
    from meshplan.autoscale.promql import MetricOverrides, build_queries, scope_matchers, window_from_seconds
    from meshplan.controller.autoscaling import rate_window_s

    if role not in ROLES:
        raise QueryInputError("role", f"{role!r} is not one of {', '.join(ROLES)}")
    m = spec.autoscaling.metrics
    overrides = MetricOverrides(ttft_histogram=m.ttft_histogram, itl_histogram=m.itl_histogram,
                                queue_gauge=m.requests_waiting, running_gauge=m.requests_running,
                                requests_counter=m.requests_completed, kv_usage_gauge=m.kv_cache_usage)
    percentile = float(spec.slo.percentile) if spec.slo is not None else 99.0
    q = build_queries(spec.engine.kind, scope_matchers(namespace, name, extra=(LabelMatcher(ROLE_LABEL, role),)),
                      percentile=percentile,
                      window=window_from_seconds(rate_window_s(spec.autoscaling.up_window_seconds)),
                      overrides=overrides)
    return replace(q, kv_usage=None) if role == "prefill" else q


def plan_ratio(choice: Any) -> tuple[int, int]:
    return max(1, int(choice.prefill_workers)), max(1, int(choice.decode_workers))


def roles_config(spec: Any, choice: Any) -> RolesConfig:
    """Both roles' policy configurations (see the module doc, step 3); raises AutoscaleConfigError naming the
    field."""
    from meshplan.controller.autoscaling import config_from_spec

    slo = spec.slo
    if slo is None or slo.ttft_ms is None:
        raise AutoscaleConfigError("spec.slo.ttftMs: a disaggregated deployment's prefill groups scale on TTFT")
    if slo.effective_itl_ms is None:
        raise AutoscaleConfigError("spec.slo.itlMs: a disaggregated deployment's decode groups scale on ITL")
    base = config_from_spec(spec)
    ratio = plan_ratio(choice)
    bounds = RatioBounds.around(*ratio)
    pmin, pmax = prefill_replica_bounds((base.min_replicas, base.max_replicas), bounds)
    pre = replace(base, min_replicas=pmin, max_replicas=pmax, itl_target_s=None)
    dec = replace(base, ttft_target_s=None, kv_high_watermark=DEFAULT_KV_HIGH_WATERMARK)
    return RolesConfig(pre, dec, ratio, bounds)


def role_capacities(choice: Any, spec: Any, topology: Any, pods: list,
                    ready: Mapping[str, int] | None = None) -> dict[str, ReplicaCapacity]:
    """Each role's `ReplicaCapacity` (module doc, step 4). `topology`: the fleet without this deployment's
    pods, on the spec's node selector; `pods`: this deployment's live pods."""
    from meshplan.controller.decide import live_pod

    own = [(p.node, p.gpus) for p in (live_pod(o) for o in pods) if p is not None and p.node and not p.finished]
    topo = topology.with_usage(own)
    free = max(0, topo.free_gpus)
    by_domain = tuple(sorted(topo.free_gpus_by_domain().items()))
    out = {}
    for role in ROLES:
        cand = choice.prefill if role == "prefill" else choice.decode
        gpus = max(1, cand.layout.gpus_per_replica)
        out[role] = role_capacity_from_plan(
            cand, role, isl=spec.workload.input_tokens, osl=spec.workload.output_tokens,
            additional_replicas_that_fit=free // gpus, free_gpus_by_domain=by_domain,
            ready_replicas=None if ready is None else ready.get(role))
    return out


def as_decision(rd: Any) -> Decision:
    """A role's decision as a `policy.Decision` (its count after the ratio rules) for the status document."""
    return replace(rd.policy, desired_replicas=rd.desired_replicas, previous_replicas=rd.previous_replicas,
                   reason=rd.reason, message=rd.message, conditions=rd.conditions, state=rd.state)


def status_document(decision: RolesDecision, snapshots: Mapping[str, MetricsSnapshot], now: datetime,
                    previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.autoscaling for a disaggregated deployment (api.models.AutoscalingStatus with `roles`)."""
    from meshplan.controller.autoscaling import status_document as role_doc
    from meshplan.controller.status import rfc3339

    prev = dict(previous or {})
    prev_roles = prev.get("roles") or {}
    docs = {r: role_doc(as_decision(decision.role(r)), snapshots[r], now, prev_roles.get(r)) for r in ROLES}
    d = decision.decode
    changed = decision.prefill.changed or decision.decode.changed
    top = {
        "lastDecisionTime": rfc3339(now),
        "lastScaleTime": rfc3339(now) if changed else prev.get("lastScaleTime"),
        "fromReplicas": d.previous_replicas,
        "toReplicas": d.desired_replicas,
        "reason": "; ".join(f"{decision.role(r).reason}: {decision.role(r).message}" for r in ROLES)[:4096],
        "metricsHealthy": all(docs[r].get("metricsHealthy") for r in ROLES),
        "roles": {**docs, "ratio": decision.ratio},
    }
    return {k: v for k, v in top.items() if v is not None}


def needs_write(previous: Mapping[str, Any] | None, new: Mapping[str, Any], now: datetime) -> bool:
    """Write when either role's decision changed in substance (`autoscaling.needs_write` per role), else at
    most every STATUS_REFRESH_S."""
    from meshplan.controller.autoscaling import needs_write as role_needs

    prev = dict(previous or {})
    pr, nr = prev.get("roles") or {}, new.get("roles") or {}
    if not isinstance(pr, Mapping) or pr.get("ratio") != nr.get("ratio"):
        return True
    return any(role_needs(pr.get(r), nr.get(r) or {}, now) for r in ROLES) or role_needs(
        {k: v for k, v in prev.items() if k != "roles"}, {k: v for k, v in new.items() if k != "roles"}, now)


def combined_conditions(decision: RolesDecision) -> list[tuple[str, str, str, str]]:
    """ScalingActive / ScalingLimited once each for both roles: ScalingActive is False when either role's is
    (its reason), ScalingLimited True when either role's is; the message names each role's (they already start
    with the role's name)."""
    out: list[tuple[str, str, str, str]] = []
    for ctype, bad in ((COND_SCALING_ACTIVE, "False"), (COND_SCALING_LIMITED, "True")):
        conds = [c for r in ROLES for c in decision.role(r).conditions if c.type == ctype]
        if not conds:
            continue
        worst = next((c for c in conds if c.status == bad), conds[-1])
        out.append((ctype, worst.status, worst.reason, "; ".join(c.message for c in conds)[:4096]))
    return out


def role_events(decision: RolesDecision) -> list[tuple[str, str, str]]:
    """(type, reason, message) per role whose group count changed: ScaledUp / ScaledDown (as an aggregated
    deployment's), the message naming the role, its reasons and any ratio note ("limited to 2 by ...")."""
    from meshplan.autoscale.policy import SCALED_DOWN, SCALED_UP

    out = []
    for r in ROLES:
        rd = decision.role(r)
        if rd.changed:
            msg = rd.message[len(r) + 2:] if rd.message.startswith(f"{r}: ") else rd.message
            out.append(("Normal", SCALED_UP if rd.desired_replicas > rd.previous_replicas else SCALED_DOWN,
                        f"{r} groups scaled from {rd.previous_replicas} to {rd.desired_replicas} because "
                        f"{msg}"[:1024]))
    return out


def held(state: RolesState, reason: str, message: str, bounds: RatioBounds) -> RolesDecision:
    """Both roles held (bad spec, no plan, Prometheus not allowed): ScalingActive=False with why."""
    from meshplan.autoscale.roles import RoleDecision
    from meshplan.controller.autoscaling import held_decision

    def one(role: str, st: Any) -> Any:
        d = held_decision(st, reason, message)
        conds = tuple(replace(c, message=f"{role}: {c.message}") for c in d.conditions)
        return RoleDecision(role, st.desired_replicas, st.desired_replicas, reason, f"{role}: {message}", conds,
                            st, d)

    return RolesDecision(one("prefill", state.prefill), one("decode", state.decode), bounds)


def roles_state_from_status(previous: Mapping[str, Any] | None, counts: Mapping[str, int],
                            now: float) -> RolesState:
    """Each role's policy memory from status.autoscaling.roles (`autoscaling.state_from_status` per role)."""
    from meshplan.controller.autoscaling import state_from_status

    roles = (previous or {}).get("roles") or {}
    roles = roles if isinstance(roles, Mapping) else {}
    return RolesState(state_from_status(roles.get("prefill"), counts["prefill"], now),
                      state_from_status(roles.get("decode"), counts["decode"], now))


# ----------------------------------------------------------------------------- the evaluation


def disaggregated_plan(reconciler: Any, uid: str) -> Any:
    """The reconciler's disaggregated plan for this object when it deploys it disaggregated, else None."""
    cached = getattr(reconciler, "disagg_plans", {}).get(uid)
    dplan = cached[1] if cached else None
    if dplan is None or not dplan.disaggregated or dplan.choice is None:
        return None
    return dplan


async def evaluate(a: Any, body: Mapping[str, Any], spec: Any, dplan: Any) -> RolesDecision:
    """One evaluation of a disaggregated deployment (module doc); `a` is the `autoscaling.Autoscaler`."""
    from meshplan.controller.autoscaling import (
        INVALID_AUTOSCALING,
        PROMETHEUS_NOT_ALLOWED,
        merge_conditions,
        resolve_prometheus,
    )
    from meshplan.controller.decide_disagg import role_groups, role_targets
    from meshplan.controller.reconcile import API_VERSION, KIND
    from meshplan.render.workloads import LABEL_DEPLOYMENT

    meta, status = body.get("metadata") or {}, body.get("status") or {}
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    key = (namespace, name)
    kube = a.reconciler.kube
    prev_auto = status.get("autoscaling") or {}
    c = dplan.choice
    targets = role_targets(spec, status, dplan)
    counts = {"prefill": targets.prefill, "decode": targets.decode}
    state = a.role_states.get(uid)
    if state is None:
        state = roles_state_from_status(prev_auto, counts, a.clock())
    elif (state.prefill.desired_replicas, state.decode.desired_replicas) != (counts["prefill"], counts["decode"]):
        # the counts were changed by someone else (bounds in the spec): start from them
        state = RolesState(replace(state.prefill, desired_replicas=counts["prefill"]),
                           replace(state.decode, desired_replicas=counts["decode"]))
    pods = await kube.list("v1", "Pod", namespace, f"{LABEL_DEPLOYMENT}={name}")
    groups = role_groups(pods)
    ready = {r: sum(1 for g in groups[r].values() if g.ready()) for r in ROLES}
    now = a.clock()
    snaps = {r: MetricsSnapshot.failed(METRICS_UNAVAILABLE, "not evaluated", now) for r in ROLES}
    try:
        config = roles_config(spec, c)
        queries = {r: role_queries(spec, namespace, name, r) for r in ROLES}
    except (AutoscaleConfigError, QueryInputError) as exc:
        decision = held(state, INVALID_AUTOSCALING, str(exc), RatioBounds.around(*plan_ratio(c)))
    else:
        picked = resolve_prometheus(spec.autoscaling, a.allowed_endpoints())
        if isinstance(picked, str) and (spec.autoscaling.prometheus is not None
                                        or spec.autoscaling.prometheus_url is not None):
            decision = held(state, PROMETHEUS_NOT_ALLOWED, picked, config.bounds)      # nothing is fetched
        else:
            if isinstance(picked, str):
                snaps = {r: MetricsSnapshot.failed(METRICS_UNAVAILABLE, picked, now) for r in ROLES}
            else:
                src = a._source(picked[1], picked[0])
                got = await asyncio.gather(*(src.fetch_async(queries[r], now) for r in ROLES))
                snaps = dict(zip(ROLES, got))
            topology = a.reconciler.world.topology_without(namespace, name).select(dict(spec.gpus.node_selector or {}))
            caps = role_capacities(c, spec, topology, pods, ready)
            decision = decide_roles(state, snaps["prefill"], snaps["decode"], config, caps["prefill"],
                                    caps["decode"], now)
    a.role_states[uid] = decision.state
    now_dt = datetime.fromtimestamp(now, timezone.utc)
    doc = status_document(decision, snaps, now_dt, prev_auto)
    if needs_write(prev_auto, doc, now_dt):
        await kube.patch_status(API_VERSION, KIND, namespace, name, {"autoscaling": doc})
    before = a.conditions.get(key, {})
    after = merge_conditions(before, combined_conditions(decision))
    a.conditions[key] = after
    a.reconciler.autoscaler_conditions[key] = tuple(after.values())
    conditions_changed = {t: x[1:3] for t, x in before.items()} != {t: x[1:3] for t, x in after.items()}
    for ev in role_events(decision):
        await a.reconciler._event(body, *ev)
    for r in ROLES:
        rd = decision.role(r)
        if rd.changed:
            try:
                from meshplan import metrics

                metrics.count_scaling("up" if rd.desired_replicas > rd.previous_replicas else "down", rd.reason)
            except Exception:  # noqa: BLE001 - metrics never break the loop
                pass
    changed = decision.prefill.changed or decision.decode.changed
    if changed or conditions_changed or prev_auto.get("toReplicas") != doc.get("toReplicas") or \
            ((prev_auto.get("roles") or {}).get("prefill") or {}).get("toReplicas") != \
            doc["roles"]["prefill"].get("toReplicas"):
        a.enqueue(key)
    return decision


__all__ = ["DEFAULT_KV_HIGH_WATERMARK", "ROLE_LABEL", "combined_conditions", "disaggregated_plan", "evaluate",
           "held", "needs_write", "plan_ratio", "role_capacities", "role_events", "role_queries", "roles_config",
           "roles_state_from_status", "status_document"]
