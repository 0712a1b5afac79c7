"""NCCL environment for one replica group, from its topology and the chosen transport.

Pure: `nccl_env(group, transport=..., ...)` returns the variables and, for each,
why it is set and where the fact comes from (`Explanation`), so `meshplan
render` can print them and the pods carry them as an annotation.

Rules (facts from docs/planner.md "NCCL environment facts"; NCCL's own
environment-variable documentation, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)
- NVLink inside the group (HGX nodes, NVL72 racks): `NCCL_P2P_LEVEL=NVL` so P2P
  is used exactly where GPUs are NVLink-connected.
- PCIe-only GPUs (L40S): nothing forced; NCCL picks PCIe P2P where the platform
  allows it, else shared memory. Forcing P2P on a platform without it fails.
- Multi-node NVLink (a group spanning several nodes of one `gpu.clique`, i.e.
  GB200 NVL72): `NCCL_MNNVL_ENABLE=1`, `NCCL_CUMEM_ENABLE=1`,
  `NCCL_NVLS_ENABLE=1`, `NCCL_P2P_LEVEL=NVL` (AIConfigurator's GB200 profile).
  MNNVL needs an IMEX channel in the pod: when the NVIDIA DRA driver's
  ComputeDomain CRD exists the renderer adds a ComputeDomain and a resource claim
  (`needs_compute_domain`); otherwise the explanation says IMEX must come from
  the node (the nvidia-imex daemon).
- Between nodes beyond NVLink (`transport`):
  - `infiniband`: `NCCL_IB_DISABLE=0`; `NCCL_IB_HCA` from the spec.
  - `roce`: as infiniband plus `NCCL_IB_GID_INDEX=3` (RoCE v2 over IPv4 is GID
    index 3 on Mellanox/NVIDIA NICs by convention; check `show_gids`).
  - `efa`: `FI_PROVIDER=efa`, `FI_EFA_USE_DEVICE_RDMA=1` (aws-ofi-nccl plugin,
    AWS EFA docs); `NCCL_NET` is NOT forced because the plugin's network
    name changed between releases; the explanation asks to check the
    `NCCL INFO NET/OFI` log line, since a silent TCP fallback costs ~10x TTFT.
  - `tcp`: `NCCL_IB_DISABLE=1`, `NCCL_NET=Socket`.
  - `nvlink`: the user asserts that every byte stays on (multi-node) NVLink; no
    NIC variables. Warned when the group spans nodes outside one clique.
  - `auto`: no transport variables; NCCL probes IB verbs, then sockets.
- RDMA only where the pod can use it (issue 15 finding "NCCL is told to use
  InfiniBand while no RDMA device is requested"): a group that crosses the NIC on
  nodes of one RDMA network block requests the block's RDMA resource
  (`GroupTopology.rdma_fabric`, see `rdma_request`); then `auto` takes the block's
  fabric (ib -> infiniband, roce, efa) and the variables above are set. When no
  RDMA resource is requested, an explicit `infiniband`/`roce`/`efa` sets no IB
  variable (the pod sees no verbs device; forcing IB would make NCCL fail or fall
  back silently) and the explanation warns.
- NVSHMEM for DeepEP (`nvshmem_env`): an engine rendered with a DeepEP all-to-all
  backend over ib/roce gets `NVSHMEM_IB_ENABLE_IBGDA=1` (GPU-initiated RDMA, which
  DeepEP's internode and low-latency kernels use: DeepEP docs "NVSHMEM
  installation", NVSHMEM env docs), `NVSHMEM_HCA_LIST` from `spec.nccl.ibHca`, and
  on RoCE `NVSHMEM_IB_GID_INDEX=3` (the same RoCE v2 convention as NCCL). EFA:
  none (DeepEP's IBGDA needs Mellanox/NVIDIA mlx5 NICs), with a warning.
- `NCCL_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME` from `spec.nccl.socketIfname` for
  bootstrap (and torch's CPU process groups that vLLM and SGLang use).
- The seeds' tips (`NCCL_ALGO=Tree`, `NCCL_NET_GDR_LEVEL=3`, `NCCL_IB_TIMEOUT=23`,
  `NCCL_P2P_DISABLE=1`) are situational, never defaults: set them in
  `spec.nccl.env` when a cluster needs them.
- User variables (`spec.nccl.env`) win over every default; each override is
  reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from meshplan.explain import Explanation  # noqa: F401  (re-exported: render.nccl.Explanation)

TRANSPORTS = ("auto", "nvlink", "infiniband", "roce", "efa", "tcp")

_SRC_PLANNER = "docs/planner.md, NCCL environment facts"
_SRC_NCCL = "NCCL env docs (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)"
_SRC_GB200 = "AIConfigurator GB200 profile via docs/planner.md; NVIDIA DRA driver ComputeDomain docs"
_SRC_EFA = "aws-ofi-nccl / AWS EFA documentation; AIConfigurator transport notes (TCP fallback ~10x TTFT)"


@dataclass(frozen=True)
class GroupTopology:
    """What NCCL settings depend on, for one replica group."""

    nodes: int                       # distinct nodes the group's pods sit on
    nvlink: bool                     # GPUs are NVLink-connected inside a domain
    multi_node_nvlink: bool          # the group spans nodes of one NVLink clique (MNNVL)
    spans_domains: bool = False      # stages sit in different NVLink domains (traffic over the NIC)
    rdma_fabric: str = ""            # "ib" | "roce" | "efa" when the pods request the block's RDMA resource
    rdma_resource: str = ""          # that resource (named in explanations)


# spec.nccl.transport each RDMA fabric means
FABRIC_TRANSPORT = {"ib": "infiniband", "roce": "roce", "efa": "efa"}
_SRC_RDMA = ("k8s-rdma-shared-dev-plugin README (github.com/Mellanox/k8s-rdma-shared-dev-plugin); NVIDIA network "
             "operator docs (RDMA pods: IPC_LOCK); aws-efa-k8s-device-plugin README")
_SRC_NVSHMEM = ("NVSHMEM environment variables (docs.nvidia.com/nvshmem/api/gen/env.html); DeepEP docs/legacy.md "
                "(NVSHMEM, InfiniBand/RoCE)")


@dataclass(frozen=True)
class NcclResult:
    env: tuple[dict[str, Any], ...]          # Kubernetes EnvVar dicts, defaults then user's
    explain: tuple[Explanation, ...]
    needs_compute_domain: bool = False


def nccl_env(
    group: GroupTopology,
    transport: str = "auto",
    *,
    socket_ifname: str | None = None,
    ib_hca: str | None = None,
    user_env: Sequence[Mapping[str, Any]] = (),
    compute_domain_available: bool = False,
) -> NcclResult:
    """NCCL variables for one replica group; see the module docstring for the rules."""
    if transport not in TRANSPORTS:
        raise ValueError(f"spec.nccl.transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    defaults: dict[str, tuple[str, str, str]] = {}       # name -> (value, reason, source)
    notes: list[Explanation] = []

    def put(name: str, value: str, reason: str, source: str) -> None:
        defaults[name] = (value, reason, source)

    if group.nvlink:
        put("NCCL_P2P_LEVEL", "NVL", "GPUs of a TP/EP group share NVLink: use P2P over NVLink", _SRC_PLANNER)
    else:
        notes.append(Explanation("env NCCL_P2P_LEVEL", "(NCCL default)",
                                 "PCIe-only GPUs: NCCL chooses PCIe P2P where the platform allows, else SHM",
                                 _SRC_NCCL))

    needs_cd = False
    if group.multi_node_nvlink:
        why = "the group spans nodes of one multi-node NVLink domain (GB200 NVL72 clique)"
        put("NCCL_MNNVL_ENABLE", "1", f"{why}: enable multi-node NVLink", _SRC_GB200)
        put("NCCL_CUMEM_ENABLE", "1", "MNNVL shares memory through cuMem handles", _SRC_GB200)
        put("NCCL_NVLS_ENABLE", "1", "NVLink SHARP on the NVSwitch fabric", _SRC_GB200)
        if compute_domain_available:
            needs_cd = True
            notes.append(Explanation("resourceClaim imex-channel", "ComputeDomain",
                                     "MNNVL needs an IMEX channel; the NVIDIA DRA driver injects it through a "
                                     "ComputeDomain claim", _SRC_GB200))
        else:
            notes.append(Explanation("resourceClaim imex-channel", "(none)",
                                     "MNNVL needs an IMEX channel but the ComputeDomain CRD "
                                     "(resource.nvidia.com) is not installed: the nodes must run nvidia-imex",
                                     _SRC_GB200, "warning"))

    crosses_nic = group.nodes > 1 and (not group.multi_node_nvlink or group.spans_domains)
    if group.nodes > 1 and socket_ifname:
        put("NCCL_SOCKET_IFNAME", socket_ifname, "bootstrap/TCP interfaces from spec.nccl.socketIfname", _SRC_NCCL)
        put("GLOO_SOCKET_IFNAME", socket_ifname, "torch CPU process groups (vLLM/SGLang) on the same interfaces",
            "PyTorch distributed docs")
    if crosses_nic and transport == "auto" and group.rdma_fabric:
        transport = FABRIC_TRANSPORT[group.rdma_fabric]
        notes.append(Explanation("spec.nccl.transport", f"auto -> {transport}",
                                 f"the group's nodes form one {group.rdma_fabric} network block and the pods request "
                                 f"{group.rdma_resource}", _SRC_RDMA))
    elif crosses_nic and transport in ("infiniband", "roce", "efa") and not group.rdma_fabric:
        notes.append(Explanation("spec.nccl.transport", transport,
                                 f"transport {transport} but the nodes advertise no RDMA resource (chart value "
                                 "network.rdmaResources), so none is requested and the pod sees no verbs device: "
                                 "IB/EFA variables are not forced; NCCL probes and falls back to sockets", _SRC_RDMA,
                                 "warning"))
        transport = "auto-unforced"
    if crosses_nic:
        if transport == "auto-unforced":
            pass
        elif transport in ("infiniband", "roce"):
            put("NCCL_IB_DISABLE", "0", f"spec.nccl.transport={transport}: use IB verbs between nodes", _SRC_NCCL)
            if ib_hca:
                put("NCCL_IB_HCA", ib_hca, "adapters from spec.nccl.ibHca", _SRC_NCCL)
            if transport == "roce":
                put("NCCL_IB_GID_INDEX", "3", "RoCE v2 over IPv4 is conventionally GID index 3 (check show_gids)",
                    _SRC_PLANNER)
        elif transport == "efa":
            put("FI_PROVIDER", "efa", "libfabric provider for AWS EFA (aws-ofi-nccl plugin)", _SRC_EFA)
            put("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA over EFA", _SRC_EFA)
            notes.append(Explanation("env NCCL_NET", "(not forced)",
                                     "check the NCCL log for NET/OFI: a silent fallback to sockets costs ~10x TTFT",
                                     _SRC_EFA, "warning"))
        elif transport == "tcp":
            put("NCCL_IB_DISABLE", "1", "spec.nccl.transport=tcp: no IB verbs", _SRC_NCCL)
            put("NCCL_NET", "Socket", "spec.nccl.transport=tcp: force the socket transport", _SRC_NCCL)
        elif transport == "nvlink":
            notes.append(Explanation("spec.nccl.transport", "nvlink",
                                     "the group crosses NVLink domains, so some traffic must use the NIC; "
                                     "set infiniband/roce/efa/tcp or auto", _SRC_PLANNER, "warning"))
        else:  # auto
            notes.append(Explanation("spec.nccl.transport", "auto",
                                     "NCCL probes IB verbs, then sockets; pin the transport to make a fallback loud",
                                     _SRC_NCCL))

    env: list[dict[str, Any]] = []
    explain: list[Explanation] = []
    user = {e["name"]: e for e in user_env}
    for name, (value, reason, source) in defaults.items():
        if name in user:
            u = user[name]
            shown = u.get("value", "(from a Secret)")
            explain.append(Explanation(f"env {name}", str(shown),
                                       f"spec.nccl.env overrides meshplan's default {value!r} ({reason})",
                                       source, "warning"))
            continue
        env.append({"name": name, "value": value})
        explain.append(Explanation(f"env {name}", value, reason, source))
    for name, u in user.items():
        env.append(dict(u))
        if name not in defaults:
            explain.append(Explanation(f"env {name}", str(u.get("value", "(from a Secret)")), "from spec.nccl.env"))
    explain.extend(notes)
    return NcclResult(env=tuple(env), explain=tuple(explain), needs_compute_domain=needs_cd)


def nvshmem_env(group: GroupTopology, args: Sequence[str], *, ib_hca: str | None = None,
                user_env: Sequence[Mapping[str, Any]] = ()) -> tuple[list[dict[str, Any]], list[Explanation]]:
    """NVSHMEM variables for an engine that runs DeepEP across nodes (see the module doc): ([EnvVar], [why])."""
    if not any("deepep" in str(a).lower() for a in args) or group.nodes <= 1 or group.multi_node_nvlink:
        return [], []
    user = {e.get("name") for e in user_env}
    out: list[dict[str, Any]] = []
    why: list[Explanation] = []
    if group.rdma_fabric == "efa":
        return [], [Explanation("env NVSHMEM_IB_ENABLE_IBGDA", "(not set)",
                                "DeepEP's GPU-initiated RDMA (IBGDA) needs mlx5 NICs; on EFA pick another "
                                "all-to-all backend", _SRC_NVSHMEM, "warning")]
    if group.rdma_fabric not in ("ib", "roce"):
        return [], [Explanation("env NVSHMEM_IB_ENABLE_IBGDA", "(not set)",
                                "DeepEP across nodes needs RDMA, and the pods request no RDMA resource",
                                _SRC_NVSHMEM, "warning")]
    want = [("NVSHMEM_IB_ENABLE_IBGDA", "1", "DeepEP's internode and low-latency kernels use GPU-initiated RDMA")]
    if ib_hca:
        want.append(("NVSHMEM_HCA_LIST", ib_hca, "the same adapters as NCCL (spec.nccl.ibHca)"))
    if group.rdma_fabric == "roce":
        want.append(("NVSHMEM_IB_GID_INDEX", "3", "RoCE v2 over IPv4 is conventionally GID index 3 (as NCCL)"))
    for name, value, reason in want:
        if name in user:
            why.append(Explanation(f"env {name}", "(spec.nccl.env)", f"spec.nccl.env overrides {value!r} ({reason})",
                                   _SRC_NVSHMEM, "warning"))
            continue
        out.append({"name": name, "value": value})
        why.append(Explanation(f"env {name}", value, reason, _SRC_NVSHMEM))
    return out, why


def rdma_request(resource: str, per_node: int, gpus_per_pod: int, gpus_per_node: int) -> int:
    """How many of the node's RDMA resource one pod requests.

    - `rdma/*` (RDMA shared device plugin): 1. The plugin advertises `rdmaHcaMax` shares of ONE pool of
      HCAs; one share gives the pod every device of the pool (plugin README).
    - anything else (`nvidia.com/hostdev` VFs/PFs, `vpc.amazonaws.com/efa` interfaces) is exclusive: the
      pod's share of the node's devices by GPUs (8 GPUs of 8 with 8 NICs -> 8; 4 of 8 -> 4), at least 1.
    """
    if resource.startswith("rdma/"):
        return 1
    if gpus_per_node <= 0:
        return max(1, per_node)
    return max(1, per_node * gpus_per_pod // gpus_per_node)

