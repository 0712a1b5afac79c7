"""kopf handlers: thin. Every path ends in `Reconciler.reconcile(namespace, name)`.

- create / update / resume of an LLMDeployment: reconcile now (kopf retries a
  `TemporaryError`, e.g. a 409 conflict, after its delay).
- events of pods and Services carrying `meshplan.dev/deployment` (deleted,
  edited, became ready): queue their deployment's reconcile. This is how drift
  is undone and how gates are released and `Available` is noticed, without
  writing anything to the parent to "touch" it.
- a queue with per-key de-duplication and delayed re-queues: each reconcile
  says when it wants to look again (`Result.requeue_after_s`: soon while
  waiting for capacity or a rollout, every minute when steady), and a resync
  loop queues every LLMDeployment every `Options.resync_s` as a safety net:
  those in kopf's index and those one LIST of the API server returns, so a
  watch event kopf missed costs at most one period (`_resync`).
  Neither is a kopf timer or daemon, because those make kopf put a finalizer on
  every object (deletion would then hang whenever the operator is down).
- a GPU Node changing what placement reads (schedulability, allocatable GPUs, NVLink
  domain and other labels; index callback) queues the deployments placed on it, then
  everything else (`State.node_changed`).

Autoscaling hook: `AUTOSCALE_HOOK`, when set (by the autoscaling wiring),
is awaited by the resync loop for every LLMDeployment with
`spec.autoscaling.enabled` before it is queued; it records its decision in
`status.autoscaling.toReplicas`, which `reconcile.desired_replicas` reads.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp
import kopf

from meshplan.controller import indexes
from meshplan.controller import settings as operator_settings
from meshplan.controller.kube import ApiError, Kube, load_credentials
from meshplan.controller.reconcile import ForeignUsage, Reconciler, World
from meshplan.render.workloads import LABEL_DEPLOYMENT

log = logging.getLogger("meshplan.controller")

GROUP, VERSION, PLURAL = "meshplan.dev", "v1alpha1", "llmdeployments"
RETRY_AFTER_ERROR_S = 5.0
# Child events come in bursts (pod created, gate removed, bound, running, ready within a
# second or two): wait this long so one reconcile handles a burst.
CHILD_EVENT_DELAY_S = 0.5
# The node index callback runs before kopf stores the node's new value: queue its reconciles a moment
# later, so they read the changed node (and one reconcile handles a burst of label edits).
NODE_EVENT_DELAY_S = 0.5

AUTOSCALE_HOOK: Callable[[str, str], Awaitable[None]] | None = None


@dataclass
class Options:
    """Set by `meshplan run` before kopf starts."""

    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()          # empty: cluster-wide
    foreign_usage_s: float = 15.0
    peering: str | None = None
    priority: int = 0
    resync_s: float = 60.0
    workers: int = 4


OPTIONS = Options()


ERROR_BACKOFF_MAX_S = 60.0


def error_signature(exc: BaseException) -> str:
    """What kind of failure `exc` is, without the names and numbers that differ between attempts."""
    import re

    status = getattr(exc, "status", None)
    return f"{type(exc).__name__}:{status}:" + re.sub(r'"[^"]*"|\d+', "", str(exc))[:200]


_EXPECTED = (ApiError, OSError, asyncio.TimeoutError, aiohttp.ClientError)


@dataclass
class ErrorLog:
    """One log line per change of a key's failure, not a traceback per object every 5 s (issue 17,
    finding 10: a namespace being deleted or an API server outage). `failed` returns the delay of the
    next try, growing from RETRY_AFTER_ERROR_S to ERROR_BACKOFF_MAX_S while the same failure repeats;
    `succeeded` logs once that the key recovered. Expected failures (API errors, connection errors,
    timeouts) are one line without a traceback; anything else gets its traceback once."""

    state: dict = field(default_factory=dict)       # key -> (signature, consecutive failures)

    def failed(self, key: tuple[str, str], exc: BaseException, what: str = "reconcile") -> float:
        sig = error_signature(exc)
        prev = self.state.get(key)
        count = prev[1] + 1 if prev is not None and prev[0] == sig else 1
        self.state[key] = (sig, count)
        delay = min(ERROR_BACKOFF_MAX_S, RETRY_AFTER_ERROR_S * 2 ** (count - 1))
        if count > 1:
            log.debug("%s of %s/%s failed again (%d in a row): %s; retrying in %.0fs", what, *key, count, exc, delay)
        elif isinstance(exc, _EXPECTED):
            log.warning("%s of %s/%s failed: %s; retrying in %.0fs, and no more lines until this changes",
                        what, *key, exc, delay)
        else:
            log.exception("%s of %s/%s failed; retrying in %.0fs", what, *key, delay)
        return delay

    def succeeded(self, key: tuple[str, str], what: str = "reconcile") -> None:
        prev = self.state.pop(key, None)
        if prev is not None and prev[1] >= 1:
            log.info("%s of %s/%s succeeded again after %d failure(s)", what, *key, prev[1])


@dataclass
class State:
    reconciler: Reconciler | None = None
    queue: asyncio.Queue | None = None
    pending: set = field(default_factory=set)
    timers: dict = field(default_factory=dict)
    tasks: list = field(default_factory=list)
    last_reconciled: dict = field(default_factory=dict)     # key -> loop time of the last finished reconcile
    llmds_index: Any = None
    list_forbidden: bool = False        # RBAC forbids the resync's cluster-wide LIST: list per namespace
    nodes_index: Any = None
    pods_index: Any = None
    missed_before: set = field(default_factory=set)    # keys the previous LIST found and the watches did not
    # Autoscaled keys the last LIST found and the watches did not: the autoscaling loop adds them to
    # its work list (it is fed by a kopf index, blind to them like every kopf handler).
    missed_autoscaled: set = field(default_factory=set)
    # What kopf's indexes lack while its watches missed something (`fill_watch_gaps`): the GPU
    # nodes when kopf watches no Node at all, the GPU pods of namespaces kopf never noticed.
    gap_nodes: list = field(default_factory=list)
    gap_usage: list = field(default_factory=list)
    peering_checks: dict = field(default_factory=dict)   # peering object path -> (loop time, may act)
    loop: asyncio.AbstractEventLoop | None = None
    errors: ErrorLog = field(default_factory=ErrorLog)   # failures of reconciles, logged once per change

    def enqueue(self, key: tuple[str, str], delay_s: float | None = 0.0) -> None:
        """Queue a reconcile of `key` now or after `delay_s`; safe from any thread.

        Never postpones: an earlier scheduled run stays, so a stream of child events
        (debounced by CHILD_EVENT_DELAY_S) cannot starve a key.
        """
        loop = self.loop
        if self.queue is None or delay_s is None or loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            loop.call_soon_threadsafe(self.enqueue, key, delay_s)
            return
        if key in self.pending:
            return
        if delay_s <= 0:
            self._enqueue_now(key)
            return
        when = loop.time() + delay_s
        old = self.timers.get(key)
        if old is not None:
            if old.when() <= when:
                return
            old.cancel()
        self.timers[key] = loop.call_at(when, self._enqueue_now, key)

    def _enqueue_now(self, key: tuple[str, str]) -> None:
        old = self.timers.pop(key, None)
        if old is not None:
            old.cancel()
        if key not in self.pending and self.queue is not None:
            self.pending.add(key)
            self.queue.put_nowait(key)

    def enqueue_all(self) -> None:
        for key in indexes.values(self.llmds_index, indexes.ALL_KEY):
            self.enqueue(tuple(key))

    def node_changed(self, node: str) -> None:
        """A GPU node changed what placement reads (`indexes.on_node_change`): queue the deployments
        placed on it first, then every other one (freed or new capacity, waiting deployments)."""
        affected = indexes.deployments_on(indexes.values(self.pods_index, indexes.USAGE_KEY), node)
        log.log(logging.INFO if affected else logging.DEBUG,
                "node %s changed (labels, allocatable GPUs or schedulability): reconciling %d deployment(s) "
                "placed on it now, then the others", node, len(affected))
        for key in affected:
            self.enqueue(key, NODE_EVENT_DELAY_S)
        for key in indexes.values(self.llmds_index, indexes.ALL_KEY):
            self.enqueue(tuple(key), 2 * NODE_EVENT_DELAY_S)


STATE = State()


# ----------------------------------------------------------------------------- indexes


@kopf.index("nodes")
def gpu_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, Any] | None:
    return indexes.index_node(name, body)


@kopf.index("pods")
def gpu_pods(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any] | None:
    return indexes.index_pod(namespace, body)


@kopf.index(GROUP, VERSION, PLURAL)
def llmds(namespace: str, name: str, **_: Any) -> dict[str, Any]:
    return indexes.index_llmd(namespace, name)


# ----------------------------------------------------------------------------- lifecycle


PEERING_CHECK_S = 2.0


async def may_act(namespace: str) -> bool:
    """False while kopf's peering pauses this operator for `namespace` (a standby replica).

    kopf pauses its own handlers and watches, not meshplan's queue, requeues and
    resync LIST: so the worker asks here first. The peering object (cluster-wide,
    or the namespace's own for a namespace-scoped operator, as kopf reads them)
    is read at most every `PEERING_CHECK_S`; a failed read keeps the last answer.
    """
    if not OPTIONS.peering or STATE.reconciler is None:
        return True
    if OPTIONS.namespaces:
        path = f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{OPTIONS.peering}"
    else:
        path = f"/apis/kopf.dev/v1/clusterkopfpeerings/{OPTIONS.peering}"
    now = asyncio.get_running_loop().time()
    cached = STATE.peering_checks.get(path)
    if cached is not None and now - cached[0] < PEERING_CHECK_S:
        return cached[1]
    acting = cached[1] if cached is not None else True
    try:
        doc = await STATE.reconciler.kube.request("GET", path)
        acting = not operator_settings.outranked(doc.get("status") or {}, OPTIONS.priority,
                                                 datetime.datetime.now(datetime.timezone.utc))
    except ApiError as exc:
        if exc.status == 404:
            acting = True          # no peering object there: kopf does not pause for it either
        else:
            log.warning("reading the peering object %s failed: %s", path, exc)
    except (OSError, asyncio.TimeoutError) as exc:
        log.warning("reading the peering object %s failed: %s", path, exc)
    STATE.peering_checks[path] = (now, acting)
    return acting


async def _worker() -> None:
    assert STATE.queue is not None and STATE.reconciler is not None
    while True:
        key = await STATE.queue.get()
        STATE.pending.discard(key)
        if not await may_act(key[0]):
            continue      # a standby: when it takes over, kopf's resume and the resync queue everything
        try:
            res = await STATE.reconciler.reconcile(*key)
            STATE.last_reconciled[key] = asyncio.get_running_loop().time()
            STATE.errors.succeeded(key)
            STATE.enqueue(key, res.requeue_after_s)
        except kopf.TemporaryError as exc:
            STATE.enqueue(key, exc.delay or 1.0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - log (once per change), retry later, serve the others
            STATE.enqueue(key, STATE.errors.failed(key, exc))


async def list_llmdeployments(kube: Kube, globs: tuple[str, ...]
                              ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(namespace, name) of every served LLMDeployment, and of those with autoscaling enabled, read
    from the API server, not from a watch.

    One cluster-wide LIST, filtered by the namespace globs (the chart's default
    RBAC, `watch.allNamespaces`, grants it). Where that is forbidden (the chart
    with `watch.namespaces`: a Role per namespace), one LIST per served
    namespace: the exact names, plus those matching a glob (namespaces may be
    listed cluster-wide: kopf needs it too).
    """
    path = "/apis/meshplan.dev/v1alpha1/llmdeployments"
    if not STATE.list_forbidden:
        try:
            items = (await kube.request("GET", path)).get("items") or ()
            return indexes.listed_keys(items, globs), indexes.autoscaled_keys(items, globs)
        except ApiError as exc:
            if exc.status != 403 or not globs:
                raise
            STATE.list_forbidden = True
            log.info("resync: may not list LLMDeployments cluster-wide (%s); listing per namespace", exc.reason)
    namespaces = {g for g in globs if not indexes.is_glob(g)}
    if any(indexes.is_glob(g) for g in globs):
        doc = await kube.request("GET", "/api/v1/namespaces")
        namespaces |= {(n.get("metadata") or {}).get("name", "") for n in doc.get("items") or ()}
    keys: set[tuple[str, str]] = set()
    autoscaled: set[tuple[str, str]] = set()
    for ns in sorted(n for n in namespaces if indexes.served_namespace(n, globs)):
        try:
            doc = await kube.request("GET", f"/apis/meshplan.dev/v1alpha1/namespaces/{ns}/llmdeployments")
        except ApiError as exc:
            if exc.status in (403, 404):
                continue
            raise
        items = doc.get("items") or ()
        keys |= indexes.listed_keys(items, globs)
        autoscaled |= indexes.autoscaled_keys(items, globs)
    return keys, autoscaled


async def fill_watch_gaps(kube: Kube, missed: set[tuple[str, str]], known: set[tuple[str, str]]) -> None:
    """Read from the API server what kopf's indexes miss while the `missed` objects (listed, not in
    kopf's index) are served only through the resync's LIST (none: forget it all).

    kopf watches pods per served namespace, and cluster-scoped kinds such as
    Nodes only while it serves at least one namespace (kopf's orchestration
    pairs every resource with every served namespace). So when the namespace
    it missed was the only one (L1's case), its node index is empty, and in any
    case the missed namespaces' GPU pods are in no index (nor in
    `ForeignUsage`, which leaves out every served namespace). Without them such
    an object would be reported as lacking capacity, or could be placed on GPUs
    its neighbours hold. One LIST of Nodes (only while the node index is empty)
    and one of pods per missed namespace, once per resync period.
    """
    missed_before, STATE.missed_before = STATE.missed_before, set(missed)
    if not missed:
        STATE.gap_nodes, STATE.gap_usage = [], []
        return
    nodes_watched = bool(indexes.values(STATE.nodes_index, indexes.NODES_KEY))
    if nodes_watched:
        STATE.gap_nodes = []
    else:
        doc = await kube.request("GET", "/api/v1/nodes")
        STATE.gap_nodes = await asyncio.to_thread(indexes.gpu_node_infos, doc.get("items") or ())
    usage: list = []
    for ns in sorted(indexes.unwatched_namespaces(missed, known, missed_before, nodes_watched)):
        doc = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                 params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
        usage += indexes.gpu_usage(doc.get("items") or ())
    STATE.gap_usage = usage
    log.debug("resync: %d GPU node(s) and %d GPU pod(s) read past kopf's watches",
              len(STATE.gap_nodes), len(usage))


async def _acts_anywhere() -> bool:
    """False when this operator is a standby for everything it serves (kopf peering): cluster-wide
    peering, or namespace-scoped peering over namespaces named without globs. With glob patterns
    the namespaces are not known before the LIST, and each object is checked by `may_act`."""
    if not OPTIONS.peering:
        return True
    if not OPTIONS.namespaces:
        return await may_act("")
    if any(indexes.is_glob(ns) for ns in OPTIONS.namespaces):
        return True
    for ns in OPTIONS.namespaces:
        if await may_act(ns):
            return True
    return False


async def _resync() -> None:
    """Every `resync_s`: queue each LLMDeployment not reconciled within the period (a safety net).

    The candidates are what kopf's index knows plus what one LIST of the API
    server returns (`list_llmdeployments`), so an object whose watch event was
    missed (L1, docs/reliability.md: a namespace kopf never noticed) is
    reconciled within one period anyway. A failed LIST leaves the index's view.
    """
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(OPTIONS.resync_s)
        if not await _acts_anywhere():
            continue     # a standby: no LIST, no "not seen by the watches" lines; nothing to act on
        known = {tuple(k) for k in indexes.values(STATE.llmds_index, indexes.ALL_KEY)}
        listed: set[tuple[str, str]] | None = None
        autoscaled: set[tuple[str, str]] = set()
        if STATE.reconciler is not None:
            try:
                listed, autoscaled = await list_llmdeployments(STATE.reconciler.kube, tuple(OPTIONS.namespaces))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the index's view still gets its resync
                log.warning("resync: listing LLMDeployments failed (%s); using the watched objects only", exc)
        keys = known | (listed or set())
        if listed is not None:
            log.debug("resync: listed %d LLMDeployment(s), %d known to the watches", len(listed), len(known))
            missed = sorted(listed - known)
            if missed:
                log.info("resync: %d LLMDeployment(s) listed but not (yet) seen by the watches, queued if due: %s",
                         len(missed), ", ".join(f"{ns}/{name}" for ns, name in missed[:10]))
            STATE.missed_autoscaled = autoscaled & set(missed)
            for gone in set(STATE.last_reconciled) - keys:     # deleted while no watch saw it
                STATE.last_reconciled.pop(gone, None)
            try:
                await fill_watch_gaps(STATE.reconciler.kube, set(missed), known)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the last view; try again next period
                log.warning("resync: reading nodes and pods past kopf's watches failed: %s", exc)
        for key in indexes.due_for_resync(keys, STATE.last_reconciled, loop.time(), OPTIONS.resync_s):
            if not await may_act(key[0]):
                continue
            if AUTOSCALE_HOOK is not None:
                try:
                    await AUTOSCALE_HOOK(*key)
                except Exception:  # noqa: BLE001
                    log.exception("autoscaling of %s/%s failed", *key)
            STATE.enqueue(key)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, gpu_nodes: kopf.Index, gpu_pods: kopf.Index,
                  llmds: kopf.Index, **_: Any) -> None:
    operator_settings.configure(settings, peering=OPTIONS.peering, priority=OPTIONS.priority)
    kube = Kube(load_credentials(OPTIONS.kubeconfig))
    world = World(nodes=lambda: indexes.values(gpu_nodes, indexes.NODES_KEY) or STATE.gap_nodes,
                  usage=lambda: indexes.values(gpu_pods, indexes.USAGE_KEY) + STATE.gap_usage)
    foreign = None
    if OPTIONS.namespaces:
        foreign = ForeignUsage(tuple(OPTIONS.namespaces), OPTIONS.foreign_usage_s)
        world.foreign = lambda: foreign.by_node
    STATE.reconciler = Reconciler(kube, world)
    STATE.queue = asyncio.Queue()
    STATE.loop = asyncio.get_running_loop()
    STATE.llmds_index = llmds
    STATE.nodes_index = gpu_nodes
    STATE.pods_index = gpu_pods
    indexes.on_node_change = STATE.node_changed
    STATE.tasks = [asyncio.create_task(_worker()) for _ in range(OPTIONS.workers)]
    STATE.tasks.append(asyncio.create_task(_resync()))
    if foreign is not None:
        STATE.tasks.append(asyncio.create_task(foreign.run(kube)))


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for t in STATE.tasks:
        t.cancel()
    await asyncio.gather(*STATE.tasks, return_exceptions=True)
    for h in STATE.timers.values():
        h.cancel()
    if STATE.reconciler is not None:
        await STATE.reconciler.kube.close()


# ----------------------------------------------------------------------------- LLMDeployments


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile_llmdeployment(namespace: str, name: str, **_: Any) -> None:
    assert STATE.reconciler is not None
    key = (namespace, name)
    try:
        res = await STATE.reconciler.reconcile(namespace, name)
    except _EXPECTED as exc:
        # The API server refused or is away: our queue retries with back-off and one log line per change
        # (raised to kopf, each retry would log a traceback).
        STATE.enqueue(key, STATE.errors.failed(key, exc))
        return
    STATE.last_reconciled[key] = asyncio.get_running_loop().time()
    STATE.errors.succeeded(key)
    STATE.enqueue(key, res.requeue_after_s)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def forget_deleted(type: str, namespace: str, name: str, uid: str, **_: Any) -> None:
    if type == "DELETED" and STATE.reconciler is not None:
        STATE.reconciler.forget(namespace, name, uid)
        STATE.last_reconciled.pop((namespace, name), None)


# ----------------------------------------------------------------------------- children


@kopf.on.event("pods", labels={LABEL_DEPLOYMENT: kopf.PRESENT})
@kopf.on.event("services", labels={LABEL_DEPLOYMENT: kopf.PRESENT})
async def child_changed(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    STATE.enqueue((namespace, labels[LABEL_DEPLOYMENT]), CHILD_EVENT_DELAY_S)


__all__ = ["AUTOSCALE_HOOK", "ErrorLog", "OPTIONS", "Options", "STATE", "error_signature"]
