"""Reads one deployment's serving metrics from Prometheus.

This is the thin network edge of the autoscaler. It runs the `QuerySet` from
`promql` through prometheus-api-client's `PrometheusConnect.custom_query`
(the Prometheus HTTP API `/api/v1/query`), all at one evaluation time, and
returns a `MetricsSnapshot`. It never raises into the controller: connection
refused, timeouts, HTTP errors, garbage JSON, empty results and NaN/Inf/
negative values all come back as a snapshot with `ok=False`, a condition
reason (`MetricsUnavailable`, `MetricsStale`, `MetricsInvalid`) and a message.

The client's default retry (3 tries with backoff) is replaced by a single try:
the controller's timer is the retry loop, and a slow failure would hold up
the evaluation of every other deployment sharing the worker thread.

`fetch` blocks (requests); kopf handlers are coroutines, so call
`fetch_async`, which runs it in a worker thread.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import requests
import urllib3
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from meshplan.autoscale.promql import QuerySet
from meshplan.autoscale.snapshot import (
    METRICS_INVALID,
    METRICS_UNAVAILABLE,
    MetricsSnapshot,
    assess,
)


class _QueryProblem(Exception):
    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem


class PrometheusSource:
    """`PrometheusSource(url, timeout_s).fetch(queries) -> MetricsSnapshot`."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        *,
        max_sample_age_s: float = 90.0,
        headers: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_sample_age_s = max_sample_age_s
        self._clock = clock
        self._client = PrometheusConnect(
            url=self.url,
            headers=headers,
            retry=Retry(total=0, connect=0, read=0, status=0, raise_on_status=False),
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._client.close()

    def fetch(self, queries: QuerySet, now: float | None = None) -> MetricsSnapshot:
        """Evaluate all queries at `now` (default: the clock) and return a snapshot."""
        eval_time = self._clock() if now is None else now
        try:
            values = {
                name: self._scalar(name, q, eval_time, allow_empty=name in ("ttft_s", "itl_s"))
                for name, q in queries.as_dict().items()
            }
        except _QueryProblem as exc:
            return MetricsSnapshot.failed(exc.problem, str(exc), sample_time=eval_time)
        except Exception as exc:  # noqa: BLE001 - the controller must never see an exception from here
            return MetricsSnapshot.failed(METRICS_UNAVAILABLE, f"unexpected error querying Prometheus: {exc!r}", eval_time)

        # An idle histogram yields NaN (0/0 rates); that is "no samples", not garbage.
        for name in ("ttft_s", "itl_s"):
            if values[name] is not None and math.isnan(values[name]):
                values[name] = None
        snapshot = MetricsSnapshot(ok=True, sample_time=eval_time, **values)
        problem, message = assess(snapshot, now=eval_time, max_age_s=self.max_sample_age_s)
        if problem:
            return MetricsSnapshot(
                ok=False, problem=problem, error=message, sample_time=eval_time, **values
            )
        return snapshot

    async def fetch_async(self, queries: QuerySet, now: float | None = None) -> MetricsSnapshot:
        return await asyncio.to_thread(self.fetch, queries, now)

    def _scalar(self, name: str, query: str, eval_time: float, allow_empty: bool) -> float | None:
        try:
            result = self._client.custom_query(query, params={"time": f"{eval_time:.3f}"})
        except requests.exceptions.Timeout:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"Prometheus at {self.url} timed out after {self.timeout_s}s") from None
        except requests.exceptions.ConnectionError as exc:
            # With retries off, urllib3 wraps the cause in MaxRetryError; unwrap it for the message.
            cause = getattr(exc.args[0], "reason", exc) if exc.args else exc
            # (urllib3's NewConnectionError subclasses its TimeoutError, hence the first test)
            refused = isinstance(cause, urllib3.exceptions.NewConnectionError)
            if not refused and isinstance(cause, TimeoutError | urllib3.exceptions.TimeoutError):
                raise _QueryProblem(
                    METRICS_UNAVAILABLE, f"Prometheus at {self.url} timed out after {self.timeout_s}s"
                ) from None
            raise _QueryProblem(METRICS_UNAVAILABLE, f"cannot reach Prometheus at {self.url}: {_short(cause)}") from None
        except PrometheusApiClientException as exc:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"Prometheus rejected the {name} query: {_short(exc)}") from None
        except ValueError as exc:  # JSON decoding errors subclass ValueError
            raise _QueryProblem(METRICS_INVALID, f"Prometheus answered the {name} query with invalid JSON: {_short(exc)}") from None
        except (KeyError, TypeError) as exc:
            raise _QueryProblem(METRICS_INVALID, f"unexpected response shape for {name}: {exc!r}") from None
        if not isinstance(result, list):
            raise _QueryProblem(METRICS_INVALID, f"{name}: expected a vector result, got {type(result).__name__}")
        if not result:
            if allow_empty:
                return None
            raise _QueryProblem(
                METRICS_UNAVAILABLE,
                f"no series for {name}; are the engine pods scraped and labelled as the query expects? ({query})",
            )
        if len(result) > 1:
            raise _QueryProblem(METRICS_INVALID, f"{name}: expected one series, got {len(result)}")
        try:
            raw = result[0]["value"][1]
            return float(raw)
        except (KeyError, IndexError, TypeError, ValueError):
            raise _QueryProblem(METRICS_INVALID, f"{name}: sample {result[0]!r} has no numeric value") from None


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."
