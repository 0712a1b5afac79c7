"""The autoscaling loop: Prometheus -> `autoscale.policy.decide` -> status.autoscaling -> reconcile.

Why a loop of its own and not the resync hook alone: the policy's windows are
seconds (`upWindowSeconds` >= 10), while the handlers' resync runs every
`--resync-seconds` (60 s by default) and only for objects not reconciled
lately. So this module keeps its own asyncio task (started by a kopf startup
handler, like the reconcile workers; not a kopf timer, which would put a
finalizer on every object) that evaluates each LLMDeployment with
`spec.autoscaling.enabled` every

    interval = clamp(upWindowSeconds / 4, 1 s, 15 s)

so an up window spans at least four evaluations (15 s is the HPA's sync
period, kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#how-does-a-horizontalpodautoscaler-work).
`handlers.AUTOSCALE_HOOK` is set to the same evaluation, which skips objects
evaluated within their interval, so the resync can never evaluate twice.

One evaluation (`Autoscaler.evaluate`)
1. GET the LLMDeployment; nothing to do unless autoscaling is enabled.
2. Queries (`autoscale.promql`): scoped by the two labels the operator
   controls (namespace, `meshplan_dev_deployment` = the pods' deployment
   label), metric names from the engine or `spec.autoscaling.metrics`; rate
   window 2 x upWindowSeconds within [30 s, 2 m] (2 m with the default 60 s
   window; shorter windows need fresher rates). Prometheus at
   `spec.autoscaling.prometheusUrl`, else `meshplan run --prometheus-url`
   (or `$MESHPLAN_PROMETHEUS_URL`); none at all holds like Prometheus down.
3. Capacity, in a worker thread: the reconciler's cached plan (planned on the
   topology without this deployment's pods, the same call reconcile makes),
   the planner's per-replica capacity at SLO (the chosen candidate's
   concurrency, and requests/s by Little's law over its TTFT + outputTokens x
   ITL), and how many more whole groups the real placement fits
   (`autoscale.capacity.replica_capacity`, the running groups kept on their
   nodes). `spec.gpus.maxGpus` caps maxReplicas at maxGpus / GPUs per replica.
4. `policy.decide(state, snapshot, config, capacity, now)` (pure).
5. Status: `status.autoscaling` (the schema's fields: decision time, from/to
   replicas, reason and message, observed TTFT/ITL, ratios, request rate,
   queue, metricsHealthy; `lastScaleTime` when the count changed). Written when
   the decision's substance changed or every `STATUS_REFRESH_S`, not every few
   seconds. `toReplicas` is what `reconcile.desired_replicas` acts on, so the
   scaling itself goes through reconcile's placement and gang path.
6. Conditions `ScalingActive` (metrics usable or why not) and `ScalingLimited`
   (max replicas, or whole groups that do not fit): handed to the reconciler
   (`Reconciler.autoscaler_conditions`), which owns `status.conditions` and
   writes them with its own in one patch (a second writer of the list would
   undo the other's changes). A decision that says nothing about
   ScalingLimited (pending, cooldown, metrics held) keeps the last one.
7. A change: a `ScaledUp`/`ScaledDown` event "from X to Y because ...",
   `meshplan_scaling_decisions_total`, and the reconcile is queued at once.

State between evaluations: the policy's windows and learned capacity
(`AutoscaleState`) are kept in memory per object UID and written to
status.autoscaling with each status write (`upSignalSince`, `downSignalSince`,
`lastScaleDownTime`, `learnedCapacityRps`/`Time`/`FromTtft`, beside
`lastScaleTime` for the cooldown). A restarted operator (or the peer that takes
over) rebuilds the state from them (`state_from_status`): a learned capacity
is kept; a window keeps running only when the last decision is at most
WINDOW_RESUME_S old (a window means the signal held without a break, and
after a longer gap nobody watched it). Status is written when the decision's
reason changes (a window starts or ends with it) and at least every
STATUS_REFRESH_S, so what a restart can lose is a window (which only delays
a change, never hastens one) or an estimate's drift since the last write.

Which Prometheus (issue 17, finding 2: the URL was fetched as given, any host)
The cluster admin lists the endpoints: `meshplan run --prometheus-endpoint
NAME=URL` (repeatable; `$MESHPLAN_PROMETHEUS_ENDPOINTS`, the chart's
`prometheusEndpoints`), plus `--prometheus-url` as the endpoint named
`default`. A CR picks one by name (`spec.autoscaling.prometheus`) or gets the
default; `spec.autoscaling.prometheusUrl` is kept for existing manifests but
only when it is exactly the URL of an allowed endpoint (it then stands for that
endpoint); any other name or URL is ScalingActive=False/PrometheusNotAllowed
naming the field and the allowed names, and nothing is fetched. The fetch
itself follows no redirect, is bounded in time and size, and puts nothing of
the response into status (`autoscale.source`).

A disaggregated deployment (the reconciler's plan splits prefill and decode) is evaluated per role by
`controller.autoscaling_roles` (its own queries per role, `autoscale.roles.decide_roles`,
status.autoscaling.roles); `toReplicas` then counts decode groups, as `spec.replicas` does.

With autoscaling disabled nothing here runs: `spec.replicas` (the scale
subresource, `kubectl scale`, HPA, KEDA) rules.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import kopf

from meshplan.autoscale.capacity import replica_capacity
from meshplan.autoscale.drift import (
    REPLAN_ADOPTED,
    REPLAN_SUGGESTED,
    Correction,
    corrected_capacity,
    corrected_predictor,
    correction_from_status,
    drift_condition,
    observed_document,
    observed_queries,
    replan_action,
    update_correction,
)
from meshplan.autoscale.policy import (
    COND_SCALING_ACTIVE,
    AutoscaleConfig,
    AutoscaleConfigError,
    AutoscaleState,
    Decision,
    ReplicaCapacity,
    decide,
)
from meshplan.autoscale.promql import (
    MetricOverrides,
    QueryInputError,
    QuerySet,
    build_queries,
    scope_matchers,
    window_from_seconds,
)
from meshplan.autoscale.snapshot import METRIC_PROBLEMS, METRICS_UNAVAILABLE, MetricsSnapshot
from meshplan.autoscale.source import PrometheusSource
from meshplan.controller import handlers, indexes
from meshplan.controller.status import rfc3339
from meshplan.render.workloads import LABEL_DEPLOYMENT

log = logging.getLogger("meshplan.autoscaler")

DEFAULT_PROMETHEUS_URL: str | None = os.environ.get("MESHPLAN_PROMETHEUS_URL") or None
# the admin's allowed endpoints (NAME=URL entries or JSON; `parse_endpoints`), set by `meshplan run`
PROMETHEUS_ENDPOINTS: list[str] | str | None = os.environ.get("MESHPLAN_PROMETHEUS_ENDPOINTS") or None
PROMETHEUS_TIMEOUT_S = 5.0
MIN_INTERVAL_S, MAX_INTERVAL_S = 1.0, 15.0
MIN_RATE_WINDOW_S, MAX_RATE_WINDOW_S = 30.0, 120.0
STATUS_REFRESH_S = 30.0        # rewrite an unchanged decision at most this often (fresh inputs in status)
WINDOW_RESUME_S = 2 * STATUS_REFRESH_S   # a restart within this of the last decision continues its windows
LOOP_TICK_S = 0.5
CONCURRENT_EVALUATIONS = 8
INVALID_AUTOSCALING = "InvalidAutoscaling"
NO_PLAN = "NoPlan"
PROMETHEUS_NOT_ALLOWED = "PrometheusNotAllowed"
DEFAULT_ENDPOINT = "default"
_ENDPOINT_NAME_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


# ----------------------------------------------------------------------------- pure parts


class EndpointError(ValueError):
    """An admin's endpoint list that cannot be used (raised at startup, naming the entry)."""


def endpoint_url_problem(url: str) -> str | None:
    """Why an admin's Prometheus URL is not usable as a base URL, or None: http(s), a host, no
    credentials, no query or fragment (a `?`/`#` would let the query path be steered)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port     # raises on a malformed port
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s)://host[:port][/path] URL"
    if "@" in parts.netloc:
        return f"{url!r} carries credentials; pass them another way"
    if "?" in url or "#" in url:
        return f"{url!r} has a query or fragment ('?', '#'); give the base URL only"
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return f"{url!r} contains whitespace or control characters"
    return None


def parse_endpoints(entries: list[str] | str | None, default_url: str | None = None) -> dict[str, str]:
    """The allowed endpoints, name -> base URL (no trailing '/'), from `NAME=URL` entries (a list, or
    one string separated by commas or whitespace, or a JSON object/list of {name, url}), plus
    `default_url` as `default`. Raises EndpointError naming the bad entry."""
    import json
    import re

    items: list[tuple[str, str]] = []
    if isinstance(entries, str):
        text = entries.strip()
        if text.startswith(("{", "[")):
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise EndpointError(f"prometheus endpoints: not JSON ({exc})") from None
            if isinstance(doc, dict):
                items = [(str(k), str(v)) for k, v in doc.items()]
            elif isinstance(doc, list) and all(isinstance(e, dict) for e in doc):
                items = [(str(e.get("name", "")), str(e.get("url", ""))) for e in doc]
            else:
                raise EndpointError("prometheus endpoints: expected an object {name: url} or a list of {name, url}")
            entries = None
        else:
            entries = [e for e in re.split(r"[,\s]+", text) if e]
    for e in entries or ():
        name, sep, url = e.partition("=")
        if not sep:
            raise EndpointError(f"prometheus endpoint {e!r}: expected NAME=URL")
        items.append((name.strip(), url))
    if default_url:
        items.append((DEFAULT_ENDPOINT, default_url))
    out: dict[str, str] = {}
    for name, url in items:
        if not re.fullmatch(_ENDPOINT_NAME_RE, name) or len(name) > 63:
            raise EndpointError(f"prometheus endpoint name {name!r}: use a DNS label (a-z, 0-9, '-', <= 63)")
        problem = endpoint_url_problem(url)
        if problem:
            raise EndpointError(f"prometheus endpoint {name!r}: {problem}")
        url = url.rstrip("/")
        if name in out and out[name] != url:
            raise EndpointError(f"prometheus endpoint {name!r} is given twice with different URLs")
        out[name] = url
    return out


def resolve_prometheus(autoscaling: Any, endpoints: Mapping[str, str]) -> tuple[str, str] | str:
    """(endpoint name, base URL) a deployment's autoscaler queries, or why none (a message naming the
    field; the caller reports ScalingActive=False/PrometheusNotAllowed and fetches nothing)."""
    allowed = ", ".join(sorted(endpoints)) or "none: the operator has no Prometheus endpoint configured"
    name, url = getattr(autoscaling, "prometheus", None), getattr(autoscaling, "prometheus_url", None)
    if name is not None:
        if name not in endpoints:
            return (f"spec.autoscaling.prometheus: {name!r} is not a Prometheus endpoint the cluster admin allows "
                    f"(allowed: {allowed}); pick one of them or ask the admin to add it (chart value "
                    "prometheusEndpoints)")
        if url is not None and url.rstrip("/") != endpoints[name]:
            return (f"spec.autoscaling.prometheusUrl is not the URL of endpoint {name!r} named in "
                    "spec.autoscaling.prometheus; remove spec.autoscaling.prometheusUrl")
        return name, endpoints[name]
    if url is not None:
        wanted = url.rstrip("/")
        for n in sorted(endpoints):
            if endpoints[n] == wanted:
                return n, endpoints[n]
        return (f"spec.autoscaling.prometheusUrl: {url[:200]!r} is not the URL of a Prometheus endpoint the cluster "
                f"admin allows; name one in spec.autoscaling.prometheus instead (allowed: {allowed})")
    if DEFAULT_ENDPOINT in endpoints:
        return DEFAULT_ENDPOINT, endpoints[DEFAULT_ENDPOINT]
    return ("no Prometheus endpoint: set spec.autoscaling.prometheus to one the cluster admin allows "
            f"(allowed: {allowed}), or start the operator with --prometheus-url")


def evaluation_interval_s(up_window_s: float) -> float:
    """Seconds between evaluations: a quarter of the up window, within [1 s, 15 s]."""
    return max(MIN_INTERVAL_S, min(MAX_INTERVAL_S, up_window_s / 4.0))


def rate_window_s(up_window_s: float) -> float:
    """Rate/quantile window: twice the up window, within [30 s, 2 m]."""
    return max(MIN_RATE_WINDOW_S, min(MAX_RATE_WINDOW_S, 2.0 * up_window_s))


def config_from_spec(spec: Any, gpus_per_replica: int | None = None) -> AutoscaleConfig:
    """The policy's configuration from an `LLMDeploymentSpec` (raises AutoscaleConfigError naming the field)."""
    a, slo = spec.autoscaling, spec.slo
    if slo is None:
        raise AutoscaleConfigError("spec.slo: autoscaling needs ttftMs and/or itlMs")
    ttft_ms, itl_ms = slo.ttft_ms, slo.effective_itl_ms
    max_replicas = a.max_replicas if a.max_replicas is not None else max(a.min_replicas, spec.replicas, 1)
    if spec.gpus.max_gpus and gpus_per_replica:
        # spec.gpus.maxGpus is the deployment's GPU ceiling, all replicas together.
        max_replicas = max(a.min_replicas, 1, min(max_replicas, spec.gpus.max_gpus // gpus_per_replica))
    return AutoscaleConfig(
        min_replicas=a.min_replicas,
        max_replicas=max_replicas,
        ttft_target_s=None if ttft_ms is None else ttft_ms / 1000.0,
        itl_target_s=None if itl_ms is None else itl_ms / 1000.0,
        percentile=float(slo.percentile),
        up_threshold=a.up_threshold,
        down_threshold=a.down_threshold,
        up_window_s=float(a.up_window_seconds),
        down_window_s=float(max(a.down_window_seconds, a.up_window_seconds)),
        cooldown_s=float(a.cooldown_seconds),
        max_step_up=a.max_step_up,
        max_step_down=a.max_step_down,
        **({} if a.initial_burst_headroom is None else {"initial_burst_rise": float(a.initial_burst_headroom)}),
    )


def queries_for(spec: Any, namespace: str, name: str) -> QuerySet:
    """The deployment's PromQL: scoped by namespace and deployment, names from the engine or the overrides."""
    m = spec.autoscaling.metrics
    overrides = MetricOverrides(ttft_histogram=m.ttft_histogram, itl_histogram=m.itl_histogram,
                                queue_gauge=m.requests_waiting, running_gauge=m.requests_running,
                                requests_counter=m.requests_completed, kv_usage_gauge=m.kv_cache_usage)
    percentile = float(spec.slo.percentile) if spec.slo is not None else 99.0
    return build_queries(spec.engine.kind, scope_matchers(namespace, name), percentile=percentile,
                         window=window_from_seconds(rate_window_s(spec.autoscaling.up_window_seconds)),
                         overrides=overrides)


def observed_queries_for(spec: Any, namespace: str, name: str, queries: QuerySet) -> dict[str, str]:
    """status.observed's extra PromQL (p50/p99, tokens/s), scoped and windowed like `queries_for`."""
    m = spec.autoscaling.metrics
    overrides = MetricOverrides(ttft_histogram=m.ttft_histogram, itl_histogram=m.itl_histogram,
                                queue_gauge=m.requests_waiting, running_gauge=m.requests_running,
                                requests_counter=m.requests_completed, kv_usage_gauge=m.kv_cache_usage)
    return observed_queries(queries, spec.engine.kind, scope_matchers(namespace, name), queries.window, overrides)


def observed_needs_write(previous: Mapping[str, Any] | None, new: Mapping[str, Any], moved: float = 0.02) -> bool:
    """Write status.observed (besides the autoscaling refresh) while a factor still moves by more than
    `moved` (so its convergence is visible evaluation by evaluation) or the re-plan layout changes."""
    prev = dict(previous or {})
    for k in ("itlCorrection", "ttftCorrection"):
        a, b = prev.get(k), new.get(k)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0:
            return True
        if abs(b / a - 1.0) > moved:
            return True
    return prev.get("replanLayout") != new.get("replanLayout")


def reported_drift_condition(cond: tuple[str, str, str, str] | None, previous: Mapping[str, Any] | None,
                             new: Mapping[str, Any] | None, wrote: bool) -> tuple[str, str, str, str] | None:
    """The PredictionDrift condition as status shows it: the factors and evaluation count its message
    quotes are those of the status.observed that is stored. An evaluation whose observed document is not
    written (the factors moved by less than `observed_needs_write`'s step) reports from the stored one,
    so the condition never cites an evaluation status.observed does not show."""
    if cond is None or new is None or wrote:
        return cond
    stored = correction_from_status(previous)
    if stored.updated_at is None:
        return cond
    return drift_condition(stored)


def per_replica_capacity(candidate: Any, output_tokens: int) -> tuple[float | None, float | None]:
    """(requests/s, concurrency) one replica serves at the planned operating point.

    The planner chose the candidate's concurrency so its predicted TTFT and ITL
    meet the SLO; a request holds a slot for TTFT + outputTokens x ITL, so by
    Little's law a replica completes concurrency / that many requests per second.
    """
    p = getattr(candidate, "prediction", None)
    if p is None or not p.concurrency or p.concurrency <= 0:
        return None, None
    service_s = (p.ttft_ms + output_tokens * p.tpot_ms) / 1000.0
    rps = p.concurrency / service_s if service_s > 0 and math.isfinite(service_s) else None
    return rps, float(p.concurrency)


def status_document(decision: Decision, snapshot: MetricsSnapshot, now: datetime,
                    previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """`status.autoscaling` (meshplan.api.models.AutoscalingStatus) for one decision."""
    prev = dict(previous or {})
    ratios = dict(decision.slo_ratios)
    healthy = decision.reason not in METRIC_PROBLEMS and snapshot.ok

    def ms(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(v * 1000.0, 1)

    def num(v: float | None, digits: int) -> float | None:
        return None if v is None or not math.isfinite(v) or v < 0 else round(v, digits)

    doc: dict[str, Any] = {
        "lastDecisionTime": rfc3339(now),
        "lastScaleTime": rfc3339(now) if decision.changed else prev.get("lastScaleTime"),
        "fromReplicas": decision.previous_replicas,
        "toReplicas": decision.desired_replicas,
        "reason": f"{decision.reason}: {decision.message}"[:4096],
        "observedTtftMs": ms(snapshot.ttft_s) if healthy else None,
        "observedItlMs": ms(snapshot.itl_s) if healthy else None,
        "ttftRatio": num(ratios.get("ttft"), 3),
        "itlRatio": num(ratios.get("itl"), 3),
        "requestRate": num(snapshot.request_rate_per_s, 3) if healthy else None,
        "requestsWaiting": num(snapshot.queue_depth, 1) if healthy else None,
        "kvCacheUsage": num(snapshot.kv_usage, 3) if healthy else None,
        "missingMetrics": list(snapshot.missing) if healthy and snapshot.missing else None,
        "metricsHealthy": healthy,
        **policy_state_fields(decision.state),
    }
    return {k: v for k, v in doc.items() if v is not None}


def _at(epoch_s: float | None) -> str | None:
    return None if epoch_s is None else rfc3339(datetime.fromtimestamp(epoch_s, timezone.utc))


def _epoch(value: Any) -> float | None:
    try:
        return datetime.strptime(value or "", "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def policy_state_fields(state: AutoscaleState) -> dict[str, Any]:
    """The policy's memory as status.autoscaling fields (times to the second; see `state_from_status`)."""
    learned = state.learned_rps_per_replica
    return {
        "upSignalSince": _at(state.above_since),
        "downSignalSince": _at(state.below_since),
        "lastScaleDownTime": _at(state.last_down_at),
        "learnedCapacityRps": None if learned is None or not math.isfinite(learned) else round(learned, 4),
        "learnedCapacityTime": _at(state.learned_at) if learned is not None else None,
        "learnedFromTtft": True if learned is not None and state.learned_from_ttft else None,
        # the burst memory (policy: learned headroom for demand rises); the demand samples of the
        # last burst horizon are not kept: losing them only delays measuring a rise by that horizon
        "learnedBurstRise": _rise(state.burst_rise),
        "learnedBurstRisePrevious": _rise(state.burst_rise_previous),
        "burstMemorySince": _at(state.burst_period_since),
        "watchingSince": _at(state.watching_since),
    }


def _rise(value: Any) -> float | None:
    """A remembered relative rise, when it is one (finite, >= 0), rounded for status."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return round(float(value), 4)
    return None


def needs_write(previous: Mapping[str, Any] | None, new: Mapping[str, Any], now: datetime,
                refresh_s: float = STATUS_REFRESH_S) -> bool:
    """Write status.autoscaling when the decision's substance changed, else at most every `refresh_s`."""
    prev = dict(previous or {})
    substance = ("fromReplicas", "toReplicas", "metricsHealthy", "lastScaleTime")
    if any(prev.get(k) != new.get(k) for k in substance):
        return True
    if (prev.get("reason") or "").split(":", 1)[0] != (new.get("reason") or "").split(":", 1)[0]:
        return True
    try:
        last = datetime.strptime(prev.get("lastDecisionTime") or "", "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return True
    return (now - last).total_seconds() >= refresh_s


def scaling_event(decision: Decision) -> tuple[str, str, str] | None:
    """(type, reason, message) of the event for a change of the replica count, None when held."""
    if not decision.changed:
        return None
    return ("Normal", decision.reason,
            f"scaled from {decision.previous_replicas} to {decision.desired_replicas} replica(s) because "
            f"{decision.message}"[:1024])


def direction(decision: Decision) -> str | None:
    if not decision.changed:
        return None
    return "up" if decision.desired_replicas > decision.previous_replicas else "down"


def merge_conditions(kept: Mapping[str, tuple[str, str, str, str]], decision_conditions: list[tuple[str, str, str, str]]
                     ) -> dict[str, tuple[str, str, str, str]]:
    """The autoscaler's conditions after a decision: what it says now, the rest as before."""
    out = dict(kept)
    for c in decision_conditions:
        out[c[0]] = c
    return out


def held_decision(state: AutoscaleState, reason: str, message: str) -> Decision:
    """A decision that changes nothing (bad spec, no plan yet): ScalingActive=False with why."""
    from meshplan.autoscale.policy import Condition

    cond = Condition(COND_SCALING_ACTIVE, "False", reason, f"holding {state.desired_replicas} replicas: {message}")
    return Decision(state.desired_replicas, state.desired_replicas, reason, cond.message, (cond,), state,
                    state.desired_replicas)


def state_from_status(previous: Mapping[str, Any] | None, current_replicas: int,
                      now: float | None = None) -> AutoscaleState:
    """What a (re)started autoscaler knows from status: the count, the last change (cooldown), the
    windows already running, the learned capacity and the burst memory (rises seen, and since when
    metrics were watched: a restart does not fall back to the initial burst assumption). Anything
    malformed is dropped field by field: a lost window only delays a change, and a lost estimate
    falls back to the planner's.

    A window means the signal held without a break, so one is resumed only when the last decision
    was written at most WINDOW_RESUME_S before `now` (a quick restart or peer handover); after a
    longer gap nobody watched the signal and the windows start again (never without `now`)."""
    prev = dict(previous or {})
    last_decision = _epoch(prev.get("lastDecisionTime"))
    resume = now is not None and last_decision is not None and 0 <= now - last_decision <= WINDOW_RESUME_S
    learned = prev.get("learnedCapacityRps")
    if not (isinstance(learned, (int, float)) and not isinstance(learned, bool) and math.isfinite(learned)
            and learned > 0):
        learned = None
    learned_at = _epoch(prev.get("learnedCapacityTime")) if learned is not None else None
    if learned_at is None:
        learned = None
    burst_since = _epoch(prev.get("burstMemorySince"))
    rise = _rise(prev.get("learnedBurstRise")) if burst_since is not None else None
    rise_previous = _rise(prev.get("learnedBurstRisePrevious")) if burst_since is not None else None
    return AutoscaleState(
        desired_replicas=current_replicas,
        last_change_at=_epoch(prev.get("lastScaleTime")),
        above_since=_epoch(prev.get("upSignalSince")) if resume else None,
        below_since=_epoch(prev.get("downSignalSince")) if resume else None,
        last_down_at=_epoch(prev.get("lastScaleDownTime")),
        learned_rps_per_replica=None if learned is None else float(learned),
        learned_at=learned_at,
        learned_from_ttft=learned is not None and prev.get("learnedFromTtft") is True,
        burst_rise=rise,
        burst_rise_previous=rise_previous,
        burst_period_since=burst_since,
        watching_since=_epoch(prev.get("watchingSince")),
    )


# ----------------------------------------------------------------------------- the loop


@dataclass
class Autoscaler:
    """Evaluates autoscaled LLMDeployments; one per operator process (see module doc)."""

    reconciler: Any                                    # controller.reconcile.Reconciler
    enqueue: Callable[[tuple[str, str]], None]
    default_prometheus_url: str | None = None
    # the allowed endpoints, name -> URL (`parse_endpoints`); None: just `default_prometheus_url`
    endpoints: dict[str, str] | None = None
    clock: Callable[[], float] = time.time
    states: dict[str, AutoscaleState] = field(default_factory=dict)          # uid -> policy state
    role_states: dict[str, Any] = field(default_factory=dict)               # uid -> autoscale.roles.RolesState
    conditions: dict[tuple[str, str], dict] = field(default_factory=dict)    # key -> type -> tuple
    last_eval: dict[tuple[str, str], float] = field(default_factory=dict)    # key -> monotonic time
    intervals: dict[tuple[str, str], float] = field(default_factory=dict)
    sources: dict[str, PrometheusSource] = field(default_factory=dict)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    uids: dict[tuple[str, str], str] = field(default_factory=dict)
    errors: Any = field(default_factory=lambda: handlers.ErrorLog())
    # predicted vs observed (autoscale.drift): uid -> learned correction; key -> the last chosen
    # candidate (its prediction), the corrected re-plan (factors it was made with, layout) and the
    # layout last suggested in an event
    corrections: dict[str, Correction] = field(default_factory=dict)
    choices: dict[tuple[str, str], Any] = field(default_factory=dict)
    replans: dict[tuple[str, str], tuple[tuple[float, float], str | None, Any]] = field(default_factory=dict)
    replan_told: dict[tuple[str, str], str] = field(default_factory=dict)
    capacities: dict[tuple[str, str], tuple[float | None, float | None]] = field(default_factory=dict)

    def due(self, key: tuple[str, str], now_mono: float) -> bool:
        last = self.last_eval.get(key)
        return last is None or now_mono - last >= self.intervals.get(key, MAX_INTERVAL_S)

    def forget(self, key: tuple[str, str]) -> None:
        for d in (self.conditions, self.last_eval, self.intervals, self.locks, self.choices, self.replans,
                  self.replan_told, self.capacities):
            d.pop(key, None)
        uid = self.uids.pop(key, "")
        self.states.pop(uid, None)
        self.role_states.pop(uid, None)
        self.corrections.pop(uid, None)
        self.reconciler.autoscaler_conditions.pop(key, None)

    def allowed_endpoints(self) -> dict[str, str]:
        if self.endpoints is None:
            self.endpoints = parse_endpoints(None, self.default_prometheus_url)
        return self.endpoints

    def _source(self, url: str, name: str | None = None) -> PrometheusSource:
        src = self.sources.get(url)
        if src is None:
            src = self.sources[url] = PrometheusSource(url, PROMETHEUS_TIMEOUT_S, name=name)
        return src

    async def hook(self, namespace: str, name: str) -> None:
        """`handlers.AUTOSCALE_HOOK`: evaluate an autoscaled object unless evaluated within its interval
        (objects never autoscaled cost nothing: the loop's list finds the new ones)."""
        key = (namespace, name)
        if key in self.last_eval and self.due(key, time.monotonic()):
            await self.evaluate(namespace, name)

    async def evaluate(self, namespace: str, name: str) -> Any:
        key = (namespace, name)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            self.last_eval[key] = time.monotonic()
            return await self._evaluate(namespace, name)

    async def _evaluate(self, namespace: str, name: str) -> Any:
        """One evaluation: a `policy.Decision`, an `autoscale.roles.RolesDecision` for a disaggregated
        deployment (controller.autoscaling_roles), or None when there is nothing to decide."""
        from pydantic import ValidationError

        from meshplan.api.models import LLMDeployment
        from meshplan.controller.reconcile import API_VERSION, KIND, PLAN_ANNOTATION, desired_replicas

        key = (namespace, name)
        kube = self.reconciler.kube
        body = await kube.get(API_VERSION, KIND, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(key)
            return None
        try:
            spec = LLMDeployment.from_manifest(dict(body)).spec
        except ValidationError:
            return None                      # the reconciler reports InvalidSpec
        if not spec.autoscaling.enabled:
            # Turned off: spec.replicas rules again; drop our conditions and the last decision.
            had = self.reconciler.autoscaler_conditions.get(key) is not None
            if (body.get("status") or {}).get("autoscaling") is not None:
                await kube.patch_status(API_VERSION, KIND, namespace, name, {"autoscaling": None})
                had = True
            self.forget(key)
            if had:
                self.enqueue(key)
            return None
        self.intervals[key] = evaluation_interval_s(spec.autoscaling.up_window_seconds)
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        uid = meta.get("uid", "")
        self.uids[key] = uid
        prev_auto = status.get("autoscaling") or {}
        from meshplan.controller.decide_disagg import is_disaggregated_spec

        if is_disaggregated_spec(spec):
            # per role (controller.autoscaling_roles) when the reconciler deploys it disaggregated; auto that
            # kept aggregated serving goes on below; before the reconciler's first plan there is nothing to size
            from meshplan.controller import autoscaling_roles

            dplan = autoscaling_roles.disaggregated_plan(self.reconciler, uid)
            if dplan is not None:
                return await autoscaling_roles.evaluate(self, body, spec, dplan)
            cached = getattr(self.reconciler, "disagg_plans", {}).get(uid)
            if cached is None or cached[1].disaggregated:
                return None
        current = desired_replicas(spec, status)
        state = self.states.get(uid)
        if state is None or state.desired_replicas != current:
            # First look, or the count was changed by someone else (bounds in the spec): start from it.
            state = replace(state, desired_replicas=current) if state is not None else \
                state_from_status(prev_auto, current, self.clock())

        pods = await kube.list("v1", "Pod", namespace, f"{LABEL_DEPLOYMENT}={name}")
        stored_plan = (meta.get("annotations") or {}).get(PLAN_ANNOTATION)
        capacity = await asyncio.to_thread(self._capacity, namespace, name, uid, spec, pods, state.desired_replicas,
                                           status.get("readyReplicas"), stored_plan, status.get("plan"))
        now = self.clock()
        snapshot = MetricsSnapshot.failed(METRICS_UNAVAILABLE, "not evaluated", now)
        extra: dict[str, float | None] = {}
        if isinstance(capacity, str):
            decision = held_decision(state, NO_PLAN, capacity)
        else:
            try:
                config = config_from_spec(spec, capacity.gpus_per_replica)
                queries = queries_for(spec, namespace, name)
            except (AutoscaleConfigError, QueryInputError) as exc:
                decision = held_decision(state, INVALID_AUTOSCALING, str(exc))
            else:
                endpoints = self.allowed_endpoints()
                picked = resolve_prometheus(spec.autoscaling, endpoints)
                if isinstance(picked, str) and (spec.autoscaling.prometheus is not None
                                                or spec.autoscaling.prometheus_url is not None):
                    decision = held_decision(state, PROMETHEUS_NOT_ALLOWED, picked)   # nothing is fetched
                else:
                    if isinstance(picked, str):
                        snapshot = MetricsSnapshot.failed(METRICS_UNAVAILABLE, picked, now)
                    else:
                        snapshot = await self._source(picked[1], picked[0]).fetch_async(queries, now)
                        if snapshot.ok:
                            extra = await self._source(picked[1], picked[0]).fetch_values_async(
                                observed_queries_for(spec, namespace, name, queries), now)
                    capacity = self._observe(key, uid, spec, status, snapshot, extra, capacity, now)
                    decision = decide(state, snapshot, config, capacity, now)

        self.states[uid] = decision.state
        now_dt = datetime.fromtimestamp(now, timezone.utc)
        doc = status_document(decision, snapshot, now_dt, prev_auto)
        observed_doc, drift_cond = None, None
        if uid in self.corrections and not isinstance(capacity, str):
            observed_doc, drift_cond = await self._observed_status(key, uid, body, spec, snapshot, extra, now)
        wrote = False
        prev_obs = status.get("observed") or {}
        write_observed = observed_doc is not None and observed_needs_write(prev_obs, observed_doc)
        if needs_write(prev_auto, doc, now_dt) or write_observed:
            patch = {"autoscaling": doc}
            if observed_doc is not None:
                patch["observed"] = observed_doc
            await kube.patch_status(API_VERSION, KIND, namespace, name, patch)
            wrote = True
        drift_cond = reported_drift_condition(drift_cond, prev_obs, observed_doc, wrote)
        before = self.conditions.get(key, {})
        after = merge_conditions(before, decision.condition_tuples() + ([drift_cond] if drift_cond else []))
        self.conditions[key] = after
        self.reconciler.autoscaler_conditions[key] = tuple(after.values())
        conditions_changed = {t: c[1:3] for t, c in before.items()} != {t: c[1:3] for t, c in after.items()}
        event = scaling_event(decision)
        if event is not None:
            log.info("%s/%s: %s", namespace, name, event[2])
            await self.reconciler._event(body, *event)
            try:
                from meshplan import metrics

                metrics.count_scaling(direction(decision) or "up", decision.reason)
            except Exception:  # noqa: BLE001 - metrics never break the loop
                pass
        if decision.changed or conditions_changed or (wrote and prev_auto.get("toReplicas") != doc.get("toReplicas")):
            self.enqueue(key)
        return decision

    def _capacity(self, namespace: str, name: str, uid: str, spec: Any, pods: list, current: int,
                  ready: Any, stored_plan: str | None = None,
                  previous_plan: Mapping[str, Any] | None = None) -> ReplicaCapacity | str:
        """The policy's capacity input (worker thread), or why there is none yet."""
        from meshplan.controller.decide import live_groups, target_for
        from meshplan.placement import request_for_layout

        rec = self.reconciler
        topology = rec.world.topology_without(namespace, name)
        plan = rec._plan(uid, spec, topology, stored_plan, previous_plan)   # cached per object: reconcile's plan
        if isinstance(plan, str):
            return plan
        if plan.choice is None:
            return f"no plan fits the free GPUs: {plan.reason}"
        target = target_for(spec, plan, topology, bool(rec.compute_domains))
        selector = dict(target.pods.node_selector)
        layout = replace(plan.choice.layout, dp=1)
        request = request_for_layout(layout, target.gpus_per_node or 1, replicas=0, product=target.product,
                                     node_selector=selector)
        groups = [g for g in live_groups(pods).values() if g.complete() and all(g.nodes())]
        existing = {pos: [n or "" for n in g.nodes()] for pos, g in enumerate(groups[:current])}
        self.choices[(namespace, name)] = plan.choice
        rps, concurrency = per_replica_capacity(plan.choice, spec.workload.output_tokens)
        try:
            cfg = config_from_spec(spec, request.gpus_per_replica)
            upper = cfg.max_replicas
        except AutoscaleConfigError:
            upper = current
        topo = topology.select(selector)
        cap = replica_capacity(request, topo, current=current, max_replicas=max(upper, current), existing=existing,
                               requests_per_s_at_slo=rps, concurrency_at_slo=concurrency,
                               ready_replicas=ready if isinstance(ready, int) else None)
        # The ScalingLimited message shows what is free beside this deployment's own running groups.
        own = [(p.node, p.gpus) for g in groups for p in g.pods.values() if p.node]
        free = topo.with_usage(own).free_gpus_by_domain()
        return replace(cap, free_gpus_by_domain=tuple(sorted(free.items())))

    def _observe(self, key: tuple[str, str], uid: str, spec: Any, status: Mapping[str, Any],
                 snapshot: MetricsSnapshot, extra: Mapping[str, float | None], capacity: Any,
                 now: float) -> Any:
        """Fold this evaluation's observed p50 latencies into the deployment's correction (restored
        from status.observed after a restart) and return the capacity the correction implies."""
        if isinstance(capacity, str):
            return capacity
        choice = self.choices.get(key)
        pred = getattr(choice, "prediction", None)
        prev = self.corrections.get(uid)
        if prev is None:
            prev = correction_from_status(status.get("observed"))
        itl50, ttft50 = (extra.get("itl_p50_s"), extra.get("ttft_p50_s")) if snapshot.ok else (None, None)
        corr = update_correction(
            prev, observed_itl_ms=None if itl50 is None else itl50 * 1000.0,
            predicted_itl_ms=getattr(pred, "tpot_ms", None),
            observed_ttft_ms=None if ttft50 is None else ttft50 * 1000.0,
            predicted_ttft_ms=getattr(pred, "median_ttft_ms", None), now=now)     # the observed p50 against the median
        self.corrections[uid] = corr
        if pred is None or not corr.learned:
            self.capacities[key] = (capacity.requests_per_s_at_slo, capacity.requests_per_s_at_slo)
            return capacity
        rps, conc = corrected_capacity(pred, spec.workload.output_tokens, corr)
        self.capacities[key] = (rps, capacity.requests_per_s_at_slo)
        return replace(capacity, requests_per_s_at_slo=rps, concurrency_at_slo=conc)

    async def _observed_status(self, key: tuple[str, str], uid: str, body: Mapping[str, Any], spec: Any,
                               snapshot: MetricsSnapshot, extra: Mapping[str, float | None],
                               now: float) -> tuple[dict[str, Any], tuple[str, str, str, str]]:
        """status.observed and the PredictionDrift condition; on drift, the re-plan with the corrected
        figures: an event when it chooses another layout, and with spec.replan onDrift its adoption."""
        corr = self.corrections[uid]
        cond = drift_condition(corr)
        status = body.get("status") or {}
        plan_doc = status.get("plan") or {}
        current = plan_doc.get("layout")
        replan_layout = None
        if cond[1] == "True" and current:
            tag = (round(math.log(corr.itl), 1), round(math.log(corr.ttft), 1))
            cached = self.replans.get(key)
            if cached is None or cached[0] != tag:
                layout, plan = await asyncio.to_thread(self._corrected_plan, key, spec, corr)
                self.replans[key] = cached = (tag, layout, plan)
            layout, plan = cached[1], cached[2]
            action = replan_action(getattr(spec, "replan", "manual"), current, layout, self.replan_told.get(key))
            if layout and layout != current:
                replan_layout = layout
            elif layout == current:
                self.replan_told.pop(key, None)        # the running layout is the corrected one (adopted)
            if action is not None:
                self.replan_told[key] = layout
                why = (f"observed latency is x{corr.itl:.3g} (ITL) / x{corr.ttft:.3g} (TTFT) the plan's prediction; "
                       f"planned again with the corrected figures, {current} would become {layout}")
                if action == "adopt":
                    self._adopt(key, spec, plan)
                    await self.reconciler._event(body, "Normal", REPLAN_ADOPTED,
                                                 f"{why}; spec.replan is onDrift: adopting it (new groups first)")
                    self.enqueue(key)
                else:
                    await self.reconciler._event(body, "Normal", REPLAN_SUGGESTED,
                                                 f"{why}; spec.replan is manual: not changed (set spec.replan: "
                                                 "onDrift to let meshplan adopt it)")
        ready = status.get("readyReplicas")
        gpus = plan_doc.get("gpusPerReplica")
        gpus_serving = ready * gpus if isinstance(ready, int) and isinstance(gpus, int) and ready > 0 else None
        doc = observed_document(
            percentile=float(spec.slo.percentile) if spec.slo is not None else 99.0,
            at_slo={"ttft_s": snapshot.ttft_s, "itl_s": snapshot.itl_s} if snapshot.ok else {},
            p50={"ttft_s": extra.get("ttft_p50_s"), "itl_s": extra.get("itl_p50_s")},
            p99={"ttft_s": extra.get("ttft_p99_s"), "itl_s": extra.get("itl_p99_s")},
            generation_tokens_per_s=extra.get("generation_tokens_per_s"), gpus_serving=gpus_serving,
            predicted=plan_doc.get("predicted"), correction=corr, replan_layout=replan_layout, now=now,
            capacity_rps=self.capacities.get(key, (None, None))[0],
            predicted_capacity_rps=self.capacities.get(key, (None, None))[1])
        return doc, cond

    def _corrected_plan(self, key: tuple[str, str], spec: Any, corr: Correction) -> tuple[str | None, Any]:
        """(layout label, plan) the planner chooses with the corrected predictor (worker thread)."""
        from meshplan.planner import plan_for_spec

        topology = self.reconciler.world.topology_without(*key)
        try:
            plan = plan_for_spec(spec, topology.select(dict(spec.gpus.node_selector or {})),
                                 predictor=corrected_predictor(corr))
        except ValueError:
            return None, None
        if plan.choice is None:
            return None, None
        return plan.choice.layout.label(), plan

    def _adopt(self, key: tuple[str, str], spec: Any, plan: Any) -> None:
        """spec.replan onDrift: the corrected plan becomes the reconciler's plan for this spec and fleet
        (same plan key, annotation rewritten, so a restart keeps it); reconcile then moves the groups
        through its normal make-before-break path."""
        from meshplan.controller.reconcile import plan_key

        rec = self.reconciler
        uid = self.uids.get(key, "")
        if not uid or plan is None:
            return
        rec.plans[uid] = (plan_key(spec, rec.world.topology_without(*key)), plan)
        rec.plans_moved.add(uid)

    async def run(self, keys: Callable[[], list]) -> None:
        """Evaluate every autoscaled object when due; at most CONCURRENT_EVALUATIONS at once.

        An object that leaves the list (autoscaling turned off, or deleted) is evaluated once
        more: that evaluation clears its conditions and last decision.
        """
        running: dict[tuple[str, str], asyncio.Task] = {}
        seen: set[tuple[str, str]] = set()
        leaving: set[tuple[str, str]] = set()
        while True:
            for key, task in list(running.items()):
                if task.done():
                    del running[key]
            current = {tuple(k) for k in keys()}
            leaving = (leaving | (seen - current)) - current
            seen = current
            now = time.monotonic()
            for key in sorted(current) + sorted(leaving):
                if key in running or len(running) >= CONCURRENT_EVALUATIONS:
                    continue
                if key in leaving:
                    leaving.discard(key)
                elif not self.due(key, now):
                    continue
                running[key] = asyncio.create_task(self._guarded(*key))
            await asyncio.sleep(LOOP_TICK_S)

    async def _guarded(self, namespace: str, name: str) -> None:
        try:
            if not await handlers.may_act(namespace):
                return      # a standby (kopf peering): the leader evaluates and writes status
            await self.evaluate(namespace, name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one object's failure must not stop the others
            self.errors.failed((namespace, name), exc, "autoscaling")     # one line per change of failure
        else:
            self.errors.succeeded((namespace, name), "autoscaling")


AUTOSCALER: Autoscaler | None = None


# ----------------------------------------------------------------------------- kopf wiring


@kopf.index(handlers.GROUP, handlers.VERSION, handlers.PLURAL)
def autoscaled_llmds(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict[str, Any] | None:
    """LLMDeployments with spec.autoscaling.enabled (the loop's work list)."""
    if (spec.get("autoscaling") or {}).get("enabled") is True:
        return {indexes.ALL_KEY: (namespace, name)}
    return None


@kopf.on.startup()
async def start_autoscaler(autoscaled_llmds: kopf.Index, **_: Any) -> None:
    async def main() -> None:
        global AUTOSCALER
        while handlers.STATE.reconciler is None:      # the handlers' startup creates it
            await asyncio.sleep(0.1)
        AUTOSCALER = Autoscaler(handlers.STATE.reconciler, handlers.STATE.enqueue, DEFAULT_PROMETHEUS_URL,
                                endpoints=parse_endpoints(PROMETHEUS_ENDPOINTS, DEFAULT_PROMETHEUS_URL))
        handlers.AUTOSCALE_HOOK = AUTOSCALER.hook
        # kopf's index, plus what the resync's LIST found autoscaled where kopf's watches are blind (L1)
        await AUTOSCALER.run(lambda: indexes.values(autoscaled_llmds, indexes.ALL_KEY)
                             + sorted(handlers.STATE.missed_autoscaled))

    _TASKS.append(asyncio.create_task(main()))


@kopf.on.cleanup()
async def stop_autoscaler(**_: Any) -> None:
    for t in _TASKS:
        t.cancel()
    await asyncio.gather(*_TASKS, return_exceptions=True)
    _TASKS.clear()
    if AUTOSCALER is not None:
        for src in AUTOSCALER.sources.values():
            src.close()


_TASKS: list[asyncio.Task] = []

__all__ = ["Autoscaler", "DEFAULT_PROMETHEUS_URL", "EndpointError", "endpoint_url_problem", "parse_endpoints",
           "resolve_prometheus", "config_from_spec", "evaluation_interval_s", "merge_conditions",
           "needs_write", "per_replica_capacity", "queries_for", "rate_window_s", "scaling_event",
           "state_from_status", "status_document"]
