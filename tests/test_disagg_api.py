"""spec.serving.disaggregation and status.disaggregation (issue 19, step 1): the API, the CRD, the status.

An aggregated manifest (no spec.serving) parses, dumps and plans exactly as before: spec.serving is absent rather
than defaulted, so `reconcile.plan_key`/`spec_key` (the plan cache and hash inputs) do not change for it.
"""

from __future__ import annotations

import copy

import pydantic
import pytest

from meshplan.api import crd as crdmod
from meshplan.api.models import DisaggregationStatus, LLMDeployment, LLMDeploymentStatus
from meshplan.controller.decide_disagg import disaggregation_status
from meshplan.planner.disagg import disagg_plan_for_spec
from meshplan.planner.fleet import load_fleet
from tests.test_api_invalid import base_manifest, with_spec

FLEET = "operator/meshplan/fleets/hgx-h200-ib.yaml"


def r1(mode: str = "enabled") -> dict:
    m = base_manifest("r1")
    m["spec"] = {"model": {"name": "deepseek-r1", "weights": {"uri": "hf://deepseek-ai/DeepSeek-R1"}},
                 "precision": {"weights": "fp8", "kvCache": "fp8"}, "engine": {"kind": "vllm"},
                 "parallelism": {"tensor": 8, "expert": 1, "pipeline": 1}, "gpus": {"maxGpus": 16},
                 "serving": {"disaggregation": mode, "router": {"image": "registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0"}}}
    return m


def test_serving_is_absent_by_default_so_aggregated_specs_dump_and_hash_as_before():
    from meshplan.controller.reconcile import spec_key

    m = base_manifest()
    spec = LLMDeployment.from_manifest(copy.deepcopy(m)).spec
    assert spec.serving is None
    assert "serving" not in spec.to_manifest()
    # the same spec key as a spec whose model never had the field (a hand-made dump without it)
    doc = spec.to_manifest()
    assert spec_key(spec) == spec_key(LLMDeployment.from_manifest({**m, "spec": doc}).spec)


def test_serving_defaults_to_disabled_and_needs_no_router_then():
    spec = LLMDeployment.from_manifest(with_spec({"serving": {}})).spec
    assert spec.serving.disaggregation == "disabled" and spec.serving.router is None


@pytest.mark.parametrize("mode", ["auto", "enabled"])
def test_auto_and_enabled_need_the_router_image_naming_the_field(mode):
    with pytest.raises(pydantic.ValidationError) as info:
        LLMDeployment.from_manifest(with_spec({"serving": {"disaggregation": mode}}))
    assert "spec.serving.router.image is required" in str(info.value)
    ok = LLMDeployment.from_manifest(with_spec({"serving": {"disaggregation": mode,
                                                            "router": {"image": "epp:1"}}}))
    assert ok.spec.serving.router.image == "epp:1"


def test_crd_has_the_field_its_default_the_rule_and_the_roles_column():
    root = crdmod.build_crd()["spec"]["versions"][0]
    props = root["schema"]["openAPIV3Schema"]["properties"]
    serving = props["spec"]["properties"]["serving"]
    assert "default" not in serving            # absent, not {}: aggregated specs unchanged
    d = serving["properties"]["disaggregation"]
    assert d["default"] == "disabled" and d["enum"] == ["auto", "enabled", "disabled"]
    assert "existing manifests" in d["description"]
    rules = serving["x-kubernetes-validations"]
    assert any(r["fieldPath"] == ".router.image" and "spec.serving.router.image" in r["message"] for r in rules)
    st = props["status"]["properties"]["disaggregation"]["properties"]
    assert {"mode", "disaggregated", "label", "ratio", "prefill", "decode", "kvPath", "aggregated",
            "reason"} <= set(st)
    cols = {c["name"]: c for c in root["additionalPrinterColumns"]}
    assert cols["Roles"]["jsonPath"] == ".status.disaggregation.label"


def test_status_of_an_enabled_r1_plan_on_the_h200_ib_fleet():
    spec = LLMDeployment.from_manifest(r1()).spec
    dplan = disagg_plan_for_spec(spec, load_fleet(FLEET), mode="enabled")
    doc = disaggregation_status(dplan)
    DisaggregationStatus.model_validate(doc)                       # the CRD's shape
    LLMDeploymentStatus.model_validate({"disaggregation": doc})
    c = dplan.choice
    assert doc["disaggregated"] is True and doc["mode"] == "enabled"
    assert doc["label"] == c.label() == "P1×TP8 + D1×TP8"
    assert doc["ratio"] == "1:1"
    assert doc["prefill"] == {"layout": "TP8", "replicas": 1, "ttftMs": round(c.prefill.prediction.ttft_ms, 2)}
    assert doc["decode"] == {"layout": "TP8", "replicas": 1, "itlMs": round(c.decode.prediction.tpot_ms, 3)}
    assert doc["kvPath"]["tier"] == c.kv_path.tier
    a = dplan.aggregated.choice
    assert doc["aggregated"]["label"] == "TP8 x DP2"
    assert doc["aggregated"]["tokensPerSecondPerGpu"] == round(a.prediction.tokens_per_s_per_gpu, 2)
    assert doc["reason"] == dplan.reason


def test_status_of_a_disabled_plan_names_the_aggregated_layout_only():
    spec = LLMDeployment.from_manifest(r1("auto")).spec
    dplan = disagg_plan_for_spec(spec, load_fleet(FLEET), mode="disabled")
    doc = disaggregation_status(dplan)
    DisaggregationStatus.model_validate(doc)
    assert doc["disaggregated"] is False and "prefill" not in doc and doc["label"] == doc["aggregated"]["label"]


def test_the_router_image_is_under_the_admins_allowed_images():
    """The endpoint picker runs in the tenant's namespace like an engine pod: its image passes
    enginePolicy.allowedImages.router (default: the Gateway API Inference Extension's registry path), else the
    operator refuses the spec (NotAllowed) naming the field and the setting."""
    from meshplan.api.models import LLMDeployment
    from meshplan.api.policy import EnginePolicy, policy_problems

    ok = LLMDeployment.from_manifest(r1()).spec
    assert policy_problems(ok, EnginePolicy()) == []
    m = r1()
    m["spec"]["serving"]["router"]["image"] = "evil.example/miner:latest"
    bad = LLMDeployment.from_manifest(m).spec
    problems = policy_problems(bad, EnginePolicy())
    assert len(problems) == 1 and "spec.serving.router.image 'evil.example/miner:latest'" in problems[0]
    assert "enginePolicy.allowedImages.router (registry.k8s.io/gateway-api-inference-extension/*)" in problems[0]
    admin = EnginePolicy.from_values({"allowedImages": {"router": ["evil.example/*"]}})
    assert policy_problems(bad, admin) == []
