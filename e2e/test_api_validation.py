"""The generated CRD on a real kube-apiserver: examples accepted, mistakes refused.

The API server, not meshplan, must refuse a bad LLMDeployment (so `kubectl
apply` fails fast and GitOps tools show the error), and its message must name
the field. The invalid manifests are the table in tests/test_api_invalid.py,
which the unit tests also feed to the pydantic models: the two validators are
held to the same cases.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _load_cases():
    path = REPO / "tests" / "test_api_invalid.py"
    spec = importlib.util.spec_from_file_location("meshplan_api_invalid_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CASES = _load_cases()


@pytest.fixture(scope="module")
def api(cluster):
    """The CRD applied and Established, and a namespace for this module's objects."""
    from e2e.operator_runner import apply_crd

    apply_crd(cluster)
    ns = f"api-validation-{uuid.uuid4().hex[:6]}"  # a reused cluster may still be terminating the last one
    cluster.kubectl("create", "namespace", ns)
    yield cluster, ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _apply(cluster, ns: str, manifest: dict, *extra: str) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-n", ns, "-f", "-", *extra, input=json.dumps(manifest), check=False)


def _create(cluster, ns: str, manifest: dict) -> subprocess.CompletedProcess:
    return cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(manifest), check=False)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_and_defaulted(api, path):
    cluster, ns = api
    manifest = yaml.safe_load(path.read_text())
    res = _create(cluster, ns, manifest)
    assert res.returncode == 0, f"{path.name} refused by the API server:\n{res.stderr}"
    name = manifest["metadata"]["name"]
    stored = json.loads(cluster.kubectl("get", "llmd", name, "-n", ns, "-o", "json").stdout)
    # the server filled the nested defaults of sections the example left out
    assert stored["spec"]["engine"]["prefixCaching"] == manifest["spec"].get("engine", {}).get("prefixCaching", True)
    assert stored["spec"]["nccl"]["transport"] == manifest["spec"].get("nccl", {}).get("transport", "auto")
    assert stored["spec"]["autoscaling"]["downWindowSeconds"] == manifest["spec"].get("autoscaling", {}).get(
        "downWindowSeconds", 300
    )
    # and what the server stored parses back into the models unchanged in meaning
    from meshplan.api.models import LLMDeployment

    ours = LLMDeployment.from_manifest(manifest).spec.to_manifest()
    theirs = LLMDeployment.from_manifest(stored).spec.to_manifest()
    assert theirs == ours


@pytest.mark.parametrize("case_id,patch,field", CASES.INVALID_CASES, ids=[c[0] for c in CASES.INVALID_CASES])
def test_invalid_manifest_is_refused_naming_the_field(api, case_id, patch, field):
    cluster, ns = api
    manifest = CASES.with_spec(patch, name=f"bad-{case_id}"[:63])
    res = _apply(cluster, ns, manifest, "--dry-run=server")
    assert res.returncode != 0, f"{case_id}: the API server accepted it"
    assert field in res.stderr, f"{case_id}: error does not name {field}:\n{res.stderr}"


def test_gpu_budget_error_gives_the_numbers(api):
    cluster, ns = api
    manifest = CASES.with_spec({"parallelism": {"tensor": 8, "pipeline": 2}, "replicas": 2, "gpus": {"maxGpus": 16}})
    res = _apply(cluster, ns, manifest, "--dry-run=server")
    assert res.returncode != 0
    assert "spec.gpus.maxGpus 16 is smaller than the 32 GPUs" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "case_id,before,after,field", CASES.IMMUTABLE_CASES, ids=[c[0] for c in CASES.IMMUTABLE_CASES]
)
def test_immutable_field_change_is_refused(api, case_id, before, after, field):
    cluster, ns = api
    name = f"imm-{case_id}"[:63]
    old = CASES.with_spec(before, name=name)
    res = _create(cluster, ns, old)
    assert res.returncode == 0, res.stderr
    new = CASES.merge(copy.deepcopy(old), {"spec": after})
    res = cluster.kubectl("replace", "-n", ns, "-f", "-", input=json.dumps(new), check=False)
    assert res.returncode != 0, f"{case_id}: the API server accepted the change"
    assert field in res.stderr and "immutable" in res.stderr, res.stderr
    # an unrelated change to the same object still goes through
    ok = CASES.merge(copy.deepcopy(old), {"spec": {"replicas": 2}})
    res = cluster.kubectl("replace", "-n", ns, "-f", "-", input=json.dumps(ok), check=False)
    assert res.returncode == 0, res.stderr


def test_scale_subresource_drives_spec_replicas(api):
    cluster, ns = api
    manifest = CASES.with_spec({}, name="scaled")
    assert _create(cluster, ns, manifest).returncode == 0
    cluster.kubectl("scale", "llmd/scaled", "-n", ns, "--replicas=3")
    stored = json.loads(cluster.kubectl("get", "llmd", "scaled", "-n", ns, "-o", "json").stdout)
    assert stored["spec"]["replicas"] == 3


def test_status_from_the_models_is_accepted_and_printed(api):
    """What the operator writes (LLMDeploymentStatus.to_manifest()) fits the CRD's status schema,
    the printer columns show it, and the scale subresource reports replicas and selector."""
    from meshplan.api.models import LLMDeploymentStatus

    cluster, ns = api
    assert _create(cluster, ns, CASES.with_spec({}, name="with-status")).returncode == 0
    status = LLMDeploymentStatus.model_validate({
        "observedGeneration": 1,
        "conditions": [{"type": "Planned", "status": "True", "reason": "PlanChosen", "message": "TP4·EP4·PP4 fits",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "plan": {"layout": "TP4·EP4·PP4", "tp": 4, "ep": 4, "pp": 4, "gpusPerReplica": 64,
                 "predicted": {"ttftMs": 250.0, "itlMs": 20.0, "tokensPerSecondPerGpu": 1234.5}},
        "placement": [{"index": 0, "nvlinkDomain": "clique-a", "nodes": ["n1"], "gpus": 64, "ready": True}],
        "replicas": 1, "readyReplicas": 1, "desiredReplicas": 1, "selector": "meshplan.dev/deployment=with-status",
    })
    res = cluster.kubectl("patch", "llmd", "with-status", "-n", ns, "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": status.to_manifest()}), check=False)
    assert res.returncode == 0, res.stderr
    table = cluster.kubectl("get", "llmd", "with-status", "-n", ns).stdout
    assert "TP4·EP4·PP4" in table and "1234.5" in table and "llama-3.1-8b" in table, table
    scale = json.loads(cluster.kubectl("get", "--raw",
                                       f"/apis/meshplan.dev/v1alpha1/namespaces/{ns}/llmdeployments/with-status/scale").stdout)
    assert scale["status"] == {"replicas": 1, "selector": "meshplan.dev/deployment=with-status"}
    stored = json.loads(cluster.kubectl("get", "llmd", "with-status", "-n", ns, "-o", "json").stdout)
    assert LLMDeploymentStatus.model_validate(stored["status"]) == status


@pytest.mark.parametrize(
    "path",
    ["spec", "spec.slo", "spec.model.weights", "spec.parallelism.tensor", "spec.autoscaling.metrics",
     "spec.nccl.transport", "status.plan.predicted", "status.conditions"],
)
def test_kubectl_explain_prints_a_description(api, path):
    cluster, _ = api
    out = cluster.kubectl("explain", f"llmd.{path}").stdout
    description = out.split("DESCRIPTION:", 1)[1].split("FIELDS:", 1)[0].strip()
    assert len(description) > 20, out


def test_every_spec_field_has_a_description_in_explain(api):
    """`kubectl explain` reads the CRD the server published: every spec field is documented there."""
    from meshplan.api.crd import build_crd, iter_properties

    cluster, _ = api
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    paths = sorted({p.replace("[]", "") for p, _ in iter_properties(schema) if "{}" not in p and not p.endswith("[]")})
    assert len(paths) > 60
    missing = []
    for path in paths:
        out = cluster.kubectl("explain", f"llmd.spec{path}").stdout
        description = out.split("DESCRIPTION:", 1)[-1].split("FIELDS:", 1)[0].strip()
        if not description or description == "<empty>":
            missing.append(path)
    assert not missing, f"fields without a description in kubectl explain: {missing}"
