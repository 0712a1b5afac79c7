"""A tenant of the red-team suite: an identity that may only manage LLMDeployments in one namespace.

The multi-tenant threat model (docs/security.md) is about what a user who holds
exactly this right can make the operator do for them. The identity is a real
ServiceAccount `tenant` in the test namespace, bound to a Role that grants the
`llmdeployments` verbs of `meshplan.dev` and nothing else (no Pods, no Secrets,
no Services). Requests are made as that ServiceAccount through the API server's
impersonation (`kubectl --as=system:serviceaccount:<ns>:tenant`), so RBAC and
admission judge them exactly as they would judge the tenant's own token.
"""

from __future__ import annotations

import json

TENANT = "tenant"

_ROLE_VERBS = ["create", "get", "list", "watch", "update", "patch", "delete"]


def make_tenant(cluster, ns: str) -> str:
    """Create the tenant ServiceAccount, Role and RoleBinding in `ns`; return the impersonated user name."""
    objs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "llmdeployment-author", "namespace": ns},
         "rules": [{"apiGroups": ["meshplan.dev"], "resources": ["llmdeployments"], "verbs": _ROLE_VERBS}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "llmdeployment-author", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "llmdeployment-author"},
         "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": ns}]},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    return f"system:serviceaccount:{ns}:{TENANT}"


def as_tenant(cluster, ns: str, *args: str, input: str | None = None, check: bool = False):
    """`kubectl -n ns ARGS` as the tenant (impersonated); returns the CompletedProcess."""
    return cluster.kubectl(f"--as=system:serviceaccount:{ns}:{TENANT}", "-n", ns, *args, input=input, check=check)


def tenant_can(cluster, ns: str, verb: str, resource: str) -> bool:
    """`kubectl auth can-i` for the tenant: the suite asserts its premise (the tenant cannot create Pods)."""
    r = as_tenant(cluster, ns, "auth", "can-i", verb, resource)
    return r.stdout.strip() == "yes"
