"""The chart's enginePolicy (issue #17): values -> the operator's env and the ValidatingAdmissionPolicy.

Rendered with a real helm (test_chart_render's helpers); the policy's CEL runs against a real
kube-apiserver in e2e/reliability/test_redteam_authority.py, which applies these same rendered objects.
"""

from __future__ import annotations

import json

import yaml
from test_chart_render import CHART, by_kind, container, one, render, render_error

from meshplan.api.policy import DEFAULT_ALLOWED_IMAGES, EnginePolicy
from meshplan.controller.settings import load_engine_policy


def _env(docs) -> dict:
    return {e["name"]: e.get("value") for e in container(docs, "Deployment")["env"]}


def _variables(vap: dict) -> dict:
    return {v["name"]: v["expression"] for v in vap["spec"]["variables"]}


def test_default_values_are_the_operators_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["enginePolicy"]
    assert {k: tuple(v) for k, v in values["allowedImages"].items()} == DEFAULT_ALLOWED_IMAGES
    assert values["allowEnvValueFrom"] is False and values["serviceAccountName"] == ""
    assert values["admissionPolicy"] == {"enabled": True, "validationActions": ["Deny"]}


def test_operator_gets_the_policy_as_json_env():
    docs = render({"enginePolicy": {"allowedImages": {"vllm": ["registry.example/llm/*"]},
                                    "allowEnvValueFrom": True, "serviceAccountName": "llm-engines"}})
    raw = _env(docs)["MESHPLAN_ENGINE_POLICY"]
    assert "admissionPolicy" not in json.loads(raw)
    policy = load_engine_policy({"MESHPLAN_ENGINE_POLICY": raw})
    assert policy.allowed_images["vllm"] == ("registry.example/llm/*",)
    assert policy.allowed_images["sglang"] == DEFAULT_ALLOWED_IMAGES["sglang"]   # helm merges maps
    assert policy.allow_env_value_from is True and policy.service_account_name == "llm-engines"
    assert load_engine_policy({"MESHPLAN_ENGINE_POLICY": _env(render())["MESHPLAN_ENGINE_POLICY"]}) == \
        EnginePolicy()


def test_admission_policy_and_binding_by_default():
    docs = render(namespace="meshplan-system")
    vap = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert vap["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == vap["metadata"]["name"] == "rel-meshplan-engine-policy"
    assert binding["spec"]["validationActions"] == ["Deny"] and "paramRef" not in binding["spec"]
    assert "matchResources" not in binding["spec"]          # cluster-wide watch: every namespace
    assert vap["spec"]["failurePolicy"] == "Fail"
    [rule] = vap["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["meshplan.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                    "resources": ["llmdeployments"]}       # not llmdeployments/status: the operator writes it
    [cond] = vap["spec"]["matchConditions"]
    assert "system:serviceaccount:meshplan-system:rel-meshplan" in cond["expression"]
    assert json.loads(_variables(vap)["allowed"]) == {k: list(v) for k, v in DEFAULT_ALLOWED_IMAGES.items()}
    text = " ".join(v.get("expression", "") + v.get("message", "") + v.get("messageExpression", "")
                    for v in vap["spec"]["validations"])
    assert "spec.engine.image" in text and "spec.engine.env[].valueFrom" in text and "spec.nccl.env[].valueFrom" in text
    assert all(v["reason"] == "Forbidden" for v in vap["spec"]["validations"])


def test_allowing_env_value_from_drops_those_rules_and_namespaced_watch_scopes_the_binding():
    docs = render({"enginePolicy": {"allowEnvValueFrom": True},
                   "watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]}})
    vap = one(docs, "ValidatingAdmissionPolicy")
    assert len(vap["spec"]["validations"]) == 1
    sel = one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["matchResources"]["namespaceSelector"]
    assert sel["matchExpressions"] == [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                        "values": ["team-a", "team-b"]}]


def test_admission_policy_can_be_turned_off_or_set_to_warn():
    assert not by_kind(render({"enginePolicy": {"admissionPolicy": {"enabled": False}}}),
                       "ValidatingAdmissionPolicy")
    binding = one(render({"enginePolicy": {"admissionPolicy": {"validationActions": ["Warn", "Audit"]}}}),
                  "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]


def test_schema_refuses_bad_policy_values_with_the_key():
    assert "tgi" in render_error({"enginePolicy": {"allowedImages": {"tgi": ["x"]}}})
    assert "validationActions" in render_error({"enginePolicy": {"admissionPolicy": {"validationActions": ["Nope"]}}})
    assert "serviceAccountName" in render_error({"enginePolicy": {"serviceAccountName": "Bad_Name"}})
    assert "allowedImages" in render_error({"enginePolicy": {"allowedImages": {"vllm": ["x' || true"]}}})
