"""The synthetic vLLM exporter used by the autoscaling e2e: names, labels, latency vs load."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.exporter import SyntheticEngine, buckets_around, make_server
from meshplan.autoscale.promql import ENGINE_METRICS

SCOPE = {"namespace": "team-a", "meshplan_dev_deployment": "llama"}


def families(engine: SyntheticEngine) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for fam in text_string_to_metric_families(engine.metrics_text().decode()):
        for sample in fam.samples:
            out[sample.name].append(sample)
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (le, count) pairs (linear within a bucket)."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_le, prev_count = le, count
    return buckets[-1][0]


def deployment_quantile(engine: SyntheticEngine, metric: str, q: float = 0.99) -> float:
    """sum by (le) over all pods, then the quantile: what the autoscaler's query computes."""
    by_le: dict[float, float] = defaultdict(float)
    for s in families(engine)[metric + "_bucket"]:
        by_le[float(s.labels["le"])] += s.value
    return histogram_quantile(q, list(by_le.items()))


def run(engine: SyntheticEngine, seconds: int) -> None:
    for _ in range(seconds):
        engine.tick(1.0)


def test_exports_the_names_the_vllm_queries_use_with_scope_labels() -> None:
    e = SyntheticEngine(labels=SCOPE, rps=2.0, replicas=2)
    run(e, 30)
    fams = families(e)
    names = ENGINE_METRICS["vllm"]
    for metric in (names.ttft_histograms[0] + "_bucket", names.itl_histograms[0] + "_bucket",
                   names.requests_counters[0], names.queue_gauges[0], names.running_gauges[0]):
        samples = fams[metric]
        assert samples, metric
        for s in samples:
            assert {k: s.labels[k] for k in SCOPE} == SCOPE
        assert {s.labels["pod"] for s in samples} == {"llama-0", "llama-1"} or metric.endswith("_bucket")


def test_p99_tracks_the_model_and_load_per_replica() -> None:
    e = SyntheticEngine(labels=SCOPE, rps=4.0, replicas=2, seed=3)
    run(e, 900)
    model = e.model.latency(2.0)
    assert deployment_quantile(e, "vllm:time_to_first_token_seconds") == pytest.approx(model.ttft_p99_s, rel=0.2)
    assert deployment_quantile(e, "vllm:inter_token_latency_seconds") == pytest.approx(model.itl_p99_s, rel=0.1)
    completed = sum(s.value for s in families(e)["vllm:request_success_total"])
    assert completed == pytest.approx(4.0 * 900, rel=0.1)


def test_overload_queues_and_more_replicas_relieve_it() -> None:
    e = SyntheticEngine(labels=SCOPE, rps=9.0, replicas=2, seed=1)
    run(e, 60)
    waiting = sum(s.value for s in families(e)["vllm:num_requests_waiting"])
    assert waiting > 50
    hot_ttft = e.state()["ttft_p99_s"]
    e.set_replicas(5)
    run(e, 120)
    assert e.state()["backlog"] == 0 and e.state()["ttft_p99_s"] < min(hot_ttft, 1.0)


def test_removed_replicas_take_their_series_with_them() -> None:
    e = SyntheticEngine(labels=SCOPE, rps=1.0, replicas=3)
    run(e, 5)
    e.set_replicas(1)
    pods = {s.labels["pod"] for s in families(e)["vllm:num_requests_running"]}
    assert pods == {"llama-0"}


def test_buckets_are_fine_near_the_targets() -> None:
    b = buckets_around([1.0])
    near = [x for x in b if 0.3 <= x <= 3.0]
    assert all(hi / lo <= 1.051 for lo, hi in zip(near, near[1:]))
    assert b[0] == 0.001 and b[-1] == 600.0 and b == sorted(set(b))


def test_http_control_and_metrics() -> None:
    e = SyntheticEngine(labels=SCOPE, rps=0.0, replicas=1)
    server = make_server(e)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        state = json.load(urllib.request.urlopen(f"{base}/load?rps=3.5"))
        assert state["rps"] == 3.5
        state = json.load(urllib.request.urlopen(f"{base}/replicas?n=3"))
        assert state["replicas"] == 3
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert 'vllm:num_requests_running{' in body and 'pod="llama-2"' in body
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/load?rps=-1")
        assert err.value.code == 400
    finally:
        server.shutdown()
        server.server_close()


def test_kv_usage_follows_running_requests_and_output_length_and_only_when_asked() -> None:
    from dataclasses import replace

    from meshplan.autoscale.queueing import ReplicaModel

    assert "vllm:kv_cache_usage_perc" not in families(SyntheticEngine(labels=SCOPE, rps=1.0, replicas=1))
    model = ReplicaModel(output_tokens=256)
    e = SyntheticEngine(labels=SCOPE, rps=1.0, replicas=1, model=model, kv_tokens_per_replica=16384, seed=3)
    assert "vllm:kv_cache_usage_perc" in ENGINE_METRICS["vllm"].kv_usage_gauges
    e.tick(1.0)

    def kv() -> float:
        return families(e)["vllm:kv_cache_usage_perc"][0].value

    short = kv()
    running = e.state()["running_per_replica"]
    assert short == pytest.approx(running * (1024 + 128) / 16384)
    e.set_model(replace(model, output_tokens=1024))         # longer outputs: more running, each holds more
    e.tick(1.0)
    one = kv()
    assert one > 3 * short
    e.set_replicas(2)                                       # a second replica halves the load per replica
    e.tick(1.0)
    both = [s.value for s in families(e)["vllm:kv_cache_usage_perc"]]
    assert len(both) == 2 and all(0 < v < 0.7 * one for v in both), (one, both)
