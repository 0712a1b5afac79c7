"""What the planner needs to know about free GPU capacity: products and NVLink domains.

A `Fleet` is a list of NVLink domains, each with its GPU product, GPUs per
node, free GPUs and zone. It is built from the same `meshplan.topology`
functions the operator uses on live Node/Pod objects, so a fleet file, a
cluster read through a kubeconfig and the controller all agree on what a
domain is (a `nvidia.com/gpu.clique`, else a node; PCIe-only nodes are
domains whose GPUs talk over PCIe).

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
        usedGpus: 2               # optional (planner only): GPUs already taken on EVERY node of the group

How many replicas fit: the same rules, in closed form, as `meshplan.placement`
(which places them; a property test checks the two agree):
- pods: a stage (`tp * ep` GPUs, one TP/EP group) is `pods_per_stage` pods of
  `g` GPUs, `g` the largest divisor of the stage that fits one node
  (`placement.gpus_per_pod_for`); a node offers `floor(free / g)` pods;
- a stage sits inside one NVLink domain: a domain offers
  `floor(pods / pods_per_stage)` stages;
- a replica of one stage, or any replica when some domain is big enough (by its
  total GPUs) to hold a whole replica, sits in one domain:
  `sum over domains of floor(stages / pp)`;
- otherwise its stages may spread over the domains of one zone:
  `sum over zones of floor(stages in the zone / pp)`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FleetDomain:
    name: str
    product: str                 # nvidia.com/gpu.product as the node reports it
    gpu: str | None              # catalogue GPU name (None when the catalogue does not know the product)
    gpus_per_node: int
    free_gpus: int
    total_gpus: int
    zone: str = ""
    nvlink: bool = True
    node_free_gpus: tuple[int, ...] = ()     # per node (empty: treated as one node of free_gpus)
    node_total_gpus: tuple[int, ...] = ()
    max_group: int = 0                       # largest TP/EP group (stage) here; 0 = no limit (1 on MIG/shared)

    def stage_fits(self, stage_gpus: int, pp: int = 1) -> bool:
        """Whether a replica of `pp` stages of `stage_gpus` may use this domain (MIG slices and shared GPUs
        take 1-GPU replicas only: no TP, EP or PP across them)."""
        return not self.max_group or stage_gpus * pp <= self.max_group

    def pods(self, g: int, *, total: bool = False) -> int:
        """Pods of `g` GPUs the domain's nodes offer (free, or all GPUs with `total`)."""
        per_node = (self.node_total_gpus if total else self.node_free_gpus) or (
            (self.total_gpus if total else self.free_gpus),)
        return sum(n // g for n in per_node)


@dataclass(frozen=True)
class Fleet:
    domains: tuple[FleetDomain, ...] = ()
    name: str = ""
    # What the nodes' labels said: per node, an unknown product named with its label
    # (`NodeInfo.unknown`), and notes where the labels changed the catalogue's view (memory, MIG, sharing).
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    gpu_notes: tuple[tuple[str, str], ...] = ()   # (GPU name, note) for the notes that explain a derived GPU

    def notes_for(self, gpu: str) -> tuple[str, ...]:
        return tuple(n for g, n in self.gpu_notes if g == gpu)

    @property
    def free_gpus(self) -> int:
        return sum(d.free_gpus for d in self.domains)

    def gpus(self) -> tuple[str, ...]:
        """Catalogue GPU names with free GPUs, most free GPUs first."""
        free: dict[str, int] = defaultdict(int)
        for d in self.domains:
            if d.gpu and d.free_gpus > 0:
                free[d.gpu] += d.free_gpus
        return tuple(sorted(free, key=lambda g: (-free[g], g)))

    def unknown_products(self) -> tuple[str, ...]:
        return tuple(sorted({d.product for d in self.domains if d.gpu is None}))

    def for_gpu(self, gpu: str) -> "Fleet":
        """The domains of one catalogue GPU."""
        return Fleet(tuple(d for d in self.domains if d.gpu == gpu), self.name, self.unknown, self.notes,
                     self.gpu_notes)

    def largest_free_domain(self) -> FleetDomain | None:
        return max(self.domains, key=lambda d: (d.free_gpus, d.name), default=None)

    def gpus_per_pod(self, stage_gpus: int) -> int:
        from meshplan.placement import gpus_per_pod_for

        per_node = max((d.gpus_per_node for d in self.domains), default=1)
        return gpus_per_pod_for(stage_gpus, max(1, per_node))

    def replica_slots(self, stage_gpus: int, pp: int, *, cross_domain: bool = False) -> int:
        """How many replicas of `pp` stages of `stage_gpus` GPUs fit the free GPUs (see module doc).

        `cross_domain=True` lets a stage span the domains of one zone (over the NIC).
        """
        if cross_domain:
            free: dict[str, int] = defaultdict(int)
            for d in self.domains:
                if d.stage_fits(stage_gpus, pp):
                    free[d.zone] += d.free_gpus
            return sum((f // stage_gpus) // pp for f in free.values())
        g = self.gpus_per_pod(stage_gpus)
        per_stage = stage_gpus // g
        stages = {d.name: d.pods(g) // per_stage if d.stage_fits(stage_gpus, pp) else 0 for d in self.domains}
        single = pp == 1 or any(d.pods(g, total=True) >= per_stage * pp for d in self.domains
                                if d.stage_fits(stage_gpus, pp))
        if single:
            return sum(n // pp for n in stages.values())
        by_zone: dict[str, int] = defaultdict(int)
        for d in self.domains:
            by_zone[d.zone] += stages[d.name]
        return sum(n // pp for n in by_zone.values())

    def why_no_room(self, stage_gpus: int, pp: int) -> str:
        """Why not even one replica fits, with the numbers."""
        big = self.largest_free_domain()
        if big is None:
            return "the fleet has no GPUs of this product"
        if stage_gpus * pp > 1 and not any(d.stage_fits(stage_gpus, pp) for d in self.domains):
            return (f"a replica needs {stage_gpus * pp} GPUs working together, but these GPUs are MIG slices or "
                    f"time-sliced replicas ({big.gpu}), never part of a multi-GPU group")
        if big.free_gpus < stage_gpus:
            return (f"a pipeline stage needs {stage_gpus} GPUs in one NVLink domain, but the largest free domain "
                    f"({big.name}) has {big.free_gpus} free GPUs")
        g = self.gpus_per_pod(stage_gpus)
        per_stage = stage_gpus // g
        if not any(d.pods(g) >= per_stage for d in self.domains):
            return (f"a pipeline stage needs {per_stage} pod(s) of {g} GPUs on the nodes of one NVLink domain; "
                    f"free GPUs are too scattered over nodes (largest free domain {big.name}: {big.free_gpus})")
        if pp == 1 or any(d.pods(g, total=True) >= per_stage * pp for d in self.domains):
            return (f"a replica of {pp * stage_gpus} GPUs must sit in one NVLink domain (one is big enough), but "
                    f"the largest free domain ({big.name}) has {big.free_gpus} free GPUs")
        by_zone: dict[str, int] = defaultdict(int)
        for d in self.domains:
            by_zone[d.zone] += d.pods(g) // per_stage
        best_zone = max(by_zone, key=lambda z: by_zone[z])
        return (f"a replica needs {pp} stages of {stage_gpus} GPUs in one zone, but zone {best_zone or '(none)'} "
                f"has room for {by_zone[best_zone]} such stages")


def fleet_from_topology(topology: Any, name: str = "") -> Fleet:
    """A `Fleet` from a `meshplan.topology.Topology` (its domains, free GPUs included). A domain's `gpu` is
    the one `meshplan.topology` resolved from its nodes' labels (catalogue entry, memory label, MIG, sharing)."""
    nodes = topology.nodes
    infos = [s.info for s in nodes.values()]
    unknown = tuple(i.unknown for i in infos if i.unknown)
    by_note: dict[str, list[str]] = defaultdict(list)
    gpu_notes: dict[tuple[str, str], None] = {}
    for i in infos:
        for n in i.notes:
            by_note[n].append(i.name)
            if i.gpu:
                gpu_notes[(i.gpu, n)] = None
    notes = tuple(f"node {ns[0]}: {n}" if len(ns) == 1 else
                  f"{len(ns)} nodes ({', '.join(ns[:3])}{', ...' if len(ns) > 3 else ''}): {n}"
                  for n, ns in by_note.items())
    return Fleet(tuple(
        FleetDomain(name=d.name, product=d.product, gpu=d.gpu, gpus_per_node=d.gpus_per_node,
                    free_gpus=d.free_gpus, total_gpus=d.total_gpus, zone=d.zone, nvlink=d.nvlink,
                    node_free_gpus=tuple(nodes[n].free_gpus for n in d.nodes if n in nodes),
                    node_total_gpus=tuple(nodes[n].info.gpus for n in d.nodes if n in nodes),
                    max_group=1 if d.max_group_gpus == 1 and d.total_gpus > 1 else 0)
        for d in topology.domains
    ), name, unknown, notes, tuple(gpu_notes))


def fleet_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    node_selector: Mapping[str, str] | None = None,
    name: str = "",
    ready_if_unknown: bool = False,
) -> Fleet:
    """A `Fleet` from Node and Pod objects (dicts), keeping only nodes that match `node_selector`."""
    from meshplan import topology

    sel = dict(node_selector or {})
    chosen = [n for n in nodes
              if all(((n.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in sel.items())]
    topo = topology.build_topology(chosen, pods, ready_if_unknown=ready_if_unknown)
    return fleet_from_topology(topo, name)


def load_fleet(name_or_path: str, *, node_selector: Mapping[str, str] | None = None) -> Fleet:
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
                              ready_if_unknown=True)


__all__ = ["Fleet", "FleetDomain", "fleet_from_topology", "fleet_from_objects", "load_fleet"]
