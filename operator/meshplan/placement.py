"""Placement: a plan's replicas -> pods pinned to NVLink domains, all-or-nothing.

Pure: `place(request, topology, existing)` reads only its arguments.

Shape of one replica (a DP replica = one pod group)
    stages (PP) x pods_per_stage pods, each pod `gpus_per_pod` GPUs on one node.
    A stage is one TP x EP group: `pods_per_stage * gpus_per_pod` GPUs.
`request_for_layout` derives this from a `Layout` and the GPUs per node:
`gpus_per_pod` is the largest divisor of the stage size that fits one node, so
a TP8 stage on 8-GPU nodes is one pod, a TP16 stage on 4-GPU GB200 trays is
four pods and a TP2 stage on 8-GPU nodes is one pod of 2 GPUs.

Rules (docs/architecture.md, "Placement rule")
1. A stage never crosses an NVLink domain (see `meshplan.topology` for what a
   domain is; PCIe nodes are domains without NVLink), unless it is larger than
   every eligible domain (wide expert parallelism, e.g. DeepSeek-R1 at EP16 on
   8-GPU HGX nodes; `PlacementRequest.span_blocks`, default on): then its pods
   spread over the FEWEST domains of ONE network block (domains whose nodes share
   an RDMA fabric, `Topology.blocks`), whole pods per node, never over a domain
   without RDMA, and every stage of the replica in that same block.
2. Single-domain replicas: when some eligible domain is big enough (by its total
   GPUs) to hold a whole replica, every replica must sit in one domain
   (`single_domain=None`, the default; `True` forces it, `False` lets stages
   spread even then). A replica that has to wait for capacity in one domain
   waits rather than spilling its pipeline over the slower network.
3. Otherwise stages may sit in different domains of ONE zone, never across zones.
4. All-or-nothing: a replica gets all its pods or none, and the result says why
   (needed vs free GPUs per domain).

Algorithm
- Eligible nodes: schedulable (the topology already dropped the others), the
  requested product, matching the node selector.
- Stable first: each existing replica (index -> node per pod, in rank order) that
  is still valid (right pod count, eligible nodes, stage/zone/domain rules hold,
  capacity left) keeps its nodes and reserves them before anything new is placed.
  The topology must not count the deployment's own pods as used (build it with
  `ignore_pod`), or kept replicas would be charged twice.
- New replicas, in index order, best-fit: among domains where the replica fits,
  the one with the fewest free GPUs left afterwards (ties: domain name). Inside a
  domain each pod goes to the node with the fewest free GPUs that still fits it,
  which packs a group onto few nodes and keeps whole nodes free. Best-fit, not
  first-fit, so a small group does not break up the only domain a large group
  could use (the fragmentation case in tests/test_placement.py).
- Spanning replicas (rule 3): per zone, each stage goes best-fit to a domain of
  that zone on a scratch copy of the capacity; the zone that leaves the fewest
  free GPUs wins. Nothing is committed unless every stage found a place.
- Wide stages (rule 1's exception): per network block, on a scratch copy, each
  stage takes the domains with the most free pod slots first (so the group
  touches the fewest domains; ties: fewest free GPUs, then name), best-fit
  nodes inside each. The block where the replica touches the fewest domains
  wins (then the fewest free GPUs left, then the name). A kept replica stays
  valid while all its domains are in one block.

Prefill/decode disaggregation (`place_disagg`)
- A serving unit is the decode groups and the prefill groups that feed them (the
  plan's P:D ratio). Each unit sits inside the scope its KV path needs: one NVLink
  domain, one network block (RDMA), or anywhere (TCP); each group inside it follows
  the rules above, and a unit is all-or-nothing as a whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from meshplan.planner.types import Layout
from meshplan.topology import Domain, Topology, gpus_per_pod_for


@dataclass(frozen=True)
class PlacementRequest:
    replicas: int
    gpus_per_pod: int
    pods_per_stage: int = 1
    stages: int = 1
    single_domain: bool | None = None          # None: required when some domain could hold a replica
    product: str | None = None                 # nvidia.com/gpu.product the plan was sized for
    node_selector: tuple[tuple[str, str], ...] = ()
    # a stage larger than every eligible domain may spread over the domains of one network block (wide EP)
    span_blocks: bool = True

    def __post_init__(self) -> None:
        for name in ("gpus_per_pod", "pods_per_stage", "stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"placement request {name} must be >= 1, got {getattr(self, name)}")
        if self.replicas < 0:
            raise ValueError(f"placement request replicas must be >= 0, got {self.replicas}")

    @property
    def gpus_per_stage(self) -> int:
        return self.gpus_per_pod * self.pods_per_stage

    @property
    def pods_per_replica(self) -> int:
        return self.pods_per_stage * self.stages

    @property
    def gpus_per_replica(self) -> int:
        return self.gpus_per_stage * self.stages


def request_for_layout(
    layout: Layout,
    gpus_per_node: int,
    replicas: int | None = None,
    product: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    single_domain: bool | None = None,
) -> PlacementRequest:
    """The placement request for `layout` on nodes with `gpus_per_node` GPUs."""
    g = gpus_per_pod_for(layout.gpus_per_stage, gpus_per_node)
    return PlacementRequest(
        replicas=layout.dp if replicas is None else replicas,
        gpus_per_pod=g,
        pods_per_stage=layout.gpus_per_stage // g,
        stages=layout.pp,
        single_domain=single_domain,
        product=product,
        node_selector=tuple(sorted((node_selector or {}).items())),
    )


@dataclass(frozen=True)
class PodAssignment:
    rank: int          # 0 = leader; ranks run stage by stage
    stage: int
    node: str
    domain: str


@dataclass(frozen=True)
class ReplicaPlacement:
    index: int
    pods: tuple[PodAssignment, ...]
    zone: str
    kept: bool = False                 # True when an existing placement was kept
    block: str = ""                    # the network block of a replica whose stages span domains ('' otherwise)

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.domain for p in self.pods))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.pods)

    @property
    def single_domain(self) -> bool:
        return len(self.domains) == 1


@dataclass(frozen=True)
class UnplacedReplica:
    index: int
    reason: str
    needed_gpus: int
    gpus_per_stage: int
    free_gpus_by_domain: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class PlacementResult:
    request: PlacementRequest
    placed: tuple[ReplicaPlacement, ...] = ()
    unplaced: tuple[UnplacedReplica, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.unplaced

    def replica(self, index: int) -> ReplicaPlacement | None:
        for r in self.placed:
            if r.index == index:
                return r
        return None

    def usage(self) -> list[tuple[str, int]]:
        """(node, GPUs) pairs this placement takes (for Topology.with_usage)."""
        g = self.request.gpus_per_pod
        return [(p.node, g) for r in self.placed for p in r.pods]

    def message(self) -> str:
        if self.ok:
            return f"placed {len(self.placed)} replica(s)"
        return "; ".join(u.reason for u in self.unplaced)


# ----------------------------------------------------------------------------- internals


def _natural(name: str) -> tuple:
    """Sort key that orders `node-2` before `node-10`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class _Capacity:
    """Free GPUs per eligible node, grouped by domain; mutable scratch state."""

    def __init__(self, topology: Topology, req: PlacementRequest):
        self.free: dict[str, int] = {}
        self.domains: dict[str, Domain] = {}
        self.domain_nodes: dict[str, list[str]] = {}
        self.node_domain: dict[str, str] = {}
        # `select` gives the matching nodes regrouped into domains exactly as a topology of only
        # those nodes would (and is memoised: the controller has usually selected already).
        topology = topology.select(dict(req.node_selector))
        for d in topology.domains:
            if req.product and d.product != req.product:
                continue
            if req.gpus_per_replica > 1 and d.max_group_gpus == 1 and d.total_gpus > 1:
                continue                     # MIG slices / time-sliced GPUs: never part of a multi-GPU group
            members = list(d.nodes)
            if not members:
                continue
            self.domains[d.name] = d
            self.domain_nodes[d.name] = members
            for n in members:
                self.free[n] = topology.nodes[n].free_gpus
                self.node_domain[n] = d.name
        self.total: dict[str, int] = {n: topology.nodes[n].info.gpus for n in self.free}

    def copy(self) -> "_Capacity":
        c = object.__new__(_Capacity)
        c.free = dict(self.free)
        c.domains, c.domain_nodes, c.node_domain, c.total = (
            self.domains, self.domain_nodes, self.node_domain, self.total)
        return c

    def slots(self, domain: str, g: int) -> int:
        return sum(self.free[n] // g for n in self.domain_nodes[domain])

    def max_slots(self, domain: str, g: int) -> int:
        return sum(self.total[n] // g for n in self.domain_nodes[domain])

    def domain_free(self, domain: str) -> int:
        return sum(self.free[n] for n in self.domain_nodes[domain])

    def take(self, domain: str, g: int, count: int) -> list[str]:
        """Best-fit `count` pods of `g` GPUs onto the domain's nodes (caller checked slots)."""
        out = []
        for _ in range(count):
            node = min((n for n in self.domain_nodes[domain] if self.free[n] >= g),
                       key=lambda n: (self.free[n], _natural(n)))
            self.free[node] -= g
            out.append(node)
        return out


def _wide(req: PlacementRequest, cap: _Capacity) -> bool:
    """Whether a stage is larger than every eligible domain (and may span domains of one block)."""
    g = req.gpus_per_pod
    return bool(cap.domains) and all(cap.max_slots(d, g) < req.pods_per_stage for d in cap.domains)


def _needs_single_domain(req: PlacementRequest, cap: _Capacity) -> bool:
    if _wide(req, cap):
        return False
    if req.single_domain is not None:
        return req.single_domain
    if req.stages == 1:
        return True
    return any(cap.max_slots(d, req.gpus_per_pod) >= req.pods_per_replica for d in cap.domains)


def _assignments(req: PlacementRequest, nodes: Sequence[str], cap: _Capacity) -> tuple[PodAssignment, ...]:
    return tuple(
        PodAssignment(rank=i, stage=i // req.pods_per_stage, node=n, domain=cap.node_domain[n])
        for i, n in enumerate(nodes)
    )


def _keep(req: PlacementRequest, nodes: Sequence[str], cap: _Capacity, single: bool) -> str:
    """Why an existing placement cannot be kept ('' when it can); reserves on success."""
    if len(nodes) != req.pods_per_replica:
        return f"has {len(nodes)} pods, the plan needs {req.pods_per_replica}"
    missing = [n for n in nodes if n not in cap.free]
    if missing:
        return f"node(s) {', '.join(sorted(set(missing)))} no longer eligible"
    doms = [cap.node_domain[n] for n in nodes]
    wide = _wide(req, cap)
    if wide:
        blocks = {cap.domains[d].block for d in doms}
        if not req.span_blocks:
            return "a stage spans NVLink domains (span_blocks is off)"
        if "" in blocks or len(blocks) > 1:
            return (f"a wide stage must sit in one network block; its domains are in "
                    f"{sorted(b or '(no RDMA)' for b in blocks)}")
    for s in range(req.stages):
        stage = doms[s * req.pods_per_stage:(s + 1) * req.pods_per_stage]
        if len(set(stage)) > 1 and not wide:
            return f"stage {s} spans NVLink domains {sorted(set(stage))}"
    if single and len(set(doms)) > 1:
        return "replica must sit in one NVLink domain"
    if not wide and len({cap.domains[d].zone for d in doms}) > 1:
        return "replica spans zones"
    trial = dict(cap.free)
    for n in nodes:
        trial[n] -= req.gpus_per_pod
        if trial[n] < 0:
            return f"node {n} has no room left for its pod"
    cap.free = trial
    return ""


def _place_single(req: PlacementRequest, cap: _Capacity) -> list[str] | None:
    g, n = req.gpus_per_pod, req.pods_per_replica
    fits = [d for d in cap.domains if cap.slots(d, g) >= n]
    if not fits:
        return None
    best = min(fits, key=lambda d: (cap.domain_free(d) - req.gpus_per_replica, d))
    return cap.take(best, g, n)


def _place_spanning(req: PlacementRequest, cap: _Capacity) -> tuple[list[str], _Capacity] | None:
    g = req.gpus_per_pod
    best: tuple[int, str, list[str], _Capacity] | None = None
    for zone in sorted({d.zone for d in cap.domains.values()}):
        trial = cap.copy()
        zone_domains = [d for d, dom in cap.domains.items() if dom.zone == zone]
        nodes: list[str] = []
        for _ in range(req.stages):
            fits = [d for d in zone_domains if trial.slots(d, g) >= req.pods_per_stage]
            if not fits:
                break
            d = min(fits, key=lambda d: (trial.domain_free(d) - req.gpus_per_stage, d))
            nodes += trial.take(d, g, req.pods_per_stage)
        else:
            left = sum(trial.domain_free(d) for d in zone_domains)
            if best is None or (left, zone) < (best[0], best[1]):
                best = (left, zone, nodes, trial)
    if best is None:
        return None
    return best[2], best[3]


def _place_wide(req: PlacementRequest, cap: _Capacity) -> tuple[list[str], _Capacity, str] | None:
    """A replica whose stages are larger than every domain: each stage over the fewest domains of one block."""
    g = req.gpus_per_pod
    best: tuple[tuple, list[str], _Capacity, str] | None = None
    blocks = sorted({dom.block for dom in cap.domains.values() if dom.block})
    for block in blocks:
        trial = cap.copy()
        members = [d for d, dom in cap.domains.items() if dom.block == block]
        nodes: list[str] = []
        used: set[str] = set()
        ok = True
        for _ in range(req.stages):
            need = req.pods_per_stage
            while need:
                open_ = [d for d in members if trial.slots(d, g) > 0]
                if not open_:
                    ok = False
                    break
                # the most free pod slots first: the fewest domains per stage; ties: fewer free GPUs, name
                d = min(open_, key=lambda d: (-min(trial.slots(d, g), need), trial.domain_free(d), d))
                take = min(trial.slots(d, g), need)
                nodes += trial.take(d, g, take)
                used.add(d)
                need -= take
            if not ok:
                break
        if not ok:
            continue
        key = (len(used), sum(trial.domain_free(d) for d in members), block)
        if best is None or key < best[0]:
            best = (key, nodes, trial, block)
    if best is None:
        return None
    return best[1], best[2], best[3]


def _unplaced(index: int, req: PlacementRequest, cap: _Capacity, single: bool) -> UnplacedReplica:
    free = tuple(sorted(((d, cap.domain_free(d)) for d in cap.domains), key=lambda x: (-x[1], x[0])))
    if not cap.domains:
        sel = dict(req.node_selector)
        what = f"product {req.product}" if req.product else "GPUs"
        return UnplacedReplica(
            index, f"replica {index}: no schedulable nodes with {what}"
            + (f" matching node selector {sel}" if sel else ""),
            req.gpus_per_replica, req.gpus_per_stage, free)
    g = req.gpus_per_pod
    largest = max(cap.max_slots(d, g) for d in cap.domains) * g
    shown = ", ".join(f"{d}={f}" for d, f in free[:6]) + (f" (+{len(free) - 6} more)" if len(free) > 6 else "")
    blocks: dict[str, int] = {}
    for d, dom in cap.domains.items():
        if dom.block:
            blocks[dom.block] = blocks.get(dom.block, 0) + cap.slots(d, g) * g
    if req.gpus_per_stage > largest and req.span_blocks and blocks:
        shown_b = ", ".join(f"{b}={f}" for b, f in sorted(blocks.items(), key=lambda x: (-x[1], x[0]))[:6])
        why = (f"needs {req.stages} stage(s) of {req.pods_per_stage} pod(s) x {g} GPUs spread over the NVLink "
               f"domains of one network block (a stage is larger than any domain, {largest} GPUs); free GPUs "
               f"per block: {shown_b}")
    elif req.gpus_per_stage > largest and req.span_blocks:
        why = (f"a stage needs {req.gpus_per_stage} GPUs in one NVLink domain but the largest eligible "
               f"domain holds {largest}; use a smaller TP x EP or GPUs with a larger NVLink domain (a stage "
               f"spans domains only inside a network block, and no eligible node advertises an RDMA resource: "
               f"chart value network.rdmaResources)")
    elif req.gpus_per_stage > largest:
        why = (f"a stage needs {req.gpus_per_stage} GPUs in one NVLink domain but the largest eligible "
               f"domain holds {largest}; use a smaller TP x EP or GPUs with a larger NVLink domain")
    elif single:
        why = (f"needs {req.pods_per_replica} pod(s) x {g} GPUs = {req.gpus_per_replica} GPUs in one "
               f"NVLink domain; free GPUs per domain: {shown}")
    else:
        why = (f"needs {req.stages} stage(s) of {req.pods_per_stage} pod(s) x {g} GPUs, each stage in one "
               f"NVLink domain and all in one zone; free GPUs per domain: {shown}")
    return UnplacedReplica(index, f"replica {index} {why}", req.gpus_per_replica, req.gpus_per_stage, free)


def place(
    request: PlacementRequest,
    topology: Topology,
    existing: Mapping[int, Sequence[str]] | None = None,
) -> PlacementResult:
    """Place `request.replicas` replicas; keep valid `existing` ones (index -> nodes by rank)."""
    cap = _Capacity(topology, request)
    single = _needs_single_domain(request, cap)
    wide = _wide(request, cap)
    placed: dict[int, ReplicaPlacement] = {}
    notes: list[str] = []
    for index in sorted(existing or {}):
        if index >= request.replicas:
            continue
        nodes = list((existing or {})[index])
        why = _keep(request, nodes, cap, single)
        if why:
            notes.append(f"replica {index} moves: {why}")
            continue
        asg = _assignments(request, nodes, cap)
        placed[index] = ReplicaPlacement(index, asg, cap.domains[asg[0].domain].zone, kept=True,
                                         block=cap.domains[asg[0].domain].block if wide else "")

    unplaced: list[UnplacedReplica] = []
    for index in range(request.replicas):
        if index in placed:
            continue
        block = ""
        if wide:
            got = _place_wide(request, cap) if request.span_blocks else None
            if got is None:
                unplaced.append(_unplaced(index, request, cap, single))
                continue
            nodes, cap, block = got
            asg = _assignments(request, nodes, cap)
            placed[index] = ReplicaPlacement(index, asg, cap.domains[asg[0].domain].zone, block=block)
            continue
        nodes = _place_single(request, cap)
        if nodes is None and not single:
            spanning = _place_spanning(request, cap)
            if spanning is not None:
                nodes, cap = spanning
        if nodes is None:
            unplaced.append(_unplaced(index, request, cap, single))
            continue
        asg = _assignments(request, nodes, cap)
        placed[index] = ReplicaPlacement(index, asg, cap.domains[asg[0].domain].zone)
    return PlacementResult(
        request=request,
        placed=tuple(placed[i] for i in sorted(placed)),
        unplaced=tuple(unplaced),
        notes=tuple(notes),
    )


# ----------------------------------------------------------------------------- priority between deployments


@dataclass(frozen=True)
class Claim:
    """Replicas a deployment waits to place (`request.replicas` of them) and its rank (lower first)."""

    owner: str                      # "namespace/name"
    rank: tuple
    request: PlacementRequest


def incumbency_rank(serving_since: str | None, created: str | None, owner: str) -> tuple:
    """The placement priority of a deployment, lower first, total and stable.

    A deployment that has served (`status.servingSince`, set once when its first replica was
    ready, kept afterwards) ranks before every one that never has, the earlier first; the others
    rank by creation time (first come, first placed); the name breaks ties. So a deployment
    that lost its groups to a topology change (a relabelled domain, a node that came back) gets
    the capacity back before a newcomer that was waiting for it.
    """
    return (0, serving_since, owner) if serving_since else (1, created or "", owner)


def held_for_claims(topology: Topology, claims: Sequence[Claim], rank: tuple,
                    own_usage: Sequence[tuple[str, int]] = ()) -> tuple[list[tuple[str, int]], list[str]]:
    """GPUs to leave free for the claims that rank before `rank`: (node, GPUs) pairs, owners holding some.

    Pure. The claims are placed in rank order on `topology` (the asking deployment's view: its own
    pods left out) with `own_usage` (its own pods) charged, so a claim never takes GPUs the asking
    deployment runs on: incumbency decides who gets free capacity, it never preempts a running
    group. A claim that does not fit holds nothing.
    """
    topo = topology.with_usage(own_usage) if own_usage else topology
    held: list[tuple[str, int]] = []
    owners: list[str] = []
    for c in sorted((c for c in claims if c.rank < rank and c.request.replicas > 0), key=lambda c: c.rank):
        got = place(c.request, topo)
        if got.placed:
            usage = got.usage()
            topo = topo.with_usage(usage)
            held += usage
            owners.append(c.owner)
    return held, owners


# ----------------------------------------------------------------------------- prefill/decode disaggregation


KV_TIERS = ("nvlink", "ib", "roce", "efa", "rdma", "tcp")      # planner.types.KvPath.tier, and "rdma" for any fabric


@dataclass(frozen=True)
class DisaggUnit:
    """One serving unit of a disaggregated deployment: the decode groups and the prefill groups that feed them
    (the plan's P:D ratio), and where they sit: one NVLink domain (`tier` nvlink), one network block (rdma) or
    anywhere (tcp). `prefill`/`decode`: the role-wide replica indices of its groups."""

    index: int
    tier: str
    scope: str                     # the domain or block name ('' for tcp)
    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    kept: bool = False             # every group of the unit kept its nodes


@dataclass(frozen=True)
class DisaggPlacement:
    """Both roles' placements (each a `PlacementResult` over the role's whole request) and the units."""

    prefill: PlacementResult
    decode: PlacementResult
    units: tuple[DisaggUnit, ...] = ()
    unplaced_units: tuple[tuple[int, str], ...] = ()     # (unit, why)
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.unplaced_units

    def usage(self) -> list[tuple[str, int]]:
        return self.prefill.usage() + self.decode.usage()

    def message(self) -> str:
        if self.ok:
            return (f"placed {len(self.units)} unit(s): {len(self.prefill.placed)} prefill and "
                    f"{len(self.decode.placed)} decode group(s)")
        return "; ".join(why for _, why in self.unplaced_units)


def _scoped(topology: Topology, domains: Sequence[str]) -> Topology:
    """The topology limited to `domains` (whole domains: no regrouping), usage kept."""
    keep = set(domains)
    ds = tuple(d for d in topology.domains if d.name in keep)
    nodes = {n: topology.nodes[n] for d in ds for n in d.nodes}
    return Topology(nodes=nodes, domains=ds, excluded=topology.excluded, name=topology.name,
                    network=topology.network)


def _scopes(topology: Topology, tier: str, products: set[str | None]) -> list[tuple[str, list[str]]]:
    """(scope name, its domains) a unit may use for `tier`."""
    eligible = [d for d in topology.domains if None in products or d.product in products]
    if tier == "nvlink":
        return [(d.name, [d.name]) for d in sorted(eligible, key=lambda d: _natural(d.name))]
    if tier == "rdma":
        by: dict[str, list[str]] = {}
        for d in eligible:
            if d.block:
                by.setdefault(d.block, []).append(d.name)
        return sorted(by.items())
    return [("", [d.name for d in eligible])]


def _shift(result: PlacementResult, base: int) -> list[ReplicaPlacement]:
    return [replace(r, index=r.index + base) for r in result.placed]


def place_disagg(
    prefill: PlacementRequest,
    decode: PlacementRequest,
    topology: Topology,
    *,
    ratio: tuple[int, int],
    tier: str,
    existing_prefill: Mapping[int, Sequence[str]] | None = None,
    existing_decode: Mapping[int, Sequence[str]] | None = None,
) -> DisaggPlacement:
    """Place a disaggregated deployment's prefill and decode groups as units (pure; issue 19, Build 3).

    `ratio` (rp, rd): prefill groups per `rd` decode groups in one unit (the plan's P:D ratio); the roles'
    `replicas` are k whole units (k x rp and k x rd, k >= 0) plus, when per-role autoscaling leaves them off
    whole units, one last partial unit k holding the rest of each role (fewer than rp prefill and/or fewer than
    rd decode groups, at least one group), placed by the same rules (one scope, all-or-nothing). `tier` is the KV path the plan priced
    (`planner.types.KvPath.tier`: "nvlink", an RDMA fabric "ib" | "roce" | "efa" (read as "rdma"), or "tcp"):
    a unit's groups all sit in one NVLink domain (nvlink), in one network block (rdma), or anywhere (tcp), so the
    KV cache never takes a slower path than the plan assumed. Each group follows `place`'s own rules (its stages,
    wide EP, all-or-nothing); a unit is all-or-nothing too: a prefill group without the decode groups it feeds
    (or the other way round) serves nothing, so a unit that does not fit whole takes no GPUs.

    Unit u holds prefill replicas [u*rp, (u+1)*rp) and decode replicas [u*rd, (u+1)*rd). Stable first: a unit
    whose existing groups are all still valid in their scope keeps them; new units go best-fit to the scope that
    leaves the fewest free GPUs (ties: name), decode groups first (the larger, usually)."""
    rp, rd = ratio
    if rp < 1 or rd < 1:
        raise ValueError(f"P:D ratio {rp}:{rd}: both sides must be >= 1")
    if prefill.replicas < 0 or decode.replicas < 0:
        raise ValueError(f"{prefill.replicas} prefill and {decode.replicas} decode group(s): counts must be >= 0")
    if tier not in KV_TIERS:
        raise ValueError(f"KV path tier {tier!r}: use one of {', '.join(KV_TIERS)}")
    kind = "nvlink" if tier == "nvlink" else "tcp" if tier == "tcp" else "rdma"
    whole = min(prefill.replicas // rp, decode.replicas // rd)
    # (prefill groups, decode groups) per unit: the whole units, then the rest as one partial unit
    sizes = [(rp, rd)] * whole
    rest = (prefill.replicas - whole * rp, decode.replicas - whole * rd)
    if rest[0] or rest[1]:
        sizes.append(rest)
    units_n = len(sizes)
    products = {prefill.product, decode.product}
    existing_prefill, existing_decode = existing_prefill or {}, existing_decode or {}
    topo = topology.select(dict(decode.node_selector))
    scopes = _scopes(topo, kind, products)
    placed_p: list[ReplicaPlacement] = []
    placed_d: list[ReplicaPlacement] = []
    units: list[DisaggUnit] = []
    unplaced: list[tuple[int, str]] = []
    notes: list[str] = []

    def held(req: PlacementRequest, ex: Mapping[int, Sequence[str]]) -> list[tuple[str, int]]:
        return [(n, req.gpus_per_pod) for nodes in ex.values() for n in nodes if n]

    def later(u: int) -> list[tuple[str, int]]:
        """GPUs of the kept groups of the units after u: not free for u's new groups (they run there)."""
        return held(decode, {i: n for i, n in existing_decode.items() if i >= (u + 1) * rd}) + \
            held(prefill, {i: n for i, n in existing_prefill.items() if i >= (u + 1) * rp})

    def attempt(u: int, scope: list[str], with_existing: bool):
        sub = _scoped(topo.with_usage(later(u)), scope)
        np_, nd_ = sizes[u]
        ex_d = {i - u * rd: existing_decode[i] for i in range(u * rd, u * rd + nd_) if i in existing_decode}
        ex_p = {i - u * rp: existing_prefill[i] for i in range(u * rp, u * rp + np_) if i in existing_prefill}
        # decode first, beside the unit's kept prefill groups (per-role scaling mixes kept and new groups in a unit)
        d = place(replace(decode, replicas=nd_), sub.with_usage(held(prefill, ex_p)) if with_existing else sub,
                  ex_d if with_existing else None)
        if not d.ok:
            return None
        p = place(replace(prefill, replicas=np_), sub.with_usage(d.usage()), ex_p if with_existing else None)
        if not p.ok:
            return None
        return d, p

    for u in range(units_n):
        np_u, nd_u = sizes[u]
        mine = [n for i in range(u * rd, u * rd + nd_u) for n in existing_decode.get(i, ())] + \
               [n for i in range(u * rp, u * rp + np_u) for n in existing_prefill.get(i, ())]
        home = [s for s in scopes if mine and set(mine) <= {n for d in s[1] for n in topo.domain(d).nodes}]
        got = None
        for name, scope in home:
            got = attempt(u, scope, True)
            if got is not None:
                chosen = name
                break
        if got is None:
            if mine:
                notes.append(f"unit {u} moves: its groups' nodes {sorted(set(mine))} no longer hold the unit in one "
                             f"{'NVLink domain' if kind == 'nvlink' else 'network block' if kind == 'rdma' else 'fleet'}")
            best = None
            for name, scope in scopes:
                r = attempt(u, scope, False)
                if r is None:
                    continue
                left = _scoped(topo, scope).free_gpus - sum(g for _, g in r[0].usage() + r[1].usage())
                if best is None or (left, name) < (best[0], best[1]):
                    best = (left, name, r)
            if best is not None:
                _, chosen, got = best
        if got is None:
            need_d = decode.gpus_per_replica * nd_u
            need_p = prefill.gpus_per_replica * np_u
            where = {"nvlink": "one NVLink domain", "rdma": "one network block", "tcp": "the fleet"}[kind]
            free = ", ".join(f"{n or 'fleet'}={_scoped(topo, s).free_gpus}" for n, s in
                             sorted(scopes, key=lambda x: (-_scoped(topo, x[1]).free_gpus, x[0]))[:6])
            unplaced.append((u, f"unit {u} needs {nd_u} decode group(s) x {decode.gpus_per_replica} GPUs and {np_u} "
                                f"prefill group(s) x {prefill.gpus_per_replica} GPUs = {need_d + need_p} GPUs in {where} "
                                f"(the KV path the plan priced: {tier}); free GPUs: {free or 'none eligible'}"))
            continue
        d, p = got
        topo = topo.with_usage(d.usage() + p.usage())
        placed_d += _shift(d, u * rd)
        placed_p += _shift(p, u * rp)
        kept = all(r.kept for r in d.placed + p.placed)
        units.append(DisaggUnit(u, kind, chosen, tuple(range(u * rp, u * rp + np_u)),
                                tuple(range(u * rd, u * rd + nd_u)), kept))

    def role(req: PlacementRequest, placed: list[ReplicaPlacement], per: int, k: int) -> PlacementResult:
        missing = [UnplacedReplica(i, f"replica {i}: its unit {u} is not placed: {why}", req.gpus_per_replica,
                                   req.gpus_per_stage) for u, why in unplaced
                   for i in range(u * per, u * per + sizes[u][k])]
        return PlacementResult(req, tuple(sorted(placed, key=lambda r: r.index)), tuple(missing))

    return DisaggPlacement(role(prefill, placed_p, rp, 0), role(decode, placed_d, rd, 1), tuple(units),
                           tuple(unplaced), tuple(notes))
