"""kopf indexes: the GPU topology and the LLMDeployments, kept current by watches.

- `gpu_nodes`    every Node with GPUs -> `topology.node_info(node)` (key "nodes").
- `gpu_pods`     every Pod holding or reserving GPUs -> (namespace, meshplan
                 deployment label or None, node, GPUs) (key "usage"); gated pods
                 rendered by meshplan reserve via their assigned-node annotation.
- `llmds`        every LLMDeployment -> its (namespace, name) (key "all"), for the
                 periodic resync and for child events.

The resync does not trust the last index alone: a watch can miss an event (L1
in docs/reliability.md: kopf never noticed a new namespace matching the
operator's glob, so nothing in it was ever reconciled). Each period it also
LISTs the LLMDeployments from the API server; `listed_keys` and
`due_for_resync` (pure, below) decide which of them to queue.

The reconciler builds the topology from the first two per reconcile
(`reconcile.World`), without listing Nodes or Pods from the API server. The
node index also notices when anything placement reads of a node changes
(NotReady, cordoned, tainted, allocatable GPUs, `nvidia.com/gpu.clique` and
other labels; `node_shape`) and asks for the deployments placed on it to be
reconciled at once, then every other one (capacity may have appeared), so
topology churn is acted on within seconds, not at the next resync.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Callable, Iterable, Mapping

from meshplan.render.workloads import LABEL_DEPLOYMENT
from meshplan.topology import node_info, pod_gpu_usage

NODES_KEY, USAGE_KEY, ALL_KEY = "nodes", "usage", "all"

# Set by the handlers module: called with the node's name when something placement reads of a GPU
# node changed (schedulability, allocatable GPUs, product, NVLink domain, zone, labels), or the node
# stopped being a GPU node. The handler only queues reconciles (those placed on the node first).
on_node_change: Callable[[str], None] = lambda name: None
_shapes: dict[str, tuple] = {}

# Labels that change without changing the node: GFD writes the time of its labelling pass
# (NVIDIA k8s-device-plugin, gpu-feature-discovery: `nvidia.com/gfd.timestamp` = Unix time, unless
# started with --no-timestamp). A change of only these does not queue anything.
VOLATILE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})


def node_shape(info: Any) -> tuple:
    """What placement reads of one GPU node (`topology.NodeInfo`), without the volatile labels."""
    return (info.product, info.gpus, info.gpu_memory_mib, info.family, info.zone, info.clique, info.schedulable,
            tuple(kv for kv in info.labels if kv[0] not in VOLATILE_LABELS))


def index_node(name: str, body: Any) -> dict[str, Any] | None:
    info = node_info(body)
    if info is None:
        if _shapes.pop(name, None) is not None:
            on_node_change(name)        # no GPUs any more (allocatable 0)
        return None
    shape = node_shape(info)
    before = _shapes.get(name)
    _shapes[name] = shape
    if before is not None and before != shape:
        on_node_change(name)
    return {NODES_KEY: info}


def deployments_on(usage: Iterable[tuple], node: str) -> list[tuple[str, str]]:
    """(namespace, deployment) of the meshplan pods (entries of the `gpu_pods` index) on `node`, sorted."""
    return sorted({(ns, dep) for ns, dep, n, _g in usage if dep and n == node})


def index_pod(namespace: str, body: Any) -> dict[str, Any] | None:
    usage = pod_gpu_usage(body)
    if usage is None:
        return None
    labels = (body.get("metadata") or {}).get("labels") or {}
    return {USAGE_KEY: (namespace, labels.get(LABEL_DEPLOYMENT), usage[0], usage[1])}


def index_llmd(namespace: str, name: str) -> dict[str, Any]:
    return {ALL_KEY: (namespace, name)}


def values(index: Any, key: str) -> list[Any]:
    """All values of one key of a kopf index (empty when the key has none)."""
    try:
        return list(index.get(key, ()))
    except Exception:  # noqa: BLE001 - an index not populated yet reads as empty
        return []


Key = tuple[str, str]


def served_namespace(namespace: str, globs: Iterable[str]) -> bool:
    """Whether an operator started with `--namespace` globs serves `namespace` (no globs: every one)."""
    globs = tuple(globs)
    return not globs or any(fnmatchcase(namespace, g) for g in globs)


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def listed_keys(items: Iterable[Mapping[str, Any]], globs: Iterable[str]) -> set[Key]:
    """(namespace, name) of listed objects in the served namespaces."""
    globs = tuple(globs)
    out = set()
    for item in items:
        meta = item.get("metadata") or {}
        ns, name = meta.get("namespace"), meta.get("name")
        if ns and name and served_namespace(ns, globs):
            out.add((ns, name))
    return out


def autoscaled_keys(items: Iterable[Mapping[str, Any]], globs: Iterable[str]) -> set[Key]:
    """(namespace, name) of listed objects in the served namespaces with spec.autoscaling.enabled
    (what the `autoscaled_llmds` index holds for the objects kopf's watches do see)."""
    return listed_keys((i for i in items if ((i.get("spec") or {}).get("autoscaling") or {}).get("enabled") is True),
                       globs)


def due_for_resync(keys: Iterable[Key], last_reconciled_s: Mapping[Key, float], now_s: float,
                   period_s: float) -> list[Key]:
    """The keys not reconciled within the last `period_s` (never reconciled: due), sorted.

    `last_reconciled_s` holds the (monotonic) time each key's last reconcile
    finished; an object reconciled recently, for any reason, is not queued again.
    """
    return sorted(k for k in set(keys) if now_s - last_reconciled_s.get(k, float("-inf")) >= period_s)


def gpu_node_infos(nodes: Iterable[Any]) -> list[Any]:
    """`node_info` of each listed Node with GPUs (what the `gpu_nodes` index would hold)."""
    return [info for info in (node_info(n) for n in nodes) if info is not None]


def unwatched_namespaces(missed: Iterable[Key], known: Iterable[Key], missed_before: Iterable[Key],
                         nodes_watched: bool) -> set[str]:
    """Namespaces whose pods kopf's pod index surely lacks: those of objects a LIST found and the
    watches did not, with no object the watches know in the same namespace (kopf watches a namespace
    whole), missed in two LISTs in a row (a just-created object is not yet in the index; its pods would
    then be counted twice), or at once when kopf watches no node at all (then it watches no namespace)."""
    known_ns = {ns for ns, _ in known}
    before = set(missed_before)
    return {ns for ns, name in missed if ns not in known_ns and (not nodes_watched or (ns, name) in before)}


def gpu_usage(pods: Iterable[Mapping[str, Any]]) -> list[tuple]:
    """The `gpu_pods` index's usage entries of listed pods (pods without GPUs left out)."""
    out = []
    for p in pods:
        entry = index_pod((p.get("metadata") or {}).get("namespace", ""), p)
        if entry is not None:
            out.append(entry[USAGE_KEY])
    return out
