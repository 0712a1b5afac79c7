"""kopf indexes: the GPU topology and the LLMDeployments, kept current by watches.

- `gpu_nodes`    every Node with GPUs -> `topology.node_info(node)` (key "nodes").
- `gpu_pods`     every Pod holding or reserving GPUs -> (namespace, meshplan
                 deployment label or None, node, GPUs) (key "usage"); gated pods
                 rendered by meshplan reserve via their assigned-node annotation.
- `llmds`        every LLMDeployment -> its (namespace, name) (key "all"), for the
                 periodic resync and for child events.

The reconciler builds the topology from the first two per reconcile
(`reconcile.World`), without listing Nodes or Pods from the API server. The
node index also notices when a node's schedulability changes (NotReady,
cordoned, tainted) and asks for every LLMDeployment to be reconciled, so a lost
node's replica groups are re-placed without waiting for the resync.
"""

from __future__ import annotations

from typing import Any, Callable

from meshplan.render.workloads import LABEL_DEPLOYMENT
from meshplan.topology import node_info, pod_gpu_usage

NODES_KEY, USAGE_KEY, ALL_KEY = "nodes", "usage", "all"

# Set by the handlers module: called with no argument when capacity changed.
on_capacity_change: Callable[[], None] = lambda: None
_schedulable: dict[str, bool] = {}


def index_node(name: str, body: Any) -> dict[str, Any] | None:
    info = node_info(body)
    if info is None:
        _schedulable.pop(name, None)
        return None
    before = _schedulable.get(name)
    _schedulable[name] = info.schedulable
    if before is not None and before != info.schedulable:
        on_capacity_change()
    return {NODES_KEY: info}


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
