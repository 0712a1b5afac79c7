"""The engine's own prefill/decode router in front of a disaggregated deployment, rendered (pure; issue 19).

For clusters without a Gateway API implementation (no InferencePool, no endpoint picker), `spec.serving.router.kind:
engine` fronts the roles with the router the engine itself ships: vllm-router (`engines.vllm.router_command`),
sglang-router (`engines.sglang.router_command`) or `trtllm-serve disaggregated` (`engines.trtllm.router_command`),
each module's one rule for its argv, which the conformance suite runs through the router's own parser.

The router lists its servers on the command line (a static list: no pod RBAC, and every argv is checked by the
router's parser), so it names exactly the groups of the revision the deployment serves, leaders only (the pods
that serve HTTP), ready ones only: the same rule as the InferencePool's selector, so the router never pairs a
prefill worker of one revision with a decode worker of another. When that list changes (a group became ready, a
role scaled, the served revision switched) the router's pod template changes and its Deployment rolls it with
`maxUnavailable: 0`: the new router is up (its port accepts connections) before the old one goes, so the
Service `<name>-router` always has a router behind it.

Endpoints are the groups' stable DNS names, `<pod>.<headless service>.<namespace>.svc:<port>` (render.workloads:
hostname = pod name, subdomain = the group's headless Service).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from meshplan.engines.base import HTTP_PORT, Disaggregation
from meshplan.render.workloads import LABEL_DEPLOYMENT, child_name

ROUTER_KINDS = ("inferencePool", "engine")
COMPONENT = "pd-router"


def router_name(name: str) -> str:
    return child_name(name, "-router")


def router_labels(name: str, engine: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"{engine}-router", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": COMPONENT, "app.kubernetes.io/managed-by": "meshplan",
            LABEL_DEPLOYMENT: name}


def endpoint(pod: Mapping[str, Any], namespace: str, port: int) -> str | None:
    """`<pod>.<subdomain>.<namespace>.svc:<port>` of a group leader; None when the pod names no subdomain."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name, sub = meta.get("name"), spec.get("subdomain")
    if not name or not sub:
        return None
    return f"{name}.{sub}.{namespace}.svc:{int(port)}"


def render_engine_router(*, name: str, namespace: str, owner: Mapping[str, Any], engine: str, image: str,
                         prefill: Sequence[str], decode: Sequence[str], disagg: Disaggregation | None = None,
                         port: int = HTTP_PORT, service_account: str | None = None,
                         replicas: int = 1) -> list[dict[str, Any]]:
    """The router's Deployment and Service for deployment `name`: `engine`'s own PD router (its module's
    `router_command`) listening on `port`, in front of `prefill` and `decode` (`host:port` each, the served
    revision's ready leaders). Raises RenderError (the engine's) when it cannot route them."""
    from meshplan import engines

    if not image:
        raise ValueError("the engine's router needs an image (spec.serving.router.image)")
    module = engines.get(engine)
    if not hasattr(module, "router_command"):
        from meshplan.engines.base import RenderError

        raise RenderError(f"spec.serving.router.kind engine: {engines.title(engine)} ships no prefill/decode router "
                          "meshplan renders; use kind inferencePool")
    command, args = module.router_command(list(prefill), list(decode), port=port, disagg=disagg)
    labels = router_labels(name, engine)
    selector = {"app.kubernetes.io/component": COMPONENT, LABEL_DEPLOYMENT: name}
    probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 5}
    pod_spec: dict[str, Any] = {
        "containers": [{
            "name": "router", "image": image, "command": list(command), "args": list(args),
            "ports": [{"name": "http", "containerPort": int(port), "protocol": "TCP"}],
            "readinessProbe": dict(probe), "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 10},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    meta = {"name": router_name(name), "namespace": namespace, "labels": labels, "ownerReferences": [dict(owner)]}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": dict(meta),
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": dict(meta),
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": int(port), "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]


__all__ = ["COMPONENT", "ROUTER_KINDS", "endpoint", "render_engine_router", "router_labels", "router_name"]
