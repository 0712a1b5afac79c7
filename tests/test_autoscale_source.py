"""PrometheusSource against a real HTTP server on loopback that speaks /api/v1/query.

The fake answers with the JSON shape of the Prometheus HTTP API
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries):
{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[t,"v"]}]}}
"""

from __future__ import annotations

import gzip
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from meshplan.autoscale.promql import build_queries, scope_matchers
from meshplan.autoscale.snapshot import METRICS_INVALID, METRICS_STALE, METRICS_UNAVAILABLE
from meshplan.autoscale.source import PrometheusSource

QUERIES = build_queries("vllm", scope_matchers("ns", "llama"))
NOW = 1_750_000_000.0

# query text -> value string ("NaN" etc. allowed) or None for an empty result
GOOD = {
    QUERIES.ttft_s: "0.42",
    QUERIES.itl_s: "0.031",
    QUERIES.request_rate_per_s: "12.5",
    QUERIES.queue_depth: "3",
    QUERIES.running: "40",
    QUERIES.sample_age_s: "7.5",
    QUERIES.kv_usage: "0.62",
}


class FakePrometheus:
    def __init__(self) -> None:
        self.values: dict[str, str | None] = dict(GOOD)
        self.raw_body: bytes | None = None
        self.status = 200
        self.delay_s = 0.0
        self.seen: list[dict[str, list[str]]] = []
        self.gzip_when_accepted = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                params = parse_qs(url.query)
                fake.seen.append(params)
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                if url.path != "/api/v1/query":
                    self.send_response(404)
                    self.end_headers()
                    return
                if fake.raw_body is not None:
                    body = fake.raw_body
                else:
                    q = params["query"][0]
                    t = float(params.get("time", [NOW])[0])
                    v = fake.values.get(q)
                    result = [] if v is None else [{"metric": {}, "value": [t, v]}]
                    body = json.dumps(
                        {"status": "success", "data": {"resultType": "vector", "result": result}}
                        if fake.status == 200
                        else {"status": "error", "errorType": "bad_data", "error": "parse error"}
                    ).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                # As Prometheus' HTTP API does: gzip when the client accepts it
                # (prometheus/common route.go / web/api compression handler).
                if fake.gzip_when_accepted and "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    yield fake
    fake.stop()


def source(url: str, **kw) -> PrometheusSource:
    return PrometheusSource(url, timeout_s=kw.pop("timeout_s", 2.0), clock=lambda: NOW, **kw)


def test_happy_path_parses_every_value(prom: FakePrometheus) -> None:
    snap = source(prom.url).fetch(QUERIES)
    assert snap.ok and snap.problem == "" and snap.error == ""
    assert (snap.ttft_s, snap.itl_s, snap.request_rate_per_s) == (0.42, 0.031, 12.5)
    assert (snap.queue_depth, snap.running, snap.sample_age_s) == (3.0, 40.0, 7.5)
    assert snap.sample_time == NOW
    # every query evaluated at the same instant
    assert {p["time"][0] for p in prom.seen} == {f"{NOW:.3f}"}
    assert {p["query"][0] for p in prom.seen} == set(GOOD)


def test_idle_histograms_are_none_not_invalid(prom: FakePrometheus) -> None:
    prom.values.update({QUERIES.ttft_s: "NaN", QUERIES.itl_s: None, QUERIES.request_rate_per_s: "0", QUERIES.running: "0"})
    snap = source(prom.url).fetch(QUERIES)
    assert snap.ok
    assert snap.ttft_s is None and snap.itl_s is None


def test_connection_refused() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    snap = source(f"http://127.0.0.1:{port}").fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_UNAVAILABLE
    assert "cannot reach Prometheus" in snap.error
    assert time.monotonic() - t0 < 5, "no retry backoff on a dead Prometheus"


def test_timeout(prom: FakePrometheus) -> None:
    prom.delay_s = 1.5
    snap = source(prom.url, timeout_s=0.3).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_UNAVAILABLE
    assert "timed out" in snap.error


def test_garbage_json(prom: FakePrometheus) -> None:
    prom.raw_body = b"<html>not json"
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_INVALID
    assert "invalid JSON" in snap.error


def test_wrong_shape(prom: FakePrometheus) -> None:
    prom.raw_body = b'{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}'
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_INVALID


def test_http_error(prom: FakePrometheus) -> None:
    prom.status = 400
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_UNAVAILABLE
    assert "rejected" in snap.error


def test_empty_result_for_a_gauge_is_a_missing_signal_not_a_failure(prom: FakePrometheus) -> None:
    # (was: the whole snapshot refused as MetricsUnavailable; issue 15 item 4)
    prom.values[QUERIES.queue_depth] = None
    snap = source(prom.url).fetch(QUERIES)
    assert snap.ok and snap.problem == ""
    assert snap.queue_depth is None and snap.running == 40.0 and snap.ttft_s == 0.42
    assert snap.missing == ("queue_depth (no series of vllm:num_requests_waiting)",)


def test_missing_request_counter_keeps_the_latencies(prom: FakePrometheus) -> None:
    prom.values[QUERIES.request_rate_per_s] = None
    snap = source(prom.url).fetch(QUERIES)
    assert snap.ok
    assert (snap.ttft_s, snap.itl_s, snap.kv_usage) == (0.42, 0.031, 0.62)
    assert snap.missing == ("request_rate_per_s (no series of vllm:request_success_total)",)


def test_no_series_at_all_is_unavailable(prom: FakePrometheus) -> None:
    for q in list(prom.values):
        prom.values[q] = None
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_UNAVAILABLE
    assert "sample_age_s" in snap.error and "vllm:num_requests_running" in snap.error


@pytest.mark.parametrize(
    ("field_query", "value"),
    [(QUERIES.request_rate_per_s, "NaN"), (QUERIES.running, "+Inf"), (QUERIES.queue_depth, "-2"), (QUERIES.ttft_s, "+Inf")],
)
def test_nonsense_values(prom: FakePrometheus, field_query: str, value: str) -> None:
    prom.values[field_query] = value
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_INVALID
    assert snap.to_dict()  # JSON-safe even with non-finite numbers
    json.dumps(snap.to_dict())


def test_stale_scrapes(prom: FakePrometheus) -> None:
    prom.values[QUERIES.sample_age_s] = "600"
    snap = source(prom.url, max_sample_age_s=90).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_STALE
    assert "600s old" in snap.error


def test_non_numeric_value(prom: FakePrometheus) -> None:
    prom.values[QUERIES.running] = "many"
    snap = source(prom.url).fetch(QUERIES)
    assert not snap.ok and snap.problem == METRICS_INVALID


def test_fetch_async(prom: FakePrometheus) -> None:
    import asyncio

    snap = asyncio.run(source(prom.url).fetch_async(QUERIES))
    assert snap.ok and math.isclose(snap.request_rate_per_s, 12.5)


def test_explicit_eval_time_is_sent(prom: FakePrometheus) -> None:
    snap = source(prom.url).fetch(QUERIES, now=NOW - 30)
    assert snap.sample_time == NOW - 30
    assert {p["time"][0] for p in prom.seen} == {f"{NOW - 30:.3f}"}



def test_a_prometheus_that_gzips_when_accepted_is_read(prom: FakePrometheus) -> None:
    # (was: the bounded raw read got gzip bytes and reported "invalid JSON" for a real Prometheus)
    prom.gzip_when_accepted = True
    snap = source(prom.url).fetch(QUERIES)
    assert snap.ok, snap.error
    assert (snap.ttft_s, snap.running) == (0.42, 40.0)
