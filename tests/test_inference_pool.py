"""The InferencePool and endpoint picker meshplan renders (issue 19), checked against the Gateway API Inference
Extension's own CRD.

The schema is NOT copied into this repository. At test time the CRD is read from the Go module cache
(`go mod download sigs.k8s.io/gateway-api-inference-extension@v1.6.0`, file
`config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`) and the rendered objects are validated against
its `openAPIV3Schema` (types, required fields, enums, patterns, bounds, unknown fields, and the two CEL rules,
evaluated here in Python). Where the module cache is absent, the tests fall back to FIELDS below: only the field
list verified by hand from that file and `api/v1/inferencepool_types.go` at v1.6.0, and say so in their id; a
test keeps that list equal to the CRD whenever the cache is there.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshplan.render import inference_pool as ip
from meshplan.render.workloads import LABEL_ROLE, owner_reference

CRD_REL = (f"sigs.k8s.io/gateway-api-inference-extension@{ip.GIE_VERSION}/config/crd/bases/"
           "inference.networking.k8s.io_inferencepools.yaml")

# Verified by hand from CRD_REL at v1.6.0 (fallback only): field -> (type, required, constraint).
FIELDS: dict[str, tuple[str, bool, Any]] = {
    "spec.selector": ("object", True, None),
    "spec.selector.matchLabels": ("object", True, (1, 64)),             # min/maxProperties
    "spec.targetPorts": ("array", True, (1, 8)),                         # min/maxItems, unique numbers (CEL)
    "spec.targetPorts[].number": ("integer", True, (1, 65535)),
    "spec.appProtocol": ("string", False, ("http", "kubernetes.io/h2c")),
    "spec.endpointPickerRef": ("object", False, None),
    "spec.endpointPickerRef.group": ("string", False, None),
    "spec.endpointPickerRef.kind": ("string", False, None),
    "spec.endpointPickerRef.name": ("string", True, None),
    "spec.endpointPickerRef.port": ("object", False, None),              # required for kind Service (CEL)
    "spec.endpointPickerRef.port.number": ("integer", True, (1, 65535)),
    "spec.endpointPickerRef.failureMode": ("string", False, ("FailOpen", "FailClose")),
}


def _modcache() -> Path | None:
    env = os.environ.get("GOMODCACHE")
    if env:
        return Path(env)
    if shutil.which("go"):
        try:
            out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=20).stdout
            if out.strip():
                return Path(out.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    home = Path.home() / "go" / "pkg" / "mod"
    return home if home.is_dir() else None


def _crd() -> dict | None:
    cache = _modcache()
    path = cache / CRD_REL if cache else None
    if path is None or not path.is_file():
        return None
    return yaml.safe_load(path.read_text())


CRD = _crd()
SOURCE = "crd-from-module-cache" if CRD else "fallback-field-list-v1.6.0"


def _schema() -> dict:
    assert CRD is not None
    (version,) = [v for v in CRD["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


# CEL rules of the v1.6.0 CRD, evaluated in Python. A rule this test does not know fails the test.
CEL = {
    "self.kind != 'Service' || has(self.port)":
        lambda o: o.get("kind", "Service") != "Service" or "port" in o,
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))":
        lambda o: all(sum(1 for q in o if q.get("number") == p.get("number")) == 1 for p in o),
}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def validate(obj: Any, schema: dict, path: str = "") -> list[str]:
    """The openAPIV3Schema keywords the InferencePool CRD uses; unknown fields are errors (the API server would
    prune them silently)."""
    errs: list[str] = []
    t = schema.get("type")
    if t == "integer":
        if not isinstance(obj, int) or isinstance(obj, bool):
            return [f"{path}: want integer, got {obj!r}"]
    elif t in _TYPES and not isinstance(obj, _TYPES[t]):
        return [f"{path}: want {t}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        errs.append(f"{path}: {obj!r} not in {schema['enum']}")
    if isinstance(obj, str):
        if "pattern" in schema and not re.search(schema["pattern"], obj):
            errs.append(f"{path}: {obj!r} does not match {schema['pattern']}")
        if len(obj) < schema.get("minLength", 0) or len(obj) > schema.get("maxLength", 1 << 30):
            errs.append(f"{path}: length {len(obj)} out of bounds")
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj < schema.get("minimum", -(1 << 62)) or obj > schema.get("maximum", 1 << 62):
            errs.append(f"{path}: {obj} out of [{schema.get('minimum')}, {schema.get('maximum')}]")
    if isinstance(obj, list):
        if len(obj) < schema.get("minItems", 0) or len(obj) > schema.get("maxItems", 1 << 30):
            errs.append(f"{path}: {len(obj)} items out of bounds")
        for i, item in enumerate(obj):
            errs += validate(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(obj, dict) and t == "object":
        props = schema.get("properties")
        if len(obj) < schema.get("minProperties", 0) or len(obj) > schema.get("maxProperties", 1 << 30):
            errs.append(f"{path}: {len(obj)} properties out of bounds")
        for req in schema.get("required", []):
            if req not in obj:
                errs.append(f"{path}.{req}: required")
        for k, v in obj.items():
            if props is not None and k in props:
                errs += validate(v, props[k], f"{path}.{k}")
            elif "additionalProperties" in schema:
                errs += validate(v, schema["additionalProperties"], f"{path}.{k}")
            elif props is not None:
                errs.append(f"{path}.{k}: unknown field")
    for rule in schema.get("x-kubernetes-validations", []):
        check = CEL.get(rule["rule"])
        if check is None:
            errs.append(f"{path}: CEL rule this test cannot evaluate: {rule['rule']}")
        elif not check(obj):
            errs.append(f"{path}: {rule['message']}")
    return errs


def validate_fallback(obj: dict) -> list[str]:
    """FIELDS only: required fields, types, enums and bounds of the verified list, and the CRD's two CEL rules
(unique port numbers; a Service reference needs its port)."""
    errs: list[str] = []

    def values(dotted: str) -> list[Any]:
        cur: list[Any] = [obj]
        for part in dotted.split("."):
            nxt: list[Any] = []
            for c in cur:
                key, many = (part[:-2], True) if part.endswith("[]") else (part, False)
                if isinstance(c, dict) and key in c:
                    nxt += c[key] if many and isinstance(c[key], list) else [c[key]]
            cur = nxt
        return cur

    for dotted, (t, required, cons) in FIELDS.items():
        parent = dotted.rsplit(".", 1)[0]
        found = values(dotted)
        if required and values(parent) and len(found) < len(values(parent)):
            errs.append(f"{dotted}: required")
        for v in found:
            if t == "integer" and (not isinstance(v, int) or not cons[0] <= v <= cons[1]):
                errs.append(f"{dotted}: {v!r}")
            if t in _TYPES and not isinstance(v, _TYPES[t]):
                errs.append(f"{dotted}: want {t}")
            if t == "string" and isinstance(cons, tuple) and v not in cons:
                errs.append(f"{dotted}: {v!r} not in {cons}")
            if t in ("object", "array") and isinstance(cons, tuple) and not cons[0] <= len(v) <= cons[1]:
                errs.append(f"{dotted}: size {len(v)}")
    nums = [p.get("number") for p in values("spec.targetPorts[]")]
    if len(nums) != len(set(nums)):
        errs.append("spec.targetPorts: port number must be unique")
    for ref in values("spec.endpointPickerRef"):
        if ref.get("kind", "Service") == "Service" and "port" not in ref:
            errs.append("spec.endpointPickerRef: port is required when kind is 'Service'")
    known = {k.replace("[]", "") for k in FIELDS}
    for k in (obj.get("spec") or {}):
        if f"spec.{k}" not in known:
            errs.append(f"spec.{k}: unknown field")
    return errs


def check(obj: dict) -> list[str]:
    return validate(obj, _schema()) if CRD else validate_fallback(obj)


OWNER = owner_reference("r1", "uid-1")


def _pool(**kw) -> dict:
    args = dict(name="r1", namespace="ns", owner=OWNER, engine="vllm", disaggregated=True, revision="abc123")
    args.update(kw)
    return ip.render_inference_pool(**args)


@pytest.mark.parametrize("kw", [{}, {"disaggregated": False, "revision": None},
                                {"target_ports": (8000, 8001), "app_protocol": "kubernetes.io/h2c",
                                 "failure_mode": "FailOpen"}], ids=["disagg", "aggregated", "two-ports-h2c"])
def test_rendered_pool_validates_against_the_crd(kw):
    pool = _pool(**kw)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert check(pool) == [], SOURCE


@pytest.mark.parametrize("breakage", ["no-selector", "port-0", "nine-ports", "duplicate-port", "bad-protocol",
                                      "epp-without-port", "misspelled-field", "empty-matchlabels"])
def test_the_check_rejects_what_the_crd_rejects(breakage):
    """The validator can fail: each broken pool is one the API server would refuse (or prune)."""
    pool = copy.deepcopy(_pool())
    spec = pool["spec"]
    if breakage == "no-selector":
        del spec["selector"]
    elif breakage == "port-0":
        spec["targetPorts"] = [{"number": 0}]
    elif breakage == "nine-ports":
        spec["targetPorts"] = [{"number": 8000 + i} for i in range(9)]
    elif breakage == "duplicate-port":
        spec["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    elif breakage == "bad-protocol":
        spec["appProtocol"] = "grpc"
    elif breakage == "epp-without-port":
        del spec["endpointPickerRef"]["port"]
    elif breakage == "misspelled-field":
        spec["targetPort"] = spec.pop("targetPorts")
    elif breakage == "empty-matchlabels":
        spec["selector"]["matchLabels"] = {}
    assert check(pool) != [], f"{breakage} passed ({SOURCE})"


def test_fallback_field_list_is_the_crds():
    if not CRD:
        pytest.skip(f"{CRD_REL} not in the module cache: the fallback list is what the other tests use")
    spec = _schema()["properties"]["spec"]
    assert set(spec["required"]) == {k.split(".")[1] for k, (_, r, _) in FIELDS.items() if k.count(".") == 1 and r}
    assert set(spec["properties"]) == {k.split(".")[1] for k in FIELDS if k.count(".") == 1}
    assert tuple(spec["properties"]["appProtocol"]["enum"]) == FIELDS["spec.appProtocol"][2]
    epp = spec["properties"]["endpointPickerRef"]
    assert set(epp["properties"]) == {k.split(".")[2] for k in FIELDS if k.startswith("spec.endpointPickerRef.")
                                      and k.count(".") == 2}
    assert tuple(epp["properties"]["failureMode"]["enum"]) == FIELDS["spec.endpointPickerRef.failureMode"][2]
    tp = spec["properties"]["targetPorts"]
    assert (tp["minItems"], tp["maxItems"]) == FIELDS["spec.targetPorts"][2]
    assert CRD["spec"]["group"] == ip.POOL_GROUP and CRD["spec"]["names"]["kind"] == ip.POOL_KIND
    assert CRD["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == ip.GIE_VERSION


def _pod(role: str, revision: str, leader: bool = True) -> dict[str, str]:
    return {**ip.role_pod_labels("r1", revision, role), LABEL_ROLE: "leader" if leader else "worker"}


def test_one_selector_change_moves_both_roles_to_the_next_revision():
    a, b = _pool(revision="rev-a"), _pool(revision="rev-b")
    sa, sb = a["spec"]["selector"]["matchLabels"], b["spec"]["selector"]["matchLabels"]
    assert {k for k in sa if sa[k] != sb.get(k)} == {ip.LABEL_SERVING_REVISION}
    pods = [_pod(r, v, lead) for r in ip.ROLES for v in ("rev-a", "rev-b") for lead in (True, False)]
    picked = [p for p in pods if ip.selects(sa, p)]
    assert sorted((p[ip.LABEL_SERVING_ROLE], p[ip.LABEL_SERVING_REVISION]) for p in picked) == \
        [("decode", "rev-a"), ("prefill", "rev-a")]     # both roles, one revision, leaders only
    assert a["spec"]["endpointPickerRef"]["name"] == ip.epp_name("r1")


def test_a_disaggregated_pool_must_name_its_revision():
    with pytest.raises(ValueError, match="revision"):
        _pool(revision=None)
    agg = _pool(disaggregated=False, revision=None)
    assert ip.LABEL_SERVING_REVISION not in agg["spec"]["selector"]["matchLabels"]


def test_serving_revision_changes_with_either_role_and_is_a_label_value():
    base = ip.serving_revision({"prefill": "p1", "decode": "d1"})
    assert base != ip.serving_revision({"prefill": "p2", "decode": "d1"})
    assert base != ip.serving_revision({"prefill": "p1", "decode": "d2"})
    assert base == ip.serving_revision({"decode": "d1", "prefill": "p1"})
    assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", base) and len(base) <= 63


def test_epp_deployment_and_service_serve_the_pool():
    dep, svc = ip.render_epp(name="r1", namespace="ns", owner=OWNER, image="registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0",
                             extra_args=["--config-file", "/etc/epp/config.yaml"], service_account="epp")
    pool = _pool()
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    flag = {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2)}
    assert flag["--pool-name"] == pool["metadata"]["name"] and flag["--pool-namespace"] == "ns"
    assert flag["--pool-group"] == ip.POOL_GROUP and flag["--config-file"] == "/etc/epp/config.yaml"
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.k8s.io/gateway-api-inference-extension/lwepp:v1.6.0"
    ref = pool["spec"]["endpointPickerRef"]
    assert svc["metadata"]["name"] == ref["name"] and ref["kind"] == "Service"
    assert ref["port"]["number"] in [p["port"] for p in svc["spec"]["ports"]]
    tmpl = dep["spec"]["template"]["metadata"]["labels"]
    assert ip.selects(svc["spec"]["selector"], tmpl) and ip.selects(dep["spec"]["selector"]["matchLabels"], tmpl)
    assert not ip.selects(pool["spec"]["selector"]["matchLabels"], tmpl)    # the picker is not a model server
    with pytest.raises(ValueError):
        ip.render_epp(name="r1", namespace="ns", owner=OWNER, image="")


def test_epp_rbac_reads_pods_and_pools_in_its_namespace_only():
    sa, role, binding = ip.render_epp_rbac(name="r1", namespace="ns", owner=OWNER)
    assert (sa["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role", "RoleBinding")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {(g, r, v) for g, r in (("", "pods"), (ip.POOL_GROUP, "inferencepools"))
                       for v in ("get", "list", "watch")}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "ns"}]
    dep, _ = ip.render_epp(name="r1", namespace="ns", owner=OWNER, image="x", service_account=sa["metadata"]["name"])
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
