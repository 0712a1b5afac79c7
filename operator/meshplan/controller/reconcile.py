"""One reconcile of one LLMDeployment: read the world once, decide (pure), apply, write status once.

    read      the LLMDeployment (GET), its pods and Services (one LIST each, by our
              deployment label), ComputeDomains when the NVIDIA DRA CRD exists;
              GPU nodes and GPU usage come from the kopf indexes (watches), not
              from the API server (`World`: the fleet's topology is rebuilt only
              when a node changed; each reconcile charges the usage to it).
    plan      `planner.plan_for_spec` on the free GPUs this deployment may use
              (the topology without its own pods), cached per object: re-planned
              only when the inputs that matter change (the spec without
              `replicas`/`autoscaling`, and the fleet's shape: domains, products,
              GPUs of schedulable nodes). A spec that cannot be planned is
              re-planned every time (capacity may have appeared). When the
              planned GPU product cannot hold the desired replica count but
              another product the spec allows can, the plan for that product
              replaces it (`decide.fallback_target`; a rolling update moves the
              groups, event PlanMovedProduct).
    decide    `controller.decide.decide`: the children to apply/delete and the status.
    apply     children with server-side apply (`controller.apply`), deletes with
              UID preconditions (never a newer object of the same name); then,
              every create having succeeded, the new groups' pods are released
              (`Outcome.release`: scheduling gates removed in the same reconcile,
              not one trip through the work queue later).
    status    one merge patch of the keys the reconciler owns, only when changed;
              events for transitions only.

Everything between read and apply runs in a worker thread: planning takes up
to about a second on a large fleet and must not stall the event loop. It is
one thread of its own (`DECIDE_THREADS`), not asyncio's default executor:
decide is pure Python and holds the GIL, so more threads add no throughput,
they only take the GIL from the event loop (kopf's watches, every API call);
and decisions must be serialised anyway, so that each placement sees the GPUs
the previous one reserved (`World.reserve`: two concurrent best-fit placements
pick the same node). A slow plan (seconds, for an unpinned spec on a large
fleet) therefore delays the other objects' decisions by as much. Reconciles of one object are serialised by a per-object lock
(kopf handlers and the child-event/resync queue both call `reconcile`).

Desired replicas: `spec.replicas`; with `spec.autoscaling.enabled` the
autoscaler's last decision (`status.autoscaling.toReplicas`, written by the
autoscaling timer, see `handlers.AUTOSCALE_HOOK`) clamped to
[minReplicas, maxReplicas], starting from `spec.replicas`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from meshplan.controller import apply as applier
from meshplan.controller import indexes
from meshplan.controller.decide_disagg import DISAGG_STATUS_KEYS
from meshplan.controller.decide import (
    OWNED_STATUS_KEYS,
    Inputs,
    Outcome,
    decide,
    fallback_target,
    target_for,
)
from meshplan.controller.kube import COMPUTE_DOMAIN_CRD, ApiError, Kube, count_writes, resource_path
from meshplan.controller.status import status_patch
from meshplan.render.workloads import LABEL_DEPLOYMENT
from meshplan.topology import NodeInfo, Topology, build_topology_from_infos

log = logging.getLogger("meshplan.controller")

API_VERSION, KIND = "meshplan.dev/v1alpha1", "LLMDeployment"
SLOW_PLAN_S = 5.0          # log a warning when one planner call takes longer
DECIDE_THREADS = 1         # decide/plan thread: one, so each placement sees the previous one's reservations
CD_API = "resource.nvidia.com/v1beta1"


def desired_replicas(spec: Any, status: Mapping[str, Any] | None) -> int:
    """spec.replicas, or the autoscaler's decision within [minReplicas, maxReplicas] (see module doc).
    The rule is `render.pipeline.replicas_and_why`, which `meshplan render` uses too."""
    from meshplan.render.pipeline import desired_replicas as rule

    return rule(spec, status)


def _planned_spec(spec: Any) -> dict[str, Any]:
    doc = spec.to_manifest()
    doc.pop("replicas", None)
    doc.pop("autoscaling", None)
    doc.pop("replan", None)          # what to do on drift is not an input of the plan (autoscale.drift)
    return doc


def _plain(product: str) -> str | None:
    from meshplan.catalog.gpus import get_gpu

    try:
        return get_gpu(product).name
    except KeyError:
        return None


def plan_key(spec: Any, topology: Topology) -> str:
    """Hash of what the plan depends on: the spec without replicas/autoscaling, and the fleet's shape."""
    # A domain whose GPU the labels changed (memory label, MIG, time-slicing: `gpu` is a derived name) adds
    # that name, so relabelling replans; plain catalogue GPUs keep the shape (and stored plans) of before.
    # The network block (RDMA fabric) enters only when there is one: fleets without RDMA keep their keys, and a
    # node that starts (or stops) advertising an RDMA resource replans (wide EP becomes possible or not).
    shape = sorted((d.name, d.product, d.total_gpus, d.zone) + ((d.gpu,) if d.gpu and d.gpu != _plain(d.product) else ())
                   + ((f"block={d.block}/{d.fabric}",) if d.block else ())
                   for d in topology.select(dict(spec.gpus.node_selector or {})).domains)
    raw = json.dumps({"spec": _planned_spec(spec), "fleet": shape}, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def spec_key(spec: Any) -> str:
    """Hash of the spec part of `plan_key` alone (did the user change what is planned?)."""
    return hashlib.sha256(json.dumps(_planned_spec(spec), sort_keys=True, default=str).encode()).hexdigest()[:16]


def labels_can_carry(name: str) -> bool:
    """Whether `name` can be the value of the children's deployment label (and name Services). The
    API server admits custom resource names up to 253 characters with dots; a longer label value
    makes even the LIST of children fail, so this is checked before listing (the parse in `_decide`
    then reports the same rule of `api.models.LLMDeployment` as InvalidSpec naming metadata.name)."""
    from meshplan.api.models import DNS_LABEL_RE, rx

    return len(name) <= 63 and bool(rx(DNS_LABEL_RE).match(name))


def node_selector_problems(selector: Mapping[str, str]) -> list[str]:
    """spec.gpus.nodeSelector entries that are not valid label keys/values (they would never match a
    node, and pods carrying them are refused): the user is told which, not "no capacity". The rule is
    the API's (`api.models.label_selector_problems`, also a CEL rule of the CRD), so a manifest parsed
    by `LLMDeployment.from_manifest` already passed it; this is a second line for stored objects that
    predate the rule."""
    from meshplan.api.models import label_selector_problems

    return label_selector_problems(dict(selector))


def _capacity_message(spec: Any, topology: Topology, reason: str,
                      empty: Topology | None = None) -> tuple[str, str]:
    """(reason, message) for a spec the planner could not fit: capacity, or no feasible layout at all.

    Which one is decided by planning again with nothing used: on the whole fleet (`empty`: the
    topology with no usage) when it has GPUs the spec may use, else on the catalogue. When even that
    fails, the message is ITS reason (the SLO, the context, memory), not the one of the plan on the
    free GPUs, which is "no free GPUs" whenever the fleet is full (issue 17, finding 10)."""
    from meshplan.planner import plan_for_spec

    sel = dict(spec.gpus.node_selector or {})
    whole = empty.select(sel) if empty is not None else None
    if whole is not None and not whole.gpus():
        whole = None
    fleet = topology.select(sel)
    if fleet.unknown and not fleet.gpus():
        # Not capacity: the nodes' GPUs are there but their product is not known (named, with its label).
        return "UnknownGPUProduct", reason

    try:
        unbounded = plan_for_spec(spec, whole)
    except ValueError:
        unbounded = None
    if unbounded is None:
        return "NoFeasiblePlan", reason
    if unbounded.choice is None:
        return "NoFeasiblePlan", unbounded.reason or reason
    c = unbounded.choice
    sel = dict(spec.gpus.node_selector or {})
    topo = topology.select(sel)
    free = sorted(((d.name, d.free_gpus) for d in topo.domains if d.free_gpus > 0), key=lambda x: (-x[1], x[0]))
    shown = ", ".join(f"{n}={f}" for n, f in free[:8]) + (f" (+{len(free) - 8} more)" if len(free) > 8 else "")
    need = c.layout.gpus_per_replica * max(spec.replicas, 1 if spec.autoscaling.enabled else spec.replicas)
    return "InsufficientCapacity", (
        f"needs {need} GPUs ({max(spec.replicas, 1)} replica(s) of {c.layout.label()} = {c.layout.gpus_per_replica} "
        f"GPUs each, {c.gpu}) but only {topo.free_gpus} are free for it"
        + (f" on nodes matching {sel}" if sel else "")
        + f"; free GPUs per NVLink domain: {shown or 'none'}. Planner: {reason}. "
        "Free capacity, lower spec.replicas or spec.gpus.maxGpus, or allow other GPUs (spec.gpus.products)")


# The chosen plan, stored on the LLMDeployment so a restarted operator keeps the layout it runs
# (re-planning on the free GPUs of the moment could choose another one and roll every replica).
PLAN_ANNOTATION = "meshplan.dev/plan"


def _candidate_doc(c: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(c)


def _candidate(d: Mapping[str, Any]) -> Any:
    from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction

    pred = dict(d["prediction"])
    pred["notes"] = tuple(pred.get("notes") or ())
    return Candidate(layout=Layout(**d["layout"]), weight_dtype=d["weight_dtype"], kv_dtype=d["kv_dtype"],
                     chunk_size=d["chunk_size"], max_num_seqs=d["max_num_seqs"], memory=MemoryFit(**d["memory"]),
                     prediction=Prediction(**pred), engine=d.get("engine", "vllm"), gpu=d.get("gpu", ""),
                     a2a_backend=d.get("a2a_backend", ""), batch_overlap=bool(d.get("batch_overlap", False)))


def plan_to_annotation(key: str, plan: Any) -> str:
    return json.dumps({"key": key, "objective": plan.objective, "reason": plan.reason, "gpu": plan.gpu,
                       "model": plan.model, "choice": _candidate_doc(plan.choice),
                       "alternatives": [_candidate_doc(a) for a in plan.alternatives[:3]]},
                      separators=(",", ":"), sort_keys=True)


def plan_annotation_key(value: str | None) -> str | None:
    try:
        return json.loads(value)["key"] if value else None
    except (ValueError, KeyError, TypeError):
        return None


def plan_from_annotation(value: str | None, key: str) -> Any:
    """The stored plan when it was made for `key` (same spec and fleet shape), else None."""
    from meshplan.planner.types import Plan

    if not value:
        return None
    try:
        d = json.loads(value)
        if d.get("key") != key:
            return None
        return Plan(choice=_candidate(d["choice"]), objective=d["objective"], reason=d["reason"],
                    alternatives=tuple(_candidate(a) for a in d.get("alternatives") or ()),
                    gpu=d.get("gpu", ""), model=d.get("model", ""))
    except (ValueError, KeyError, TypeError):
        return None        # unreadable (edited by hand, older format): plan again


def verify_stored_plan(plan: Any, spec: Any, topology: Topology) -> list[str]:
    """Why a plan read back from `PLAN_ANNOTATION` cannot be used for `spec` (empty: it can).

    The annotation is a cache, not an authority (issue 17, finding 5: an edited annotation made the
    operator run TP8 on 8 GPUs although the spec pinned tensor 4 and maxGpus 4). Anyone who may edit
    the LLMDeployment may edit it, and its key (a hash of the spec and the fleet's shape) can be
    recomputed by anyone, so the plan it holds is checked like a new one:
    1. against the spec: the pinned sizes and knobs (tensor, expert, pipeline, chunkSize,
       maxNumSeqs, precision), the engine, the allowed GPU products, and the GPU budget
       (spec.gpus.maxGpus >= GPUs per replica x the fewest replicas);
    2. against the planner: the planner, pinned to the stored layout and knobs on the same fleet,
       must produce exactly the stored candidate (same memory fit and predictions); the same for
       each stored alternative (one that does not verify is dropped, not an error).
    """
    from dataclasses import replace as dc_replace

    from meshplan.api.models import pinned
    from meshplan.planner import plan_for_spec, plan_inputs_from_spec

    c = plan.choice
    if c is None:
        return ["it holds no choice"]
    lay, par, prec = c.layout, spec.parallelism, spec.precision
    out = []
    for field_name, want, have in (("tensor", pinned(par.tensor), lay.tp), ("expert", pinned(par.expert), lay.ep),
                                   ("pipeline", pinned(par.pipeline), lay.pp),
                                   ("chunkSize", pinned(par.chunk_size), c.chunk_size),
                                   ("maxNumSeqs", pinned(par.max_num_seqs), c.max_num_seqs)):
        if want is not None and want != have:
            out.append(f"spec.parallelism.{field_name} is {want}, the stored plan has {have}")
    for field_name, want, have in (("weights", prec.weights, c.weight_dtype), ("kvCache", prec.kv_cache, c.kv_dtype)):
        if want not in (None, "auto") and want != have:
            out.append(f"spec.precision.{field_name} is {want}, the stored plan has {have}")
    if c.engine != spec.engine.kind:
        out.append(f"spec.engine.kind is {spec.engine.kind}, the stored plan is for {c.engine}")
    try:
        from meshplan.catalog.gpus import get_gpu

        allowed = {get_gpu(p).name for p in spec.gpus.products} if spec.gpus.products else None
    except KeyError:
        allowed = None
    if allowed is not None and c.gpu not in allowed:
        out.append(f"spec.gpus.products allows {sorted(allowed)}, the stored plan is for {c.gpu!r}")
    fewest = spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas
    if spec.gpus.max_gpus is not None and lay.gpus_per_replica * max(fewest, 1) > spec.gpus.max_gpus:
        out.append(f"spec.gpus.maxGpus is {spec.gpus.max_gpus}, the stored plan needs {lay.gpus_per_replica} GPUs "
                   f"per replica x {max(fewest, 1)}")
    if out:
        return out
    fleet = topology.select(dict(spec.gpus.node_selector or {}))
    base = plan_inputs_from_spec(spec)["space"]

    def planner_agrees(cand: Any) -> bool:
        space = dc_replace(base, tensor=cand.layout.tp, expert=cand.layout.ep, pipeline=cand.layout.pp,
                           chunk_sizes=(cand.chunk_size,), max_num_seqs=(cand.max_num_seqs,),
                           weight_dtype=cand.weight_dtype, kv_dtype=cand.kv_dtype)
        try:
            again = plan_for_spec(spec, fleet, space=space, gpus=[cand.gpu], replicas=cand.layout.dp,
                                  n_alternatives=64)
        except (ValueError, KeyError, TypeError):
            return False
        return any(x == cand for x in (again.choice, *again.alternatives) if x is not None)

    if not planner_agrees(c):
        return [f"the planner, pinned to its layout {lay.label(True)} on {c.gpu}, does not produce it (edited, or "
                "made for other inputs)"]
    return []


def _same_gpu(product: Any, gpu: str) -> bool:
    """status.plan.gpuProduct is the node label (NVIDIA-H100-80GB-HBM3), the plan's gpu a catalogue name."""
    from meshplan.catalog.gpus import get_gpu

    if not product:
        return True
    try:
        return product == gpu or get_gpu(str(product)).name == get_gpu(gpu).name
    except (KeyError, ValueError):
        return False


def restored_reason(plan: Any, previous_plan: Mapping[str, Any] | None) -> str:
    """The Planned message for a verified stored plan: the operator's own sentence from status.plan
    (status is written by the operator only) when it describes this very choice, else a sentence made
    here; never the annotation's text."""
    c, prev = plan.choice, dict(previous_plan or {})
    same = (prev.get("tp"), prev.get("ep"), prev.get("pp"), prev.get("chunkSize"), prev.get("maxNumSeqs"),
            prev.get("weightsDtype"), prev.get("kvCacheDtype")) == \
        (c.layout.tp, c.layout.ep, c.layout.pp, c.chunk_size, c.max_num_seqs, c.weight_dtype, c.kv_dtype) \
        and _same_gpu(prev.get("gpuProduct"), c.gpu)
    # status.plan.searchReason holds the planner's sentence (status.plan.reason describes what is
    # deployed); objects written before searchReason existed kept the planner's sentence in reason.
    said = prev.get("searchReason") or prev.get("reason")
    if same and isinstance(said, str) and said:
        return said
    return (f"{c.layout.label()} on {c.gpu}: the plan an earlier run of the operator chose for this spec and fleet, "
            "re-checked against the spec's pins, the GPU budget and the planner")


# ----------------------------------------------------------------------------- refused writes
# Issue 17, finding 7: in a namespace enforcing PodSecurity `restricted`, under a GPU ResourceQuota or
# while the namespace is being deleted, the API server refuses the pods with 403; the LLMDeployment got
# no status and the operator logged a traceback every 5 s. Now such a refusal is a condition
# (Placed=False with the API server's reason and message, which carries the numbers), retried with a
# growing delay, with one log line when it starts, changes or ends.

REFUSAL_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)


def classify_refusal(status: int, message: str, reason: str = "") -> tuple[str, str] | None:
    """(Placed=False reason, what to do) for a create the API server refused, or None when it is not a
    refusal the spec's author or the namespace's admin must act on (transient: 5xx, 429, conflicts)."""
    text = message or ""
    if status == 409 and reason == "NameCollision":
        return "NameCollision", (
            "Two LLMDeployments claim one name: the children of NAME are named NAME, NAME-r<i> and "
            "NAME-r<i>-<rank>, so a deployment named like another's replica Service collides with it. The "
            "existing object is left to its owner; rename one of the two")
    if status == 403:
        if "violates PodSecurity" in text:
            return "PodSecurityRefused", (
                "The namespace's Pod Security admission refuses it (the engine pods pass the `baseline` level, "
                "not `restricted`: docs/security.md); label the namespace pod-security.kubernetes.io/enforce="
                "baseline or run it elsewhere")
        if "exceeded quota" in text:
            return "QuotaExceeded", ("A ResourceQuota of the namespace is exhausted; raise it, free GPUs in the "
                                     "namespace, or lower spec.replicas")
        if "being terminated" in text or "is terminating" in text:
            return "NamespaceTerminating", "The namespace is being deleted"
        return "CreateForbidden", "The operator may not create it here (RBAC or an admission policy)"
    if status == 404 and "namespaces" in text and "not found" in text:
        return "NamespaceTerminating", "The namespace is gone"
    return None


def refusal_message(reason: str, hint: str, kind: str, name: str, status: int, api_message: str, retry_s: float,
                    attempts: int) -> str:
    if reason == "NameCollision":
        return (f"cannot create {kind} {name}: {api_message[:700]}. {hint}. Retrying in {retry_s:.0f}s "
                f"(attempt {attempts})")[:2000]
    return (f"the API server refused to create {kind} {name} (HTTP {status}): {api_message[:700]}. {hint}. "
            f"Retrying in {retry_s:.0f}s (attempt {attempts})")[:2000]


@dataclass
class WriteRefusal:
    reason: str
    message: str
    signature: str        # what changed the log line: reason + the API server's message without names
    attempts: int
    retry_at: float       # monotonic


def refusal_signature(reason: str, api_message: str) -> str:
    import re

    # names and numbers of the pod differ between attempts; the kind of refusal does not
    return reason + ":" + re.sub(r'"[^"]*"|\d+', "", api_message)[:300]


RESERVATION_TTL_S = 60.0    # how long a pod this operator just decided to create is charged without the watch


@dataclass
class World:
    """What the kopf indexes hold: GPU node infos and (namespace, deployment, node, GPUs) per pod,
    plus, for a namespace-scoped operator, the GPU pods of the other namespaces (`ForeignUsage`),
    plus the pods this operator has just decided to create (`reserve`).

    Why reservations: the pod index follows a watch, which lags behind our own creates (seconds
    when 200 objects are worked on at once). Without them, the next deployment's placement
    sees the GPUs a previous reconcile just took as free and best-fit picks the very same node;
    one of the two groups is then moved (deleted and created again) when its reconcile sees the
    node over-full. A reservation counts until the index shows at least as many GPUs for that
    deployment on that node (then it is dropped: the index alone counts, also once someone else
    deletes the pods; until then the larger of the two is charged, never their sum), until we
    delete the pod or the deployment is gone, or for `RESERVATION_TTL_S`.
    Decisions are serialised (`DECIDE_THREADS` = 1), so each sees the previous one's reservations.
    """

    nodes: Callable[[], Iterable[NodeInfo]] = lambda: ()
    usage: Callable[[], Iterable[tuple[str, str | None, str, int]]] = lambda: ()
    foreign: Callable[[], Iterable[tuple[str, int]]] = lambda: ()
    clock_s: Callable[[], float] = time.monotonic
    # (namespace, pod name) -> (deployment, node, GPUs, expires at clock_s)
    reserved: dict[tuple[str, str], tuple[str, str, int, float]] = field(default_factory=dict, repr=False)

    def reserve(self, namespace: str, name: str, created: Iterable[tuple[str, str, int]],
                deleted: Iterable[str] = ()) -> None:
        """Charge `created` (pod name, node, GPUs) of deployment `name` until the index has them;
        stop charging the pods named in `deleted`."""
        until = self.clock_s() + RESERVATION_TTL_S
        for pod, node, gpus in created:
            if node and gpus > 0:
                self.reserved[(namespace, pod)] = (name, node, gpus, until)
        for pod in deleted:
            self.reserved.pop((namespace, pod), None)

    def forget(self, namespace: str, name: str) -> None:
        """Stop charging the reservations of a deployment that is gone."""
        for key, (dep, *_rest) in list(self.reserved.items()):
            if key[0] == namespace and dep == name:
                self.reserved.pop(key, None)

    def _usage_without(self, own: tuple[str, str]) -> list[tuple[str, int]]:
        by_key: dict[tuple[str, str | None, str], int] = {}
        for ns, dep, node, g in self.usage():
            by_key[(ns, dep, node)] = by_key.get((ns, dep, node), 0) + g
        if self.reserved:
            now = self.clock_s()
            mine: dict[tuple[str, str | None, str], int] = {}
            for (ns, pod), (dep, node, g, until) in list(self.reserved.items()):
                if until <= now:
                    self.reserved.pop((ns, pod), None)
                else:
                    mine[(ns, dep, node)] = mine.get((ns, dep, node), 0) + g
            for key, g in mine.items():
                if by_key.get(key, 0) >= g:
                    # The index caught up: from now on it alone says what these pods hold (also once
                    # they are deleted by someone else, e.g. with their namespace).
                    for rkey, (dep, node, *_rest) in list(self.reserved.items()):
                        if (rkey[0], dep, node) == key:
                            self.reserved.pop(rkey, None)
                else:
                    by_key[key] = g
        return [(node, g) for (ns, dep, node), g in by_key.items() if (ns, dep) != own]
    # (node infos, topology of those nodes with nothing used): the fleet's shape changes far less
    # often than its usage, so a reconcile only charges the usage to it (`Topology.with_usage`
    # recomputes the touched nodes and domains) instead of regrouping 1,000 nodes into domains.
    _empty: tuple[list, Topology] | None = field(default=None, repr=False, compare=False)

    def fleet(self) -> Topology:
        """The GPU nodes' topology with nothing used (rebuilt only when a NodeInfo changed)."""
        infos = list(self.nodes())
        cached = self._empty
        if cached is None or cached[0] != infos:      # list equality: identity first, then field values
            cached = (infos, build_topology_from_infos(infos))
            self._empty = cached                      # one atomic assignment (read from worker threads)
        return cached[1]

    def topology_without(self, namespace: str, name: str) -> Topology:
        return self.fleet().with_usage(self._usage_without((namespace, name)) + list(self.foreign()))


@dataclass
class ForeignUsage:
    """GPUs held by pods in namespaces a namespace-scoped operator does not watch.

    kopf watches pods only in the served namespaces, but the GPUs of a node are
    shared with every namespace. Where the operator is scoped, one background
    task lists GPU-holding pods of the whole cluster every `period_s` (one LIST
    per period, not per reconcile) and keeps those outside the served namespaces.
    Cluster-wide operators do not need it: their pod index already sees every pod.
    """

    served: tuple[str, ...]                    # namespace globs
    period_s: float = 15.0
    by_node: list[tuple[str, int]] = field(default_factory=list)

    def served_namespace(self, namespace: str) -> bool:
        # only used by scoped operators (`served` is never empty here)
        return indexes.served_namespace(namespace, self.served)

    def update(self, pods: Iterable[Mapping[str, Any]]) -> None:
        from meshplan.topology import pod_gpu_usage

        out = []
        for p in pods:
            if self.served_namespace((p.get("metadata") or {}).get("namespace", "")):
                continue
            u = pod_gpu_usage(p, reservations=False)    # not served: bound pods only (finding 4)
            if u is not None:
                out.append(u)
        self.by_node = out

    async def run(self, kube: Kube) -> None:
        while True:
            try:
                doc = await kube.request("GET", "/api/v1/pods",
                                         params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
                await asyncio.to_thread(self.update, doc.get("items") or [])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the last view; try again next period
                log.warning("listing GPU pods of other namespaces failed: %s", exc)
            await asyncio.sleep(self.period_s)


@dataclass
class Result:
    requeue_after_s: float | None
    writes: int = 0
    outcome: Outcome | None = None
    seconds: float = 0.0
    written: str = ""          # what the writes were ("PATCH pods/x-r0-0, POST events", see kube.WriteCount)




def _serving_mode_switch(pods: list, disaggregated: bool) -> str:
    """Why this reconcile must not act ('' when it may): the deployment's running pods serve the other mode
    (aggregated groups while the plan is now disaggregated, or prefill/decode groups while it is aggregated).
    Switching a running deployment between the two is not supported yet (issue 19): its pods keep serving."""
    from meshplan.render.inference_pool import LABEL_SERVING_ROLE

    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    role = [p for p in live if LABEL_SERVING_ROLE in ((p.get("metadata") or {}).get("labels") or {})]
    other = role if not disaggregated else [p for p in live if p not in role]
    if not other:
        return ""
    now, was = ("disaggregated", "aggregated") if disaggregated else ("aggregated", "disaggregated")
    return (f"the plan is now {now} serving but {len(other)} pod(s) of this deployment serve {was} "
            f"({', '.join(sorted(p['metadata']['name'] for p in other)[:4])}); switching a running deployment between "
            f"aggregated and disaggregated serving is not supported yet: nothing was changed and they keep serving. "
            f"Set spec.serving.disaggregation back (under auto: pin enabled or disabled), or delete and re-create "
            f"the deployment")


@dataclass
class Reconciler:
    kube: Kube
    world: World
    compute_domains: bool | None = None            # None: look the CRD up once
    plans: dict[str, tuple[str, Any]] = field(default_factory=dict)   # uid -> (plan key, Plan)
    plan_specs: dict[str, str] = field(default_factory=dict)           # uid -> spec_key of the cached plan
    # uid -> (metadata.generation, message): the API server refused a child this generation renders;
    # not tried again until the spec changes (a refused create cannot succeed for the same spec).
    refusals: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # uid -> the last create the API server refused (403: PodSecurity, quota, namespace terminating)
    write_refusals: dict[str, WriteRefusal] = field(default_factory=dict)
    monotonic: Callable[[], float] = time.monotonic
    # uid -> message: the stored plan annotation was ignored (`verify_stored_plan`); reported once as an event
    plan_notes: dict[str, str] = field(default_factory=dict)
    # uid -> the annotation value last refused (log it once, not at every reconcile)
    plans_refused: dict[str, str] = field(default_factory=dict)
    # uids whose cached plan was replaced under the same plan key (another GPU product had room,
    # `decide.fallback_target`): their plan annotation is rewritten although the key is unchanged.
    plans_moved: set[str] = field(default_factory=set)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    # (namespace, name) -> (type, status, reason, message) tuples the autoscaler wants in status.conditions;
    # the reconciler is the one writer of the list and merges them (status.merge_values).
    autoscaler_conditions: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # (namespace, name) -> placement.Claim: replicas a deployment waits to place, with its rank. Read and
    # written only in the decide thread; a deployment ranked after a claim leaves the GPUs it would take.
    claims: dict[tuple[str, str], Any] = field(default_factory=dict)
    # The cluster admin's engine-pod policy (meshplan.api.policy; chart value enginePolicy).
    engine_policy: Any = field(default_factory=lambda: _load_policy())
    # uid -> (plan key, planner.types.DisaggPlan): spec.serving.disaggregation auto/enabled (issue 19)
    disagg_plans: dict[str, tuple[str, Any]] = field(default_factory=dict)
    # (namespace, name) -> (InferencePool CRD exists, live router objects): read before each decision
    router_views: dict[tuple[str, str], tuple[bool, list]] = field(default_factory=dict)
    pool_crd: bool | None = None             # the InferencePool CRD was found (looked up until it is)
    _threads: Any = field(default=None, repr=False)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the reconciler's own small thread pool (see module doc)."""
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(DECIDE_THREADS, thread_name_prefix="meshplan-decide")
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def forget(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.world.forget(namespace, name)
        self.locks.pop((namespace, name), None)
        self.autoscaler_conditions.pop((namespace, name), None)
        self.claims.pop((namespace, name), None)
        self.router_views.pop((namespace, name), None)
        if uid:
            self.disagg_plans.pop(uid, None)
            self.plans.pop(uid, None)
            self.plan_specs.pop(uid, None)
            self.refusals.pop(uid, None)
            self.plans_moved.discard(uid)
            self.plan_notes.pop(uid, None)
            self.plans_refused.pop(uid, None)
            self.write_refusals.pop(uid, None)

    async def reconcile(self, namespace: str, name: str) -> Result:
        lock = self.locks.setdefault((namespace, name), asyncio.Lock())
        async with lock:
            t0 = time.monotonic()
            res = await self._reconcile(namespace, name)
            res.seconds = time.monotonic() - t0
            if res.writes:
                log.info("reconciled %s/%s in %.2fs: %d write(s): %s", namespace, name, res.seconds, res.writes,
                         res.written)
            try:
                from meshplan import metrics

                metrics.observe_reconcile(res.seconds, True)
            except Exception:  # noqa: BLE001 - metrics never break a reconcile
                pass
            return res

    async def _reconcile(self, namespace: str, name: str) -> Result:
        kube = self.kube
        writes = count_writes()          # this reconcile's writes (the Kube is shared by every worker)
        body = await kube.get(API_VERSION, KIND, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            # Children go with the owner (ownerReferences + garbage collector): nothing to do.
            return Result(None)
        if self.compute_domains is None:
            self.compute_domains = await kube.crd_exists(COMPUTE_DOMAIN_CRD)
        selector = f"{LABEL_DEPLOYMENT}={name}"
        if not labels_can_carry(name):
            # No child can carry this name (the LIST by label would fail): report, create nothing.
            pods, services, cds = [], [], []
        else:
            pods, services = await asyncio.gather(kube.list("v1", "Pod", namespace, selector),
                                                  kube.list("v1", "Service", namespace, selector))
            cds = await kube.list(CD_API, "ComputeDomain", namespace, selector) if self.compute_domains else []
        uid = body["metadata"].get("uid", "")
        # Only children this object owns (a same-named object from before a re-create is not ours).
        pods = [p for p in pods if _owned_by(p, uid)]
        services = [s for s in services if _owned_by(s, uid)]
        cds = [c for c in cds if _owned_by(c, uid)]
        # A child this generation renders was refused before: report it again without retrying the create.
        generation = body["metadata"].get("generation")
        known = self.refusals.get(uid)
        known_refusal = known[1] if known is not None and known[0] == generation else None
        if labels_can_carry(name) and wants_router_view(body, services):
            self.router_views[(namespace, name)] = await self._router_view(namespace, name, uid, services)
        else:
            self.router_views.pop((namespace, name), None)
        outcome = await self._in_thread(self._decide_in_thread, namespace, name, body, pods, services, cds,
                                        known_refusal)
        cached = self.plans.get(uid)
        stored = (body["metadata"].get("annotations") or {}).get(PLAN_ANNOTATION)
        if cached is not None and (plan_annotation_key(stored) != cached[0] or uid in self.plans_moved):
            self.plans_moved.discard(uid)
            value = plan_to_annotation(cached[0], cached[1])
            await kube.request("PATCH", resource_path(API_VERSION, KIND, namespace, name),
                               body={"metadata": {"annotations": {PLAN_ANNOTATION: value}}},
                               content_type="application/merge-patch+json")

        refused = known_refusal
        wr = self.write_refusals.get(uid)
        holding = wr is not None and self.monotonic() < wr.retry_at      # back-off: do not hammer the API server
        new_refusal: tuple[str, dict, ApiError] | None = None
        applies = list(outcome.apply) if refused is None and not holding else []
        ssh_checked = False
        for i, (desired, live) in enumerate(applies):
            try:
                if live is None and desired.get("kind") == "Pod" and not ssh_checked:
                    ssh_checked = True
                    await ensure_trtllm_ssh_secret(kube, namespace, name, uid, [d for d, _ in applies])
                    await ensure_nim_ssh_secret(kube, namespace, name, uid, [d for d, _ in applies])
                if live is None and desired.get("kind") == "Service":
                    taken = await _taken_by_another(kube, desired, uid)
                    if taken is not None:
                        raise ApiError(409, "NameCollision", taken)
                await applier.apply(kube, desired, live)
            except applier.ImmutableFieldChanged as exc:
                log.warning("replacing %s: %s", desired["metadata"]["name"], exc)
                await kube.delete(desired["apiVersion"], desired["kind"], namespace, desired["metadata"]["name"],
                                  uid=(live or {}).get("metadata", {}).get("uid"))
            except ApiError as exc:
                kind = classify_refusal(exc.status, exc.message, exc.reason) if live is None else None
                if kind is not None:
                    new_refusal = (kind, desired, exc)
                    # the pods not created hold no GPUs: stop charging their reservations
                    self.world.reserve(namespace, name, [], [d["metadata"]["name"] for d, lv in applies[i:]
                                                             if d.get("kind") == "Pod" and lv is None])
                    break
                # 400/422 on create: what the spec renders is invalid for the API server (e.g. a pod over
                # its size limits). Retrying cannot help until the spec changes: report it like an
                # invalid spec (nothing else is changed) and look again at the waiting pace.
                if exc.status not in (400, 422) or live is not None:
                    raise
                refused = (f"the API server refuses the {desired['kind']} {desired['metadata']['name']} this spec "
                           f"renders: {exc.message[:600]}. Shrink what the spec adds to every pod "
                           "(spec.engine.env, spec.nccl.env, spec.engine.extraArgs)")
                log.warning("%s/%s: %s", namespace, name, refused)
                self.refusals[uid] = (generation, refused)
                break
        if new_refusal is not None:
            (reason, hint), desired, exc = new_refusal
            attempts = (wr.attempts + 1) if wr is not None and wr.reason == reason else 1
            delay = REFUSAL_BACKOFF_S[min(attempts, len(REFUSAL_BACKOFF_S)) - 1]
            sig = refusal_signature(reason, exc.message)
            message = refusal_message(reason, hint, desired["kind"], desired["metadata"]["name"], exc.status,
                                      exc.message, delay, attempts)
            if wr is None or wr.signature != sig:
                log.warning("%s/%s: %s", namespace, name, message)      # one line per change, no traceback
            else:
                log.debug("%s/%s: still refused (attempt %d): %s", namespace, name, attempts, reason)
            wr = self.write_refusals[uid] = WriteRefusal(reason, message, sig, attempts, self.monotonic() + delay)
        elif wr is not None and not holding and refused is None:
            log.info("%s/%s: the API server accepts the writes again (after %d refused attempt(s): %s)",
                     namespace, name, wr.attempts, wr.reason)
            self.write_refusals.pop(uid, None)
            wr = None
        if refused is None and wr is None:
            self.refusals.pop(uid, None)
            # Every create above succeeded, so each new group's pods all exist: release them now (all
            # or nothing, decide rule 4), not one queue round later.
            for group in outcome.release:
                for pod in group:
                    await applier.apply(kube, pod, None)
        elif refused is not None and known_refusal is None:
            outcome = await self._in_thread(self._decide_in_thread, namespace, name, body, pods, services, cds,
                                              refused)
        if wr is not None:
            # Report it as Placed=False (the API server's reason and numbers); nothing else is changed.
            prev = (body.get("status") or {}).get("conditions") or []
            conds = outcome.status.get("conditions")
            if isinstance(conds, list):
                from meshplan.controller import status as st

                placed = st.condition(prev, "Placed", False, wr.reason, wr.message, generation, self.clock())
                outcome.status["conditions"] = [placed if c.get("type") == "Placed" else c for c in conds] + \
                    ([] if any(c.get("type") == "Placed" for c in conds) else [placed])
                if st.transitioned(prev, placed):
                    outcome.events.append(("Warning", wr.reason, wr.message[:1024]))
            outcome.release = []
            # Nothing is removed while creates are refused (a rolling update would otherwise drop a serving
            # group for a replacement that cannot be created), and no event claims a group was created.
            outcome.delete = []
            outcome.events = [e for e in outcome.events if e[1] not in ("ReplicaCreated", "ReplicaReleased")]
            outcome.requeue_after_s = max(1.0, wr.retry_at - self.monotonic())
        for api_version, kind, child, child_uid in outcome.delete:
            await kube.delete(api_version, kind, namespace, child, uid=child_uid or None)
        patch = status_patch(body.get("status"), outcome.status, DISAGG_STATUS_KEYS)
        if patch:
            try:
                # No resourceVersion precondition: only this reconciler writes these keys (per-object
                # lock), and kopf's own annotation writes would make every patch conflict.
                await kube.patch_status(API_VERSION, KIND, namespace, name, patch)
            except ApiError as exc:
                if exc.status == 409:
                    import kopf

                    raise kopf.TemporaryError(f"status of {namespace}/{name} changed meanwhile; retrying",
                                              delay=1.0) from exc
                raise
        for type_, reason, message in outcome.events:
            await self._event(body, type_, reason, message)
        return Result(outcome.requeue_after_s, writes.n, outcome, written=writes.what())

    def _decide_in_thread(self, namespace: str, name: str, body: Mapping[str, Any], pods: list, services: list,
                          cds: list, refused: str | None = None) -> Outcome:
        # The topology is built here, not on the event loop: it walks every GPU node and pod. Reserving
        # in the same (single) thread makes "see free GPUs, place, reserve" one step (see World).
        from meshplan.placement import Claim, held_for_claims, incumbency_rank
        from meshplan.topology import ASSIGNED_NODE_ANNOTATION, pod_gpus

        topology = self.world.topology_without(namespace, name)
        meta = body.get("metadata") or {}
        key = (namespace, name)
        rank = incumbency_rank((body.get("status") or {}).get("servingSince"), meta.get("creationTimestamp"),
                               f"{namespace}/{name}")
        rivals = [c for k, c in self.claims.items() if k != key and c.rank < rank]
        held_for: tuple[str, ...] = ()
        if rivals:
            own = [((p.get("metadata") or {}).get("annotations", {}).get(ASSIGNED_NODE_ANNOTATION)
                    or (p.get("spec") or {}).get("nodeName"), pod_gpus(p)) for p in pods]
            held, owners = held_for_claims(topology, rivals, rank, [(n, g) for n, g in own if n and g > 0])
            if held:
                topology, held_for = topology.with_usage(held), tuple(owners)
        out = self._decide(body, topology, pods, services, cds, refused, held_for)
        if out.placement is not None and out.waiting > 0:
            self.claims[key] = Claim(f"{namespace}/{name}", rank,
                                     dataclasses.replace(out.placement.request, replicas=out.waiting))
        else:
            self.claims.pop(key, None)

        created = [(d["metadata"]["name"], (d["metadata"].get("annotations") or {}).get(ASSIGNED_NODE_ANNOTATION, ""),
                    pod_gpus(d)) for d, live in out.apply if d.get("kind") == "Pod" and live is None]
        deleted = [child for _, kind, child, _ in out.delete if kind == "Pod"]
        if created or deleted:
            self.world.reserve(namespace, name, created, deleted)
        return out

    def _decide(self, body: Mapping[str, Any], topology: Topology, pods: list, services: list,
                cds: list, refused: str | None = None, held_for: tuple[str, ...] = ()) -> Outcome:
        """The pure part of a reconcile (runs in a worker thread). `refused`: the API server refused a
        child this spec renders (reported as InvalidSpec; nothing is changed)."""
        from pydantic import ValidationError

        from meshplan.api.models import LLMDeployment, validate_semantics
        from meshplan.controller.routing import is_router_object

        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        common = dict(name=meta.get("name", ""), namespace=meta.get("namespace", ""), uid=meta.get("uid", ""),
                      generation=meta.get("generation"), topology=topology, pods=pods,
                      services=[s for s in services if not is_router_object(s)],
                      compute_domains=cds, previous_status=status, now=self.clock(),
                      extra_conditions=tuple(self.autoscaler_conditions.get(key, ())), held_for=held_for)
        try:
            llmd = LLMDeployment.from_manifest(dict(body))
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            return decide(Inputs(desired_replicas=0, planned_reason="InvalidSpec", planned_message=msg, **common))
        spec = llmd.spec
        from meshplan.render.pipeline import replicas_and_why

        desired, replicas_why = replicas_and_why(spec, status)
        if refused is not None:
            return decide(Inputs(desired_replicas=desired, planned_reason="InvalidSpec", planned_message=refused,
                                 **common))
        from meshplan.api.policy import policy_problems

        refused_by_admin = policy_problems(spec, self.engine_policy)
        if refused_by_admin:
            return decide(Inputs(desired_replicas=desired, planned_reason="NotAllowed",
                                 planned_message="; ".join(refused_by_admin), **common))
        problems = validate_semantics(spec) + node_selector_problems(dict(spec.gpus.node_selector or {}))
        if problems and not (len(problems) == 1 and "predictions may not describe" in problems[0]):
            return decide(Inputs(desired_replicas=desired, planned_reason="InvalidSpec",
                                 planned_message="; ".join(problems), **common))
        stored = ((meta.get("annotations") or {}).get(PLAN_ANNOTATION))
        plan = self._plan(common["uid"], spec, topology, stored, status.get("plan"))
        note = self.plan_notes.pop(common["uid"], None)
        if note is not None:
            outcome = self._decide_planned(spec, plan, topology, desired, common, replicas_why)
            outcome.events.append(("Warning", "PlanAnnotationIgnored", note))
            return outcome
        return self._decide_planned(spec, plan, topology, desired, common, replicas_why)

    def _decide_planned(self, spec: Any, plan: Any, topology: Topology, desired: int,
                        common: dict[str, Any], replicas_why: str = "") -> Outcome:
        if isinstance(plan, str):
            return decide(Inputs(desired_replicas=desired, planned_reason="InvalidSpec", planned_message=plan,
                                 **common))
        if plan.choice is None:
            reason, message = _capacity_message(spec, topology, plan.reason, self.world.fleet())
            return decide(Inputs(desired_replicas=desired, planned_reason=reason, planned_message=message,
                                 **common))
        from meshplan.controller.decide_disagg import disaggregation_status, is_disaggregated_spec

        split = self._decide_disagg(spec, plan, topology, desired, common, replicas_why) \
            if is_disaggregated_spec(spec) else None
        switch = _serving_mode_switch(common["pods"], split is not None)
        if switch:
            # Running pods of the other serving mode: decide.py reads groups by replica index and would pair a
            # prefill and a decode pod as one group; decide_disagg does not know aggregated groups. Nothing is
            # changed (rule 1: no plan), the condition says what to do.
            return decide(Inputs(desired_replicas=desired, planned_reason="ServingModeChange",
                                 planned_message=switch, **common))
        if split is not None:
            return split
        target = self._with_policy(target_for(spec, plan, topology, bool(self.compute_domains)))
        rout = self._aggregated_router(spec, target, common)
        if rout is not None and rout.condition is not None:
            common = {**common, "extra_conditions": (*common["extra_conditions"], rout.condition)}
        outcome = decide(Inputs(desired_replicas=desired, target=target, replicas_why=replicas_why, **common))
        if rout is not None:
            outcome.apply += rout.apply
            outcome.delete += rout.delete
        if is_disaggregated_spec(spec) and common["uid"] in self.disagg_plans:
            # auto kept aggregated serving: say why (the comparison), the groups are decide's
            outcome.status["disaggregation"] = disaggregation_status(self.disagg_plans[common["uid"]][1])
        if outcome.placement is not None and outcome.placement.unplaced:
            # The planned product is full: another product the spec allows may hold every replica.
            from meshplan.planner import plan_for_spec

            alt = fallback_target(spec, target, topology, desired, plan_for_spec, bool(self.compute_domains))
            if alt is not None:
                alt = self._with_policy(alt)
                fit = len(outcome.placement.placed)
                self.plans[common["uid"]] = (plan_key(spec, topology), alt.plan)
                self.plan_specs[common["uid"]] = spec_key(spec)
                self.plans_moved.add(common["uid"])
                outcome = decide(Inputs(desired_replicas=desired, target=alt, replicas_why=replicas_why, **common))
                message = (f"{target.product} has room for {fit} of {desired} replica(s), {alt.product} for all: "
                           f"planned again on {alt.product} as {alt.plan.choice.layout.label()} "
                           f"({alt.plan.choice.layout.gpus_per_replica} GPUs per replica); the running groups "
                           "are replaced one at a time")
                log.info("%s/%s: %s", common["namespace"], common["name"], message)
                outcome.events.append(("Normal", "PlanMovedProduct", message))
        return outcome

    async def _router_view(self, namespace: str, name: str, uid: str, services: list) -> tuple[bool, list]:
        """Whether the InferencePool CRD exists, and the deployment's live router objects (read by name): the
        picker's and the pool (kind inferencePool), the engine router's Deployment (kind engine); their Services
        are among the deployment's own (listed by label)."""
        from meshplan.controller.routing import POOL_CRD, engine_router_objects_named, pool_objects_named
        from meshplan.render.inference_pool import POOL_KIND

        if not self.pool_crd:
            self.pool_crd = await self.kube.crd_exists(POOL_CRD)
        wanted = [(a, k, n) for a, k, n in pool_objects_named(name) + engine_router_objects_named(name)
                  if k != "Service" and (k != POOL_KIND or self.pool_crd)]
        found = await asyncio.gather(*(self.kube.get(a, k, namespace, n) for a, k, n in wanted))
        return bool(self.pool_crd), [o for o in found if o is not None and _owned_by(o, uid)] + list(services)

    def _aggregated_router(self, spec: Any, target: Any, common: dict[str, Any]) -> Any:
        """An aggregated deployment's router (controller.routing): an InferencePool in front of its replicas when
        spec.serving.router asks for one, and the removal of router objects no longer asked for; None when the
        reconciler read no router objects (none asked for, none left)."""
        from meshplan.controller.routing import RouterInputs, decide_router

        view = self.router_views.get((common["namespace"], common["name"]))
        if view is None:
            return None
        router = getattr(getattr(spec, "serving", None), "router", None)
        return decide_router(RouterInputs(
            name=common["name"], namespace=common["namespace"], uid=common["uid"], engine=spec.engine.kind,
            kind=getattr(router, "kind", None), image=getattr(router, "image", None), port=target.serving.port,
            pool_crd=view[0], disaggregated=False, live=view[1]))

    def _decide_disagg(self, spec: Any, plan: Any, topology: Topology, desired: int,
                       common: dict[str, Any], replicas_why: str) -> Outcome | None:
        """The disaggregated path (controller.decide_disagg) when the planner disaggregates this spec, else None
        (aggregated: `decide`, with status.disaggregation saying why under auto)."""
        from meshplan.controller.decide_disagg import DisaggInputs, DisaggTarget, decide_disagg
        from meshplan.planner.disagg import disagg_plan_for_spec
        from meshplan.render.options import options_from_spec
        from meshplan.render.pipeline import product_for_gpu

        uid = common["uid"]
        fleet = topology.select(dict(spec.gpus.node_selector or {}))
        key = plan_key(spec, topology)
        cached = self.disagg_plans.get(uid)
        if cached is not None and cached[0] == key:
            dplan = cached[1]
        else:
            try:
                dplan = disagg_plan_for_spec(spec, fleet, mode=spec.serving.disaggregation, aggregated=plan)
            except ValueError as exc:
                return decide(Inputs(desired_replicas=desired, planned_reason="InvalidSpec",
                                     planned_message=f"spec.serving.disaggregation: {exc}", **common))
            if dplan.choice is not None or not dplan.disaggregated:
                self.disagg_plans[uid] = (key, dplan)
        if not dplan.disaggregated or dplan.choice is None:
            if spec.serving.disaggregation == "enabled":
                return decide(Inputs(desired_replicas=desired, planned_reason="NoFeasiblePlan",
                                     planned_message=f"spec.serving.disaggregation is enabled: {dplan.reason}"[:4096],
                                     **common))
            return None
        serving, network, pods = options_from_spec(spec)
        network = dataclasses.replace(network, compute_domains=bool(self.compute_domains))
        sa = getattr(self.engine_policy, "service_account_name", None)
        if sa:
            pods = dataclasses.replace(pods, service_account=sa)
        product, per_node = product_for_gpu(fleet, dplan.choice.decode.gpu)
        if not per_node:
            from meshplan.catalog.gpus import get_gpu

            per_node = get_gpu(dplan.choice.decode.gpu).gpus_per_node
        pool_crd, routers = self.router_views.get((common["namespace"], common["name"]), (False, []))
        target = DisaggTarget(dplan, serving, network, pods, product, per_node or 1, spec.serving.router.image,
                              pool_crd, spec.serving.router.kind)
        from meshplan.controller.decide_disagg import role_targets

        # spec.replicas (and the autoscaler's toReplicas) count decode groups; prefill from role_targets
        targets = role_targets(spec, common["previous_status"], dplan)
        base = Inputs(desired_replicas=targets.decode, replicas_why=targets.why, **common)
        return decide_disagg(DisaggInputs(base, target, routers, prefill_replicas=targets.prefill))

    def _with_policy(self, target: Any) -> Any:
        """The target's pods run as the admin's engine ServiceAccount (enginePolicy.serviceAccountName)."""
        import dataclasses

        sa = getattr(self.engine_policy, "service_account_name", None)
        if not sa or target.pods.service_account == sa:
            return target
        return dataclasses.replace(target, pods=dataclasses.replace(target.pods, service_account=sa))

    def _plan(self, uid: str, spec: Any, topology: Topology, stored: str | None = None,
              previous_plan: Mapping[str, Any] | None = None) -> Any:
        """The plan for `spec`: cached, else the one stored on the object by an earlier run of the
        operator (same inputs -> same plan, even if other tenants' usage changed meanwhile), else new."""
        from meshplan.planner import plan_for_spec

        key = plan_key(spec, topology)
        cached = self.plans.get(uid)
        if cached is not None and cached[0] == key:
            return cached[1]
        restored = plan_from_annotation(stored, key)
        if restored is not None:
            problems = verify_stored_plan(restored, spec, topology)
            if not problems:
                from dataclasses import replace as dc_replace

                ok_alts = tuple(a for a in restored.alternatives
                                if not verify_stored_plan(dc_replace(restored, choice=a, alternatives=()), spec,
                                                          topology))
                restored = dc_replace(restored, reason=restored_reason(restored, previous_plan),
                                      alternatives=ok_alts)
                self.plans[uid] = (key, restored)
                self.plan_specs[uid] = spec_key(spec)
                return restored
            message = (f"the stored plan annotation {PLAN_ANNOTATION} is ignored and a new plan is made: "
                       + "; ".join(problems))[:1024]
            if self.plans_refused.get(uid) != stored:
                self.plans_refused[uid] = stored or ""
                self.plan_notes[uid] = message
                log.warning("%s: %s", spec.model.name, message)
            self.plans_moved.add(uid)       # rewrite the annotation with the plan made now
        t0 = time.monotonic()
        try:
            plan = plan_for_spec(spec, topology.select(dict(spec.gpus.node_selector or {})))
        except ValueError as exc:
            return str(exc)
        finally:
            took_s = time.monotonic() - t0
            if took_s > SLOW_PLAN_S:
                log.warning("planning %s took %.1fs (spec.gpus.maxGpus and pinned sizes narrow the search)",
                            spec.model.name, took_s)
            try:
                from meshplan import metrics

                metrics.observe_plan(took_s)
            except Exception:  # noqa: BLE001
                pass
        if plan.choice is not None:
            self.plans[uid] = (key, plan)
            self.plan_specs[uid] = spec_key(spec)
        elif cached is not None and self.plan_specs.get(uid) == spec_key(spec):
            # Only the fleet changed (a node lost, cordoned) and the smaller fleet cannot hold the
            # whole spec: keep the running layout. Placement then re-places or removes the groups
            # that lost their nodes and reports what no longer fits (Placed=False with numbers);
            # the deployment stays managed (drift is still undone) instead of being left as it is.
            return cached[1]
        return plan

    async def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body.get("metadata") or {}
        now = self.clock().astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'llmd')}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason[:128], "message": message[:1024],
            "source": {"component": "meshplan"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await kube_post(self.kube, f"/api/v1/namespaces/{meta.get('namespace')}/events", event)
        except ApiError as exc:      # events are best effort
            log.debug("event not posted: %s", exc)


def _load_policy() -> Any:
    from meshplan.controller.settings import load_engine_policy

    return load_engine_policy()


async def kube_post(kube: Kube, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return await kube.request("POST", path, body=body)


async def _taken_by_another(kube: Kube, desired: Mapping[str, Any], uid: str) -> str | None:
    """Why the name of a child about to be created belongs to another object (issue 17, finding 6:
    deployments `foo` and `foo-r0` both claimed Service `foo-r0`, and server-side apply with force
    made owner and selector flip at every resync), or None when it is free or already ours. A child
    owned by anything else is never adopted or overwritten."""
    meta = desired.get("metadata") or {}
    live = await kube.get(desired.get("apiVersion", "v1"), desired["kind"], meta.get("namespace"), meta["name"])
    if live is None or _owned_by(live, uid):
        return None
    refs = (live.get("metadata") or {}).get("ownerReferences") or []
    ctl = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    owner = f"{ctl.get('kind', '?')} {ctl.get('name', '?')}" if ctl else "no owner (created by someone else)"
    labels = (live.get("metadata") or {}).get("labels") or {}
    dep = labels.get(LABEL_DEPLOYMENT)
    return (f'{desired["kind"]} "{meta["name"]}" already exists, owned by {owner}'
            + (f" (LLMDeployment {dep})" if dep and (not ctl or ctl.get("name") != dep) else ""))


async def ensure_trtllm_ssh_secret(kube: Kube, namespace: str, name: str, uid: str,
                                   desired: list[Mapping[str, Any]]) -> bool:
    """Create the ssh Secret the TensorRT-LLM multi-node pods about to be created mount (True when created).

    The keys are generated here once (`meshplan.engines.trtllm_ssh`); the Secret is owned by the
    LLMDeployment, so it goes with it, and an existing one is kept as it is (running pods hold its keys).
    A same-named Secret this deployment does not own is never overwritten: a 409 NameCollision, which
    the caller reports like any refused create.
    """
    from meshplan.engines.trtllm_ssh import ssh_secret
    from meshplan.render.workloads import base_labels

    return await ensure_owned_secret(
        kube, namespace, name, uid, desired, volume="trtllm-ssh", who="the TensorRT-LLM multi-node pods",
        build=lambda dep, ns, owner: ssh_secret(dep, ns, owner, base_labels(dep, "trtllm")))


async def ensure_owned_secret(kube: Kube, namespace: str, name: str, uid: str, desired: list[Mapping[str, Any]],
                              *, volume: str, build: Any, who: str) -> bool:
    """Engine-neutral: create the Secret the pods about to be created mount as volume `volume` (True when created).

    `build(deployment, namespace, owner)` makes the manifest (its keys generated once, here); the
    Secret is owned by the LLMDeployment, an existing owned one is kept as it is (running pods hold its
    keys), and a same-named Secret this deployment does not own is never overwritten: 409 NameCollision.
    """
    from meshplan.engines.trtllm_ssh import mounted_secret
    from meshplan.render.workloads import owner_reference

    secret = mounted_secret(list(desired), volume)
    if secret is None:
        return False
    live = await kube.get("v1", "Secret", namespace, secret)
    if live is not None:
        if _owned_by(live, uid):
            return False
        raise ApiError(409, "NameCollision", f"Secret {secret} exists and is not owned by LLMDeployment {name}: "
                       f"{who} mount their ssh keys from it; rename or remove it")
    await kube.apply(build(name, namespace, owner_reference(name, uid)), applier.FIELD_MANAGER, force=True)
    return True


async def ensure_nim_ssh_secret(kube: Kube, namespace: str, name: str, uid: str,
                                desired: list[Mapping[str, Any]]) -> bool:
    """The ssh key Secret of NVIDIA NIM multi-node pods (`meshplan.engines.nim.ssh_secret`), as for TensorRT-LLM."""
    from meshplan.engines import nim
    from meshplan.render.workloads import base_labels

    return await ensure_owned_secret(
        kube, namespace, name, uid, desired, volume=nim.SSH_VOLUME, who="the NIM multi-node pods",
        build=lambda dep, ns, owner: nim.ssh_secret(dep, ns, owner, base_labels(dep, "nim")))


def wants_router_view(body: Mapping[str, Any], services: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a reconcile reads the deployment's router objects: it is (or may be) disaggregated, asks for a
    router, or still has a router Service of its own (a router no longer asked for, to delete)."""
    from meshplan.controller.routing import is_router_object

    serving = (body.get("spec") or {}).get("serving") or {}
    return (serving.get("disaggregation") in ("auto", "enabled") or bool(serving.get("router"))
            or any(is_router_object(s) for s in services))


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return not uid or any(r.get("uid") == uid for r in refs)


__all__ = ["REFUSAL_BACKOFF_S", "WriteRefusal", "classify_refusal", "PLAN_ANNOTATION", "plan_from_annotation", "restored_reason", "verify_stored_plan", "plan_to_annotation", "ForeignUsage", "Reconciler", "Result", "World", "desired_replicas", "plan_key"]
