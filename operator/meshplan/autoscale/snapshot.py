"""One evaluation's serving metrics, and the pure check of whether to trust them.

The autoscaler must never act on numbers it cannot trust: Prometheus down,
exporters no longer scraped, NaN/Inf from a broken histogram, a negative
gauge. `MetricsSnapshot` carries the numbers *and* why they are unusable;
`assess` is the single place that decides, used both by the source (for what
it can see: transport errors, empty results, non-finite values, old scrapes)
and by the policy (with its own clock and the SLO's targets, e.g. "no ITL
samples although requests are being served").

Latency fields are None when the histogram had no observations in the window
(`histogram_quantile` over a zero rate is NaN). That is normal when a
deployment is idle, so it is only a problem while requests are being served.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Condition reasons (also used as Decision.reason when metrics are unusable).
METRICS_UNAVAILABLE = "MetricsUnavailable"
METRICS_STALE = "MetricsStale"
METRICS_INVALID = "MetricsInvalid"
METRIC_PROBLEMS = (METRICS_UNAVAILABLE, METRICS_STALE, METRICS_INVALID)
# Usable, but some signals have no series (ScalingActive stays True with this reason and names them).
METRICS_PARTIAL = "MetricsPartial"
SIGNALS = ("ttft_s", "itl_s", "request_rate_per_s", "queue_depth", "running", "kv_usage")

# A scrape may land a little after the query's evaluation time; ignore tiny negative ages.
_CLOCK_SLACK_S = 1.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """Serving metrics of one deployment at one instant (units in the names)."""

    ok: bool
    ttft_s: float | None = None              # chosen percentile of time to first token
    itl_s: float | None = None               # chosen percentile of inter-token latency
    request_rate_per_s: float | None = None  # completed requests per second, summed over replicas
    queue_depth: float | None = None         # requests waiting, summed over replicas
    running: float | None = None             # requests running, summed over replicas
    sample_age_s: float | None = None        # seconds since the newest scrape of any replica
    sample_time: float | None = None         # unix seconds at which the queries were evaluated
    kv_usage: float | None = None            # KV-cache usage of the fullest replica, 0..1 (reported only)
    # signals whose query found no series at all, each "signal (metric names tried)": the rest
    # are still used (see docs/autoscaling.md "When a signal is missing")
    missing: tuple[str, ...] = ()
    problem: str = ""                        # one of METRIC_PROBLEMS when not ok
    error: str = ""                          # human-readable why

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite numbers become strings) for status and events."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            out[k] = repr(v) if isinstance(v, float) and not math.isfinite(v) else v
        out["missing"] = list(self.missing)
        return out

    def is_missing(self, signal: str) -> bool:
        return any(m == signal or m.startswith(signal + " ") for m in self.missing)

    @classmethod
    def failed(cls, problem: str, error: str, sample_time: float | None = None) -> MetricsSnapshot:
        return cls(ok=False, problem=problem, error=error, sample_time=sample_time)


_FIELDS_NON_NEGATIVE = ("ttft_s", "itl_s", "request_rate_per_s", "queue_depth", "running", "kv_usage")


def assess(
    snapshot: MetricsSnapshot,
    *,
    now: float | None,
    max_age_s: float,
    require_ttft: bool = False,
    require_itl: bool = False,
) -> tuple[str, str]:
    """Return (problem, message): problem is "" when the snapshot is usable.

    Order matters: a source-reported problem wins, then staleness (the
    numbers may be fine but old), then nonsensical values, then missing ones.
    """
    if not snapshot.ok or snapshot.problem:
        return (snapshot.problem or METRICS_UNAVAILABLE, snapshot.error or "metrics source reported a failure")
    if now is not None and snapshot.sample_time is not None and now - snapshot.sample_time > max_age_s:
        return (METRICS_STALE, f"metrics were evaluated {now - snapshot.sample_time:.0f}s ago (limit {max_age_s:.0f}s)")
    age = snapshot.sample_age_s
    if age is not None:
        if not math.isfinite(age) or age < -_CLOCK_SLACK_S:
            return (METRICS_INVALID, f"sample age {age!r} (seconds) is not a valid age")
        if age > max_age_s:
            return (METRICS_STALE, f"newest engine scrape is {age:.0f}s old (limit {max_age_s:.0f}s); are the exporters still scraped?")
    for name in _FIELDS_NON_NEGATIVE:
        v = getattr(snapshot, name)
        if v is None:
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return (METRICS_INVALID, f"{name} is {v!r}, not a finite number")
        if v < 0:
            return (METRICS_INVALID, f"{name} is {v!r}, negative")
    # Each signal degrades on its own (`missing`, reported as MetricsPartial by the policy);
    # only a deployment none of whose signals has any series is unusable.
    if age is None or all(snapshot.is_missing(n) for n in SIGNALS[:5]):
        return (METRICS_UNAVAILABLE, "no series for any serving metric; are the engine pods scraped and "
                "labelled as the queries expect?" + (f" (missing: {'; '.join(snapshot.missing)})" if snapshot.missing else ""))
    for name in ("request_rate_per_s", "queue_depth", "running"):
        if getattr(snapshot, name) is None and not snapshot.is_missing(name):
            return (METRICS_UNAVAILABLE, f"no samples for {name}")
    serving = (snapshot.request_rate_per_s or 0) > 0 or (snapshot.running or 0) > 0
    for name, required in (("ttft_s", require_ttft), ("itl_s", require_itl)):
        # a histogram with no series at all is a missing signal (partial), not this
        if required and serving and getattr(snapshot, name) is None and not snapshot.is_missing(name):
            return (
                METRICS_UNAVAILABLE,
                f"no {name} samples while serving {snapshot.request_rate_per_s or 0:.3g} req/s "
                f"({snapshot.running or 0:.0f} running); check the histogram name",
            )
    return ("", "")
