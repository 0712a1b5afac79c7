"""meshplan.metrics: the controller's one-call API produces the scraped series."""

from __future__ import annotations

import urllib.request

import pytest

from meshplan import metrics


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    got = metrics.REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if got is None else got


def test_reconcile_ok_and_error_are_counted_and_timed():
    ok0 = _value("meshplan_reconciles_total", {"result": "ok"})
    err0 = _value("meshplan_reconciles_total", {"result": "error"})
    errors0 = _value("meshplan_reconcile_errors_total")
    count0 = _value("meshplan_reconcile_duration_seconds_count")
    sum0 = _value("meshplan_reconcile_duration_seconds_sum")
    le_small0 = _value("meshplan_reconcile_duration_seconds_bucket", {"le": "0.05"})

    metrics.observe_reconcile(0.02, ok=True)
    metrics.observe_reconcile(3.0, ok=False)

    assert _value("meshplan_reconciles_total", {"result": "ok"}) == ok0 + 1
    assert _value("meshplan_reconciles_total", {"result": "error"}) == err0 + 1
    assert _value("meshplan_reconcile_errors_total") == errors0 + 1
    assert _value("meshplan_reconcile_duration_seconds_count") == count0 + 2
    assert _value("meshplan_reconcile_duration_seconds_sum") == pytest.approx(sum0 + 3.02)
    # only the 20 ms reconcile falls in the le=0.05 bucket
    assert _value("meshplan_reconcile_duration_seconds_bucket", {"le": "0.05"}) == le_small0 + 1


def test_plan_duration_histogram():
    count0 = _value("meshplan_plan_duration_seconds_count")
    metrics.observe_plan(0.004)
    assert _value("meshplan_plan_duration_seconds_count") == count0 + 1


def test_scaling_decisions_by_direction_and_reason():
    up0 = _value("meshplan_scaling_decisions_total", {"direction": "up", "reason": "TtftAboveSlo"})
    metrics.count_scaling("up", "TtftAboveSlo")
    metrics.count_scaling("down", "Underutilized")
    assert _value("meshplan_scaling_decisions_total", {"direction": "up", "reason": "TtftAboveSlo"}) == up0 + 1
    assert _value("meshplan_scaling_decisions_total", {"direction": "down", "reason": "Underutilized"}) >= 1


def test_unknown_direction_is_refused():
    with pytest.raises(ValueError, match="direction"):
        metrics.count_scaling("sideways", "Whatever")


def test_metrics_server_serves_the_registry_and_is_idempotent():
    port = metrics.start_metrics_server(0, addr="127.0.0.1")
    assert metrics.start_metrics_server(0, addr="127.0.0.1") == port
    metrics.observe_reconcile(0.1, ok=True)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "meshplan_reconciles_total{result=\"ok\"}" in body
    assert "meshplan_plan_duration_seconds_bucket" in body

