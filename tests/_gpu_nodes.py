"""Node/Pod dict builders for the topology, placement and render tests.

Labels follow NVIDIA GPU feature discovery (k8s-device-plugin
docs/gpu-feature-discovery/README.md); the values mirror the built-in fleets in
operator/meshplan/fleets/ (H100 81559 MiB, GB200 189471 MiB, L40S 46068 MiB).
"""

from __future__ import annotations

from typing import Any


def gpu_node(name: str, product: str = "NVIDIA-H100-80GB-HBM3", gpus: int = 8, *, memory_mib: int = 81559,
             family: str = "hopper", zone: str = "zone-a", clique: str | None = None, ready: bool | None = True,
             unschedulable: bool = False, taints: list[dict] | None = None) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "topology.kubernetes.io/zone": zone,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.family": family,
    }
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    status: dict[str, Any] = {"allocatable": {"cpu": "64", "nvidia.com/gpu": str(gpus)}}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": spec, "status": status}


def gpu_pod(name: str, node: str | None, gpus: int, *, phase: str = "Running", use_request: bool = True,
            annotations: dict | None = None, labels: dict | None = None) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if use_request:
        res["requests"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {},
                         "labels": labels or {}},
            "spec": spec, "status": {"phase": phase}}


def hgx_h100(n: int = 4, zone: str = "zone-a", prefix: str = "hgx") -> list[dict]:
    return [gpu_node(f"{prefix}-{i}", zone=zone) for i in range(n)]


def gb200_nvl72(racks: int = 1, nodes_per_rack: int = 18, zone: str = "zone-a") -> list[dict]:
    out = []
    for r in range(racks):
        for i in range(nodes_per_rack):
            out.append(gpu_node(f"nvl72-{r}-{i:02d}", "NVIDIA-GB200", 4, memory_mib=189471, family="blackwell",
                                zone=zone, clique=f"9a8f6c1e-0000-4000-8000-00000000a001.{r + 1}"))
    return out


def l40s(n: int = 2, gpus: int = 4, zone: str = "zone-a") -> list[dict]:
    return [gpu_node(f"l40s-{i}", "NVIDIA-L40S", gpus, memory_mib=46068, family="ada-lovelace", zone=zone)
            for i in range(n)]
