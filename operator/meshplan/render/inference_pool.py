"""The Gateway API Inference Extension's InferencePool and its endpoint picker (EPP), rendered (pure).

Source: the Go module `sigs.k8s.io/gateway-api-inference-extension` at release tag v1.6.0 (2026-08-10), read from
the module cache. The module proxy refused `@latest` here (403 on the version list) and v1.7.0; v1.6.0 is the
newest tag it served (fetched: v1.0.0, v1.1.0, v1.2.0, v1.3.0, v1.3.1, v1.4.0, v1.5.0, v1.6.0). Files read:
- `api/v1/inferencepool_types.go`: `InferencePoolSpec` {selector (LabelSelector, matchLabels only), targetPorts
  ([]Port{number}), appProtocol ("http" | "kubernetes.io/h2c"), endpointPickerRef {group, kind, name, port{number},
  failureMode ("FailOpen" | "FailClose")}}.
- `config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`: group `inference.networking.k8s.io`, version
  `v1`, kind `InferencePool`; `spec.selector` and `spec.targetPorts` required (1 to 8 unique ports), matchLabels
  1 to 64 entries; `endpointPickerRef.name` required and `port` required when kind is Service (a CEL rule). In
  v1.6.0 `endpointPickerRef` itself is optional (v1.5.0's CRD required it); meshplan always sets it.
- `pkg/lwepp/server/options.go` (v1.6.0) and `pkg/epp/server/options.go` (v1.5.0): the picker's flags
  `--pool-name`, `--pool-namespace`, `--pool-group`, `--grpc-port` (default 9002, the ext-proc port),
  `--grpc-health-port` (9003), `--metrics-port` (9090). Both pickers take these, so the EPP image is a choice.

Prefill/decode ("pd") scheduling profile: NOT in that release. In v1.6.0 the EPP moved out of the repository
(README: "EPP and associated APIs: llm-d/llm-d-router"); what stays is the lightweight EPP (lwepp), which has no
scheduling profiles. The last in-repo EPP (v1.5.0, `pkg/epp/framework/plugins/scheduling/profile/`) has only
`single-profile-handler`. So no pd profile config is rendered here: a disaggregated pool is meant for a picker
that reads the role label (`LABEL_SERVING_ROLE`) itself, whose image and arguments the caller passes.

One pool per deployment, whatever its roles. Its selector is the deployment, the group leaders (the pods that
serve HTTP) and, for a disaggregated deployment, the serving revision (`LABEL_SERVING_REVISION`): prefill and
decode pods of one revision carry the same value, so moving the pool from one revision to the next is one
selector change and the pool never selects a prefill worker of one revision beside a decode worker of another
(two per-role pools would take two changes, with a moment in between that mixes them). An aggregated replica is
self-contained, so an aggregated pool needs no revision (its rolling update may serve old and new replicas at
once); pass one to pin it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from meshplan.render.workloads import LABEL_DEPLOYMENT, LABEL_ROLE, base_labels, child_name

GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GIE_VERSION = "v1.6.0"
POOL_GROUP = "inference.networking.k8s.io"
POOL_API_VERSION = f"{POOL_GROUP}/v1"
POOL_KIND = "InferencePool"
APP_PROTOCOLS = ("http", "kubernetes.io/h2c")
FAILURE_MODES = ("FailOpen", "FailClose")
EPP_GRPC_PORT = 9002          # --grpc-port default (ext-proc)
EPP_HEALTH_PORT = 9003        # --grpc-health-port default
EPP_METRICS_PORT = 9090       # --metrics-port default

# meshplan's own labels on a disaggregated deployment's pods (values: ROLES; a revision from `serving_revision`).
LABEL_SERVING_ROLE = "meshplan.dev/serving-role"
LABEL_SERVING_REVISION = "meshplan.dev/serving-revision"
ROLES = ("prefill", "decode")


def serving_revision(role_hashes: Mapping[str, str]) -> str:
    """One revision for all roles of a disaggregated deployment: a hash of every role's plan hash, so a change
    to either role's pods is a new revision of both (10 hex digits, a valid label value)."""
    if not role_hashes:
        raise ValueError("serving_revision needs at least one role's plan hash")
    text = ";".join(f"{r}={h}" for r, h in sorted(role_hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def role_pod_labels(name: str, revision: str, role: str) -> dict[str, str]:
    """The labels a disaggregated role's pods carry beside the usual ones (`render.workloads`)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: use one of {', '.join(ROLES)}")
    return {LABEL_DEPLOYMENT: name, LABEL_SERVING_ROLE: role, LABEL_SERVING_REVISION: revision}


def pool_selector(name: str, revision: str | None = None) -> dict[str, str]:
    """matchLabels of the deployment's pool: its group leaders, of `revision` when given."""
    sel = {LABEL_DEPLOYMENT: name, LABEL_ROLE: "leader"}
    if revision is not None:
        sel[LABEL_SERVING_REVISION] = revision
    return sel


def pool_name(name: str) -> str:
    return child_name(name, "pool")


def epp_name(name: str) -> str:
    return child_name(name, "epp")


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """matchLabels semantics: every selector entry present with the same value (an AND)."""
    return all(labels.get(k) == v for k, v in selector.items())


def render_inference_pool(*, name: str, namespace: str, owner: Mapping[str, Any], engine: str,
                          disaggregated: bool, revision: str | None, target_ports: Sequence[int] = (8000,),
                          app_protocol: str = "http", failure_mode: str = "FailClose") -> dict[str, Any]:
    """The InferencePool (inference.networking.k8s.io/v1) of deployment `name`, its picker the EPP Service
    `epp_name(name)`. A disaggregated pool must name the revision it serves."""
    if disaggregated and not revision:
        raise ValueError("a disaggregated deployment's pool serves one revision: pass revision")
    if app_protocol not in APP_PROTOCOLS:
        raise ValueError(f"appProtocol {app_protocol!r}: use one of {', '.join(APP_PROTOCOLS)}")
    if failure_mode not in FAILURE_MODES:
        raise ValueError(f"failureMode {failure_mode!r}: use one of {', '.join(FAILURE_MODES)}")
    ports = list(dict.fromkeys(int(p) for p in target_ports))
    if not 1 <= len(ports) <= 8 or any(not 1 <= p <= 65535 for p in ports):
        raise ValueError(f"targetPorts {list(target_ports)}: 1 to 8 ports in 1..65535")
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": {"name": pool_name(name), "namespace": namespace,
                     "labels": {**base_labels(name, engine), "app.kubernetes.io/component": "inference-pool"},
                     "ownerReferences": [dict(owner)]},
        "spec": {
            "selector": {"matchLabels": pool_selector(name, revision)},
            "targetPorts": [{"number": p} for p in ports],
            "appProtocol": app_protocol,
            "endpointPickerRef": {"group": "", "kind": "Service", "name": epp_name(name),
                                  "port": {"number": EPP_GRPC_PORT}, "failureMode": failure_mode},
        },
    }


def epp_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "endpoint-picker", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "endpoint-picker", "app.kubernetes.io/managed-by": "meshplan",
            LABEL_DEPLOYMENT: name}


def render_epp(*, name: str, namespace: str, owner: Mapping[str, Any], image: str,
               extra_args: Sequence[str] = (), service_account: str | None = None,
               replicas: int = 1) -> list[dict[str, Any]]:
    """The endpoint picker's Deployment and Service for deployment `name`'s pool. `image` is the caller's (the
    lightweight EPP of GIE v1.6.0, or a pd-aware picker that takes the same pool flags); `extra_args` are
    appended (a picker's own config, e.g. its scheduling profiles)."""
    if not image:
        raise ValueError("the endpoint picker needs an image")
    labels = epp_labels(name)
    selector = {"app.kubernetes.io/component": "endpoint-picker", LABEL_DEPLOYMENT: name}
    args = ["--pool-name", pool_name(name), "--pool-namespace", namespace, "--pool-group", POOL_GROUP,
            "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT), *extra_args]
    probe = {"grpc": {"port": EPP_HEALTH_PORT}, "periodSeconds": 10}
    pod_spec: dict[str, Any] = {
        "containers": [{
            "name": "epp", "image": image, "args": args,
            "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                      {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
            "readinessProbe": dict(probe), "livenessProbe": {**probe, "initialDelaySeconds": 5},
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    meta = {"name": epp_name(name), "namespace": namespace, "labels": labels, "ownerReferences": [dict(owner)]}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": dict(meta),
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": dict(meta),
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc",
                            "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
                           {"name": "http-metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics",
                            "protocol": "TCP"}]},
    }
    return [deployment, service]


def render_epp_rbac(*, name: str, namespace: str, owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The picker's ServiceAccount, Role and RoleBinding: read Pods and InferencePools in its own namespace, as
    GIE v1.6.0's lwepp needs (`pkg/lwepp/controller/pod_reconciler.go` and `inferencepool_reconciler.go` watch and
    get them; `pkg/lwepp/server/controller_manager.go` caches both in the pool's namespace only). A fuller picker
    may need more (its own CRDs, leader-election leases): add a Role beside this one."""
    meta = {"name": epp_name(name), "namespace": namespace, "labels": epp_labels(name),
            "ownerReferences": [dict(owner)]}
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": read},
                   {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp_name(name)},
         "subjects": [{"kind": "ServiceAccount", "name": epp_name(name), "namespace": namespace}]},
    ]


__all__ = ["APP_PROTOCOLS", "EPP_GRPC_PORT", "EPP_HEALTH_PORT", "EPP_METRICS_PORT", "FAILURE_MODES", "GIE_MODULE",
           "GIE_VERSION", "LABEL_SERVING_REVISION", "LABEL_SERVING_ROLE", "POOL_API_VERSION", "POOL_GROUP",
           "POOL_KIND", "ROLES", "epp_labels", "epp_name", "pool_name", "pool_selector", "render_epp",
           "render_epp_rbac", "render_inference_pool", "role_pod_labels", "selects", "serving_revision"]
