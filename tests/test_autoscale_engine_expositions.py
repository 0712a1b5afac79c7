"""The engines' own documented /metrics expositions through meshplan's queries, source and policy.

Fixtures (tests/fixtures/metrics/*.prom) are copied from the engines' documentation, each with its
source in its header. They are parsed with prometheus_client's text parser.

A fake stands in for Prometheus' query engine (no Prometheus runs in unit tests): `FakeQueryEngine`
evaluates exactly the query shapes `promql.build_queries` emits, with Prometheus' semantics for what
they use -- label matching, `or on(pod)` (keep the right-hand series whose pod has no left-hand
series), `sum`/`max`, `sum by (le)` and `histogram_quantile` (linear interpolation inside a bucket;
the upper bound of the highest finite bucket when the rank falls in +Inf; NaN without a +Inf bucket,
https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile). One documented
exposition is one scrape, so `rate(c[w])` is read as c / w (the counter counted from zero within the
window): the rate's size is not what these tests check, only whether the series is found; `avg_over_time(g[w])` of
one scrape is that scrape's value. Each sample
gets the labels the chart's PodMonitor gives engine series (namespace, meshplan_dev_deployment, pod).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshplan.autoscale.policy import (
    COND_SCALING_ACTIVE,
    AutoscaleConfig,
    AutoscaleState,
    ReplicaCapacity,
    decide,
)
from meshplan.autoscale.promql import MetricOverrides, build_queries, scope_matchers, validate_window
from meshplan.autoscale.snapshot import METRICS_PARTIAL, METRICS_UNAVAILABLE
from meshplan.autoscale.source import PrometheusSource

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
NS, DEPLOY = "team-a", "chat"
NOW = 1_750_000_000.0
WINDOW = "120s"

Sample = tuple[str, dict[str, str], float]


def load(name: str, pod: str, rename: dict[str, str] | None = None, add_inf: bool = False) -> list[Sample]:
    """Samples of one documented exposition as one pod's scrape (optionally with metric names renamed)."""
    out: list[Sample] = []
    for fam in text_string_to_metric_families((FIXTURES / name).read_text()):
        for s in fam.samples:
            metric = s.name
            for old, new in (rename or {}).items():
                if metric.startswith(old):
                    metric = new + metric[len(old):]
            labels = {**s.labels, "namespace": NS, "meshplan_dev_deployment": DEPLOY, "pod": pod}
            out.append((metric, labels, float(s.value)))
    if add_inf:
        # The +Inf bucket every prometheus_client histogram exposes equals its _count; the docs
        # elide it. Restored from the documented _count, nothing else.
        names = {m for m, _, _ in out}
        for m, labels, v in list(out):
            if m.endswith("_count") and (base := m[: -len("_count")]) + "_bucket" in names:
                if not any(b == base + "_bucket" and lb.get("le") == "+Inf" for b, lb, _ in out):
                    out.append((base + "_bucket", {**labels, "le": "+Inf"}, v))
    return out


class FakeQueryEngine:
    """Stands in for `PrometheusConnect.custom_query` over a fixed set of samples (see module doc)."""

    _TERM = re.compile(r"^(?:(?P<fn>rate|avg_over_time|timestamp)\()?(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<sel>[^}]*)\}"
                       r"(?:\[(?P<w>[0-9a-z]+)\])?\)?$")

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        self.queries: list[str] = []

    def custom_query(self, query: str, params: dict | None = None) -> list[dict]:
        self.queries.append(query)
        value = self.evaluate(query)
        return [] if value is None else [{"metric": {}, "value": [NOW, repr(value)]}]

    # -- evaluation ----------------------------------------------------------

    def evaluate(self, q: str) -> float | None:
        if m := re.match(r"^histogram_quantile\(([0-9.]+), sum by \(le\) \((.*)\)\)$", q):
            vec = self.union(m.group(2))
            if not vec:
                return None
            by_le: dict[float, float] = {}
            for labels, v in vec:
                by_le[float(labels["le"])] = by_le.get(float(labels["le"]), 0.0) + v
            return histogram_quantile(float(m.group(1)), by_le)
        if m := re.match(r"^time\(\) - max\((.*)\)$", q):
            vec = [x for part in m.group(1).split(" or ") for x in self.term(part)]
            return 0.0 if vec else None          # every sample was scraped "now"
        if m := re.match(r"^(sum|max)\((.*)\)$", q):
            vec = self.union(m.group(2))
            if not vec:
                return None
            values = [v for _, v in vec]
            return sum(values) if m.group(1) == "sum" else max(values)
        raise AssertionError(f"query shape the fake does not know: {q}")

    def union(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """`A or on(pod) B or on(pod) C`: left-associative, matching on the pod label only."""
        out: list[tuple[dict[str, str], float]] = []
        for part in expr.split(" or on(pod) "):
            pods = {labels.get("pod", "") for labels, _ in out}
            out += [(labels, v) for labels, v in self.term(part) if labels.get("pod", "") not in pods]
        return out

    def term(self, part: str) -> list[tuple[dict[str, str], float]]:
        m = self._TERM.match(part.strip())
        assert m, f"term the fake does not know: {part}"
        want = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("sel")))
        rows = [(labels, v) for name, labels, v in self.samples
                if name == m.group("name") and all(labels.get(k) == val for k, val in want.items())]
        if m.group("fn") == "rate":
            seconds = window_seconds(m.group("w"))
            return [(labels, v / seconds) for labels, v in rows]
        return rows


def window_seconds(w: str) -> float:
    validate_window(w)
    assert w.endswith("s") and w[:-1].isdigit(), "the controller renders windows in whole seconds"
    return float(w[:-1])


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile over cumulative bucket counts keyed by upper bound."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return math.nan
    total = buckets[math.inf]
    if total == 0:
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if b == math.inf:
                return bounds[-2] if len(bounds) > 1 else math.nan
            if b <= 0:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (buckets[b] - prev_count)
        prev_bound, prev_count = b, buckets[b]
    return bounds[-2]


def fetch(engine: str, samples: list[Sample], overrides: MetricOverrides | None = None):
    queries = build_queries(engine, scope_matchers(NS, DEPLOY), percentile=99, window=WINDOW, overrides=overrides)
    src = PrometheusSource("http://prometheus.invalid:9090", clock=lambda: NOW)
    fake = FakeQueryEngine(samples)
    src._client = fake            # the fake query engine in place of the HTTP client (module doc)
    return src.fetch(queries), fake


def config(**kw) -> AutoscaleConfig:
    return AutoscaleConfig(min_replicas=1, max_replicas=8, ttft_target_s=kw.pop("ttft", 2.0),
                           itl_target_s=kw.pop("itl", 0.1), **kw)


def decision(snapshot, replicas: int = 3):
    state = AutoscaleState(desired_replicas=replicas)
    cap = ReplicaCapacity(requests_per_s_at_slo=50.0, concurrency_at_slo=400.0, ready_replicas=replicas)
    return decide(state, snapshot, config(), cap, NOW)


def active(dec):
    (cond,) = [c for c in dec.conditions if c.type == COND_SCALING_ACTIVE]
    return cond


# --- SGLang ------------------------------------------------------------------


def test_sglang_documented_exposition_uses_ttft_and_itl_and_names_the_missing_counter() -> None:
    snap, _ = fetch("sglang", load("sglang-production-metrics.prom", "sglang-0"))
    assert snap.ok, snap.error                                   # was: MetricsUnavailable for the whole snapshot
    # p99 TTFT: rank 0.99 x 11008 lies in the +Inf bucket -> the highest finite bound, 30 s.
    assert snap.ttft_s == pytest.approx(30.0)
    # p99 ITL from time_per_output_token_seconds (the doc has no inter_token_latency_seconds):
    # rank 7326749.43 between le=0.5 (7312226) and le=0.75 (7339675) -> 0.5 + 0.25 x 14523.43/27449.
    assert snap.itl_s == pytest.approx(0.5 + 0.25 * (0.99 * 7.400757e6 - 7.312226e6) / (7.339675e6 - 7.312226e6))
    assert (snap.running, snap.queue_depth, snap.kv_usage) == (162.0, 2826.0, 0.28)
    assert snap.request_rate_per_s is None
    assert snap.missing == ("request_rate_per_s (no series of sglang:num_requests_total)",)

    dec = decision(snap)
    cond = active(dec)
    assert (cond.status, cond.reason) == ("True", METRICS_PARTIAL)
    assert "sglang:num_requests_total" in cond.message and "no scale-down" in cond.message
    # both latencies are used: TTFT 30 s against a 2 s target -> 15x, and the fleet scales up
    assert dict(dec.slo_ratios)["ttft"] == pytest.approx(15.0)
    assert dict(dec.slo_ratios)["itl"] == pytest.approx(snap.itl_s / 0.1)


def test_sglang_request_counter_renamed_in_the_spec_gives_a_full_snapshot() -> None:
    samples = load("sglang-production-metrics.prom", "sglang-0")
    snap, fake = fetch("sglang", samples, MetricOverrides(requests_counter="sglang:e2e_request_latency_seconds_count"))
    assert snap.ok and snap.missing == ()
    assert snap.request_rate_per_s == pytest.approx(11228.0 / 120)
    assert any("rate(sglang:e2e_request_latency_seconds_count{" in q for q in fake.queries)
    cond = active(decision(snap))
    assert (cond.status, cond.reason) == ("True", "ValidMetrics")


# --- TensorRT-LLM ------------------------------------------------------------


def test_trtllm_documented_exposition_as_shown_has_no_usable_percentile() -> None:
    # The doc shows no le="+Inf" bucket: Prometheus' histogram_quantile is NaN for such a
    # histogram, i.e. no percentile; with requests being served and a TTFT target that is refused.
    snap, _ = fetch("trtllm", load("trtllm-dynamo-prometheus.prom", "trtllm-0"))
    assert snap.ok and snap.ttft_s is None and snap.itl_s is None
    dec = decision(snap)
    assert (active(dec).status, active(dec).reason) == ("False", METRICS_UNAVAILABLE)
    assert "ttft_s" in active(dec).message


def test_trtllm_documented_exposition_uses_ttft_and_itl_and_names_the_missing_gauges() -> None:
    snap, _ = fetch("trtllm", load("trtllm-dynamo-prometheus.prom", "trtllm-0", add_inf=True))
    assert snap.ok, snap.error
    # TTFT: rank 148.5 of 150 lies in +Inf -> highest finite bound 0.05 s; TPOT likewise 0.1 s.
    assert (snap.ttft_s, snap.itl_s) == (pytest.approx(0.05), pytest.approx(0.1))
    assert snap.request_rate_per_s == pytest.approx(155.0 / 120)
    assert [m.split(" ")[0] for m in snap.missing] == ["queue_depth", "running", "kv_usage"]
    assert "trtllm_num_requests_running" in " ".join(snap.missing)

    dec = decision(snap)
    cond = active(dec)
    assert (cond.status, cond.reason) == ("True", METRICS_PARTIAL)
    assert "trtllm_num_requests_waiting" in cond.message and "trtllm_num_requests_running" in cond.message
    assert dict(dec.slo_ratios) == {"ttft": pytest.approx(0.025), "itl": pytest.approx(1.0)}
    assert "no scale-down while queue_depth, running are missing" in cond.message


def test_trtllm_missing_gauges_never_scale_down() -> None:
    snap, _ = fetch("trtllm", load("trtllm-dynamo-prometheus.prom", "trtllm-0", add_inf=True))
    # well within SLO (ITL 0.1 s of 0.5 s), 1.3 req/s for 3 replicas of 50 req/s, below threshold
    # for far longer than the down window: everything but the unknown queue/running says "down".
    state = AutoscaleState(desired_replicas=3, below_since=NOW - 3600, last_change_at=NOW - 3600)
    cap = ReplicaCapacity(requests_per_s_at_slo=50.0, concurrency_at_slo=400.0, ready_replicas=3)
    dec = decide(state, snap, config(itl=0.5), cap, NOW)
    assert dec.desired_replicas == 3, dec.message
    # the same numbers with the gauges present (running 0, queue 0) do scale down
    full = load("trtllm-dynamo-prometheus.prom", "trtllm-0", add_inf=True) + [
        ("trtllm_num_requests_running", {"namespace": NS, "meshplan_dev_deployment": DEPLOY, "pod": "trtllm-0"}, 0.0),
        ("trtllm_num_requests_waiting", {"namespace": NS, "meshplan_dev_deployment": DEPLOY, "pod": "trtllm-0"}, 0.0),
    ]
    snap_full, _ = fetch("trtllm", full)
    assert decide(state, snap_full, config(itl=0.5), cap, NOW).desired_replicas == 2


# --- vLLM --------------------------------------------------------------------


def test_vllm_documented_exposition_names_what_the_doc_elides() -> None:
    snap, _ = fetch("vllm", load("vllm-design-metrics.prom", "vllm-0", add_inf=True))
    assert snap.ok, snap.error
    # p99 TTFT: rank 138.6 between le=0.08 (138) and le=0.1 (140): 0.08 + 0.02 x 0.6/2.
    assert snap.ttft_s == pytest.approx(0.086)
    assert snap.running == 8.0 and snap.request_rate_per_s == pytest.approx(132.0 / 120)
    assert [m.split(" ")[0] for m in snap.missing] == ["itl_s", "queue_depth", "kv_usage"]
    cond = active(decision(snap))
    assert cond.reason == METRICS_PARTIAL
    assert "vllm:inter_token_latency_seconds_bucket, vllm:time_per_output_token_seconds_bucket" in cond.message


# --- rolling upgrade: old and new names per pod --------------------------------


def _upgrade_fleet() -> list[Sample]:
    # pod sglang-old exports the documented names; pod sglang-new is the same scrape under the
    # names SGLang's newer collector uses (inter_token_latency_seconds for the ITL histogram).
    old = load("sglang-production-metrics.prom", "sglang-old")
    new = load("sglang-production-metrics.prom", "sglang-new",
               rename={"sglang:time_per_output_token_seconds": "sglang:inter_token_latency_seconds"})
    return old + new


def test_rolling_upgrade_counts_old_and_new_names_per_pod() -> None:
    samples = _upgrade_fleet()
    qs = build_queries("sglang", scope_matchers(NS, DEPLOY), window=WINDOW)
    inner = re.match(r"^histogram_quantile\([0-9.]+, sum by \(le\) \((.*)\)\)$", qs.itl_s).group(1)
    pods = {labels["pod"] for labels, _ in FakeQueryEngine(samples).union(inner)}
    assert pods == {"sglang-old", "sglang-new"}
    # and a pod exporting both names is counted once (the newest name)
    both = samples + [(n.replace("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"), lb, v)
                      for n, lb, v in samples if lb["pod"] == "sglang-new" and n.startswith("sglang:inter_token")]
    counted = FakeQueryEngine(both).union(inner)
    assert sum(1 for lb, _ in counted if lb["pod"] == "sglang-new") == sum(
        1 for n, lb, _ in samples if lb["pod"] == "sglang-new" and n.startswith("sglang:inter_token_latency_seconds_bucket"))
    # The previous shape, `(quantile of new) or (quantile of old)`, fell back for the whole
    # deployment: with one pod upgraded it read only that pod.
    deployment_wide = FakeQueryEngine(samples).union(inner.split(" or on(pod) ")[0])
    assert {labels["pod"] for labels, _ in deployment_wide} == {"sglang-new"}


def test_rolling_upgrade_snapshot_sums_both_pods() -> None:
    snap, _ = fetch("sglang", _upgrade_fleet())
    assert snap.ok and snap.running == 2 * 162.0 and snap.queue_depth == 2 * 2826.0
    assert snap.itl_s == pytest.approx(0.5 + 0.25 * (0.99 * 7.400757e6 - 7.312226e6) / (7.339675e6 - 7.312226e6))
