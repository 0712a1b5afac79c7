"""Fleet files and cluster objects -> the one cluster model, `meshplan.topology.Topology`.

The planner, placement and the autoscaler all read a `Topology` (NVLink domains
inside network blocks, free GPUs per node); this module only builds one from a
fleet file or from Node/Pod objects, with the same `meshplan.topology`
functions the operator uses on the live cluster, so a fleet file, a cluster
read through a kubeconfig and the controller agree on what a domain and a block
are. How many replicas fit is `Topology.replica_slots` (the rules placement
follows, in closed form).

Fleet files (`operator/meshplan/fleets/*.yaml`, loaded by name or path) are the
dev-cluster's format, a list of node groups:

    name: hgx-h100
    nodeGroups:
      - namePrefix: hgx-h100      # nodes hgx-h100-0 .. hgx-h100-3
        count: 4
        gpusPerNode: 8
        product: NVIDIA-H100-80GB-HBM3   # nvidia.com/gpu.product (or a catalogue name)
        memoryMiB: 81559
        zone: zone-a
        clique: <uuid>.<id>       # optional: nodes sharing it form one multi-node NVLink domain
        rdma: {rdma/ib: 8}        # optional: RDMA resources each node advertises (allocatable)
        usedGpus: 2               # optional (planner only): GPUs already taken on EVERY node of the group
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshplan.topology import NetworkConfig, Topology


def fleet_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    node_selector: Mapping[str, str] | None = None,
    name: str = "",
    ready_if_unknown: bool = False,
    network: NetworkConfig | None = None,
) -> Topology:
    """The topology of Node and Pod objects (dicts), keeping only nodes that match `node_selector`."""
    from meshplan import topology

    sel = dict(node_selector or {})
    chosen = [n for n in nodes
              if all(((n.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in sel.items())]
    return topology.build_topology(chosen, pods, ready_if_unknown=ready_if_unknown, network=network, name=name)


def load_fleet(name_or_path: str, *, node_selector: Mapping[str, str] | None = None,
               network: NetworkConfig | None = None) -> Topology:
    """A fleet file by built-in name (`hgx-h100`, `gb200-nvl72`, `mixed`) or YAML path, all GPUs free
    except a node group's optional `usedGpus`."""
    from meshplan.devcluster import fleets

    spec = fleets.load_fleet(name_or_path)
    nodes = fleets.fleet_nodes(spec)
    used_by_prefix = {g["namePrefix"]: int(g.get("usedGpus") or 0) for g in spec["nodeGroups"]}
    pods = []
    for g in spec["nodeGroups"]:
        used = used_by_prefix[g["namePrefix"]]
        if used <= 0:
            continue
        for i in range(int(g["count"])):
            pods.append({"spec": {"nodeName": f"{g['namePrefix']}-{i}",
                                  "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(used)}}}]},
                         "status": {"phase": "Running"}})
    return fleet_from_objects(nodes, pods, node_selector=node_selector, name=spec.get("name", name_or_path),
                              ready_if_unknown=True, network=network)


__all__ = ["fleet_from_objects", "load_fleet"]
