"""Every weights form on a real kube-apiserver: the LLMDeployment is accepted, and the Pod meshplan renders
for it (volumes, read-only mounts, Secret-sourced credentials) passes the API server's own Pod validation.

The forms are the table of tests/test_render_weights.py (whose golden files fix what is rendered); the
refused forms are in tests/test_api_invalid.py and go through e2e/test_api_validation.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def _load_forms():
    sys.path.insert(0, str(REPO / "tests"))          # the module imports tests/_gpu_nodes.py
    path = REPO / "tests" / "test_render_weights.py"
    spec = importlib.util.spec_from_file_location("meshplan_render_weights_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


FORMS = _load_forms()


@pytest.fixture(scope="module")
def api(cluster):
    from e2e.operator_runner import apply_crd

    apply_crd(cluster)
    ns = f"weights-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    yield cluster, ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("form", sorted(FORMS.FORMS))
def test_weights_form_is_accepted_and_its_pod_is_a_valid_pod(api, form):
    cluster, ns = api
    engine, model = FORMS.FORMS[form]
    manifest = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
                "metadata": {"name": f"w-{form}"[:63]}, "spec": {"model": model, "engine": {"kind": engine}}}
    res = cluster.kubectl("create", "-n", ns, "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
    assert res.returncode == 0, f"{form}: LLMDeployment refused:\n{res.stderr}"
    spec = FORMS.spec_for(engine, model)
    pods = [o for o in FORMS.render(spec) if o["kind"] == "Pod"]
    assert pods
    for pod in pods:
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["namespace"] = ns
        res = cluster.kubectl("create", "-n", ns, "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert res.returncode == 0, f"{form}: the API server refused the rendered Pod:\n{res.stderr}"
        # what the server would store keeps the volumes and mounts as rendered
        stored = json.loads(cluster.kubectl("create", "-n", ns, "--dry-run=server", "-o", "json", "-f", "-",
                                            input=json.dumps(pod)).stdout)
        names = [v["name"] for v in stored["spec"]["volumes"] if not v["name"].startswith("kube-api-access-")]
        assert names == [v["name"] for v in pod["spec"]["volumes"]]   # (the server adds the SA token volume)
        mounts = {m["name"]: m for m in stored["spec"]["containers"][0]["volumeMounts"]}
        if "weights" in mounts:
            assert mounts["weights"]["readOnly"] is True
