"""The router objects of issue 19 against the real API server: the Gateway API Inference Extension's own CRDs
(v1.6.0, from its Go module: e2e/build-control-plane.sh puts config/crd/bases/ in the machine cache) are installed
into the local cluster, and what `render.inference_pool` renders is created there.

The API server prunes fields a CRD's schema does not know, without an error; so the test reads each pool back and
compares its spec with what was sent (a field meshplan misspells would vanish there). A pool the schema refuses is
refused with the field named. No picker runs (kwok runs no container), so only the objects are checked here."""

from __future__ import annotations

import json

import pytest

from meshplan.devcluster.cluster import cache_dir
from meshplan.render import inference_pool as ip

CRD_DIR = cache_dir() / f"crds-gie-{ip.GIE_VERSION}"
POOL_CRD = "inferencepools.inference.networking.k8s.io"


@pytest.fixture(scope="module")
def gie_crds(cluster):
    if not (CRD_DIR / "inference.networking.k8s.io_inferencepools.yaml").is_file():
        pytest.fail(f"{CRD_DIR} has no InferencePool CRD: run e2e/build-control-plane.sh (make setup)")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{POOL_CRD}", "--timeout=60s")
    return CRD_DIR


def _owner(cluster, namespace: str) -> dict:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    cm = json.loads(cluster.kubectl("get", "configmap", "owner", "-n", namespace, "-o", "json").stdout)
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": cm["metadata"]["uid"]}


def _create(cluster, obj: dict, check: bool = True):
    return cluster.kubectl("create", "-f", "-", input=json.dumps(obj), check=check)


def test_rendered_pools_are_accepted_whole_by_the_inference_extensions_crd(cluster, namespace, gie_crds):
    owner = _owner(cluster, namespace)
    rev = ip.serving_revision({"prefill": "a1b2c3d4e5", "decode": "f6a7b8c9d0"})
    disagg = ip.render_inference_pool(name="r1", namespace=namespace, owner=owner, engine="sglang",
                                      disaggregated=True, revision=rev)
    agg = ip.render_inference_pool(name="llama", namespace=namespace, owner=owner, engine="vllm",
                                   disaggregated=False, revision=None, app_protocol="kubernetes.io/h2c",
                                   failure_mode="FailOpen")
    for pool in (disagg, agg):
        _create(cluster, pool)
        got = json.loads(cluster.kubectl("get", "inferencepool", pool["metadata"]["name"], "-n", namespace,
                                         "-o", "json").stdout)
        assert got["apiVersion"] == ip.POOL_API_VERSION
        assert got["spec"] == pool["spec"], "the API server pruned or defaulted a field meshplan renders"
    assert disagg["spec"]["selector"]["matchLabels"][ip.LABEL_SERVING_REVISION] == rev
    # the picker's Deployment, Service and RBAC: core objects, checked by the API server's own validation
    objs = ip.render_epp(name="r1", namespace=namespace, owner=owner, image="registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0")
    objs += ip.render_epp_rbac(name="r1", namespace=namespace, owner=owner)
    assert {o["kind"] for o in objs} >= {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    for o in objs:
        r = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(o))
        assert json.loads(r.stdout)["kind"] == o["kind"]


@pytest.mark.parametrize("field,value,named", [
    ("failureMode", "Maybe", "failureMode"),
    ("targetPorts", [{"number": p} for p in range(8000, 8009)], "targetPorts"),
    ("appProtocol", "grpc", "appProtocol"),
])
def test_the_crd_refuses_a_broken_pool_naming_the_field(cluster, namespace, gie_crds, field, value, named):
    owner = _owner(cluster, namespace)
    pool = ip.render_inference_pool(name="bad", namespace=namespace, owner=owner, engine="vllm",
                                    disaggregated=True, revision="r0")
    if field == "failureMode":
        pool["spec"]["endpointPickerRef"]["failureMode"] = value
    else:
        pool["spec"][field] = value
    r = _create(cluster, pool, check=False)
    assert r.returncode != 0 and named in r.stderr, r.stderr
    assert cluster.kubectl("get", "inferencepool", "bad", "-n", namespace, check=False).returncode != 0
