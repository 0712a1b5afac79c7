"""NIM and DeepSpeed-MII beyond their command lines: precision rule, pricing, metrics, image (docs/engines.md)."""

from __future__ import annotations

import pytest

import meshplan.planner  # noqa: F401  (first: meshplan.engines.base imports the planner's types)
from meshplan import engines
from meshplan.autoscale.promql import MetricOverrides, QueryInputError, build_queries, scope_matchers
from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner import perf
from meshplan.planner.memory import choose_precision


def test_precision_rule_plans_16_bit_for_engines_that_cannot_be_told_fp8():
    model, h100 = get_model("llama-3.1-70b"), get_gpu("h100_sxm")
    assert choose_precision(model, h100, accuracy_floor="fp8", engine="vllm")[1] == "fp8"
    for kind in ("nim", "deepspeed"):
        assert choose_precision(model, h100, accuracy_floor="fp8", engine=kind) == ("bf16", "bf16"), kind


def test_nim_and_mii_are_priced_as_vllm_and_say_so():
    h100 = get_gpu("h100_sxm")
    for kind in ("nim", "deepspeed"):
        assert engines.priced_as(kind) == "vllm"
        assert perf.engine_defaults(kind, h100) == perf.engine_defaults("vllm", h100)
        assert "priced as vLLM" in engines.MODULES[kind].PRICED_AS_REASON


def test_deepspeed_has_no_metrics_and_says_why_unless_every_signal_is_named():
    m = scope_matchers("ns", "llm")
    with pytest.raises(QueryInputError, match="DeepSpeed-MII 0.3.3 exports no Prometheus metrics"):
        build_queries("deepspeed", m)
    with pytest.raises(QueryInputError, match="exports no Prometheus metrics"):
        build_queries("deepspeed", m, overrides=MetricOverrides(ttft_histogram="my_ttft_seconds"))
    q = build_queries("deepspeed", m, overrides=MetricOverrides(
        ttft_histogram="my_ttft_seconds_bucket", itl_histogram="my_itl_seconds", requests_counter="my_requests_total",
        queue_gauge="my_waiting", running_gauge="my_running"))
    text = repr(q)
    assert "my_ttft_seconds_bucket" in text and "my_requests_total" in text and "vllm:" not in text


def test_nim_queries_use_nim_s_documented_names():
    text = repr(build_queries("nim", scope_matchers("ns", "llm")))
    assert "time_to_first_token_seconds_bucket" in text and "vllm:" not in text


@pytest.mark.parametrize("kind", ["nim", "deepspeed"])
def test_rendering_without_an_image_names_the_field(kind, monkeypatch):
    import test_render_golden as g

    from meshplan.render import RenderError

    monkeypatch.delitem(g.NEW_ENGINE_IMAGES, kind)
    with pytest.raises(RenderError, match=f"spec.engine.image: engine {kind} has no image"):
        g.render_scenario(kind, "hgx-h100-tp2")
