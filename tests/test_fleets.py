"""Fleet files become Nodes with NVIDIA GFD labels and device-plugin allocatable."""

import pytest

from meshplan.devcluster.fleets import fleet_names, fleet_nodes, load_fleet


def test_builtin_fleets_present():
    assert {"hgx-h100", "gb200-nvl72", "mixed"} <= set(fleet_names())


def test_hgx_h100_is_four_nodes_of_eight_without_clique():
    nodes = fleet_nodes(load_fleet("hgx-h100"))
    assert len(nodes) == 4
    for n in nodes:
        labels = n["metadata"]["labels"]
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert "nvidia.com/gpu.clique" not in labels
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]


def test_gb200_racks_share_one_clique_each():
    nodes = fleet_nodes(load_fleet("gb200-nvl72"))
    cliques = {}
    for n in nodes:
        cliques.setdefault(n["metadata"]["labels"]["nvidia.com/gpu.clique"], []).append(n)
    assert len(cliques) == 2
    for members in cliques.values():
        assert len(members) == 18
        assert sum(int(m["status"]["allocatable"]["nvidia.com/gpu"]) for m in members) == 72


def test_mixed_has_two_zones_and_pcie_nodes():
    nodes = fleet_nodes(load_fleet("mixed"))
    zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert zones == {"zone-a", "zone-b"}
    assert {"NVIDIA-H200", "NVIDIA-L40S", "NVIDIA-GB200"} <= products
    l40s = [n for n in nodes if n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L40S"]
    assert l40s and all("nvidia.com/gpu.clique" not in n["metadata"]["labels"] for n in l40s)


def test_unknown_fleet_names_the_choices():
    with pytest.raises(ValueError, match="hgx-h100"):
        load_fleet("no-such-fleet")


def test_fleet_from_path(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("nodeGroups:\n- {namePrefix: t, count: 2, gpusPerNode: 2, product: NVIDIA-A100-SXM4-80GB, memoryMiB: 81920}\n")
    nodes = fleet_nodes(load_fleet(str(p)))
    assert [n["metadata"]["name"] for n in nodes] == ["t-0", "t-1"]
    assert nodes[0]["metadata"]["labels"]["meshplan.dev/fleet"] == "tiny"
