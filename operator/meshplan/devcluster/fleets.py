"""GPU fleet files -> simulated Node objects.

A fleet file (`operator/meshplan/fleets/*.yaml`) lists node groups. Each node
becomes a kwok-managed Node carrying what real GPU nodes carry:

- allocatable/capacity `nvidia.com/gpu` (NVIDIA k8s-device-plugin), which
  kube-scheduler's NodeResourcesFit enforces;
- the GPU feature discovery labels `nvidia.com/gpu.product`, `.count`,
  `.memory` (MiB), `.family`, and `nvidia.com/gpu.clique` for nodes in one
  multi-node NVLink (IMEX) domain such as a GB200 NVL72 rack
  (k8s-device-plugin docs/gpu-feature-discovery/README.md);
- `topology.kubernetes.io/zone` and `kubernetes.io/hostname`;
- optional RDMA resources (`rdma: {rdma/ib: 8}`) in allocatable/capacity, as the
  RDMA shared device plugin (github.com/Mellanox/k8s-rdma-shared-dev-plugin), NVIDIA
  network operator's host-device network (`nvidia.com/hostdev`) or the AWS EFA
  device plugin (`vpc.amazonaws.com/efa`) advertise them: the second tier of the
  topology (network blocks, `meshplan.topology`).

Nodes also carry `meshplan.dev/fleet=<name>` so several fleets can share one
dev cluster and tests can select one.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

FLEET_LABEL = "meshplan.dev/fleet"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def fleet_names() -> list[str]:
    pkg = resources.files("meshplan") / "fleets"
    return sorted(p.name[:-5] for p in pkg.iterdir() if p.name.endswith(".yaml"))


def load_fleet(name_or_path: str) -> dict[str, Any]:
    """Load a fleet by built-in name (`hgx-h100`) or by path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        text = p.read_text()
    else:
        res = resources.files("meshplan") / "fleets" / f"{name_or_path}.yaml"
        if not res.is_file():
            raise ValueError(f"unknown fleet {name_or_path!r}: use one of {', '.join(fleet_names())} or a YAML path")
        text = res.read_text()
    fleet = yaml.safe_load(text)
    if not isinstance(fleet, dict) or not fleet.get("nodeGroups"):
        raise ValueError(f"fleet {name_or_path!r}: expected a mapping with nodeGroups")
    fleet.setdefault("name", p.stem if p.exists() else name_or_path)
    return fleet


def fleet_nodes(fleet: dict[str, Any]) -> list[dict[str, Any]]:
    """Node manifests (with status) for every node of the fleet."""
    nodes = []
    for g in fleet["nodeGroups"]:
        for i in range(int(g["count"])):
            name = f"{g['namePrefix']}-{i}"
            gpus = str(int(g["gpusPerNode"]))
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": g.get("arch", "amd64"),
                "type": "kwok",
                FLEET_LABEL: fleet["name"],
                "topology.kubernetes.io/zone": g.get("zone", "zone-a"),
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": g["product"],
                "nvidia.com/gpu.count": gpus,
                "nvidia.com/gpu.memory": str(int(g["memoryMiB"])),
                "nvidia.com/gpu.family": g.get("family", ""),
            }
            if g.get("clique"):
                labels["nvidia.com/gpu.clique"] = str(g["clique"])
            labels.update(g.get("labels") or {})
            resources_ = {
                "cpu": str(g.get("cpu", "64")),
                "memory": str(g.get("memory", "512Gi")),
                "pods": str(g.get("pods", 110)),
                "ephemeral-storage": "1Ti",
                "nvidia.com/gpu": gpus,
            }
            resources_.update({str(k): str(int(v)) for k, v in (g.get("rdma") or {}).items()})
            nodes.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
                "spec": {"taints": list(g.get("taints") or [])},
                "status": {
                    "capacity": dict(resources_),
                    "allocatable": dict(resources_),
                    "nodeInfo": {"architecture": labels["kubernetes.io/arch"], "operatingSystem": "linux",
                                 "kubeletVersion": "fake", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                                 "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
                    "phase": "Running",
                },
            })
    return nodes
