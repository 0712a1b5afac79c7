"""Issue 17, finding 2 (SSRF): the admin's endpoint list, picked by name; hostile servers on loopback.

The servers are real HTTP servers on 127.0.0.1 (http.server), each answering in a hostile way: a
redirect to another server, an error whose body is a marker, a vector whose labels and value are a
marker, a body larger than the limit. Nothing a server sends may appear in a snapshot's message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from meshplan.autoscale.promql import build_queries, scope_matchers
from meshplan.autoscale.snapshot import METRICS_INVALID, METRICS_UNAVAILABLE
from meshplan.autoscale.source import MAX_RESPONSE_BYTES, PrometheusSource
from meshplan.controller.autoscaling import (
    DEFAULT_ENDPOINT,
    EndpointError,
    endpoint_url_problem,
    parse_endpoints,
    resolve_prometheus,
)

MARKER = "MARKER-7f3a-remote-content"
QUERIES = build_queries("vllm", scope_matchers("ns", "llama"))
NOW = 1_750_000_000.0


class Server:
    """One loopback HTTP server whose answer is `behave(handler)`; counts the requests it got."""

    def __init__(self, behave) -> None:
        self.hits = 0
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                me.hits += 1
                behave(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(h: BaseHTTPRequestHandler, code: int, body: bytes, headers: dict | None = None) -> None:
    h.send_response(code)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _vector(value: str = "1", metric: dict | None = None) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": metric or {}, "value": [NOW, value]}]}}).encode()


@pytest.fixture
def target() -> Iterator[Server]:
    """Where a redirect would lead: it answers well, with the marker in a label."""
    s = Server(lambda h: _send(h, 200, _vector("1", {"leak": MARKER})))
    yield s
    s.close()


def _fetch(url: str, name: str = "main"):
    src = PrometheusSource(url, timeout_s=2.0, name=name)
    try:
        return src.fetch(QUERIES, now=NOW)
    finally:
        src.close()


def test_redirect_is_not_followed(target: Server) -> None:
    hostile = Server(lambda h: _send(h, 302, MARKER.encode(), {"Location": f"{target.url}/api/v1/query?x=1"}))
    try:
        snap = _fetch(hostile.url)
    finally:
        hostile.close()
    assert not snap.ok and snap.problem == METRICS_UNAVAILABLE
    assert "redirect refused" in snap.error and MARKER not in snap.error
    assert target.hits == 0, "the redirect was followed to another host"


@pytest.mark.parametrize("code", [400, 500, 503])
def test_error_body_is_not_echoed(code: int) -> None:
    hostile = Server(lambda h: _send(h, code, json.dumps({"status": "error", "error": MARKER}).encode()))
    try:
        snap = _fetch(hostile.url)
    finally:
        hostile.close()
    assert not snap.ok and f"HTTP {code}" in snap.error and "'main'" in snap.error
    assert MARKER not in snap.error and MARKER not in json.dumps(snap.to_dict())


def test_labels_and_non_numeric_samples_are_not_echoed() -> None:
    two = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"a": MARKER}, "value": [NOW, MARKER]}]}}).encode()
    hostile = Server(lambda h: _send(h, 200, two))
    try:
        snap = _fetch(hostile.url)
    finally:
        hostile.close()
    assert not snap.ok and snap.problem == METRICS_INVALID
    assert "no numeric value" in snap.error and MARKER not in json.dumps(snap.to_dict())


def test_garbage_that_is_not_json_is_not_echoed() -> None:
    hostile = Server(lambda h: _send(h, 200, f"<html>{MARKER}</html>".encode()))
    try:
        snap = _fetch(hostile.url)
    finally:
        hostile.close()
    assert not snap.ok and "invalid JSON" in snap.error and MARKER not in snap.error


def test_oversized_body_is_refused_unread() -> None:
    big = b"x" * (MAX_RESPONSE_BYTES + 10)

    def behave(h: BaseHTTPRequestHandler) -> None:     # no Content-Length: the reader must count itself
        h.send_response(200)
        h.end_headers()
        try:
            h.wfile.write(big)
        except (BrokenPipeError, ConnectionResetError):
            pass

    hostile = Server(behave)
    try:
        snap = _fetch(hostile.url)
    finally:
        hostile.close()
    assert not snap.ok and "refused" in snap.error and str(MAX_RESPONSE_BYTES) in snap.error


def test_a_slow_drip_body_is_cut_at_the_timeout() -> None:
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        try:
            for _ in range(40):            # a byte every 0.25 s: each read is quick, the whole is not
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.25)
        except (BrokenPipeError, ConnectionResetError):
            pass

    hostile = Server(behave)
    t0 = time.monotonic()
    try:
        src = PrometheusSource(hostile.url, timeout_s=1.0, name="slow")
        snap = src.fetch(QUERIES, now=NOW)
        src.close()
    finally:
        hostile.close()
    assert not snap.ok and "timed out" in snap.error
    assert time.monotonic() - t0 < 4.0


# ------------------------------------------------------------------ the admin's list, by name


def _auto(**kw) -> SimpleNamespace:
    return SimpleNamespace(prometheus=kw.get("prometheus"), prometheus_url=kw.get("prometheus_url"))


ENDPOINTS = parse_endpoints(["team-a=http://prom-a.monitoring:9090/", "team-b=https://prom-b:9091/prom"],
                            "http://prometheus.monitoring:9090")


def test_parse_endpoints_forms_agree() -> None:
    assert ENDPOINTS == {"team-a": "http://prom-a.monitoring:9090", "team-b": "https://prom-b:9091/prom",
                         DEFAULT_ENDPOINT: "http://prometheus.monitoring:9090"}
    as_json = json.dumps([{"name": "team-a", "url": "http://prom-a.monitoring:9090"},
                          {"name": "team-b", "url": "https://prom-b:9091/prom"}])
    assert parse_endpoints(as_json, "http://prometheus.monitoring:9090") == ENDPOINTS
    assert parse_endpoints("team-a=http://prom-a.monitoring:9090, team-b=https://prom-b:9091/prom",
                           "http://prometheus.monitoring:9090") == ENDPOINTS


@pytest.mark.parametrize("url", ["http://p:9090/?x=1", "http://p:9090/#frag", "http://u:pw@p:9090",
                                 "ftp://p", "p:9090", "http://p:99999999", "http://p:9090/\x0b"])
def test_admin_urls_that_could_be_steered_are_refused(url: str) -> None:
    assert endpoint_url_problem(url) is not None
    with pytest.raises(EndpointError, match="'x'"):
        parse_endpoints([f"x={url}"])


def test_a_cr_picks_an_allowed_endpoint_by_name() -> None:
    assert resolve_prometheus(_auto(prometheus="team-b"), ENDPOINTS) == ("team-b", "https://prom-b:9091/prom")
    assert resolve_prometheus(_auto(), ENDPOINTS) == (DEFAULT_ENDPOINT, "http://prometheus.monitoring:9090")
    msg = resolve_prometheus(_auto(prometheus="evil"), ENDPOINTS)
    assert isinstance(msg, str) and "spec.autoscaling.prometheus" in msg and "default, team-a, team-b" in msg


def test_a_cr_url_counts_only_as_an_exact_allowed_url() -> None:
    assert resolve_prometheus(_auto(prometheus_url="http://prom-a.monitoring:9090/"), ENDPOINTS) == \
        ("team-a", "http://prom-a.monitoring:9090")
    for url in ("http://169.254.169.254/latest/meta-data", "http://prom-a.monitoring:9090/api/v1/query?x#",
                "http://prom-a.monitoring:9091", "http://127.0.0.1:9090"):
        msg = resolve_prometheus(_auto(prometheus_url=url), ENDPOINTS)
        assert isinstance(msg, str) and msg.startswith("spec.autoscaling.prometheusUrl:"), url
    # a name and a URL that is not that endpoint's: refused
    msg = resolve_prometheus(_auto(prometheus="team-a", prometheus_url="https://prom-b:9091/prom"), ENDPOINTS)
    assert isinstance(msg, str) and "spec.autoscaling.prometheusUrl" in msg
    # nothing configured at all: the message says how to get one
    assert "--prometheus-url" in resolve_prometheus(_auto(), {})


def test_a_gzipped_answer_is_read_like_prometheus_sends_it() -> None:
    """Prometheus gzips its answers when the client accepts it (requests does): the bounded reader
    must decode them (found by e2e/test_autoscale.py against a real Prometheus)."""
    import gzip

    body = gzip.compress(_vector("0.5"))
    server = Server(lambda h: _send(h, 200, body, {"Content-Encoding": "gzip", "Content-Type": "application/json"}))
    try:
        snap = _fetch(server.url)
    finally:
        server.close()
    assert snap.problem != METRICS_INVALID and snap.ttft_s == 0.5, snap
