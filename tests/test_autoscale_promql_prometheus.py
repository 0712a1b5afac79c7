"""meshplan's PromQL evaluated by Prometheus' own engine (`promtool test rules`), not by a fake.

`promtool` ships with Prometheus (Debian package `prometheus`; here 2.42). Its rule unit tests
evaluate a PromQL expression over synthetic input series at a given time and compare the result
(https://prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/). The series below
are test inputs chosen so the per-pod combination and the old whole-deployment fallback give
different answers; they are not engine captures (those are in tests/fixtures/metrics/).
Without promtool on the PATH these tests are skipped (reported as skipped, never as passed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from meshplan.autoscale.promql import ENGINE_METRICS, build_queries, scope_matchers

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Prometheus) is not installed")

SEL = 'namespace="ns",meshplan_dev_deployment="d"'


def promtool_test(tmp_path: Path, series: list[tuple[str, str]], exprs: list[tuple[str, float]]) -> None:
    doc = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [
                # compared in 1e-4 steps (promtool compares floats exactly)
                {"expr": f"round(({e}) * 10000)", "eval_time": "5m",
                 "exp_samples": [{"labels": "{}", "value": round(v * 10000)}]} for e, v in exprs
            ],
        }],
    }
    path = tmp_path / "t.yml"
    path.write_text(json.dumps(doc))            # JSON is YAML
    out = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def hist(name: str, pod: str, per_step: dict[str, int]) -> list[tuple[str, str]]:
    return [(f'{name}_bucket{{{SEL},pod="{pod}",le="{le}"}}', f"0+{n}x40") for le, n in per_step.items()]


def test_rolling_upgrade_old_and_new_names_are_combined_per_pod(tmp_path: Path) -> None:
    qs = build_queries("vllm", scope_matchers("ns", "d"), percentile=50, window="2m")
    # pod "old" (v0 names): every token within 0.05 s; pod "new" (V1 names): all in (0.05, 0.1].
    old = hist("vllm:time_per_output_token_seconds", "old", {"0.05": 10, "0.1": 10, "+Inf": 10})
    new = hist("vllm:inter_token_latency_seconds", "new", {"0.05": 0, "0.1": 10, "+Inf": 10})
    # pod "both" exports both names (as some releases do during a deprecation): counted once
    both = (hist("vllm:inter_token_latency_seconds", "both", {"0.05": 10, "0.1": 10, "+Inf": 10})
            + hist("vllm:time_per_output_token_seconds", "both", {"0.05": 10, "0.1": 10, "+Inf": 10}))
    kv = [(f'vllm:gpu_cache_usage_perc{{{SEL},pod="old"}}', "0.75x40"),
          (f'vllm:kv_cache_usage_perc{{{SEL},pod="new"}}', "0.25x40")]
    running = [(f'vllm:num_requests_running{{{SEL},pod="{p}"}}', "4x40") for p in ("old", "new", "both")]
    # Per pod: rates at le=0.05 are 20/15 (old+both), at 0.1 and +Inf 30/15 -> the median (rank 15/15)
    # lies in the first bucket: 0.05 x (15/20) = 0.0375. The old whole-deployment fallback would read
    # only the V1 pods ("new", "both"): 10/15 at 0.05, 20/15 at +Inf -> rank 10/15 -> 0.05.
    # KV: the fullest replica is the v0 pod (0.75); the fallback saw only 0.25.
    promtool_test(tmp_path, old + new + both + kv + running, [
        (qs.itl_s, 0.0375),
        (qs.kv_usage, 0.75),
        (qs.running, 12),
    ])


def test_the_whole_deployment_fallback_would_have_read_one_name(tmp_path: Path) -> None:
    # The shape before issue 15: `(quantile of new) or (quantile of old)`, evaluated on the same input.
    q = (f"(histogram_quantile(0.5, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{{SEL}}}[2m])))) or "
         f"(histogram_quantile(0.5, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket{{{SEL}}}[2m]))))")
    old = hist("vllm:time_per_output_token_seconds", "old", {"0.05": 10, "0.1": 10, "+Inf": 10})
    new = hist("vllm:inter_token_latency_seconds", "new", {"0.05": 0, "0.1": 10, "+Inf": 10})
    promtool_test(tmp_path, old + new, [(q, 0.075)])     # only the upgraded pod: 0.05 + 0.05 x 0.5


@pytest.mark.parametrize("engine", sorted(ENGINE_METRICS))
def test_every_query_parses_and_an_absent_signal_is_empty_not_an_error(tmp_path: Path, engine: str) -> None:
    qs = build_queries(engine, scope_matchers("ns", "d"))
    names = ENGINE_METRICS[engine]
    # only the running gauge exists: its query and the sample age answer, the others are empty
    series = [(f'{names.running_gauges[0]}{{{SEL},pod="p"}}', "3x40")]
    doc = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [
                {"expr": qs.running, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 3}]},
                {"expr": f"({qs.sample_age_s}) < bool 30", "eval_time": "5m",
                 "exp_samples": [{"labels": "{}", "value": 1}]},
                *({"expr": q, "eval_time": "5m", "exp_samples": []}
                  for q in (qs.ttft_s, qs.itl_s, qs.request_rate_per_s, qs.queue_depth, qs.kv_usage)),
            ],
        }],
    }
    path = tmp_path / "t.yml"
    path.write_text(json.dumps(doc))
    out = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
