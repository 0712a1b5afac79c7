"""Topology from Node/Pod dicts: capacity, exclusions, NVLink domains."""

from __future__ import annotations

from _gpu_nodes import gb200_nvl72, gpu_node, gpu_pod, hgx_h100, l40s

from meshplan.topology import (
    ASSIGNED_NODE_ANNOTATION,
    build_topology,
    build_topology_from_infos,
    node_info,
    pod_gpu_usage,
    pod_gpus,
)


def test_free_gpus_subtract_requests_of_bound_unfinished_pods():
    nodes = hgx_h100(2)
    pods = [
        gpu_pod("a", "hgx-0", 4),
        gpu_pod("b", "hgx-0", 2, use_request=False),     # limit only counts too
        gpu_pod("done", "hgx-0", 8, phase="Succeeded"),  # finished: frees its GPUs
        gpu_pod("failed", "hgx-1", 8, phase="Failed"),
        gpu_pod("pending", None, 8, phase="Pending"),    # not bound: holds nothing
    ]
    topo = build_topology(nodes, pods)
    assert topo.nodes["hgx-0"].free_gpus == 2
    assert topo.nodes["hgx-1"].free_gpus == 8
    assert topo.free_gpus_by_domain() == {"hgx-0": 2, "hgx-1": 8}
    assert topo.total_gpus == 16 and topo.free_gpus == 10


OWNER = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "name": "x", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}


def _owned(pod: dict, owner: dict = OWNER) -> dict:
    pod["metadata"]["ownerReferences"] = [dict(owner)]
    return pod


def test_gated_pod_with_assigned_node_reserves_gpus():
    pod = _owned(gpu_pod("gated", None, 4, phase="Pending", annotations={ASSIGNED_NODE_ANNOTATION: "hgx-1"}))
    assert pod_gpu_usage(pod) == ("hgx-1", 4)
    topo = build_topology(hgx_h100(2), [pod])
    assert topo.nodes["hgx-1"].free_gpus == 4


def test_only_the_operators_own_pods_reserve_through_the_annotation():
    """Issue 17 finding 4: anyone's pod with the annotation and a GPU limit was a reservation."""
    spoofed = [
        gpu_pod("plain", None, 8, phase="Pending", annotations={ASSIGNED_NODE_ANNOTATION: "hgx-0"}),
        _owned(gpu_pod("other-kind", None, 8, phase="Pending", annotations={ASSIGNED_NODE_ANNOTATION: "hgx-1"}),
               {**OWNER, "apiVersion": "apps/v1", "kind": "ReplicaSet"}),
        _owned(gpu_pod("not-controller", None, 8, phase="Pending",
                       annotations={ASSIGNED_NODE_ANNOTATION: "hgx-2"}), {**OWNER, "controller": False}),
    ]
    assert [pod_gpu_usage(p) for p in spoofed] == [None, None, None]
    assert build_topology(hgx_h100(3), spoofed).free_gpus == 24
    # an owned pod of a namespace the operator does not serve: no reservation either
    owned = _owned(gpu_pod("owned", None, 4, phase="Pending", annotations={ASSIGNED_NODE_ANNOTATION: "hgx-0"}))
    assert pod_gpu_usage(owned, reservations=False) is None
    # bound and running, any pod's GPUs are usage (whoever owns it)
    assert pod_gpu_usage(gpu_pod("bound", "hgx-0", 8, annotations={ASSIGNED_NODE_ANNOTATION: "hgx-1"})) == ("hgx-0", 8)


def test_ignore_pod_leaves_own_pods_out():
    pods = [gpu_pod("mine", "hgx-0", 8, labels={"meshplan.dev/deployment": "x"}), gpu_pod("other", "hgx-0", 0)]
    topo = build_topology(hgx_h100(1), pods,
                          ignore_pod=lambda p: p["metadata"]["labels"].get("meshplan.dev/deployment") == "x")
    assert topo.nodes["hgx-0"].free_gpus == 8


def test_init_and_sidecar_containers_follow_effective_request_rule():
    pod = gpu_pod("p", "hgx-0", 2)
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
    ]
    assert pod_gpus(pod) == 4          # max(2 + 1, 4)
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert pod_gpus(pod) == 3


def test_unschedulable_notready_and_tainted_nodes_are_not_capacity():
    nodes = [
        gpu_node("ok"),
        gpu_node("cordoned", unschedulable=True),
        gpu_node("notready", ready=False),
        gpu_node("noready", ready=None),
        gpu_node("tainted", taints=[{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]),
        gpu_node("evicting", taints=[{"key": "x", "effect": "NoExecute"}]),
        gpu_node("preferred", taints=[{"key": "soft", "effect": "PreferNoSchedule"}]),
        gpu_node("gputaint", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    ]
    topo = build_topology(nodes)
    assert sorted(topo.nodes) == ["gputaint", "ok", "preferred"]
    reasons = dict(topo.excluded)
    assert "cordoned" in reasons["cordoned"]
    assert reasons["notready"] == "NotReady"
    assert "no Ready condition" in reasons["noready"]
    assert "maintenance" in reasons["tainted"]
    assert "NoExecute" in reasons["evicting"]
    assert topo.total_gpus == 24


def test_caller_tolerations_admit_tainted_node_and_ready_if_unknown():
    tainted = gpu_node("t", taints=[{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}], ready=None)
    assert not node_info(tainted).schedulable
    tol = [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]
    assert node_info(tainted, tolerations=tol, ready_if_unknown=True).schedulable
    wrong = [{"key": "dedicated", "operator": "Equal", "value": "other"}]
    assert not node_info(tainted, tolerations=wrong, ready_if_unknown=True).schedulable


def test_node_without_gpus_is_ignored():
    cpu = gpu_node("cpu")
    cpu["status"]["allocatable"].pop("nvidia.com/gpu")
    assert node_info(cpu) is None
    assert build_topology([cpu]).domains == ()


def test_hgx_nodes_are_one_domain_each_with_nvlink():
    topo = build_topology(hgx_h100(3))
    assert [d.name for d in topo.domains] == ["hgx-0", "hgx-1", "hgx-2"]
    d = topo.domain("hgx-1")
    assert (d.kind, d.nodes, d.total_gpus, d.nvlink, d.nvlink_gpus) == ("node", ("hgx-1",), 8, True, 8)
    assert d.match_labels == (("kubernetes.io/hostname", "hgx-1"),)


def test_clique_groups_nodes_into_one_multi_node_domain():
    nodes = gb200_nvl72(racks=2, nodes_per_rack=18)
    pods = [gpu_pod("p", "nvl72-1-03", 4)]
    topo = build_topology(nodes, pods)
    assert len(topo.domains) == 2
    rack2 = topo.domain_of("nvl72-1-03")
    assert rack2.kind == "clique" and rack2.multi_node
    assert rack2.total_gpus == 72 and rack2.free_gpus == 68 and rack2.gpus_per_node == 4
    assert rack2.nvlink_gpus == 72
    assert rack2.match_labels == (("nvidia.com/gpu.clique", rack2.name),)


def test_clique_split_when_zone_differs():
    nodes = [gpu_node("a", "NVIDIA-GB200", 4, zone="z1", clique="c.1"),
             gpu_node("b", "NVIDIA-GB200", 4, zone="z2", clique="c.1")]
    topo = build_topology(nodes)
    assert len(topo.domains) == 2
    assert all(d.zone in d.name for d in topo.domains)
    assert all(("topology.kubernetes.io/zone", d.zone) in d.match_labels for d in topo.domains)


def test_pcie_node_is_a_domain_without_nvlink():
    topo = build_topology(l40s(2, gpus=4))
    d = topo.domain("l40s-0")
    assert not d.nvlink and d.total_gpus == 4 and d.nvlink_gpus == 1


def test_incremental_build_matches_full_build():
    nodes = hgx_h100(2) + gb200_nvl72(1, 4)
    pods = [gpu_pod("a", "hgx-1", 3), gpu_pod("b", "nvl72-0-02", 4), gpu_pod("c", "hgx-1", 1)]
    full = build_topology(nodes, pods)
    infos = [node_info(n) for n in nodes]
    usage = [pod_gpu_usage(p) for p in pods]
    assert build_topology_from_infos(infos, usage) == full


def test_with_usage_and_to_fleet():
    topo = build_topology(hgx_h100(2) + l40s(1))
    after = topo.with_usage([("hgx-0", 8), ("l40s-0", 1)])
    assert after.free_gpus_by_domain() == {"hgx-0": 0, "hgx-1": 8, "l40s-0": 3}
    fleet = after.named("t")
    by_name = {d.name: d for d in fleet.domains}
    assert (by_name["hgx-0"].free_gpus, by_name["hgx-1"].free_gpus, by_name["l40s-0"].free_gpus) == (0, 8, 3)
    assert by_name["hgx-0"].gpu == "h100_sxm" and by_name["l40s-0"].nvlink is False
    assert fleet.free_gpus == after.free_gpus == 11


def _mixed_fleet() -> list[dict]:
    """HGX nodes in two zones, two NVL72 racks, and one clique whose trays sit in two zones (split)."""
    nodes = hgx_h100(3, zone="zone-a") + hgx_h100(2, zone="zone-b", prefix="hgxb") + gb200_nvl72(2, 4)
    nodes += [gpu_node("split-a", "NVIDIA-GB200", 4, zone="zone-a", clique="c.9"),
              gpu_node("split-b", "NVIDIA-GB200", 4, zone="zone-b", clique="c.9")]
    for n in nodes[:2]:
        n["metadata"]["labels"]["team"] = "x"
    nodes[7]["metadata"]["labels"]["team"] = "x"          # one tray of a rack: that domain is cut
    return nodes


def _rebuilt(topo, keep):
    """What select/with_usage must equal: the full build over the kept nodes and their usage."""
    states = [s for n, s in topo.nodes.items() if keep(s.info)]
    return build_topology_from_infos([s.info for s in states], [(s.name, s.used_gpus) for s in states])


def test_select_equals_a_rebuild_of_the_matching_nodes():
    pods = [gpu_pod("a", "hgx-1", 3), gpu_pod("b", "nvl72-0-02", 4), gpu_pod("c", "split-b", 2)]
    topo = build_topology(_mixed_fleet(), pods)
    selectors = [{"topology.kubernetes.io/zone": "zone-a"},              # drops one part of the split clique
                 {"topology.kubernetes.io/zone": "zone-b"},
                 {"nvidia.com/gpu.product": "NVIDIA-GB200"},             # keeps both parts
                 {"team": "x"},                                          # cuts a rack domain
                 {"team": "nobody"}]
    for sel in selectors:
        got = topo.select(sel)
        want = _rebuilt(topo, lambda i: i.matches(sel))
        assert (got.nodes, got.domains) == (want.nodes, want.domains), sel
        assert got.excluded == topo.excluded
        assert topo.select(dict(sel)) is got                             # asked again: the same view
    names = {d.name for d in topo.select({"topology.kubernetes.io/zone": "zone-a"}).domains}
    assert "c.9" in names and not any(n.startswith("c.9/") for n in names)    # no longer split


def test_with_usage_equals_a_rebuild_with_the_extra_usage():
    topo = build_topology(_mixed_fleet(), [gpu_pod("a", "hgx-1", 3)])
    extra = [("hgx-1", 2), ("nvl72-1-03", 4), ("nvl72-1-03", 1), ("split-a", 4), ("no-such-node", 8)]
    got = topo.with_usage(extra)
    used = {n: s.used_gpus for n, s in topo.nodes.items()}
    for n, g in extra:
        if n in used:
            used[n] += g
    want = build_topology_from_infos([s.info for s in topo.nodes.values()], used)
    assert (got.nodes, got.domains) == (want.nodes, want.domains)
    assert got.domain_of("nvl72-1-03").free_gpus == 16 - 4              # a tray's free GPUs stop at 0
    assert topo.domain_of("nvl72-1-03").free_gpus == 16                 # the original is unchanged
    assert topo.with_usage([]) is topo
