"""Wide expert parallelism on a real control plane (issue 18 'Done when'): DeepSeek-R1 at DP32+EP and
DP16+EP on a fleet of 4 x 8 H200 nodes advertising `rdma/ib` reaches Available, every rank gang-gated and
all ranks in one network block; a lost node restarts the whole group, never half of it.

The fleet is private (kwok nodes `rel-wide-*`, deleted afterwards): 4 HGX H200 nodes in zone-a (one
InfiniBand block) and 2 in zone-b (a second block), labelled as NVIDIA GFD labels them and advertising
8 x `rdma/ib` as the RDMA shared device plugin does (operator/meshplan/fleets/hgx-h200-ib.yaml).
kwok runs no containers: what is checked is what the operator creates, where the scheduler binds it and
how the group is released and restarted.
"""

from __future__ import annotations

import time

import pytest

from e2e.reliability import kit
from e2e.reliability.test_capacity import HalfWatch

pytestmark = [pytest.mark.e2e]
GLOB = "mpwide-*"
H200 = "NVIDIA-H200"


def h200_group(prefix: str, count: int, zone: str) -> dict:
    return {"namePrefix": prefix, "count": count, "zone": zone, "gpusPerNode": 8, "product": H200,
            "memoryMiB": 143771, "family": "hopper", "cpu": "224", "memory": "2Ti", "rdma": {"rdma/ib": 8}}


@pytest.fixture(scope="module")
def fleet(cluster):
    kit.ensure_crd(cluster)
    f = kit.Fleet(cluster, "rel-wide", [h200_group("rel-wide-a", 4, "zone-a"), h200_group("rel-wide-b", 2, "zone-b")])
    f.add()
    yield f
    f.delete()


@pytest.fixture(scope="module")
def op(cluster, fleet, request):
    yield from kit.serve_module(cluster, request, GLOB)


@pytest.fixture
def ns(cluster, op, request):
    import uuid

    name = kit.namespace(cluster, "mpwide", f"{request.node.name[5:30]}-{uuid.uuid4().hex[:6]}")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def deepseek(name: str, expert: int, replicas: int) -> dict:
    """DeepSeek-R1 pinned to attention-DP x EP (`expert` GPUs per replica, TP1), SGLang, no SLO."""
    m = kit.pinned(name, "rel-wide", H200, tensor=1, replicas=replicas, max_gpus=expert * replicas)
    m["spec"]["model"] = {"name": "deepseek-r1", "weights": {"uri": "hf://deepseek-ai/DeepSeek-R1"}}
    m["spec"]["precision"] = {"weights": "fp8", "kvCache": "fp8"}
    m["spec"]["engine"] = {"kind": "sglang"}
    m["spec"]["parallelism"] = {"tensor": 1, "expert": expert, "pipeline": 1}
    return m


def zone(cluster, node: str) -> str:
    return kit.node(cluster, node)["metadata"]["labels"]["topology.kubernetes.io/zone"]


def check_wide_groups(cluster, ns: str, name: str, replicas: int, pods_per_group: int) -> dict[str, list[dict]]:
    g = kit.groups(kit.pods(cluster, ns), name)
    assert len(g) == replicas, sorted(g)
    for key, members in g.items():
        assert len(members) == pods_per_group, (key, len(members))
        nodes = [p["spec"]["nodeName"] for p in members]
        assert len(set(nodes)) == pods_per_group, nodes                 # one pod per 8-GPU node
        assert len({zone(cluster, n) for n in nodes}) == 1, nodes        # one network block
        for p in members:
            c = p["spec"]["containers"][0]
            assert c["resources"]["limits"]["rdma/ib"] == "1" and c["resources"]["limits"]["nvidia.com/gpu"] == "8"
            assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
            assert kit.group_size(p) == pods_per_group
    return g


@pytest.mark.parametrize("expert, replicas", [(32, 1), (16, 2)])
def test_wide_ep_reaches_available_in_one_block(cluster, ns, expert, replicas):
    name = f"ds-ep{expert}"
    kit.apply(cluster, ns, deepseek(name, expert, replicas))
    hw = HalfWatch(cluster, ns)
    hw.until(lambda: (o := kit.get(cluster, ns, "llmd", name)) and (o.get("status") or {}).get("readyReplicas", 0) >= replicas
             and kit.cond(o, "Available").get("status") == "True", 120, f"{name} Available")
    assert hw.worst <= 5.0, f"a group was half-released for {hw.worst:.1f}s"
    g = check_wide_groups(cluster, ns, name, replicas, expert // 8)
    if expert == 32:
        # 32 GPUs fit only zone-a's block (4 nodes); zone-b's two nodes never take part
        assert {zone(cluster, p["spec"]["nodeName"]) for m in g.values() for p in m} == {"zone-a"}
    obj = kit.get(cluster, ns, "llmd", name)
    assert kit.cond(obj, "Placed")["status"] == "True"


def test_a_lost_node_restarts_the_whole_wide_group(cluster, ns, fleet):
    name = "ds-kill"
    kit.apply(cluster, ns, deepseek(name, 16, 1))
    kit.available(cluster, ns, name, timeout_s=120)
    (key, before), = check_wide_groups(cluster, ns, name, 1, 2).items()
    old_uids = {p["metadata"]["uid"] for p in before}
    victim = before[1]["spec"]["nodeName"]
    t0 = time.monotonic()
    kit.make_not_ready(cluster, victim)
    hw = HalfWatch(cluster, ns)

    def restarted() -> bool:
        groups = kit.groups(kit.pods(cluster, ns), name)
        if len(groups) != 1:
            return False
        (members,) = groups.values()
        o = kit.get(cluster, ns, "llmd", name)
        return (len(members) == 2 and not {p["metadata"]["uid"] for p in members} & old_uids
                and victim not in {p["spec"].get("nodeName") for p in members}
                and (o.get("status") or {}).get("readyReplicas", 0) >= 1)

    hw.until(restarted, 120, "the group re-created whole off the lost node and ready")
    took = time.monotonic() - t0
    assert hw.worst <= 5.0, f"a group was half-running for {hw.worst:.1f}s"
    check_wide_groups(cluster, ns, name, 1, 2)
    print(f"wide EP16 group restarted whole {took:.1f}s after its node was lost; "
          f"longest half-running {hw.worst:.1f}s")
