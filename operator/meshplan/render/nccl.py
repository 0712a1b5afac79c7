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
    if crosses_nic:
        if transport in ("infiniband", "roce"):
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
