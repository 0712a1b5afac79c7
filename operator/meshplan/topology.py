"""GPU topology from Node and Pod objects: GPUs per node, NVLink domains, free capacity.

Pure functions over plain dicts (Node/Pod objects as the API server returns them,
e.g. `kubectl get nodes -o json`): no kubernetes client, no clock. The controller
keeps `node_info(node)` and `pod_gpu_usage(pod)` results in kopf indexes (one entry
per object, updated by the watch), so nothing is re-listed: it builds the fleet's
topology (`build_topology_from_infos`, nothing used) again only when a NodeInfo
changed, and per reconcile charges the GPUs in use to it (`Topology.with_usage`,
which recomputes only the touched nodes and domains). At 1,000 nodes a full build
costs several milliseconds and a reconcile asks for derived views (`select`) several
times, so those are memoised on the immutable topology.

Where the facts come from
- Node labels set by NVIDIA GPU feature discovery (k8s-device-plugin
  docs/gpu-feature-discovery/README.md): `nvidia.com/gpu.product` (nvidia-smi name,
  spaces as `-`), `nvidia.com/gpu.memory` (MiB per GPU), `nvidia.com/gpu.family`,
  `nvidia.com/gpu.clique` (`<ClusterUUID>.<CliqueID>`: the nodes of one multi-node
  NVLink partition, e.g. one GB200 NVL72 rack).
- GPU count: `status.allocatable["nvidia.com/gpu"]` (the device plugin's resource;
  kube-scheduler's NodeResourcesFit enforces it), not the `gpu.count` label,
  because allocatable already excludes unhealthy GPUs. AMD: `amd.com/gpu`; MIG
  mixed: `nvidia.com/mig-<profile>` (see `gpu_view`).
- What GPU that is (`gpu_view`, `NodeInfo.gpu`): the catalogue entry of the product
  label (AMD: of `amd.com/gpu.device-id`, else `amd.com/gpu.product-name`, from AMD's
  node labeller, `beta.amd.com/...` as fallback), turned into a derived GPU where
  the labels say more: `nvidia.com/gpu.memory` (or `amd.com/gpu.vram`) more than 2%
  off the catalogue -> that memory; MIG (`-MIG-<profile>` product suffix under the
  single strategy, `nvidia.com/mig-*` resources under mixed) -> one slice; time-slicing
  (`-SHARED` suffix, `nvidia.com/gpu.replicas` per GPU) -> 1/n of the GPU. Slices and
  shared GPUs have no NVLink and are never part of a multi-GPU group. A product the
  catalogue does not know gives `gpu=None`; `NodeInfo.unknown` names it with its label.
- Zone: `topology.kubernetes.io/zone` (Kubernetes well-known labels).

Schedulable capacity
A node counts as capacity only when `spec.unschedulable` is not set, its `Ready`
condition is `True` and it carries no `NoSchedule`/`NoExecute` taint that the
caller's tolerations do not tolerate (`PreferNoSchedule` is a preference and is
ignored). By default the common `nvidia.com/gpu` taint is tolerated, and the
rendered pods carry the same toleration (`DEFAULT_TOLERATIONS`). Excluded nodes are
kept in `Topology.excluded` with the reason, so status messages can say why.

Used GPUs
A pod uses GPUs on a node when it is bound there (`spec.nodeName`) and not finished
(phase not Succeeded/Failed); pods being deleted still hold their GPUs. Per pod the
GPU count follows the scheduler's effective-request rule: max(sum over app and
sidecar containers, largest plain init container); per container the
`nvidia.com/gpu` request, or the limit when no request is set (extended resources
default their request to the limit). A pod rendered by meshplan but not yet bound
(held back by its scheduling gate) carries the annotation `ASSIGNED_NODE_ANNOTATION`
and reserves its GPUs on that node, so two deployments planned one after the other
never count the same free GPUs twice. Only the operator's own pods reserve: the
annotation counts on a pod whose controlling ownerReference is an LLMDeployment
(`meshplan.dev/*`, kind `LLMDeployment`), and only where the operator serves the
namespace (`pod_gpu_usage(pod, reservations=False)` elsewhere). Anyone else's pod
with the annotation (issue 17, finding 4: three such pods in another namespace made a
deployment InsufficientCapacity with 24 GPUs free) is usage only once bound.

NVLink domains (the rule placement honours)
- Nodes sharing a `nvidia.com/gpu.clique` value form one domain (multi-node NVLink,
  MNNVL). A clique whose nodes disagree on product or zone is split by both, so
  every domain is homogeneous and inside one zone.
- Any other node is its own domain.
- PCIe-only products (catalogue `nvlink_domain == 1`, e.g. L40S; never decided from
  the product's name) have no NVLink at
  all. Their node is still the domain, with `nvlink=False`: a TP/EP group may span
  the node's GPUs (over PCIe, slower; the planner prices it with the PCIe/NIC
  bandwidth via `nvlink_gpus == 1`) but never crosses nodes. This keeps e.g.
  Mixtral-8x7B at TP2 on two L40S of one node possible, which a literal
  "one GPU per domain" rule would forbid.

Network blocks (the second tier)
- A network block is a set of NVLink domains whose nodes reach each other over a
  scale-out RDMA fabric (InfiniBand, RoCE, EFA): nodes that advertise the same RDMA
  resource (`status.allocatable`, names configurable: `NetworkConfig.rdma_resources`,
  default `rdma/ib`, `rdma/roce*`, `nvidia.com/hostdev`, `vpc.amazonaws.com/efa`)
  and carry the same value of the network-block label (`NetworkConfig.block_label`,
  operator setting `$MESHPLAN_NETWORK_BLOCK_LABEL`, chart value `network.blockLabel`;
  empty: `topology.kubernetes.io/zone`). A node that advertises no RDMA resource is
  in no block (`Domain.block == ""`): its domain talks to others over TCP only, and
  no TP/EP group spans it with another domain.
- Each tier has a bandwidth and a latency (`Tier`, `Domain.tier`, `NetworkBlock.tier`):
  NVLink per GPU generation from `catalog.gpus` (one direction), the block's RDMA
  per GPU from the catalogue's `nic_gb_s` (the NIC NVIDIA pairs with each GPU on its
  HGX/DGX reference board), latencies from NCCL's own tuning model.
- This one `Topology` is what the planner (`Topology.replica_slots`, `gpus`, `for_gpu`),
  placement (`meshplan.placement.place`) and the autoscaler (`autoscale.capacity`) read;
  `meshplan.planner.fleet` only loads fleet files into it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence

GPU_RESOURCE = "nvidia.com/gpu"
AMD_GPU_RESOURCE = "amd.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"          # time-slicing with renameByDefault=true
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
# AMD GPU operator node labeller (ROCm/k8s-device-plugin docs/user-guide/installation.md): current prefix
# `amd.com/gpu.*`, legacy `beta.amd.com/gpu.*` (read when the current one is missing).
LABEL_AMD_PRODUCT = "amd.com/gpu.product-name"
LABEL_AMD_DEVICE_ID = "amd.com/gpu.device-id"
LABEL_AMD_VRAM = "amd.com/gpu.vram"
LABEL_AMD_FAMILY = "amd.com/gpu.family"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY_MIB = "nvidia.com/gpu.memory"
LABEL_FAMILY = "nvidia.com/gpu.family"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"

# Set by meshplan.render on pods it creates: the node placement chose. Lets a gated
# (unbound) pod reserve its GPUs in the topology other deployments see.
ASSIGNED_NODE_ANNOTATION = "meshplan.dev/assigned-node"

# The NVIDIA GPU operator / many clouds taint GPU nodes `nvidia.com/gpu:NoSchedule`
# so only GPU pods land there; meshplan's pods are GPU pods and tolerate it.
DEFAULT_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
)

# ----------------------------------------------------------------------------- network blocks (second tier)

# RDMA resources nodes advertise (status.allocatable) and the fabric each means. Sources:
# - `rdma/ib`, `rdma/roce*`: the k8s-rdma-shared-dev-plugin (github.com/Mellanox/k8s-rdma-shared-dev-plugin,
#   README "resourceName"; the resource prefix is `rdma/`; NVIDIA network-operator docs name them e.g.
#   `rdma/rdma_shared_device_a`, so the names are configurable);
# - `nvidia.com/hostdev`: NVIDIA network-operator's host-device (SR-IOV/PF passthrough) network
#   (network-operator docs, "HostDeviceNetwork"): ConnectX ports, InfiniBand on HGX east-west fabrics;
# - `vpc.amazonaws.com/efa`: the AWS EFA Kubernetes device plugin (aws-efa-k8s-device-plugin README).
# A trailing `*` matches by prefix.
DEFAULT_RDMA_RESOURCES: tuple[tuple[str, str], ...] = (
    ("rdma/ib", "ib"),
    ("rdma/roce*", "roce"),
    ("nvidia.com/hostdev", "ib"),
    ("vpc.amazonaws.com/efa", "efa"),
)
FABRICS = ("ib", "roce", "efa")


@dataclass(frozen=True)
class NetworkConfig:
    """How network blocks are read from the nodes (operator setting / chart value `network`)."""

    block_label: str = ""                       # '' -> topology.kubernetes.io/zone
    rdma_resources: tuple[tuple[str, str], ...] = DEFAULT_RDMA_RESOURCES   # (resource name or prefix*, fabric)
    # Multus NetworkAttachmentDefinitions (`name` or `namespace/name`) the pods that request an RDMA resource
    # attach to (annotation k8s.v1.cni.cncf.io/networks, Multus docs "how to use"); empty: none.
    multus_networks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, fabric in self.rdma_resources:
            if fabric not in FABRICS:
                raise ValueError(f"network.rdmaResources: {name}={fabric}: the fabric must be one of "
                                 f"{', '.join(FABRICS)}")

    @property
    def label(self) -> str:
        return self.block_label or LABEL_ZONE

    def fabric_of(self, resource: str) -> str:
        for name, fabric in self.rdma_resources:
            if resource == name or (name.endswith("*") and resource.startswith(name[:-1])):
                return fabric
        return ""


def network_config_from_env(env: Mapping[str, str]) -> NetworkConfig:
    """`$MESHPLAN_NETWORK_BLOCK_LABEL` and `$MESHPLAN_RDMA_RESOURCES` (`name=fabric,...`, set by the chart's
    `network.blockLabel` / `network.rdmaResources`); unset -> the defaults. A malformed entry raises
    ValueError naming the variable (the operator stops at start rather than plan without blocks)."""
    label = (env.get("MESHPLAN_NETWORK_BLOCK_LABEL") or "").strip()
    raw = (env.get("MESHPLAN_RDMA_RESOURCES") or "").strip()
    multus = tuple(n.strip() for n in (env.get("MESHPLAN_MULTUS_NETWORKS") or "").split(",") if n.strip())
    if not raw:
        return NetworkConfig(label, multus_networks=multus)
    pairs = []
    for item in raw.split(","):
        name, sep, fabric = item.strip().partition("=")
        if not sep or not name.strip():
            raise ValueError(f"MESHPLAN_RDMA_RESOURCES: {item!r} is not name=fabric (e.g. rdma/ib=ib); "
                             f"fabrics: {', '.join(FABRICS)}")
        pairs.append((name.strip(), fabric.strip()))
    return NetworkConfig(label, tuple(pairs), multus)


# The operator's network configuration (read once at start); pure functions take it as an argument.
NETWORK = network_config_from_env(os.environ)


@dataclass(frozen=True)
class Tier:
    """One tier of the cluster's network as the planner prices it."""

    kind: str               # "nvlink" | "pcie" | "ib" | "roce" | "efa" | "tcp"
    gb_s: float             # bandwidth per GPU, one direction, GB/s
    latency_us: float       # per-message latency, µs
    source: str


# Latencies: NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc, `hwLat`, Ring/LL: NVLink 0.47 µs, network
# 2.7 µs); NCCL does not tell IB, RoCE and EFA apart there, neither do we.
NVLINK_LATENCY_US = 0.47
NET_LATENCY_US = 2.7


def nvlink_tier(gpu: str | None) -> Tier:
    """The tier inside one NVLink domain: the catalogue's NVLink per GPU (one direction), or PCIe."""
    try:
        from meshplan.catalog.gpus import get_gpu

        spec = get_gpu(gpu) if gpu else None
    except KeyError:
        spec = None
    if spec is None or spec.nvlink_domain <= 1:
        # PCIe Gen5 x16: 64 GB/s per direction (PCI-SIG PCIe 5.0 spec, 32 GT/s x 16 lanes); the catalogue's NIC
        # figure is what a PCIe-only node's GPUs reach each other at in the planner (perf.py `nvlink_gpus==1`).
        return Tier("pcie", spec.nic_gb_s if spec else 0.0, NET_LATENCY_US,
                    "PCIe: GPUs without NVLink (catalog.gpus nic_gb_s); latency NCCL tuning.cc hwLat NET")
    return Tier("nvlink", spec.nvlink_uni_gb_s, NVLINK_LATENCY_US,
                f"{spec.name}: NVLink {spec.nvlink_gb_s:g} GB/s bidirectional per GPU (catalog.gpus: "
                f"{spec.source[:80]}); latency NCCL tuning.cc hwLat NVLink Ring/LL")


def rdma_tier(fabric: str, gpu: str | None) -> Tier:
    """The tier between the NVLink domains of one network block: one NIC per GPU at the catalogue's `nic_gb_s`
    (HGX H100/H200: ConnectX-7 NDR InfiniBand 400 Gb/s = 50 GB/s per GPU, NVIDIA DGX H100/H200 user guide;
    B300/GB300: ConnectX-8 XDR 800 Gb/s = 100 GB/s; RoCE on Spectrum-X the same 400 GbE per GPU; EFA on AWS
    p5.48xlarge 3,200 Gb/s per 8 GPUs = 400 Gb/s per GPU, AWS EC2 P5 docs)."""
    try:
        from meshplan.catalog.gpus import get_gpu

        nic = get_gpu(gpu).nic_gb_s if gpu else 0.0
    except KeyError:
        nic = 0.0
    if fabric not in FABRICS:
        return Tier("tcp", 0.0, NET_LATENCY_US, "no RDMA resource advertised: TCP sockets only, not planned on")
    return Tier(fabric, nic, NET_LATENCY_US,
                f"{fabric}: {nic * 8:g} Gb/s per GPU (catalog.gpus nic_gb_s for {gpu}); latency NCCL tuning.cc "
                "hwLat NET Ring/LL")


def product_has_nvlink(product: str) -> bool:
    """Whether GPUs of this product (a label value or catalogue/derived name) talk over NVLink inside a
    domain: the catalogue entry's `nvlink_domain > 1`, never a substring of the name. A product the
    catalogue does not know has no NVLink (and is not planned on: `NodeInfo.unknown`)."""
    try:
        from meshplan.catalog.gpus import get_gpu

        return get_gpu(product).nvlink_domain > 1
    except KeyError:
        return False


def parse_count(value: Any) -> int:
    """An integer resource quantity ("8", 8, "8000m") -> int; anything else -> 0."""
    if value is None:
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    s = str(value).strip()
    try:
        if s.endswith("m"):
            return int(s[:-1]) // 1000
        if s.endswith("k"):
            return int(s[:-1]) * 1000
        return int(float(s))
    except ValueError:
        return 0


@dataclass(frozen=True)
class NodeInfo:
    """What placement needs to know about one GPU node (hashable, index-friendly)."""

    name: str
    product: str
    gpus: int                       # allocatable nvidia.com/gpu
    gpu_memory_mib: int
    family: str
    zone: str
    clique: str | None
    hostname: str
    schedulable: bool
    unschedulable_reason: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    gpu: str | None = None          # catalogue (or derived, see catalog.gpus.get_gpu) GPU; None: not known
    resource: str = GPU_RESOURCE    # extended resource the pods request (nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-*)
    product_label: str = LABEL_PRODUCT   # the node label that carries `product` (node affinity uses it)
    notes: tuple[str, ...] = ()     # what the labels said that changed the catalogue's view (shown in plan/status)
    # Other extended resources the node advertises (allocatable, e.g. rdma/ib, vpc.amazonaws.com/efa): which
    # of them are RDMA is decided with the operator's NetworkConfig when domains are built.
    extended: tuple[tuple[str, int], ...] = ()

    @property
    def nvlink(self) -> bool:
        return product_has_nvlink(self.gpu) if self.gpu else False

    @property
    def unknown(self) -> str:
        """Why this node's GPUs cannot be planned on ('' when they can): the product label, named."""
        if self.gpu:
            return ""
        return (f"node {self.name}: {self.product_label}={self.product} is not in the GPU catalogue; declare it "
                f"(memory, bandwidth, dense TFLOP/s per dtype, interconnect) in the chart value gpuCatalog, "
                f"or for the CLI `meshplan plan --gpu-catalog FILE` (docs/install.md)")

    @cached_property
    def label_map(self) -> dict[str, str]:
        """`labels` as a dict, built once per NodeInfo (selectors are matched against every node per
        reconcile). cached_property writes the instance __dict__ directly, so this works on a frozen
        dataclass and is not a field (equality and hashing are unchanged)."""
        return dict(self.labels)

    def matches(self, selector: Mapping[str, str]) -> bool:
        labels = self.label_map
        return all(labels.get(k) == v for k, v in selector.items())

    def rdma(self, network: NetworkConfig) -> tuple[str, int, str]:
        """(resource, count, fabric) of the first RDMA resource this node advertises, or ('', 0, '')."""
        for name, count in self.extended:
            fabric = network.fabric_of(name)
            if fabric and count > 0:
                return name, count, fabric
        return "", 0, ""


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes toleration matching (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    op = toleration.get("operator") or "Equal"
    if not key:
        return op == "Exists"
    if key != taint.get("key"):
        return False
    if op == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def _ready(node: Mapping[str, Any]) -> bool | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return None


def _amd_label(labels: Mapping[str, str], key: str) -> str:
    """An AMD node-labeller label, current prefix first, then the legacy `beta.` one. The legacy labels are
    count-style (`beta.amd.com/gpu.device-id.74a1: "8"`): the value is then the suffix of the key."""
    if labels.get(key):
        return labels[key]
    beta = "beta." + key
    if labels.get(beta):
        return labels[beta]
    for k in labels:
        if k.startswith(beta + "."):
            return k[len(beta) + 1:]
    return ""


def _mib_from_gib_label(value: str) -> int:
    """`192G` (AMD labeller: VRAM in GiB, rounded) -> MiB; '' or junk -> 0."""
    v = value.strip().upper().removesuffix("B").removesuffix("G")
    try:
        return int(float(v) * 1024)
    except ValueError:
        return 0


def gpu_view(labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> dict[str, Any] | None:
    """What GPUs a node offers, from its labels and allocatable resources (pure; see module doc):
    {resource, gpus, product, product_label, gpu (catalogue/derived name or None), memory_mib, notes}.
    None when the node advertises no GPU resource."""
    from meshplan.catalog import gpus as cat

    notes: list[str] = []
    full = parse_count(allocatable.get(GPU_RESOURCE))
    amd = parse_count(allocatable.get(AMD_GPU_RESOURCE))
    mig = {k: parse_count(v) for k, v in allocatable.items() if str(k).startswith(MIG_RESOURCE_PREFIX)}
    mig = {k: v for k, v in mig.items() if v > 0}

    if amd > 0 and full <= 0:
        product = _amd_label(labels, LABEL_AMD_PRODUCT)
        device_id = _amd_label(labels, LABEL_AMD_DEVICE_ID)
        spec = cat.gpu_for_device_id(device_id) if device_id else None
        if spec is None and product:
            try:
                spec = cat.get_gpu(product)
            except KeyError:
                spec = None
        mem = _mib_from_gib_label(_amd_label(labels, LABEL_AMD_VRAM))
        # The label node affinity pins the product with: a plain label holding it, else none ('': the legacy
        # count-style `beta.amd.com/gpu.device-id.<id>` labels carry no value to match; the domain's hostname
        # label still pins the node).
        label_key = next((k for k in (LABEL_AMD_PRODUCT, "beta." + LABEL_AMD_PRODUCT, LABEL_AMD_DEVICE_ID,
                                      "beta." + LABEL_AMD_DEVICE_ID) if labels.get(k)), "")
        product = labels.get(label_key, "") if label_key else (device_id or "unknown")
        gpu = None
        if spec is not None:
            derived = cat.with_memory(spec, mem)
            if derived is not spec:
                notes.append(f"{AMD_GPU_RESOURCE}.vram={mem // 1024}G differs from the catalogue's "
                             f"{spec.memory_gib:.1f} GiB for {spec.name}: planned with the node's {mem / 1024:.1f} GiB")
            gpu = derived.name
        return {"resource": AMD_GPU_RESOURCE, "gpus": amd, "product": product, "product_label": label_key,
                "gpu": gpu, "memory_mib": mem, "notes": tuple(notes)}

    product = labels.get(LABEL_PRODUCT, "")
    resource, count, profile, mem = GPU_RESOURCE, full, "", parse_count(labels.get(LABEL_MEMORY_MIB))
    renamed = False
    # Time-slicing with renameByDefault=true advertises `<resource>.shared` (nvidia.com/gpu.shared,
    # nvidia.com/mig-1g.5gb.shared) and leaves the product label as it is (NVIDIA cloud-native-docs
    # gpu-operator/gpu-sharing.rst).
    if full <= 0 and parse_count(allocatable.get(GPU_RESOURCE + SHARED_SUFFIX)) > 0:
        resource, count, renamed = GPU_RESOURCE + SHARED_SUFFIX, parse_count(allocatable.get(GPU_RESOURCE + SHARED_SUFFIX)), True
    elif full <= 0 and mig:
        # MIG 'mixed': each profile is its own resource (nvidia.com/mig-1g.5gb); the product label is the
        # whole GPU's. One resource per node is planned on: the profile with the most memory in total.
        resource = max(mig, key=lambda k: (mig[k] * _profile_gb(k), k))
        count = mig[resource]
        profile = resource[len("nvidia.com/"):].removeprefix("mig-")
        if profile.endswith(SHARED_SUFFIX):
            profile, renamed = profile[: -len(SHARED_SUFFIX)], True
        mem = parse_count(labels.get(f"nvidia.com/mig-{profile}.memory"))   # 0: the profile's size
        others = sorted(k for k in mig if k != resource)
        notes.append(f"MIG mixed: planned on {count} x {resource}" +
                     (f"; {', '.join(others)} not used" if others else ""))
    elif full > 0 and mig:
        notes.append(f"MIG mixed: planned on the {full} whole GPUs; {', '.join(sorted(mig))} not used")
    if count <= 0:
        return None
    base = product
    shared = 0
    if base.upper().endswith("-SHARED"):
        base = base[: -len("-SHARED")]
        shared = max(2, parse_count(labels.get(LABEL_REPLICAS)))
    elif parse_count(labels.get(LABEL_REPLICAS)) > 1 or renamed:
        shared = max(2, parse_count(labels.get(LABEL_REPLICAS)))
    if "-MIG-" in base:
        # MIG 'single': the product label is `<product>-MIG-<profile>` and nvidia.com/gpu counts slices.
        base, _, profile = base.partition("-MIG-")
    try:
        spec = cat.get_gpu(base) if base else None
    except KeyError:
        spec = None
    gpu = None
    if spec is not None:
        name = spec.name
        if profile:
            name += f"/mig-{profile.lower()}"
            notes.append(f"MIG {profile}: {count} slices, each a small GPU without NVLink (never part of a "
                         f"multi-GPU group)")
        if shared:
            name += f"/shared-{shared}"
            notes.append(f"time-sliced: {count} replicas ({shared} per GPU, {LABEL_REPLICAS}), each planned as "
                         f"1/{shared} of a GPU without NVLink (never part of a multi-GPU group)")
        derived = cat.get_gpu(name)
        if mem > 0 and not shared:
            with_mem = cat.with_memory(derived, mem)
            if with_mem is not derived:
                if not profile:
                    notes.append(f"{LABEL_MEMORY_MIB}={mem} MiB differs from the catalogue's "
                                 f"{derived.memory_gib * 1024:,.0f} MiB for {spec.name}: planned with the node's "
                                 f"{mem / 1024:.1f} GiB")
                derived = with_mem
        gpu = derived.name
    return {"resource": resource, "gpus": count, "product": product or "unknown", "product_label": LABEL_PRODUCT,
            "gpu": gpu, "memory_mib": mem, "notes": tuple(notes)}


def _profile_gb(resource: str) -> float:
    try:
        return float(resource.rsplit(".", 1)[1].rstrip("gb"))
    except (IndexError, ValueError):
        return 0.0


def node_info(
    node: Mapping[str, Any],
    tolerations: Sequence[Mapping[str, Any]] = DEFAULT_TOLERATIONS,
    ready_if_unknown: bool = False,
) -> NodeInfo | None:
    """One Node object -> NodeInfo, or None when the node has no GPUs.

    `ready_if_unknown` treats a node without a Ready condition as ready (for node
    manifests read from a fleet file, which have no status conditions yet).
    """
    meta = node.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    status = node.get("status") or {}
    view = gpu_view(labels, status.get("allocatable") or {})
    if view is None:
        return None
    name = meta.get("name", "")
    reasons = []
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        reasons.append("cordoned (spec.unschedulable)")
    ready = _ready(node)
    if ready is False or (ready is None and not ready_if_unknown):
        reasons.append("NotReady" if ready is False else "no Ready condition")
    for taint in spec.get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            reasons.append(f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}")
    return NodeInfo(
        name=name,
        product=view["product"],
        gpus=view["gpus"],
        gpu_memory_mib=view["memory_mib"],
        family=labels.get(LABEL_FAMILY) or _amd_label(labels, LABEL_AMD_FAMILY),
        zone=labels.get(LABEL_ZONE, ""),
        clique=labels.get(LABEL_CLIQUE) or None,
        hostname=labels.get(LABEL_HOSTNAME, name),
        schedulable=not reasons,
        unschedulable_reason="; ".join(reasons),
        labels=tuple(sorted(labels.items())),
        gpu=view["gpu"],
        resource=view["resource"],
        product_label=view["product_label"],
        notes=view["notes"],
        extended=tuple(sorted((str(k), parse_count(v)) for k, v in (status.get("allocatable") or {}).items()
                              if "/" in str(k) and not _is_gpu_resource(str(k)) and parse_count(v) > 0)),
    )


def _is_gpu_resource(name: str) -> bool:
    return name in (GPU_RESOURCE, AMD_GPU_RESOURCE, GPU_RESOURCE + SHARED_SUFFIX) or name.startswith(MIG_RESOURCE_PREFIX)


def _container_gpus(c: Mapping[str, Any]) -> int:
    """GPUs (whole, AMD or MIG slices) a container asks for: its request, else its limit, per resource."""
    res = c.get("resources") or {}
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    total = 0
    for r in {*requests, *limits}:
        if _is_gpu_resource(str(r)):
            total += parse_count(requests[r] if r in requests else limits.get(r))
    return total


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """Effective nvidia.com/gpu request of a pod (the scheduler's rule, see module doc)."""
    spec = pod.get("spec") or {}
    app = sum(_container_gpus(c) for c in spec.get("containers") or [])
    inits = spec.get("initContainers") or []
    sidecars = sum(_container_gpus(c) for c in inits if c.get("restartPolicy") == "Always")
    plain_init = max((_container_gpus(c) for c in inits if c.get("restartPolicy") != "Always"), default=0)
    return max(app + sidecars, plain_init)


def owned_by_llmdeployment(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's controlling ownerReference is an LLMDeployment (what meshplan renders)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if (isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == "LLMDeployment"
                and str(ref.get("apiVersion", "")).startswith("meshplan.dev/") and ref.get("uid")):
            return True
    return False


def pod_gpu_usage(pod: Mapping[str, Any], reservations: bool = True) -> tuple[str, int] | None:
    """(node name, GPUs) a pod holds or reserves, or None when it holds none.

    A bound pod holds GPUs on its node. An unbound one reserves them through
    `ASSIGNED_NODE_ANNOTATION` only when it is the operator's own (see the module
    doc): `reservations` is True for pods of served namespaces, and the pod must be
    controlled by an LLMDeployment."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node and reservations and owned_by_llmdeployment(pod):
        node = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNED_NODE_ANNOTATION)
    if not node:
        return None
    gpus = pod_gpus(pod)
    return (node, gpus) if gpus > 0 else None


@dataclass(frozen=True)
class NodeState:
    info: NodeInfo
    used_gpus: int = 0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def free_gpus(self) -> int:
        return max(0, self.info.gpus - self.used_gpus)


@dataclass(frozen=True)
class Domain:
    """One NVLink domain: the GPUs a TP/EP group may span.

    `match_labels` are node labels that select exactly this domain's nodes (used
    for node affinity): the clique label (plus zone/product when a clique was
    split) or the node's hostname.
    """

    name: str
    kind: str                                 # "clique" | "node"
    nodes: tuple[str, ...]
    product: str
    gpus_per_node: int
    total_gpus: int
    free_gpus: int
    zone: str
    nvlink: bool
    match_labels: tuple[tuple[str, str], ...]
    gpu_memory_mib: int = 0
    family: str = ""
    gpu: str | None = None                    # catalogue/derived GPU name (NodeInfo.gpu); None: unknown product
    resource: str = GPU_RESOURCE              # extended resource the pods request
    product_label: str = LABEL_PRODUCT        # node label carrying `product`
    # second tier: the network block this domain belongs to ('' = none: no RDMA resource on its nodes)
    block: str = ""
    fabric: str = ""                          # "ib" | "roce" | "efa" ('' = none)
    rdma_resource: str = ""                   # the RDMA resource its nodes advertise (pods request it)
    rdma_per_node: int = 0                    # how many of it each node advertises (the fewest of its nodes)

    @property
    def tier(self) -> Tier:
        """Bandwidth and latency inside this domain (NVLink, or PCIe on cards without it)."""
        return nvlink_tier(self.gpu)

    @property
    def nvlink_gpus(self) -> int:
        """GPUs that reach each other over NVLink (1 on PCIe-only products)."""
        return self.total_gpus if self.nvlink else 1

    @property
    def max_group_gpus(self) -> int:
        """GPUs one TP/EP group (pipeline stage) may span here: 1 on MIG slices and time-sliced replicas
        (never part of a multi-GPU group), else the domain's GPUs."""
        from meshplan.catalog.gpus import is_fractional

        return 1 if is_fractional(self.gpu) else self.total_gpus

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1


@dataclass(frozen=True)
class NetworkBlock:
    """NVLink domains that reach each other over one RDMA fabric (see the module doc)."""

    name: str
    fabric: str                      # "ib" | "roce" | "efa"
    resource: str                    # the RDMA resource its nodes advertise
    domains: tuple[str, ...]
    gpu: str | None
    total_gpus: int
    free_gpus: int

    @property
    def tier(self) -> Tier:
        return rdma_tier(self.fabric, self.gpu)


def _fits_group(d: "Domain", stage_gpus: int, pp: int = 1) -> bool:
    """Whether a replica of `pp` stages of `stage_gpus` GPUs may use this domain at all: MIG slices and
    time-sliced GPUs take 1-GPU replicas only (no TP, EP or PP across them)."""
    fractional = d.max_group_gpus == 1 and d.total_gpus > 1
    return not fractional or stage_gpus * pp <= 1


def gpus_per_pod_for(gpus_per_stage: int, gpus_per_node: int) -> int:
    """Largest divisor of the stage size that fits one node (one pod per node slice of a stage)."""
    for d in range(min(gpus_per_stage, gpus_per_node), 0, -1):
        if gpus_per_stage % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class Topology:
    """Schedulable GPU nodes, their NVLink domains and network blocks, with free GPUs.

    The one model of the cluster: placement places on it, the planner counts replicas on it
    (`replica_slots`, `why_no_room`, `gpus`, `for_gpu`), the autoscaler asks it for capacity.

    Immutable. `select` and `with_usage` return derived topologies without rebuilding
    the whole fleet: at 1,000 nodes a rebuild (`build_topology_from_infos`) costs
    milliseconds, and one reconcile asks for the same selection several times (plan key,
    target, placement), so selections are memoised per topology object and `with_usage`
    only recomputes the nodes and domains it touches. Memoisation never changes a
    result: the same topology and arguments give an equal topology.
    """

    nodes: Mapping[str, NodeState] = field(default_factory=dict)     # schedulable GPU nodes
    domains: tuple[Domain, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()                       # (node, reason)
    name: str = ""                                                   # what it is (fleet file, kubeconfig), for messages
    network: NetworkConfig = field(default_factory=lambda: NETWORK)   # how network blocks were read
    # memo of derived views (selections, name indexes); not part of the value
    _memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def _by_name(self) -> dict[str, Domain]:
        idx = self._memo.get("by_name")
        if idx is None:
            idx = self._memo["by_name"] = {d.name: d for d in self.domains}
        return idx

    @property
    def _node_domain(self) -> dict[str, Domain]:
        idx = self._memo.get("node_domain")
        if idx is None:
            idx = self._memo["node_domain"] = {n: d for d in self.domains for n in d.nodes}
        return idx

    def domain(self, name: str) -> Domain:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no NVLink domain {name!r}") from None

    def domain_of(self, node: str) -> Domain | None:
        return self._node_domain.get(node)

    @property
    def total_gpus(self) -> int:
        return sum(d.total_gpus for d in self.domains)

    @property
    def free_gpus(self) -> int:
        return sum(d.free_gpus for d in self.domains)

    def free_gpus_by_domain(self) -> dict[str, int]:
        return {d.name: d.free_gpus for d in self.domains}

    def select(self, node_selector: Mapping[str, str]) -> "Topology":
        """Only the nodes whose labels match `node_selector` (spec.gpus.nodeSelector).

        The result equals `build_topology_from_infos` over the matching nodes. When every
        domain is kept whole or dropped whole (the usual case: selectors pick fleets, zones
        or products, which domains never straddle) the domains are reused as they are;
        otherwise the matching nodes are rebuilt into domains."""
        if not node_selector:
            return self
        key = ("select", tuple(sorted(node_selector.items())))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        # Which nodes and domains match depends on labels only, not on usage: the answer is shared
        # with every topology derived by `with_usage` (same nodes), so it is worked out once per fleet.
        shapes = self._memo.setdefault("shapes", {})
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = self._selection_shape(node_selector)
        keep, kept_domains = shape
        if kept_domains is not None:
            topo = Topology(nodes={n: s for n, s in self.nodes.items() if n in keep},
                            domains=tuple(d for d in self.domains if d.name in kept_domains),
                            excluded=self.excluded, name=self.name, network=self.network, _memo={"shapes": shapes})
        else:
            states = [self.nodes[n] for n in self.nodes if n in keep]
            built = build_topology_from_infos([s.info for s in states], [(s.name, s.used_gpus) for s in states],
                                              network=self.network)
            topo = Topology(nodes=built.nodes, domains=built.domains, excluded=self.excluded, name=self.name,
                            network=self.network)
        self._memo[key] = topo
        return topo

    def _selection_shape(self, node_selector: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str] | None]:
        """(matching nodes, names of the domains kept whole) for `select`; None instead of the names
        when some domain is cut by the selector (its nodes must be regrouped)."""
        keep = frozenset(n for n, s in self.nodes.items() if s.info.matches(node_selector))
        kept: list[Domain] = []
        for d in self.domains:
            n_keep = sum(1 for n in d.nodes if n in keep)
            if n_keep == 0:
                continue
            if n_keep != len(d.nodes):
                return keep, None
            kept.append(d)
        # A clique split by zone/product is named by its parts only while it has several;
        # if the selection dropped some parts, the names change: regroup then.
        parts_all: dict[str, int] = defaultdict(int)
        parts_kept: dict[str, int] = defaultdict(int)
        for d in self.domains:
            if d.kind == "clique":
                parts_all[d.match_labels[0][1]] += 1
        for d in kept:
            if d.kind == "clique":
                parts_kept[d.match_labels[0][1]] += 1
        if not all(parts_kept[c] == parts_all[c] or parts_all[c] == 1 for c in parts_kept):
            return keep, None
        return keep, frozenset(d.name for d in kept)

    def with_usage(self, usage: Iterable[tuple[str, int]]) -> "Topology":
        """A copy with extra GPUs used (e.g. what a placement just took); nodes not in the
        topology are ignored. Only the touched nodes and their domains are recomputed."""
        extra: dict[str, int] = defaultdict(int)
        for n, g in usage:
            if n in self.nodes:
                extra[n] += int(g)
        if not any(extra.values()):
            return self
        nodes = dict(self.nodes)
        touched: set[str] = set()
        for n, g in extra.items():
            s = nodes[n]
            nodes[n] = NodeState(s.info, s.used_gpus + g)
            d = self.domain_of(n)
            if d is not None:
                touched.add(d.name)
        # Domain(**vars(d), ...) rather than dataclasses.replace: the same copy, several times faster.
        domains = tuple(Domain(**{**vars(d), "free_gpus": sum(nodes[m].free_gpus for m in d.nodes)})
                        if d.name in touched else d for d in self.domains)
        return Topology(nodes=nodes, domains=domains, excluded=self.excluded, name=self.name, network=self.network,
                        _memo={"shapes": self._memo.setdefault("shapes", {})})

    def named(self, name: str) -> "Topology":
        """The same topology under another name (shown in plan messages)."""
        return self if name == self.name else replace(self, name=name, _memo={})

    # ------------------------------------------------------------------ the second tier

    @property
    def blocks(self) -> tuple[NetworkBlock, ...]:
        """The network blocks (domains sharing one RDMA fabric and block label value), by name."""
        hit = self._memo.get("blocks")
        if hit is None:
            by: dict[str, list[Domain]] = defaultdict(list)
            for d in self.domains:
                if d.block:
                    by[d.block].append(d)
            hit = self._memo["blocks"] = tuple(
                NetworkBlock(b, ds[0].fabric, ds[0].rdma_resource, tuple(d.name for d in ds), ds[0].gpu,
                             sum(d.total_gpus for d in ds), sum(d.free_gpus for d in ds))
                for b, ds in sorted(by.items()))
        return hit

    def block(self, name: str) -> NetworkBlock:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(f"no network block {name!r}")

    # ------------------------------------------------------------------ what the planner asks

    @property
    def unknown(self) -> tuple[str, ...]:
        """Per schedulable node whose product the catalogue does not know: why, with its label named."""
        return tuple(s.info.unknown for s in self.nodes.values() if s.info.unknown)

    @property
    def gpu_notes(self) -> tuple[tuple[str, str], ...]:
        """(GPU name, note) for the label notes that explain a derived GPU (memory, MIG, sharing)."""
        out: dict[tuple[str, str], None] = {}
        for s in self.nodes.values():
            if s.info.gpu:
                for n in s.info.notes:
                    out[(s.info.gpu, n)] = None
        return tuple(out)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the nodes' labels said that changed the catalogue's view, with the nodes named."""
        by_note: dict[str, list[str]] = defaultdict(list)
        for s in self.nodes.values():
            for n in s.info.notes:
                by_note[n].append(s.name)
        return tuple(f"node {ns[0]}: {n}" if len(ns) == 1 else
                     f"{len(ns)} nodes ({', '.join(ns[:3])}{', ...' if len(ns) > 3 else ''}): {n}"
                     for n, ns in by_note.items())

    def notes_for(self, gpu: str) -> tuple[str, ...]:
        return tuple(n for g, n in self.gpu_notes if g == gpu)

    def gpus(self) -> tuple[str, ...]:
        """Catalogue GPU names with free GPUs, most free GPUs first."""
        free: dict[str, int] = defaultdict(int)
        for d in self.domains:
            if d.gpu and d.free_gpus > 0:
                free[d.gpu] += d.free_gpus
        return tuple(sorted(free, key=lambda g: (-free[g], g)))

    def unknown_products(self) -> tuple[str, ...]:
        return tuple(sorted({d.product for d in self.domains if d.gpu is None}))

    def for_gpu(self, gpu: str) -> "Topology":
        """Only the domains (and their nodes) of one catalogue GPU."""
        key = ("for_gpu", gpu)
        hit = self._memo.get(key)
        if hit is None:
            domains = tuple(d for d in self.domains if d.gpu == gpu)
            keep = {n for d in domains for n in d.nodes}
            hit = self._memo[key] = Topology(nodes={n: s for n, s in self.nodes.items() if n in keep},
                                             domains=domains, excluded=self.excluded, name=self.name,
                                             network=self.network)
        return hit

    def largest_free_domain(self) -> Domain | None:
        return max(self.domains, key=lambda d: (d.free_gpus, d.name), default=None)

    def gpus_per_pod(self, stage_gpus: int) -> int:
        per_node = max((d.gpus_per_node for d in self.domains), default=1)
        return gpus_per_pod_for(stage_gpus, max(1, per_node))

    def _pods(self, d: Domain, g: int, *, total: bool = False) -> int:
        """Pods of `g` GPUs the domain's nodes offer (free, or all GPUs with `total`)."""
        return sum((self.nodes[n].info.gpus if total else self.nodes[n].free_gpus) // g
                   for n in d.nodes if n in self.nodes)

    def spans_domains(self, stage_gpus: int) -> bool:
        """Whether one stage of `stage_gpus` GPUs is larger than every domain (by its total GPUs), so that
        it can only run spread over the domains of one network block (wide EP). A stage that fits some
        domain always stays inside one (placement's rule 1)."""
        g = self.gpus_per_pod(stage_gpus)
        per_stage = stage_gpus // g
        return not any(self._pods(d, g, total=True) >= per_stage for d in self.domains if _fits_group(d, stage_gpus))

    def replica_slots(self, stage_gpus: int, pp: int, *, span_blocks: bool = True) -> int:
        """How many replicas of `pp` stages of `stage_gpus` GPUs fit the free GPUs, by the rules placement
        follows (`meshplan.placement`; a property test checks the two agree):
        - pods: a stage is `per_stage` pods of `g` GPUs, `g` the largest divisor of the stage that fits a node;
        - a stage sits inside one NVLink domain; only a stage larger than every domain (`spans_domains`, with
          `span_blocks`) spreads over the domains of ONE network block, whole pods per domain;
        - a replica of one stage, or any replica when some domain can hold a whole replica, sits in one
          domain; otherwise its stages spread over the domains of one zone (or, spanning, one block)."""
        g = self.gpus_per_pod(stage_gpus)
        per_stage = stage_gpus // g
        if self.spans_domains(stage_gpus):
            if not span_blocks:
                return 0
            by_block: dict[str, int] = defaultdict(int)
            for d in self.domains:
                if d.block and _fits_group(d, stage_gpus, pp):
                    by_block[d.block] += self._pods(d, g)
            return sum((pods // per_stage) // pp for pods in by_block.values())
        stages = {d.name: self._pods(d, g) // per_stage if _fits_group(d, stage_gpus, pp) else 0
                  for d in self.domains}
        single = pp == 1 or any(self._pods(d, g, total=True) >= per_stage * pp for d in self.domains
                                if _fits_group(d, stage_gpus, pp))
        if single:
            return sum(n // pp for n in stages.values())
        by_zone: dict[str, int] = defaultdict(int)
        for d in self.domains:
            by_zone[d.zone] += stages[d.name]
        return sum(n // pp for n in by_zone.values())

    def why_no_room(self, stage_gpus: int, pp: int, *, span_blocks: bool = True) -> str:
        """Why not even one replica fits, with the numbers."""
        big = self.largest_free_domain()
        if big is None:
            return "the fleet has no GPUs of this product"
        if stage_gpus * pp > 1 and not any(_fits_group(d, stage_gpus, pp) for d in self.domains):
            return (f"a replica needs {stage_gpus * pp} GPUs working together, but these GPUs are MIG slices or "
                    f"time-sliced replicas ({big.gpu}), never part of a multi-GPU group")
        g = self.gpus_per_pod(stage_gpus)
        per_stage = stage_gpus // g
        if self.spans_domains(stage_gpus):
            largest = max((self._pods(d, g, total=True) * g for d in self.domains), default=0)
            if not span_blocks:
                return (f"a pipeline stage needs {stage_gpus} GPUs in one NVLink domain, but the largest domain "
                        f"holds {largest} (spec.parallelism.crossDomain: never)")
            if not self.blocks:
                return (f"a stage of {stage_gpus} GPUs is larger than any NVLink domain ({largest} GPUs) and "
                        f"may span domains only inside a network block, but no node advertises an RDMA "
                        f"resource ({', '.join(n for n, _ in self.network.rdma_resources)})")
            best = min(self.blocks, key=lambda b: (-b.free_gpus, b.name))
            return (f"a replica needs {pp} stage(s) of {stage_gpus} GPUs spread over the NVLink domains of one "
                    f"network block, but the block with the most free GPUs ({best.name}, {best.fabric}) has "
                    f"{best.free_gpus} free")
        if big.free_gpus < stage_gpus:
            return (f"a pipeline stage needs {stage_gpus} GPUs in one NVLink domain, but the largest free domain "
                    f"({big.name}) has {big.free_gpus} free GPUs")
        if not any(self._pods(d, g) >= per_stage for d in self.domains):
            return (f"a pipeline stage needs {per_stage} pod(s) of {g} GPUs on the nodes of one NVLink domain; "
                    f"free GPUs are too scattered over nodes (largest free domain {big.name}: {big.free_gpus})")
        if pp == 1 or any(self._pods(d, g, total=True) >= per_stage * pp for d in self.domains):
            return (f"a replica of {pp * stage_gpus} GPUs must sit in one NVLink domain (one is big enough), but "
                    f"the largest free domain ({big.name}) has {big.free_gpus} free GPUs")
        by_zone: dict[str, int] = defaultdict(int)
        for d in self.domains:
            by_zone[d.zone] += self._pods(d, g) // per_stage
        best_zone = max(by_zone, key=lambda z: by_zone[z])
        return (f"a replica needs {pp} stages of {stage_gpus} GPUs in one zone, but zone {best_zone or '(none)'} "
                f"has room for {by_zone[best_zone]} such stages")


def _block_of(members: Sequence[NodeState], network: NetworkConfig) -> tuple[str, str, str, int]:
    """(block label value, fabric, RDMA resource, per node) of a domain's nodes; ('', '', '', 0) when some node
    advertises no RDMA resource or the nodes disagree (resource or label value): then the domain is in no
    block and never spans with another."""
    seen = {(m.info.label_map.get(network.label, ""),) + m.info.rdma(network)[::2] for m in members}
    rdma = [m.info.rdma(network) for m in members]
    if len(seen) != 1 or any(not r[0] for r in rdma):
        return "", "", "", 0
    value, resource, fabric = next(iter(seen))
    return value, fabric, resource, min(r[1] for r in rdma)


def build_topology_from_infos(
    infos: Iterable[NodeInfo],
    usage: Iterable[tuple[str, int]] | Mapping[str, int] = (),
    *,
    network: NetworkConfig | None = None,
    name: str = "",
) -> Topology:
    """Topology from NodeInfos and (node, GPUs used) pairs (summed per node); network blocks read with
    `network` (default: the operator's `NETWORK`)."""
    network = NETWORK if network is None else network
    topology_name = name          # `name` is reused for each domain below
    used: dict[str, int] = defaultdict(int)
    for n, g in (usage.items() if isinstance(usage, Mapping) else usage):
        used[n] += int(g)
    nodes: dict[str, NodeState] = {}
    excluded: list[tuple[str, str]] = []
    for info in sorted(infos, key=lambda i: i.name):
        if info.schedulable:
            nodes[info.name] = NodeState(info, used.get(info.name, 0))
        else:
            excluded.append((info.name, info.unschedulable_reason))

    groups: dict[tuple, list[NodeState]] = defaultdict(list)
    for s in nodes.values():
        i = s.info
        key = ("clique", i.clique, i.zone, i.product) if i.clique else ("node", i.name, i.zone, i.product)
        groups[key + (i.gpu, i.resource)].append(s)
    # Cliques split by zone/product get a qualified name and extra match labels.
    clique_keys: dict[str, int] = defaultdict(int)
    for k in groups:
        if k[0] == "clique":
            clique_keys[k[1]] += 1   # a clique whose nodes disagree on product, GPU or resource is split

    blocks: dict[str, tuple[str, str, str, int]] = {}
    for key, members in groups.items():
        blocks[repr(key)] = _block_of(members, network)
    # a block is one label value and one RDMA resource; a value shared by two resources names both
    values: dict[str, set[str]] = defaultdict(set)
    for value, _fabric, resource, _n in blocks.values():
        if resource:
            values[value].add(resource)
    domains = []
    for key, members in groups.items():
        value, fabric, resource, per_node = blocks[repr(key)]
        block = ""
        if resource:
            block = (value or "-") + (f"/{resource}" if len(values[value]) > 1 else "")
        kind, ident, zone, product = key[:4]
        first = members[0].info
        if kind == "clique":
            split = clique_keys[ident] > 1
            name = f"{ident}/{zone}/{product}" if split else ident
            if split and sum(1 for k in groups if k[:4] == key[:4]) > 1:
                name += f"/{key[4] or 'unknown'}"
            match = [(LABEL_CLIQUE, ident)]
            if split:
                match += [(LABEL_ZONE, zone), (first.product_label, product)]
        else:
            name = ident
            match = [(LABEL_HOSTNAME, first.hostname)]
        domains.append(Domain(
            name=name,
            kind=kind,
            nodes=tuple(m.name for m in members),
            product=product,
            gpus_per_node=max(m.info.gpus for m in members),
            total_gpus=sum(m.info.gpus for m in members),
            free_gpus=sum(m.free_gpus for m in members),
            zone=zone,
            nvlink=first.nvlink,
            match_labels=tuple(match),
            gpu_memory_mib=first.gpu_memory_mib,
            family=first.family,
            gpu=first.gpu,
            resource=first.resource,
            product_label=first.product_label,
            block=block,
            fabric=fabric,
            rdma_resource=resource,
            rdma_per_node=per_node,
        ))
    domains.sort(key=lambda d: d.name)
    return Topology(nodes=nodes, domains=tuple(domains), excluded=tuple(excluded), name=topology_name,
                    network=network)


def build_topology(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    tolerations: Sequence[Mapping[str, Any]] = DEFAULT_TOLERATIONS,
    ignore_pod: Callable[[Mapping[str, Any]], bool] | None = None,
    ready_if_unknown: bool = False,
    *,
    network: NetworkConfig | None = None,
    name: str = "",
) -> Topology:
    """Topology from Node and Pod objects.

    `ignore_pod(pod) -> True` leaves a pod's GPUs out: pass the deployment's own
    pods when re-placing it, so its running replicas can keep their place.
    """
    infos = [i for i in (node_info(n, tolerations, ready_if_unknown) for n in nodes) if i is not None]
    usage = []
    for p in pods:
        if ignore_pod is not None and ignore_pod(p):
            continue
        u = pod_gpu_usage(p)
        if u is not None:
            usage.append(u)
    return build_topology_from_infos(infos, usage, network=network, name=name)
