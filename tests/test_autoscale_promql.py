"""PromQL builder: scoping, engine names, fallbacks, and injection safety."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.autoscale.promql import (
    ENGINE_METRICS,
    LabelMatcher,
    MetricOverrides,
    QueryInputError,
    build_queries,
    escape_label_value,
    scope_matchers,
    validate_window,
    window_from_seconds,
)

_GO_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def split_literals(query: str) -> tuple[str, list[str]]:
    """Split PromQL into (code with every "..." literal replaced by "S", decoded literals).

    An independent reader of PromQL double-quoted strings (Go escaping), used to
    check that whatever we put in a label value stays inside one literal.
    """
    code, literals, i = [], [], 0
    while i < len(query):
        ch = query[i]
        if ch != '"':
            code.append(ch)
            i += 1
            continue
        i += 1
        buf = []
        while True:
            c = query[i]
            if c == "\\":
                nxt = query[i + 1]
                if nxt == "x":
                    buf.append(chr(int(query[i + 2 : i + 4], 16)))
                    i += 4
                else:
                    buf.append(_GO_ESCAPES[nxt])
                    i += 2
            elif c == '"':
                i += 1
                break
            else:
                assert c != "\n", "raw newline inside a PromQL string literal"
                buf.append(c)
                i += 1
        literals.append("".join(buf))
        code.append('"S"')
    return "".join(code), literals


HOSTILE = [
    '"} or vector(1) #',
    'x"}[5m])) or vector(1) or sum(up{job="',
    "back\\slash\\",
    "new\nline",
    "tab\tand\rreturn",
    "\x00nul\x1bescape\x7f",
    "ünïcødé-名前",
    '\\"',
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_deployment_name_stays_one_literal(value: str) -> None:
    benign = build_queries("vllm", scope_matchers("ns", "benign"))
    hostile = build_queries("vllm", scope_matchers("ns", value))
    for key, q in hostile.as_dict().items():
        code, literals = split_literals(q)
        benign_code, _ = split_literals(benign.as_dict()[key])
        # Same query structure as with a harmless name: nothing escaped the literal.
        assert code == benign_code, key
        assert value in literals
        assert "vector(1)" not in code


@given(st.text())
def test_escape_roundtrips_any_text(value: str) -> None:
    code, literals = split_literals(escape_label_value(value))
    assert code == '"S"'
    assert literals == [value]


def test_queries_are_scoped_and_use_engine_names() -> None:
    qs = build_queries("vllm", scope_matchers("team-a", "llama"), percentile=95, window="90s")
    sel = '{namespace="team-a",meshplan_dev_deployment="llama"}'
    assert qs.ttft_s == f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{sel}[90s])))"
    # ITL falls back to the older TPOT histogram via `or`, newest name first.
    assert qs.itl_s.index("vllm:inter_token_latency_seconds_bucket") < qs.itl_s.index(
        "vllm:time_per_output_token_seconds_bucket"
    )
    # ... per pod, inside the sum: a pod still on the old name is counted next to upgraded ones.
    assert qs.itl_s == (
        f"histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{sel}[90s]) "
        f"or on(pod) rate(vllm:time_per_output_token_seconds_bucket{sel}[90s])))"
    )
    assert qs.request_rate_per_s == f"sum(rate(vllm:request_success_total{sel}[90s]))"
    assert qs.queue_depth == f"sum(avg_over_time(vllm:num_requests_waiting{sel}[90s]))"
    assert qs.running == f"sum(vllm:num_requests_running{sel})"
    assert qs.kv_usage == f"max(vllm:kv_cache_usage_perc{sel} or on(pod) vllm:gpu_cache_usage_perc{sel})"
    # the age is that of the newest scrape of any series a signal reads
    assert qs.sample_age_s.startswith(f"time() - max(timestamp(vllm:num_requests_running{sel}) or ")
    assert f"timestamp(vllm:time_to_first_token_seconds_count{sel})" in qs.sample_age_s
    for q in qs.as_dict().values():
        assert q.count(sel) >= 1


@pytest.mark.parametrize("engine", sorted(ENGINE_METRICS))
def test_every_engine_builds_and_cites_a_source(engine: str) -> None:
    names = ENGINE_METRICS[engine]
    assert names.source
    qs = build_queries(engine, scope_matchers("ns", "d"))
    assert names.ttft_histograms[0] + "_bucket" in qs.ttft_s
    assert names.queue_gauges[0] in qs.queue_depth


def test_sglang_names() -> None:
    qs = build_queries("sglang", scope_matchers("ns", "d"))
    assert "sglang:num_queue_reqs" in qs.queue_depth
    assert "sglang:num_running_reqs" in qs.running
    assert "sglang:time_per_output_token_seconds_bucket" in qs.itl_s


def test_custom_scoping_labels_and_extra_matchers() -> None:
    m = scope_matchers(
        "ns", "d", namespace_label="kubernetes_namespace", deployment_label="app", extra=(LabelMatcher("role", "decode|agg", "=~"),)
    )
    qs = build_queries("vllm", m)
    assert '{kubernetes_namespace="ns",app="d",role=~"decode|agg"}' in qs.running


def test_extra_matcher_cannot_replace_scope() -> None:
    with pytest.raises(QueryInputError, match="metrics.labels"):
        scope_matchers("ns", "d", extra=(LabelMatcher("namespace", "other"),))
    with pytest.raises(QueryInputError, match="metrics.labels"):
        scope_matchers("ns", "d", extra=(LabelMatcher("meshplan_dev_deployment", ".*", "=~"),))


def test_overrides_replace_names_and_add_labels() -> None:
    ov = MetricOverrides(
        ttft_histogram="custom:ttft_seconds_bucket", queue_gauge="gw_queue", labels=(LabelMatcher("pool", "a"),)
    )
    qs = build_queries("vllm", scope_matchers("ns", "d"), overrides=ov)
    assert "custom:ttft_seconds_bucket{" in qs.ttft_s and "_bucket_bucket" not in qs.ttft_s
    assert qs.queue_depth == f'sum(avg_over_time(gw_queue{{namespace="ns",meshplan_dev_deployment="d",pool="a"}}[{qs.window}]))'
    assert "vllm:inter_token_latency_seconds" in qs.itl_s  # not overridden


@pytest.mark.parametrize(
    "bad",
    ["vllm:x{a=\"1\"}", "rate(x[5m])", "x) or vector(1", "1abc", "", "a b", "x#"],
)
def test_override_metric_names_are_validated(bad: str) -> None:
    with pytest.raises(QueryInputError, match="metrics.ttftHistogram"):
        build_queries("vllm", scope_matchers("ns", "d"), overrides=MetricOverrides(ttft_histogram=bad))


@pytest.mark.parametrize("bad", ["1x", "a-b", "a.b", "__name__", "x}", ""])
def test_label_names_are_validated(bad: str) -> None:
    with pytest.raises(QueryInputError):
        LabelMatcher(bad, "v")


def test_matcher_ops_and_regex_are_validated() -> None:
    with pytest.raises(QueryInputError, match="operator"):
        LabelMatcher("a", "b", "==")
    with pytest.raises(QueryInputError, match="regex"):
        LabelMatcher("a", "(", "=~")


@pytest.mark.parametrize("good", ["2m", "90s", "1h30m", "500ms", "1d"])
def test_windows_accept_durations(good: str) -> None:
    assert validate_window(good) == good


@pytest.mark.parametrize("bad", ["", "0s", "2", "2 m", "1m]) or vector(1", "-1m", "m", "1.5m", "30s1m"])
def test_windows_reject_everything_else(bad: str) -> None:
    with pytest.raises(QueryInputError, match="window"):
        build_queries("vllm", scope_matchers("ns", "d"), window=bad)


def test_window_from_seconds() -> None:
    assert window_from_seconds(90) == "90s"
    assert window_from_seconds(0.2) == "1s"
    with pytest.raises(QueryInputError):
        window_from_seconds(0)


@pytest.mark.parametrize("bad", [0, 100, -1, 150, True, float("nan")])
def test_percentile_must_be_in_range(bad) -> None:
    with pytest.raises(QueryInputError, match="percentile"):
        build_queries("vllm", scope_matchers("ns", "d"), percentile=bad)


def test_unknown_engine_and_unscoped_queries_are_rejected() -> None:
    with pytest.raises(QueryInputError, match="spec.engine"):
        build_queries("tgi", scope_matchers("ns", "d"))  # type: ignore[arg-type]
    with pytest.raises(QueryInputError, match="scoped"):
        build_queries("vllm", ())


def test_quantile_literal() -> None:
    qs = build_queries("vllm", scope_matchers("ns", "d"), percentile=99.9)
    assert re.match(r"histogram_quantile\(0\.999, ", qs.ttft_s)
