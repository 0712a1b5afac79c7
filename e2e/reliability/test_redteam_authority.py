"""Red team, issue #17 part A: an LLMDeployment grants no more than its author already has.

The attacker is the suite's tenant (e2e/reliability/tenant.py): a ServiceAccount that may manage
LLMDeployments in its namespace and nothing else, impersonated, so RBAC and admission judge each
request exactly as they would judge the tenant's own token. The operator runs as the chart's
ServiceAccount (kit.operator_kubeconfig) with the chart's engine policy: the MESHPLAN_ENGINE_POLICY
value of the rendered Deployment (enginePolicy.serviceAccountName=llm-engines, the rest default),
and the chart's ValidatingAdmissionPolicy and binding are applied exactly as `helm template`
renders them (release `e2e`, whose ServiceAccount the operator runs as). The namespace enforces
the `baseline` Pod Security Standard.

Each attack is refused up front (CRD schema/CEL or the admission policy, with the field named) or
reported by the operator as a condition; no pod runs an image the admin did not allow, reads a
Secret, mounts a ServiceAccount token or sees a `$(VAR)` expanded; the canary LLMDeployment beside
them stays Available throughout.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
import time
import uuid

import pytest
import yaml

from . import kit
from .tenant import as_tenant, make_tenant, tenant_can

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-rta-*"
RELEASE = "e2e"                    # the release whose ServiceAccount kit.operator_kubeconfig makes
OPERATOR_NS = "meshplan-e2e-operator"
ENGINE_SA = "llm-engines"
VALUES = {"enginePolicy.serviceAccountName": ENGINE_SA}
ALLOWED_REPOS = ("vllm/vllm-openai", "docker.io/vllm/vllm-openai", "lmsysorg/sglang", "docker.io/lmsysorg/sglang",
                 "nvcr.io/nvidia/tensorrt-llm/release")


def _cases():
    path = kit.REPO / "tests" / "test_authority.py"
    spec = importlib.util.spec_from_file_location("meshplan_authority_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CASES = _cases()


def _rendered(cluster, template: str) -> list[dict]:
    from e2e.chart_credentials import render

    return [d for d in yaml.safe_load_all(render(cluster, [template], OPERATOR_NS, RELEASE, VALUES)) if d]


@pytest.fixture(scope="module")
def policy_objects(cluster):
    """The chart's ValidatingAdmissionPolicy + binding, as rendered, applied; removed afterwards."""
    kit.ensure_crd(cluster)
    kit.operator_kubeconfig(cluster)     # the chart's ServiceAccount exists before its exemption matters
    objs = _rendered(cluster, "templates/engine-policy.yaml")
    assert {o["kind"] for o in objs} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    cluster.kubectl("apply", "-f", "-", input=doc)
    yield objs
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=doc, check=False)


@pytest.fixture(scope="module")
def op(cluster, request, policy_objects):
    """The operator with the chart's policy env (from the rendered Deployment)."""
    [dep] = _rendered(cluster, "templates/deployment.yaml")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    policy = env["MESHPLAN_ENGINE_POLICY"]
    assert json.loads(policy)["serviceAccountName"] == ENGINE_SA
    old = os.environ.get("MESHPLAN_ENGINE_POLICY")
    os.environ["MESHPLAN_ENGINE_POLICY"] = policy      # OperatorProcess passes os.environ on
    try:
        o = kit.start(kit.operator(cluster, GLOB))
    finally:
        if old is None:
            os.environ.pop("MESHPLAN_ENGINE_POLICY", None)
        else:
            os.environ["MESHPLAN_ENGINE_POLICY"] = old
    failed = request.session.testsfailed
    yield o
    o.stop()
    if request.session.testsfailed > failed:
        print(f"\n----- operator log (tail) -----\n{o.tail(150)}")


@pytest.fixture(scope="module")
def fleet(cluster):
    f = kit.Fleet(cluster, "rel-rta", [kit.h100_group("rel-rta-h", 3)])
    f.add()
    yield f
    f.delete()


@pytest.fixture(scope="module")
def ns(cluster, op):
    name = f"mprel-rta-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=baseline",
                    "pod-security.kubernetes.io/enforce-version=latest")
    cluster.kubectl("create", "serviceaccount", ENGINE_SA, "-n", name)
    cluster.kubectl("create", "secret", "generic", "db", "-n", name, "--from-literal=password=hunter2")
    make_tenant(cluster, name)
    yield name
    kit.drop_namespace(cluster, name)


def base(name: str, fleet: kit.Fleet) -> dict:
    return kit.pinned(name, fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8)


def _with_spec(m: dict, patch: dict) -> dict:
    m = copy.deepcopy(m)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(m["spec"].get(k), dict):
            m["spec"][k] = {**m["spec"][k], **v}
        else:
            m["spec"][k] = v
    return m


def tenant_apply(cluster, ns: str, manifest: dict):
    return as_tenant(cluster, ns, "apply", "-f", "-", input=json.dumps(manifest))


@pytest.fixture(scope="module")
def canary(cluster, ns, fleet):
    """A normal deployment of the tenant's; every test checks it is still Available."""
    r = tenant_apply(cluster, ns, base("canary", fleet))
    assert r.returncode == 0, r.stderr
    kit.available(cluster, ns, "canary", timeout_s=120)
    return "canary"


def _still_available(cluster, ns: str, name: str = "canary") -> None:
    o = kit.get(cluster, ns, "llmd", name)
    assert kit.cond(o, "Available").get("status") == "True", json.dumps((o or {}).get("status"))[:1500]


def test_premise_the_tenant_may_manage_llmdeployments_only(cluster, ns):
    assert tenant_can(cluster, ns, "create", "llmdeployments.meshplan.dev")
    for verb, resource in (("create", "pods"), ("get", "secrets"), ("create", "services"),
                           ("create", "serviceaccounts/token")):
        assert not tenant_can(cluster, ns, verb, resource), (verb, resource)


@pytest.mark.parametrize("case_id,patch,field", CASES.UP_FRONT_CASES, ids=[c[0] for c in CASES.UP_FRONT_CASES])
def test_crd_refuses_guard_cases_up_front_naming_the_field(cluster, ns, fleet, canary, case_id, patch, field):
    m = _with_spec(base(f"bad-{case_id}"[:50], fleet), patch)
    r = tenant_apply(cluster, ns, m)
    assert r.returncode != 0, f"accepted: {json.dumps(m['spec'])[:400]}"
    assert field in r.stderr, r.stderr[:2000]
    _still_available(cluster, ns)


POLICY_CASES = [
    ("image-not-allowed", {"engine": {"kind": "vllm", "image": "evil.example/miner:latest"}}, "spec.engine.image"),
    ("image-lookalike-repo", {"engine": {"kind": "vllm", "image": "vllm/vllm-openai-evil:v1"}}, "spec.engine.image"),
    ("image-other-engines-repo", {"engine": {"kind": "sglang", "image": "vllm/vllm-openai:v0.12.0"}},
     "spec.engine.image"),
    ("engine-env-secret", {"engine": {"kind": "vllm", "env": [
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}},
     "spec.engine.env[].valueFrom"),
    ("nccl-env-secret", {"nccl": {"env": [
        {"name": "NCCL_X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}},
     "spec.nccl.env[].valueFrom"),
]


@pytest.mark.parametrize("case_id,patch,field", POLICY_CASES, ids=[c[0] for c in POLICY_CASES])
def test_admission_policy_refuses_what_the_admin_did_not_allow(cluster, ns, fleet, canary, case_id, patch, field):
    m = _with_spec(base(f"pol-{case_id}"[:50], fleet), patch)
    r = tenant_apply(cluster, ns, m)
    assert r.returncode != 0, f"accepted: {json.dumps(m['spec'])[:400]}"
    assert "ValidatingAdmissionPolicy" in r.stderr and field in r.stderr, r.stderr[:2000]
    _still_available(cluster, ns)


def test_allowed_image_is_admitted(cluster, ns, fleet, canary):
    m = _with_spec(base("pinned-tag", fleet), {"engine": {"kind": "vllm", "image": "vllm/vllm-openai:v0.12.0"}})
    r = as_tenant(cluster, ns, "apply", "--dry-run=server", "-f", "-", input=json.dumps(m))
    assert r.returncode == 0, r.stderr


def test_operator_refuses_what_reaches_it_past_admission(cluster, ns, fleet, canary, policy_objects):
    """With the binding switched to Warn (an admin trying a policy out), the tenant's disallowed image and
    Secret env are admitted: the operator reports each as Planned=False/NotAllowed and creates no pod."""
    binding = next(o for o in policy_objects if o["kind"] == "ValidatingAdmissionPolicyBinding")
    name = binding["metadata"]["name"]
    cluster.kubectl("patch", "validatingadmissionpolicybinding", name, "--type=merge",
                    "-p", json.dumps({"spec": {"validationActions": ["Warn"]}}))
    try:
        def admitted(m):
            for _ in range(20):       # the binding change reaches admission within a second or so
                r = tenant_apply(cluster, ns, m)
                if r.returncode == 0:
                    return r
                time.sleep(0.5)
            raise AssertionError(r.stderr)
        img = _with_spec(base("warn-image", fleet), {"engine": {"kind": "vllm", "image": "evil.example/miner:1"}})
        r = admitted(img)
        assert "spec.engine.image" in r.stderr          # kubectl prints the policy's warning
        env = _with_spec(base("warn-env", fleet), {"engine": {"kind": "vllm", "env": [
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}})
        admitted(env)
    finally:
        cluster.kubectl("patch", "validatingadmissionpolicybinding", name, "--type=merge",
                        "-p", json.dumps({"spec": {"validationActions": ["Deny"]}}))
    for dep, text in (("warn-image", "enginePolicy.allowedImages.vllm"), ("warn-env", "enginePolicy.allowEnvValueFrom")):
        def reported(dep=dep):
            o = kit.get(cluster, ns, "llmd", dep)
            p = kit.cond(o, "Planned")
            return p if p.get("status") == "False" and p.get("reason") == "NotAllowed" else None
        p = kit.wait(reported, 60, f"{dep} Planned=False/NotAllowed")
        assert text in p["message"], p
        assert not [x for x in kit.pods(cluster, ns)
                    if x["metadata"]["labels"].get("meshplan.dev/deployment") == dep]
    _still_available(cluster, ns)


def test_operator_reports_an_abbreviation_the_crd_cannot_see(cluster, ns, fleet, canary):
    """SGLang `--tp` passes the CRD with allowPlanOverride (a PLAN_OWNED_FLAGS spelling); SGLang's argparse
    would read it as `--tp-size`. The operator checks exact option names: Planned=False/InvalidSpec."""
    m = _with_spec(base("sgl-abbrev", fleet), {"engine": {"kind": "sglang", "allowPlanOverride": True,
                                                          "extraArgs": ["--tp", "4"]}})
    r = tenant_apply(cluster, ns, m)
    assert r.returncode == 0, r.stderr

    def reported():
        p = kit.cond(kit.get(cluster, ns, "llmd", "sgl-abbrev"), "Planned")
        return p if p.get("status") == "False" else None
    p = kit.wait(reported, 60, "sgl-abbrev Planned=False")
    assert p["reason"] == "InvalidSpec" and "abbreviation of --tp-size" in p["message"], p
    assert not [x for x in kit.pods(cluster, ns) if x["metadata"]["labels"].get("meshplan.dev/deployment")
                == "sgl-abbrev"]
    _still_available(cluster, ns)


def test_kubelet_references_reach_the_engine_escaped(cluster, ns, fleet, canary):
    """`$(VAR)` in extraArgs is admitted (it is a value) and rendered as `$$(VAR)`, which the kubelet
    turns back into the literal text: no variable, and so no Secret, is expanded into the command line."""
    m = _with_spec(base("dollar", fleet), {"engine": {"kind": "vllm", "extraArgs": [
        "--max-model-len=16384", "--chat-template", "$(HF_TOKEN)$(MESHPLAN_LEADER_ADDRESS)"],
        "env": [{"name": "GREETING", "value": "$(MESHPLAN_NODE_RANK)"}]}})
    r = tenant_apply(cluster, ns, m)
    assert r.returncode == 0, r.stderr
    kit.available(cluster, ns, "dollar", timeout_s=120)
    [pod] = [p for p in kit.pods(cluster, ns) if p["metadata"]["labels"].get("meshplan.dev/deployment") == "dollar"]
    args = pod["spec"]["containers"][0]["args"]
    assert "$$(HF_TOKEN)$$(MESHPLAN_LEADER_ADDRESS)" in args, args
    assert not any("$(" in a.replace("$$(", "") for a in args), args
    _still_available(cluster, ns)


def test_no_pod_runs_a_disallowed_image_reads_a_secret_or_mounts_a_token(cluster, ns, canary):
    pods = kit.pods(cluster, ns)
    assert pods, "no engine pods at all"
    for p in pods:
        spec, name = p["spec"], p["metadata"]["name"]
        assert spec.get("automountServiceAccountToken") is False, name
        assert spec.get("serviceAccountName") == ENGINE_SA, name
        assert not any("projected" in v or "secret" in v for v in spec.get("volumes") or []), (name, spec["volumes"])
        for c in spec["containers"] + spec.get("initContainers", []):
            repo = c["image"].split("@")[0].rsplit(":", 1)[0] if ":" in c["image"].split("/")[-1] \
                else c["image"].split("@")[0]
            assert repo in ALLOWED_REPOS, (name, c["image"])
            assert not c.get("envFrom"), name
            for e in c.get("env") or []:
                assert "secretKeyRef" not in (e.get("valueFrom") or {}), (name, e)
            assert not (c.get("securityContext") or {}).get("privileged"), name
    _still_available(cluster, ns)
