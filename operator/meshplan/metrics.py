"""Operator metrics: what the reconciler did, how long it took, and why it scaled.

Why a module of its own: the controller should record facts with one call and
no knowledge of Prometheus, and the chart's metrics Service / ServiceMonitor
should scrape names that never change by accident. Every metric is defined
here, once, with its unit in the name (Prometheus naming conventions:
https://prometheus.io/docs/practices/naming/ -- `_total` for counters,
`_seconds` for durations).

API for the controller (all cheap, thread-safe, never raise):

    observe_reconcile(duration_s, ok)     one reconcile of one LLMDeployment
    observe_plan(duration_s)              one call of the pure planner
    count_scaling(direction, reason)      one DP-replica change decided by the autoscaler
    start_metrics_server(port)            serve /metrics over HTTP (`meshplan run --metrics-port`)

Metrics (exposed as `meshplan_*`):

    meshplan_reconciles_total{result="ok"|"error"}
    meshplan_reconcile_errors_total
    meshplan_reconcile_duration_seconds   (histogram)
    meshplan_plan_duration_seconds        (histogram)
    meshplan_scaling_decisions_total{direction="up"|"down", reason=...}

The metrics live in a private `CollectorRegistry` (`REGISTRY`) so tests and a
second operator in the same process never collide with the default registry.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

# Reconciles read the cluster, plan, place, render and apply: tens of
# milliseconds when nothing changed, seconds when many children are written.
RECONCILE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The planner sweeps layouts x batch sizes; benchmarks/plan_speed.py measures
# it in milliseconds for one node up to about a second for 1,024 GPUs.
PLAN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

SCALING_DIRECTIONS = ("up", "down")

RECONCILES = Counter(
    "meshplan_reconciles", "LLMDeployment reconciles, by result.", ["result"], registry=REGISTRY)
RECONCILE_ERRORS = Counter(
    "meshplan_reconcile_errors", "LLMDeployment reconciles that ended in an error.", registry=REGISTRY)
RECONCILE_DURATION = Histogram(
    "meshplan_reconcile_duration_seconds", "Wall time of one LLMDeployment reconcile.",
    buckets=RECONCILE_BUCKETS_S, registry=REGISTRY)
PLAN_DURATION = Histogram(
    "meshplan_plan_duration_seconds", "Wall time of one planner call (layout search and choice).",
    buckets=PLAN_BUCKETS_S, registry=REGISTRY)
SCALING_DECISIONS = Counter(
    "meshplan_scaling_decisions", "Data-parallel replica changes decided by the autoscaler.",
    ["direction", "reason"], registry=REGISTRY)

# Both result labels exist from the start, so `rate(...{result="error"})` is 0, not absent.
RECONCILES.labels(result="ok")
RECONCILES.labels(result="error")

_server_lock = threading.Lock()
_server_port: int | None = None


def observe_reconcile(duration_s: float, ok: bool) -> None:
    """Record one reconcile that took `duration_s` seconds; `ok=False` also counts an error."""
    RECONCILES.labels(result="ok" if ok else "error").inc()
    if not ok:
        RECONCILE_ERRORS.inc()
    RECONCILE_DURATION.observe(max(0.0, float(duration_s)))


def observe_plan(duration_s: float) -> None:
    """Record one planner call that took `duration_s` seconds."""
    PLAN_DURATION.observe(max(0.0, float(duration_s)))


def count_scaling(direction: str, reason: str) -> None:
    """Count one scaling decision. `direction` is "up" or "down"; `reason` a short
    CamelCase reason such as the autoscaler's condition reason (e.g. "TtftAboveSlo").

    A direction outside ("up", "down") is a programming error and raises ValueError,
    so a typo cannot silently create a new time series.
    """
    if direction not in SCALING_DIRECTIONS:
        raise ValueError(f"count_scaling: direction must be one of {SCALING_DIRECTIONS}, got {direction!r}")
    SCALING_DECISIONS.labels(direction=direction, reason=str(reason) or "Unknown").inc()


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> int:
    """Serve `REGISTRY` at http://addr:port/metrics in a daemon thread; returns the port.

    `meshplan run --metrics-port PORT` calls it (the chart passes `metrics.port`).
    Idempotent: a second call in the same process returns the port already
    serving instead of failing with "address in use". `port=0` picks a free
    port (tests).
    """
    global _server_port
    with _server_lock:
        if _server_port is not None:
            return _server_port
        server, _thread = start_http_server(int(port), addr=addr, registry=REGISTRY)
        _server_port = int(server.server_address[1])
        return _server_port
