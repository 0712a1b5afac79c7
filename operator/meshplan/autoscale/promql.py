"""PromQL for one LLMDeployment's serving metrics, built safely.

The autoscaler needs five numbers per deployment: the chosen percentile of
time-to-first-token (TTFT) and inter-token latency (ITL), the request rate,
the queue depth and the number of running requests, plus the age of the
newest scrape (to tell "idle" from "the exporters stopped reporting").

Why a builder and not string templates: every part of a query that comes from
a user's manifest (namespace, deployment name, metric-name overrides, extra
label matchers) ends up inside PromQL. A deployment name like
``x"} or vector(1) #`` spliced raw would turn a scoped query into one that
returns a constant, and the autoscaler would act on it. So:

- label values are always emitted as PromQL double-quoted string literals with
  backslash, double quote and control characters escaped (PromQL strings follow
  Go's escaping rules: https://prometheus.io/docs/prometheus/latest/querying/basics/#string-literals);
- label names must match ``[a-zA-Z_][a-zA-Z0-9_]*`` and metric names
  ``[a-zA-Z_:][a-zA-Z0-9_:]*`` (https://prometheus.io/docs/concepts/data_model/);
- range windows must be Prometheus durations such as ``2m`` or ``90s``
  (https://prometheus.io/docs/prometheus/latest/querying/basics/#time-durations);
- overrides are metric names and label matchers, never raw PromQL.

Query shapes (q is the percentile as a fraction, e.g. 0.99):

- latency: ``histogram_quantile(q, sum by (le) (rate(<hist>_bucket{sel}[w])))``.
  Summing the per-pod bucket rates before the quantile gives the
  deployment-wide percentile (quantiles of pods cannot be averaged).
  Engines renamed their metrics over time, so each engine lists its names
  newest first and the builder joins the alternatives per pod, inside the
  aggregation, with ``or on(pod)``: each pod contributes under the newest name
  it exports, so a rolling upgrade (old and new pods side by side) counts both.
- request rate: ``sum(rate(<requests counter>{sel}[w]))``, completed requests
  per second. Under overload this equals what the replicas can serve, not what
  arrives; the policy adds the queue to estimate demand.
- queue depth / running: ``sum(<gauge>{sel})``; KV usage ``max(<gauge>{sel})``
  (the fullest replica, reported only).
- sample age: ``time() - max(timestamp(<m>{sel}) or ...)`` over every series
  any signal reads, seconds since the newest scrape of any replica.

Each query may find no series: the source then marks that signal missing and
the policy degrades per signal (docs/autoscaling.md, "When a signal is missing").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from meshplan.planner.types import Engine

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# Prometheus duration: units in descending order, each at most once, e.g. 1h30m, 90s, 500ms.
_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_UNITS_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_MATCH_OPS = ("=", "!=", "=~", "!~")


class QueryInputError(ValueError):
    """A value from the spec cannot be used in a query; the message names the field and the fix."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name


# --- validation and escaping -------------------------------------------------


def escape_label_value(value: str) -> str:
    """Return `value` as a PromQL double-quoted string literal (quotes included).

    Backslash and double quote are escaped, newline/carriage return/tab get
    their short escapes, every other control character becomes ``\\xHH``.
    Non-ASCII text is kept as UTF-8, which PromQL strings accept.
    """
    if not isinstance(value, str):
        raise TypeError(f"label value must be a string, got {type(value).__name__}")
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def validate_label_name(name: str, field_name: str = "label") -> str:
    if not isinstance(name, str) or not _LABEL_NAME_RE.match(name) or name.startswith("__"):
        raise QueryInputError(
            field_name,
            f"{name!r} is not a usable Prometheus label name; use letters, digits and "
            "underscores, not starting with a digit or '__' (e.g. 'meshplan_dev_deployment')",
        )
    return name


def validate_metric_name(name: str, field_name: str = "metric") -> str:
    if not isinstance(name, str) or not _METRIC_NAME_RE.match(name):
        raise QueryInputError(
            field_name,
            f"{name!r} is not a Prometheus metric name; use letters, digits, '_' and ':' "
            "(e.g. 'vllm:time_to_first_token_seconds')",
        )
    return name


def validate_window(window: str, field_name: str = "window") -> str:
    """Check a Prometheus duration (``2m``, ``90s``, ``1m30s``) and return it unchanged."""
    if isinstance(window, str) and window and (m := _DURATION_RE.match(window)):
        seconds = sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS_S) if g)
        if seconds > 0:
            return window
    raise QueryInputError(field_name, f"{window!r} is not a positive Prometheus duration; write e.g. '2m' or '90s'")


def window_from_seconds(seconds: float) -> str:
    """Whole seconds as a Prometheus duration (rounded up, at least 1s)."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise QueryInputError("window", f"{seconds!r} must be a positive number of seconds")
    return f"{math.ceil(seconds)}s"


def _quantile(percentile: float) -> str:
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not (0 < percentile < 100):
        raise QueryInputError("slo.percentile", f"{percentile!r} must be between 0 and 100 exclusive (e.g. 99)")
    return f"{percentile / 100:.6g}"


# --- label matchers ----------------------------------------------------------


@dataclass(frozen=True)
class LabelMatcher:
    """One ``name op "value"`` term of a series selector."""

    name: str
    value: str
    op: str = "="

    def __post_init__(self) -> None:
        validate_label_name(self.name, "metrics.labels")
        if self.op not in _MATCH_OPS:
            raise QueryInputError("metrics.labels", f"operator {self.op!r} must be one of {', '.join(_MATCH_OPS)}")
        if not isinstance(self.value, str):
            raise QueryInputError("metrics.labels", f"value of {self.name!r} must be a string")
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise QueryInputError("metrics.labels", f"regex for {self.name!r} does not compile: {exc}") from None

    def render(self) -> str:
        return f"{self.name}{self.op}{escape_label_value(self.value)}"


def render_selector(matchers: tuple[LabelMatcher, ...]) -> str:
    return "{" + ",".join(m.render() for m in matchers) + "}"


# Prometheus' Kubernetes service discovery exposes pod label `meshplan.dev/deployment`
# as `__meta_kubernetes_pod_label_meshplan_dev_deployment` ("any unsupported characters
# converted to an underscore", https://prometheus.io/docs/prometheus/latest/configuration/configuration/#pod);
# the chart's PodMonitor/ServiceMonitor relabels it to the target label below.
DEFAULT_NAMESPACE_LABEL = "namespace"
DEFAULT_DEPLOYMENT_LABEL = "meshplan_dev_deployment"


def scope_matchers(
    namespace: str,
    deployment: str,
    *,
    namespace_label: str = DEFAULT_NAMESPACE_LABEL,
    deployment_label: str = DEFAULT_DEPLOYMENT_LABEL,
    extra: tuple[LabelMatcher, ...] = (),
) -> tuple[LabelMatcher, ...]:
    """Matchers that select exactly one LLMDeployment's engine pods.

    The two scoping labels are the ones the operator controls (namespace and
    the deployment label on the pods it creates); `extra` are per-deployment
    overrides. Extra matchers may narrow the scope but never replace the two
    scoping matchers: a matcher on a scoping label is rejected.
    """
    validate_label_name(namespace_label, "metrics.namespaceLabel")
    validate_label_name(deployment_label, "metrics.deploymentLabel")
    if not namespace or not deployment:
        raise QueryInputError("metadata", "namespace and deployment name must be non-empty")
    for m in extra:
        if m.name in (namespace_label, deployment_label):
            raise QueryInputError(
                "metrics.labels", f"{m.name!r} is set by the operator to scope the queries; remove it from the overrides"
            )
    return (LabelMatcher(namespace_label, namespace), LabelMatcher(deployment_label, deployment), *extra)


# --- per-engine metric names -------------------------------------------------


@dataclass(frozen=True)
class EngineMetricNames:
    """Metric names of one engine, each a tuple of alternatives, newest first.

    Histogram names are base names (without ``_bucket``).
    """

    ttft_histograms: tuple[str, ...]
    itl_histograms: tuple[str, ...]
    requests_counters: tuple[str, ...]
    queue_gauges: tuple[str, ...]
    running_gauges: tuple[str, ...]
    source: str = ""
    # KV-cache usage as a fraction 0..1 (reported, not a decision input); may be empty.
    kv_usage_gauges: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for fname in ("ttft_histograms", "itl_histograms", "requests_counters", "queue_gauges", "running_gauges",
                      "kv_usage_gauges"):
            names = getattr(self, fname)
            if not names and fname != "kv_usage_gauges":
                raise QueryInputError(f"metrics.{fname}", "needs at least one metric name")
            for n in names:
                validate_metric_name(n, f"metrics.{fname}")


ENGINE_METRICS: dict[Engine, EngineMetricNames] = {
    "vllm": EngineMetricNames(
        ttft_histograms=("vllm:time_to_first_token_seconds",),
        # v1 engine: inter_token_latency_seconds; older releases only had
        # time_per_output_token_seconds (per-token, same unit).
        itl_histograms=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        requests_counters=("vllm:request_success_total",),
        queue_gauges=("vllm:num_requests_waiting",),
        running_gauges=("vllm:num_requests_running",),
        # V1 renamed the KV gauge: vllm:gpu_cache_usage_perc (v0) -> vllm:kv_cache_usage_perc (V1);
        # both are fractions 0..1 (vllm docs/design/metrics.md at v0.12.0, "v0 metrics" list).
        kv_usage_gauges=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        source=(
            "vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger) and "
            "docs/source/design/v1/metrics.md (v0 list incl. vllm:time_per_output_token_seconds)"
        ),
    ),
    "sglang": EngineMetricNames(
        ttft_histograms=("sglang:time_to_first_token_seconds",),
        # Current collectors export inter_token_latency_seconds; older ones
        # time_per_output_token_seconds.
        itl_histograms=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        requests_counters=("sglang:num_requests_total",),
        queue_gauges=("sglang:num_queue_reqs",),
        running_gauges=("sglang:num_running_reqs",),
        # "The token usage": used KV tokens / pool size (docs/references/production_metrics.md).
        kv_usage_gauges=("sglang:token_usage",),
        source=(
            "sgl-project/sglang python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector, "
            "SchedulerMetricsCollector) and docs/references/production_metrics.md"
        ),
    ),
    "trtllm": EngineMetricNames(
        # trtllm-serve's MetricsCollector prefixes `trtllm_` itself (TensorRT-LLM main,
        # tensorrt_llm/metrics/collector.py); Dynamo adds the same prefix to older
        # unprefixed releases (ai-dynamo/dynamo docs/backends/trtllm/prometheus.md), and
        # earlier Dynamo docs spelled it `trtllm:`. TRT-LLM has no ITL histogram: its
        # per-request TPOT is the closest signal.
        ttft_histograms=("trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds"),
        itl_histograms=("trtllm_time_per_output_token_seconds", "trtllm:time_per_output_token_seconds"),
        requests_counters=("trtllm_request_success_total", "trtllm:request_success_total"),
        queue_gauges=("trtllm_num_requests_waiting",),
        running_gauges=("trtllm_num_requests_running",),
        # NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py @050f80de: Gauge "KV cache utilization".
        kv_usage_gauges=("trtllm_kv_cache_utilization",),
        source="NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py; ai-dynamo/dynamo backends/trtllm/prometheus.md",
    ),
    "nim": EngineMetricNames(
        # NIM for LLMs serves these unprefixed names on /v1/metrics (docs.nvidia.com/nim/large-language-models
        # "Observability for NVIDIA NIM for LLMs", 1.x metrics table). No request counter is listed: the
        # end-to-end latency histogram's count counts finished requests.
        ttft_histograms=("time_to_first_token_seconds",),
        itl_histograms=("time_per_output_token_seconds",),
        requests_counters=("e2e_request_latency_seconds_count",),
        queue_gauges=("num_requests_waiting",),
        running_gauges=("num_requests_running",),
        kv_usage_gauges=("gpu_cache_usage_perc",),
        source="docs.nvidia.com/nim/large-language-models Observability (metrics table, /v1/metrics)",
    ),
}
# Engines that export no metrics: the autoscaler reports why (ScalingActive) unless every signal is named in
# spec.autoscaling.metrics (the deployment's own exporter).
ENGINES_WITHOUT_METRICS: dict[str, str] = {
    "deepspeed": ("DeepSpeed-MII 0.3.3 exports no Prometheus metrics (mii/entrypoints/openai_api_server.py has no "
                  "/metrics route): name the TTFT and ITL histograms, request counter and queue and running gauges "
                  "of your own exporter in spec.autoscaling.metrics, or disable autoscaling"),
}


@dataclass(frozen=True)
class MetricOverrides:
    """Per-deployment overrides: metric names (validated) and extra label matchers.

    Any name given replaces the engine's list for that signal. Histogram names
    may be given with or without the ``_bucket`` suffix.
    """

    ttft_histogram: str | None = None
    itl_histogram: str | None = None
    requests_counter: str | None = None
    queue_gauge: str | None = None
    running_gauge: str | None = None
    kv_usage_gauge: str | None = None
    labels: tuple[LabelMatcher, ...] = ()

    def apply(self, names: EngineMetricNames) -> EngineMetricNames:
        def pick(override: str | None, current: tuple[str, ...], fname: str, histogram: bool) -> tuple[str, ...]:
            if override is None:
                return current
            validate_metric_name(override, f"metrics.{fname}")
            if histogram and override.endswith("_bucket"):
                override = override[: -len("_bucket")]
            return (override,)

        return EngineMetricNames(
            ttft_histograms=pick(self.ttft_histogram, names.ttft_histograms, "ttftHistogram", True),
            itl_histograms=pick(self.itl_histogram, names.itl_histograms, "itlHistogram", True),
            requests_counters=pick(self.requests_counter, names.requests_counters, "requestsCounter", False),
            queue_gauges=pick(self.queue_gauge, names.queue_gauges, "queueGauge", False),
            running_gauges=pick(self.running_gauge, names.running_gauges, "runningGauge", False),
            kv_usage_gauges=pick(self.kv_usage_gauge, names.kv_usage_gauges, "kvCacheUsage", False),
            source=names.source + (" (with per-deployment overrides)" if self != MetricOverrides() else ""),
        )


# --- the queries -------------------------------------------------------------


@dataclass(frozen=True)
class QuerySet:
    """The PromQL the source runs for one deployment, one evaluation."""

    ttft_s: str
    itl_s: str
    request_rate_per_s: str
    queue_depth: str
    running: str
    sample_age_s: str
    percentile: float
    window: str
    names: EngineMetricNames = field(compare=False)
    kv_usage: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {
            "ttft_s": self.ttft_s,
            "itl_s": self.itl_s,
            "request_rate_per_s": self.request_rate_per_s,
            "queue_depth": self.queue_depth,
            "running": self.running,
            "sample_age_s": self.sample_age_s,
        }
        if self.kv_usage is not None:
            out["kv_usage"] = self.kv_usage
        return out

    def metric_names(self, signal: str) -> tuple[str, ...]:
        """The metric names one signal's query reads (for messages naming a missing signal)."""
        n = self.names
        return {
            "ttft_s": tuple(h + "_bucket" for h in n.ttft_histograms),
            "itl_s": tuple(h + "_bucket" for h in n.itl_histograms),
            "request_rate_per_s": n.requests_counters,
            "queue_depth": n.queue_gauges,
            "running": n.running_gauges,
            "kv_usage": n.kv_usage_gauges,
        }.get(signal, ())


# The target label Prometheus' Kubernetes pod discovery gives each engine pod: the Prometheus
# Operator's PodMonitor adds `pod` (and `namespace`, `container`) to every series it scrapes
# (prometheus-operator Documentation/api.md, PodMonitor; generated relabelling
# `__meta_kubernetes_pod_name` -> `pod`).
DEFAULT_POD_LABEL = "pod"


def _per_pod(parts: list[str], pod_label: str) -> str:
    """Join the alternatives of one signal so that each pod contributes its own newest name.

    `A or on(pod) B` keeps every series of A and those series of B whose pod has no A series:
    during a rolling upgrade old pods (old names) and new pods (new names) are both counted,
    and a pod exporting both is counted once, under the newest name. Series without a pod
    label all match each other (one group), i.e. the fallback is then deployment-wide.
    """
    return f" or on({pod_label}) ".join(parts)


def build_queries(
    engine: Engine,
    matchers: tuple[LabelMatcher, ...],
    *,
    percentile: float = 99,
    window: str = "2m",
    overrides: MetricOverrides | None = None,
    pod_label: str = DEFAULT_POD_LABEL,
) -> QuerySet:
    """All queries for one deployment. `matchers` normally come from `scope_matchers`."""
    validate_label_name(pod_label, "metrics.podLabel")
    if engine in ENGINES_WITHOUT_METRICS:
        o = overrides or MetricOverrides()
        named = (o.ttft_histogram, o.itl_histogram, o.requests_counter, o.queue_gauge, o.running_gauge)
        if not all(named):
            raise QueryInputError("spec.engine.kind", ENGINES_WITHOUT_METRICS[engine])
        base = EngineMetricNames(ttft_histograms=(str(o.ttft_histogram),), itl_histograms=(str(o.itl_histogram),),
                                 requests_counters=(str(o.requests_counter),), queue_gauges=(str(o.queue_gauge),),
                                 running_gauges=(str(o.running_gauge),), source="spec.autoscaling.metrics")
    elif engine not in ENGINE_METRICS:
        raise QueryInputError("spec.engine", f"{engine!r} is not one of {', '.join(ENGINE_METRICS)}")
    if not matchers:
        raise QueryInputError("metrics.labels", "queries must be scoped by at least one label matcher")
    names = base if engine in ENGINES_WITHOUT_METRICS else ENGINE_METRICS[engine]
    if overrides is not None:
        names = overrides.apply(names)
        matchers = (*matchers, *overrides.labels)
    q = _quantile(percentile)
    w = validate_window(window)
    sel = render_selector(matchers)

    def quantile(histograms: tuple[str, ...]) -> str:
        rates = _per_pod([f"rate({h}_bucket{sel}[{w}])" for h in histograms], pod_label)
        return f"histogram_quantile({q}, sum by (le) ({rates}))"

    def summed(metrics: tuple[str, ...], fn: str | None = None, agg: str = "sum") -> str:
        """`agg` over pods of each series as it is (`fn` None) or of `fn(series[w])` (rate, avg_over_time)."""
        return f"{agg}(" + _per_pod([f"{fn}({m}{sel}[{w}])" if fn else f"{m}{sel}" for m in metrics], pod_label) + ")"

    # The newest scrape of any series any signal reads: a deployment whose engine exports
    # only some of the signals still has an age (timestamp() drops the metric name, so `or`
    # here only removes exact duplicates; max takes the newest).
    age_series = (
        *names.running_gauges, *names.queue_gauges, *names.requests_counters, *names.kv_usage_gauges,
        *(h + "_count" for h in (*names.ttft_histograms, *names.itl_histograms)),
    )
    age_series = tuple(dict.fromkeys(age_series))
    return QuerySet(
        ttft_s=quantile(names.ttft_histograms),
        itl_s=quantile(names.itl_histograms),
        request_rate_per_s=summed(names.requests_counters, fn="rate"),
        # The queue over the window, like the rates: one sample of the gauge is not the backlog. Under a steady
        # overload a real vLLM 0.32.0 (CPU build, e2e/test_real_vllm.py: 128 requests in flight against
        # --max-num-seqs 32) was scraped at 0 waiting at one instant and 98 within the same 30 s, and a
        # scale-up was sized on "0 queued".
        queue_depth=summed(names.queue_gauges, fn="avg_over_time"),
        running=summed(names.running_gauges),
        sample_age_s="time() - max(" + " or ".join(f"timestamp({m}{sel})" for m in age_series) + ")",
        percentile=float(percentile),
        window=w,
        names=names,
        # KV usage: the fullest replica (max), a fraction 0..1.
        kv_usage=summed(names.kv_usage_gauges, agg="max") if names.kv_usage_gauges else None,
    )
