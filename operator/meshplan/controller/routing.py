"""The router in front of a deployment, decided (pure; issue 19): which router objects to apply or delete, and the
`Routed` condition. One rule for aggregated and disaggregated deployments (`decide.py` and `decide_disagg.py` call
it; the reconciler reads the live objects, `RouterView`).

spec.serving.router (api.models.RouterSpec):
- kind inferencePool: the endpoint picker (its ServiceAccount, Role, RoleBinding, Deployment and Service,
  `render.inference_pool`) and an InferencePool. A disaggregated deployment's pool selects the served revision's
  leaders and is (re)applied only while a revision is served (`serve`): before the first whole unit is ready there
  is no pool, and a pool that exists is left as it is while none is (it still names the last served revision,
  whose groups the rollout drains only after the next one serves). An aggregated deployment's pool selects every
  replica leader of the deployment, no revision: an aggregated replica is self-contained, so its rolling update may
  serve old and new replicas side by side (`render.inference_pool` module doc).
- kind engine (disaggregated only; the CRD's CEL refuses it on an aggregated spec): the engine's own PD router
  (`render.engine_router`), listing the served revision's ready prefill and decode leaders.
- absent (aggregated only): no router.

Router objects of a kind not (or no longer) asked for are deleted, by name and only when this deployment owns them
(the reconciler reads only owned ones): switching kinds, or removing spec.serving.router from an aggregated
deployment, leaves no picker or router behind. Engine pods and their Services are never touched here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from meshplan.render.engine_router import COMPONENT as ROUTER_COMPONENT
from meshplan.render.engine_router import endpoint, render_engine_router, router_name
from meshplan.render.inference_pool import (
    POOL_API_VERSION,
    POOL_GROUP,
    POOL_KIND,
    epp_name,
    pool_name,
    render_epp,
    render_epp_rbac,
    render_inference_pool,
)
from meshplan.render.workloads import owner_reference

POOL_CRD = f"inferencepools.{POOL_GROUP}"
Condition = tuple[str, bool | str, str, str]


def pool_objects_named(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of kind inferencePool's objects for deployment `name`."""
    e = epp_name(name)
    return [("v1", "ServiceAccount", e), ("rbac.authorization.k8s.io/v1", "Role", e),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", e), ("apps/v1", "Deployment", e), ("v1", "Service", e),
            (POOL_API_VERSION, POOL_KIND, pool_name(name))]


def engine_router_objects_named(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of kind engine's objects for deployment `name`."""
    r = router_name(name)
    return [("apps/v1", "Deployment", r), ("v1", "Service", r)]


def is_router_object(obj: Mapping[str, Any]) -> bool:
    """A router object (picker or engine router), not an engine pod's or group's: by its component label."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/component") in ("endpoint-picker", ROUTER_COMPONENT)


@dataclass(frozen=True)
class RouterInputs:
    name: str
    namespace: str
    uid: str
    engine: str                              # spec.engine.kind
    kind: str | None                         # spec.serving.router.kind, None when no router is asked for
    image: str | None
    port: int                                # the engines' HTTP port (the pool's target port, the router's too)
    pool_crd: bool
    disaggregated: bool
    serve: str | None = None                 # disaggregated: the revision served now (None: none yet)
    served_units: int = 0
    ratio: tuple[int, int] = (1, 1)
    revision: str = ""                       # disaggregated: the revision the spec renders now
    prefill: Sequence[str] = ()              # kind engine: the served revision's ready prefill leaders (host:port)
    decode: Sequence[str] = ()
    disagg: Any = None                       # engines.base.Disaggregation of the roles (backend, bootstrap port)
    service_account: str | None = None       # the engine pods' ServiceAccount (enginePolicy), for kind engine
    live: Sequence[Mapping[str, Any]] = ()   # owned live router objects (and the deployment's Services)


@dataclass
class RouterOutcome:
    apply: list[tuple[dict[str, Any], Mapping[str, Any] | None]] = field(default_factory=list)
    delete: list[tuple[str, str, str, str]] = field(default_factory=list)
    condition: Condition | None = None       # Routed; None when no router is asked for and none is left


def _live(live: Sequence[Mapping[str, Any]], kind: str, name: str) -> Mapping[str, Any] | None:
    return next((o for o in live if o.get("kind") == kind and (o.get("metadata") or {}).get("name") == name), None)


def router_endpoints(groups: Sequence[Any], namespace: str, port: int) -> list[str]:
    """`host:port` of each group's leader (rank 0), in the order given (`decide.LiveGroup`s)."""
    out = []
    for g in groups:
        leader = g.pods.get(0)
        e = endpoint(leader.obj, namespace, port) if leader is not None else None
        if e:
            out.append(e)
    return out


def decide_router(inp: RouterInputs) -> RouterOutcome:
    """One reconcile's router objects and Routed condition (see the module doc)."""
    out = RouterOutcome()
    name, ns = inp.name, inp.namespace
    owner = owner_reference(name, inp.uid)
    keep: set[tuple[str, str]] = set()
    if inp.kind == "inferencePool":
        keep = {(k, n) for _, k, n in pool_objects_named(name)}
        rbac = render_epp_rbac(name=name, namespace=ns, owner=owner)
        for obj in rbac + render_epp(name=name, namespace=ns, owner=owner, image=inp.image or "",
                                     service_account=rbac[0]["metadata"]["name"]):
            out.apply.append((obj, _live(inp.live, obj["kind"], obj["metadata"]["name"])))
        if not inp.pool_crd:
            out.condition = ("Routed", False, "InferencePoolCRDMissing",
                             f"the CustomResourceDefinition {POOL_CRD} (Gateway API Inference Extension) is not "
                             "installed: no InferencePool is created; the "
                             + ("prefill and decode groups are" if inp.disaggregated else "replicas are")
                             + " deployed all the same. Install the GIE CRDs (v1.6.0) to route through the endpoint "
                             "picker")
        elif inp.disaggregated and inp.serve is None:
            out.condition = ("Routed", False, "NoRevisionReady",
                             f"no whole unit ({inp.ratio[0]} prefill + {inp.ratio[1]} decode group(s)) of revision "
                             f"{inp.revision} is ready yet: the InferencePool is created once one is")
        else:
            pool = render_inference_pool(name=name, namespace=ns, owner=owner, engine=inp.engine,
                                         disaggregated=inp.disaggregated, revision=inp.serve if inp.disaggregated
                                         else None, target_ports=(inp.port,))
            out.apply.append((pool, _live(inp.live, POOL_KIND, pool_name(name))))
            out.condition = (("Routed", True, "PoolServesRevision",
                              f"InferencePool {pool_name(name)} selects revision {inp.serve}: {inp.served_units} whole "
                              "unit(s) ready") if inp.disaggregated else
                             ("Routed", True, "PoolSelectsReplicas",
                              f"InferencePool {pool_name(name)} selects every replica leader of {name} (port "
                              f"{inp.port}), its endpoint picker {epp_name(name)}"))
    elif inp.kind == "engine" and inp.disaggregated:
        keep = {(k, n) for _, k, n in engine_router_objects_named(name)}
        if inp.serve is None or not inp.prefill or not inp.decode:
            out.condition = ("Routed", False, "NoRevisionReady",
                             f"no whole unit ({inp.ratio[0]} prefill + {inp.ratio[1]} decode group(s)) of revision "
                             f"{inp.revision} is ready yet: the {inp.engine} router {router_name(name)} is created "
                             "once one is")
        else:
            for obj in render_engine_router(name=name, namespace=ns, owner=owner, engine=inp.engine,
                                            image=inp.image or "", prefill=inp.prefill, decode=inp.decode,
                                            disagg=inp.disagg, port=inp.port,
                                            service_account=inp.service_account):
                out.apply.append((obj, _live(inp.live, obj["kind"], obj["metadata"]["name"])))
            out.condition = ("Routed", True, "EngineRouterServesRevision",
                             f"{router_name(name)} ({inp.engine}'s own prefill/decode router) routes revision "
                             f"{inp.serve}: {len(inp.prefill)} prefill and {len(inp.decode)} decode leader(s)")
    # Router objects of another kind (or of none) go.
    ours = {(k, n): a for a, k, n in pool_objects_named(name) + engine_router_objects_named(name)}
    for o in inp.live:
        meta = o.get("metadata") or {}
        k, n = o.get("kind", ""), meta.get("name", "")
        if (k, n) in ours and (k, n) not in keep and (k != "Service" or is_router_object(o)):
            out.delete.append((o.get("apiVersion") or ours[(k, n)], k, n, meta.get("uid", "")))
    if out.condition is None and out.delete:
        out.condition = ("Routed", False, "NoRouter", "spec.serving.router is not set: the router objects of "
                         f"{name} are deleted; clients reach the replicas through the Service {name}")
    return out


__all__ = ["POOL_CRD", "RouterInputs", "RouterOutcome", "decide_router", "engine_router_objects_named",
           "is_router_object", "pool_objects_named", "router_endpoints"]
