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

Hostile endpoints (issue 17, finding 2). Which endpoint is queried is the
cluster admin's choice (`controller.autoscaling.resolve_prometheus`: a CR picks
an allowed endpoint by name); this module makes the fetch itself safe:
- no redirect is followed (a 3xx is a failure: `redirect refused`), so an
  allowed host cannot bounce the operator to another one;
- bounded: connect and read timeouts of `timeout_s` each, the body read for at
  most `timeout_s` and `MAX_RESPONSE_BYTES`;
- nothing of the response reaches a message: what is reported is the endpoint's
  name, the query's name, an HTTP status code, an exception class, a count or a
  number parsed as float; never the body, a label, or an error text the server
  sent (`PrometheusApiClientException` carries the body: only its status code is
  kept).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from typing import Any

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


_EMPTY = object()                       # a query that found no series (vs NaN: series, no observations)
MAX_RESPONSE_BYTES = 4 * 1024 * 1024    # an instant query of one series is a few hundred bytes


class _Refused(requests.exceptions.RequestException):
    """A response the source will not read: a redirect, too large, too slow."""


def _guard_response(timeout_s: float) -> Callable[..., Any]:
    """A requests response hook: refuse redirects, read the body bounded in size and time."""

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
        if response.is_redirect or 300 <= response.status_code < 400:
            response.close()
            raise _Refused(f"HTTP {response.status_code} redirect refused (redirects are not followed)")
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
            response.close()
            raise _Refused(f"response of {int(length)} bytes refused (limit {MAX_RESPONSE_BYTES})")
        deadline = time.monotonic() + timeout_s
        chunks, size = [], 0
        while True:
            # decoded (Prometheus gzips its answers when asked, and requests asks): the limit is on what is kept
            chunk = (response.raw.read1(65536, decode_content=True) if hasattr(response.raw, "read1")
                     else response.raw.read(65536, decode_content=True))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                response.close()
                raise _Refused(f"response over {MAX_RESPONSE_BYTES} bytes refused")
            if time.monotonic() > deadline:
                response.close()
                raise requests.exceptions.Timeout(f"body not read within {timeout_s}s")
        response._content = b"".join(chunks)      # requests' own cache of the body (what .content/.json read)
        response._content_consumed = True
        return response

    return hook


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
        name: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_sample_age_s = max_sample_age_s
        self._clock = clock
        # How messages name the endpoint: the admin's name for it (the URL only when unnamed).
        self.label = f"{name!r}" if name else f"at {self.url}"
        session = requests.Session()
        session.max_redirects = 0              # belt and braces: the hook refuses any 3xx first
        session.trust_env = False              # no proxy or netrc from the operator's environment
        # The hook reads the raw body; Prometheus gzips its answers when the client accepts gzip
        # (requests asks for it by default), and raw bytes are not decoded: a real Prometheus then
        # read as "invalid JSON". Ask for the identity encoding (also keeps MAX_RESPONSE_BYTES the
        # size of what is parsed: no decompression bomb).
        session.headers["Accept-Encoding"] = "identity"
        session.hooks["response"].append(_guard_response(timeout_s))
        self._client = PrometheusConnect(
            url=self.url,
            headers=headers,
            retry=Retry(total=0, connect=0, read=0, status=0, raise_on_status=False, redirect=0),
            timeout=timeout_s,
            session=session,
        )

    def close(self) -> None:
        self._client.close()

    def fetch(self, queries: QuerySet, now: float | None = None) -> MetricsSnapshot:
        """Evaluate all queries at `now` (default: the clock) and return a snapshot."""
        eval_time = self._clock() if now is None else now
        try:
            # Every signal but the sample age may have no series: it is then listed as missing
            # (with the names it tried) and the others are still used.
            values = {
                name: self._scalar(name, q, eval_time, allow_empty=name != "sample_age_s")
                for name, q in queries.as_dict().items()
            }
        except _QueryProblem as exc:
            return MetricsSnapshot.failed(exc.problem, str(exc), sample_time=eval_time)
        except Exception as exc:  # noqa: BLE001 - the controller must never see an exception from here
            return MetricsSnapshot.failed(
                METRICS_UNAVAILABLE, f"unexpected error querying Prometheus {self.label}: {type(exc).__name__}",
                eval_time)

        # An idle histogram yields NaN (0/0 rates); that is "no samples", not garbage.
        for name in ("ttft_s", "itl_s"):
            if isinstance(values[name], float) and math.isnan(values[name]):
                values[name] = None
        missing = tuple(
            f"{name} (no series of {', '.join(queries.metric_names(name))})"
            for name in values
            if name != "sample_age_s" and values[name] is _EMPTY
        )
        values = {k: (None if v is _EMPTY else v) for k, v in values.items()}
        snapshot = MetricsSnapshot(ok=True, sample_time=eval_time, missing=missing, **values)
        problem, message = assess(snapshot, now=eval_time, max_age_s=self.max_sample_age_s)
        if problem:
            return MetricsSnapshot(
                ok=False, problem=problem, error=message, sample_time=eval_time, missing=missing, **values
            )
        return snapshot

    async def fetch_async(self, queries: QuerySet, now: float | None = None) -> MetricsSnapshot:
        return await asyncio.to_thread(self.fetch, queries, now)

    def fetch_values(self, queries: dict[str, str], now: float | None = None) -> dict[str, float | None]:
        """Evaluate extra scalar queries (status.observed's p50/p99, tokens/s) at `now`: each value,
        or None when it has no series, is not finite, or its query failed (these only inform
        status; the decision rests on `fetch`)."""
        eval_time = self._clock() if now is None else now
        out: dict[str, float | None] = {}
        for name, q in queries.items():
            try:
                v = self._scalar(name, q, eval_time, allow_empty=True)
            except _QueryProblem:
                v = None
            except Exception:  # noqa: BLE001 - never an exception into the controller
                v = None
            out[name] = v if isinstance(v, float) and math.isfinite(v) else None
        return out

    async def fetch_values_async(self, queries: dict[str, str], now: float | None = None) -> dict[str, float | None]:
        return await asyncio.to_thread(self.fetch_values, queries, now)

    def _scalar(self, name: str, query: str, eval_time: float, allow_empty: bool) -> float | object:
        where = f"Prometheus {self.label}"
        try:
            result = self._client.custom_query(query, params={"time": f"{eval_time:.3f}"})
        except _Refused as exc:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"{where}, {name} query: {exc}") from None
        except requests.exceptions.Timeout:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"{where} timed out after {self.timeout_s}s") from None
        except requests.exceptions.ConnectionError as exc:
            # With retries off, urllib3 wraps the cause in MaxRetryError; unwrap it for the message.
            cause = getattr(exc.args[0], "reason", exc) if exc.args else exc
            # (urllib3's NewConnectionError subclasses its TimeoutError, hence the first test)
            refused = isinstance(cause, urllib3.exceptions.NewConnectionError)
            if not refused and isinstance(cause, TimeoutError | urllib3.exceptions.TimeoutError):
                raise _QueryProblem(METRICS_UNAVAILABLE, f"{where} timed out after {self.timeout_s}s") from None
            raise _QueryProblem(METRICS_UNAVAILABLE, f"cannot reach {where}: {type(cause).__name__}") from None
        except requests.exceptions.TooManyRedirects:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"{where}, {name} query: redirect refused") from None
        except PrometheusApiClientException as exc:
            # Its text is "HTTP Status Code <n> (<the body>)": keep the code, never the body.
            m = re.match(r"HTTP Status Code (\d{3})", str(exc))
            code = f"HTTP {m.group(1)}" if m else "an error"
            raise _QueryProblem(METRICS_UNAVAILABLE, f"{where} rejected the {name} query with {code}") from None
        except ValueError:  # JSON decoding errors subclass ValueError
            raise _QueryProblem(METRICS_INVALID, f"{where} answered the {name} query with invalid JSON") from None
        except (KeyError, TypeError) as exc:
            raise _QueryProblem(METRICS_INVALID,
                                f"unexpected response shape for {name} ({type(exc).__name__})") from None
        except requests.exceptions.RequestException as exc:
            raise _QueryProblem(METRICS_UNAVAILABLE, f"{where}, {name} query failed: {type(exc).__name__}") from None
        if not isinstance(result, list):
            raise _QueryProblem(METRICS_INVALID, f"{name}: expected a vector result, got {type(result).__name__}")
        if not result:
            if allow_empty:
                return _EMPTY
            raise _QueryProblem(
                METRICS_UNAVAILABLE,
                f"no series for {name}; are the engine pods scraped and labelled as the query expects? ({query})",
            )
        if len(result) > 1:
            raise _QueryProblem(METRICS_INVALID, f"{name}: expected one series, got {len(result)}")
        try:
            raw = result[0]["value"][1]
            if not isinstance(raw, str | int | float) or isinstance(raw, bool):
                raise TypeError
            return float(raw)
        except (KeyError, IndexError, TypeError, ValueError):
            # (the sample itself is remote text: not repeated)
            raise _QueryProblem(METRICS_INVALID, f"{name}: the sample has no numeric value") from None


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."
