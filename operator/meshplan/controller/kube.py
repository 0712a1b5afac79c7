"""A small asyncio client of the Kubernetes REST API for the reconciler.

Why not the `kubernetes` package's API classes: they are synchronous (a call
would block kopf's event loop, or need a thread per call) and deserialize every
object into generated models we would only turn back into dicts. kopf itself
talks to the API server with aiohttp; this module does the same for the few
verbs the reconciler needs (list, server-side apply, delete, status patch) and
returns plain dicts. Credentials come from the same place kopf's default login
takes them: the in-cluster ServiceAccount, else the kubeconfig (`KUBECONFIG`),
resolved by the `kubernetes` package's config loader.

Errors: every non-2xx answer raises `ApiError(status, reason, message)`; the
controller maps 409 Conflict to `kopf.TemporaryError` (kopf does not retry
4xx by itself) and 404 on delete to "already gone".
"""

from __future__ import annotations

import contextvars
import json
import ssl
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import quote, urlencode

import aiohttp

# kind -> (API path prefix, plural). Only what meshplan reads or writes.
RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "Secret"): ("/api/v1", "secrets"),        # the TensorRT-LLM multi-node ssh keys (engines.trtllm_ssh)
    ("v1", "Event"): ("/api/v1", "events"),
    ("meshplan.dev/v1alpha1", "LLMDeployment"): ("/apis/meshplan.dev/v1alpha1", "llmdeployments"),
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): ("/apis/resource.nvidia.com/v1beta1", "computedomains"),
    # a disaggregated deployment's router (render.inference_pool)
    ("inference.networking.k8s.io/v1", "InferencePool"): ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
}
COMPUTE_DOMAIN_CRD = "computedomains.resource.nvidia.com"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, body: Mapping[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
                  subresource: str | None = None) -> str:
    try:
        prefix, plural = RESOURCES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"meshplan does not handle {api_version} {kind}") from None
    path = prefix + (f"/namespaces/{quote(namespace)}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{quote(name)}"
    if subresource:
        path += f"/{subresource}"
    return path


@dataclass
class Credentials:
    server: str
    ssl_context: ssl.SSLContext | bool
    headers: dict[str, str]


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """In-cluster ServiceAccount if present, else the kubeconfig (`kubeconfig`, `KUBECONFIG`, ~/.kube/config)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            raise config.ConfigException("kubeconfig given")
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    ctx: ssl.SSLContext | bool
    if cfg.verify_ssl is False:
        ctx = False
    else:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if cfg.cert_file and cfg.key_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    headers = {}
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token:
        prefix = (cfg.api_key_prefix or {}).get("authorization", "")
        headers["Authorization"] = token if token.lower().startswith("bearer") else f"{prefix or 'Bearer'} {token}"
    return Credentials(cfg.host.rstrip("/"), ctx, headers)


class WriteCount:
    """Writes made by one piece of work (one reconcile), counted across the tasks it spawns."""

    SHOWN = 6         # writes named in `what` (the log line says what was written, not only how much)

    def __init__(self) -> None:
        self.n = 0
        self.shown: list[str] = []

    def add(self, method: str, path: str) -> None:
        self.n += 1
        if len(self.shown) < self.SHOWN:
            parts = path.strip("/").split("/")
            # /api/v1/namespaces/<ns>/<plural>/<name>[/<sub>] -> "<METHOD> <plural>/<name>[/<sub>]"
            tail = parts[parts.index("namespaces") + 2:] if "namespaces" in parts else parts[-2:]
            self.shown.append(f"{method} {'/'.join(tail)}")

    def what(self) -> str:
        more = self.n - len(self.shown)
        return ", ".join(self.shown) + (f" and {more} more" if more > 0 else "")


# The WriteCount of the reconcile running in this asyncio task (tasks it creates, e.g. with
# asyncio.gather, inherit the context and so count into the same object). `Kube.writes` is shared
# by every concurrent reconcile and cannot say which of them wrote.
_WRITES: contextvars.ContextVar[WriteCount | None] = contextvars.ContextVar("meshplan_writes", default=None)


def count_writes() -> WriteCount:
    """Start counting this task's writes (and those of tasks it starts from now on) in a new WriteCount."""
    c = WriteCount()
    _WRITES.set(c)
    return c


class Kube:
    """One aiohttp session to the API server. Create inside a running event loop; `close()` at the end."""

    def __init__(self, creds: Credentials, timeout_s: float = 30.0):
        self.creds = creds
        self._session = aiohttp.ClientSession(
            headers={"Accept": "application/json", **creds.headers},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(ssl=creds.ssl_context, limit=32),
        )
        self.writes = 0          # requests that change something (apply, delete, patch): idempotence checks

    async def close(self) -> None:
        await self._session.close()

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        url = self.creds.server + path + (f"?{urlencode(params)}" if params else "")
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        if method != "GET":
            self.writes += 1
            mine = _WRITES.get()
            if mine is not None:
                mine.add(method, path)
        async with self._session.request(method, url, data=data, headers=headers) as resp:
            text = await resp.text()
            try:
                doc = json.loads(text) if text else {}
            except ValueError:
                doc = {"message": text[:500]}
            if resp.status >= 400:
                raise ApiError(resp.status, str(doc.get("reason") or resp.reason),
                               str(doc.get("message") or text[:500]), doc)
            return doc

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str | None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        doc = await self.request("GET", resource_path(api_version, kind, namespace), params=params)
        items = doc.get("items") or []
        for i in items:   # list items carry no apiVersion/kind
            i.setdefault("apiVersion", api_version)
            i.setdefault("kind", kind)
        return items

    async def apply(self, obj: Mapping[str, Any], field_manager: str, force: bool) -> dict[str, Any]:
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        return await self.request("PATCH", path, params=params, body=obj,
                                  content_type="application/apply-patch+yaml")

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str,
                     uid: str | None = None, grace_period_s: int | None = None) -> bool:
        """Delete (foreground-free, default propagation); False when it was already gone."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            await self.request("DELETE", resource_path(api_version, kind, namespace, name), body=body)
            return True
        except ApiError as exc:
            if exc.status in (404, 409) and (exc.status == 404 or uid):
                return False   # gone, or replaced by a newer object of the same name
            raise

    async def patch_status(self, api_version: str, kind: str, namespace: str, name: str,
                           status: Mapping[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        """Merge-patch `.status` (optimistic: with `resource_version`, a concurrent change gives 409)."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.request("PATCH", resource_path(api_version, kind, namespace, name, "status"),
                                  body=body, content_type="application/merge-patch+json")

    async def crd_exists(self, name: str) -> bool:
        try:
            await self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{quote(name)}")
            return True
        except ApiError as exc:
            if exc.status in (404, 403):
                return False
            raise


__all__ = ["ApiError", "COMPUTE_DOMAIN_CRD", "Credentials", "Kube", "WriteCount", "count_writes", "load_credentials",
           "resource_path"]
