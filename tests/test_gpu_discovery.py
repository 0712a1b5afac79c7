"""GPU discovery as real clusters label nodes (issue #16, part A).

Fed with the label sets NVIDIA's and AMD's documentation print (tests/fixtures/nodes/*.yaml, each with its
`# source:`), wrapped as `kubectl get nodes -o yaml` prints them. Only unknown-product.yaml is made up, on
purpose: it is the product no catalogue can know.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from meshplan.catalog.gpus import GPUS, clear_custom_gpus, get_gpu, load_gpu_catalog, parse_gpu_catalog
from meshplan.cli import main
from meshplan.commands.plan import read_kube_objects
from meshplan.planner import plan_for_spec
from meshplan.planner.fleet import fleet_from_objects
from meshplan.topology import build_topology, node_info, product_has_nvlink

FIX = Path(__file__).parent / "fixtures" / "nodes"
ROOT = Path(__file__).parent.parent


@pytest.fixture(autouse=True)
def _no_declared_gpus():
    clear_custom_gpus()
    yield
    clear_custom_gpus()


def nodes(name: str) -> list[dict]:
    return read_kube_objects(str(FIX / name), "Node")


def llmd(**spec) -> dict:
    base = {"model": {"name": "llama-3.1-8b"}, "workload": {"inputTokens": 1024, "outputTokens": 256,
                                                          "concurrency": 8}}
    base.update(spec)
    return {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "default", "uid": "u-chat", "generation": 1},
            "spec": base}


def spec_of(doc: dict):
    from meshplan.api.models import LLMDeployment

    return LLMDeployment.from_manifest(doc).spec


# ---- the catalogue -------------------------------------------------------------------------------------

# nvidia.com/gpu.product as GFD writes it (nvidia-smi name, spaces as "-"; sources in the fixtures and in
# catalog/gpus.py) -> catalogue entry, NVLink inside the node or not
PRODUCTS = [
    ("NVIDIA-A100-SXM4-40GB", "a100_sxm_40gb", True), ("A100-SXM4-40GB", "a100_sxm_40gb", True),
    ("NVIDIA-A100-SXM4-80GB", "a100_sxm_80gb", True), ("NVIDIA-A100-PCIE-40GB", "a100_pcie_40gb", False),
    ("NVIDIA-A100-80GB-PCIe", "a100_pcie_80gb", False), ("NVIDIA-H100-80GB-HBM3", "h100_sxm", True),
    ("NVIDIA-H100-PCIe", "h100_pcie", False), ("NVIDIA-H100-NVL", "h100_nvl", False),
    ("NVIDIA-H200", "h200_sxm", True), ("NVIDIA-H200-NVL", "h200_nvl", False),
    ("NVIDIA-GH200-480GB", "gh200_96gb", False), ("NVIDIA-B200", "b200_sxm", True),
    ("NVIDIA-B300-SXM6-AC", "b300_sxm", True), ("NVIDIA-B300-SXM6-AC-269GB", "b300_sxm", True), ("NVIDIA-GB200", "gb200", True), ("NVIDIA-GB300", "gb300", True),
    ("NVIDIA-L4", "l4", False), ("NVIDIA-L40", "l40", False), ("NVIDIA-L40S", "l40s", False),
    ("NVIDIA-A10", "a10", False), ("NVIDIA-A10G", "a10", False), ("Tesla-T4", "t4", False),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "rtx_pro_6000", False),
    ("AMD_Instinct_MI300X_OAM", "mi300x", True), ("AMD_Instinct_MI325X_OAM", "mi325x", True),
    ("AMD_Instinct_MI355X_OAM", "mi355x", True),
]


@pytest.mark.parametrize("label,name,nvlink", PRODUCTS)
def test_every_datacenter_product_string_is_known_with_its_interconnect(label, name, nvlink):
    g = get_gpu(label)
    assert g.name == name
    assert product_has_nvlink(label) is nvlink
    assert (g.nvlink_domain > 1) is nvlink
    assert g.interconnect and g.source and g.memory_gib > 0 and g.hbm_tb_s > 0 and g.tflops


def test_every_catalogue_entry_names_its_source_and_dense_flops():
    for g in GPUS.values():
        assert "datasheet" in g.source.lower(), g.name
        assert all(v > 0 for v in g.tflops.values()), g.name
        # dense BF16 (or FP16 on T4) is never above dense FP8, which is never above dense FP4
        base = g.tflops.get("bf16", g.tflops.get("fp16"))
        assert base and base <= g.tflops.get("fp8", base) <= g.tflops.get("fp4", g.tflops.get("fp8", base))


def test_mig_and_shared_product_labels_name_the_slice():
    g = get_gpu("A100-SXM4-40GB-MIG-1g.5gb")
    assert g.name == "a100_sxm_40gb/mig-1g.5gb" and g.nvlink_domain == 1 and g.gpus_per_node == 1
    assert g.memory_gib == pytest.approx(5e9 / 2**30) and g.tflops["bf16"] == pytest.approx(312 / 7)
    assert get_gpu("Tesla-T4-SHARED").name == "t4/shared-1"
    # spec.gpus.products may name the slice as the node's label does; the plan then runs on it
    node = copy.deepcopy(nodes("gfd-a100-mig-mixed.yaml")[0])
    node["metadata"]["labels"].update({"nvidia.com/gpu.count": "2", "nvidia.com/mig-7g.40gb.count": "2"})
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0", "nvidia.com/mig-7g.40gb": "2"}
    plan = plan_for_spec(spec_of(llmd(gpus={"maxGpus": 2, "products": ["A100-SXM4-40GB-MIG-7g.40gb"]})),
                         fleet_from_objects([node]))
    assert plan.choice is not None and plan.choice.gpu == "a100_sxm_40gb/mig-7g.40gb"


def test_nvlink_never_rests_on_a_substring():
    # "A100" contains "A10" and "RTX"-free names with "PCIE" inside: only the catalogue entry decides
    assert product_has_nvlink("A100-SXM4-40GB") and product_has_nvlink("NVIDIA-A100-SXM4-80GB")
    assert not product_has_nvlink("NVIDIA-A10")
    assert not product_has_nvlink("NVIDIA-Foo-96GB")        # unknown: no NVLink assumed (and not planned)
    info = node_info(nodes("gfd-a100-sxm4-40gb.yaml")[0])
    assert info.nvlink and info.gpu == "a100_sxm_40gb"


# ---- label sets from the vendors' documentation -------------------------------------------------------

CASES = [
    # file, product label value, resolved GPU, memory GiB, GPUs, NVLink, resource, largest TP/EP group
    ("gfd-a100-sxm4-40gb.yaml", "A100-SXM4-40GB", "a100_sxm_40gb", 39.6, 1, True, "nvidia.com/gpu", 1),
    ("gfd-a100-mig-single-1g5gb.yaml", "A100-SXM4-40GB-MIG-1g.5gb", "a100_sxm_40gb/mig-1g.5gb@4864mib", 4.75, 7,
     False, "nvidia.com/gpu", 1),
    ("gfd-a100-mig-mixed.yaml", "A100-SXM4-40GB", "a100_sxm_40gb/mig-1g.5gb@4864mib", 4.75, 7, False,
     "nvidia.com/mig-1g.5gb", 1),
    ("gfd-t4-time-sliced.yaml", "Tesla-T4-SHARED", "t4/shared-8", 15.0 / 8, 8, False, "nvidia.com/gpu", 1),
    ("amd-mi300x.yaml", "AMD_Instinct_MI300X_OAM", "mi300x", 192.0, 8, True, "amd.com/gpu", 8),
    ("amd-mi325x-beta-labels.yaml", "74a5", "mi325x", 256.0, 8, True, "amd.com/gpu", 8),
]


@pytest.mark.parametrize("fixture,product,gpu,mem_gib,count,nvlink,resource,group", CASES)
def test_vendor_label_sets_give_product_memory_count_and_domain(fixture, product, gpu, mem_gib, count, nvlink,
                                                                resource, group):
    topo = build_topology(nodes(fixture))
    assert len(topo.domains) == 1
    d = topo.domains[0]
    assert (d.product, d.gpu, d.total_gpus, d.nvlink, d.resource) == (product, gpu, count, nvlink, resource)
    assert d.max_group_gpus == group
    assert get_gpu(d.gpu).memory_gib == pytest.approx(mem_gib, rel=0.01)


def test_time_slicing_with_renamed_resources_is_shared_too():
    # renameByDefault=true (NVIDIA cloud-native-docs gpu-operator/gpu-sharing.rst): the resource becomes
    # nvidia.com/gpu.shared and the product label keeps its name
    node = copy.deepcopy(nodes("gfd-t4-time-sliced.yaml")[0])
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-T4"
    node["status"]["allocatable"] = {"nvidia.com/gpu.shared": "8"}
    info = node_info(node)
    assert (info.gpu, info.resource, info.gpus) == ("t4/shared-8", "nvidia.com/gpu.shared", 8)
    pod = {"spec": {"nodeName": info.name, "containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "3"}}}]},
           "status": {"phase": "Running"}}
    assert build_topology([node], [pod]).domains[0].free_gpus == 5


def test_amd_nodes_are_visible_with_infinity_fabric_as_the_node_domain():
    info = node_info(nodes("amd-mi300x.yaml")[0])
    assert info is not None and info.gpus == 8 and info.resource == "amd.com/gpu"
    assert get_gpu(info.gpu).interconnect == "infinity-fabric" and info.nvlink
    assert info.product_label == "amd.com/gpu.product-name" and info.family == "AI"
    # the legacy-prefix-only node: found by its PCI device id, no product label to pin (hostname does)
    beta = node_info(nodes("amd-mi325x-beta-labels.yaml")[0])
    assert beta.gpu == "mi325x" and beta.product_label == ""


def test_the_products_of_a_real_multi_product_cluster_are_all_known():
    topo = build_topology(nodes("gfd-products.yaml"))
    assert {d.name: d.gpu for d in topo.domains} == {
        "a10-0": "a10", "l4-0": "l4", "l40-0": "l40", "a100-pcie-40-0": "a100_pcie_40gb",
        "a100-pcie-80-0": "a100_pcie_80gb", "a100-sxm-80-0": "a100_sxm_80gb", "gh200-0": "gh200_96gb",
        "h200-nvl-0": "h200_nvl", "h100-nvl-0": "h100_nvl", "h100-pcie-0": "h100_pcie",
        "rtx-pro-0": "rtx_pro_6000"}
    assert {d.name for d in topo.domains if d.nvlink} == {"a100-sxm-80-0"}
    assert not fleet_from_objects(nodes("gfd-products.yaml")).unknown


# ---- MIG and time-slicing never host a multi-GPU group ------------------------------------------------

def test_a_mig_or_time_sliced_node_never_hosts_a_multi_gpu_group():
    # Llama-3.1-8B needs more than one 1g.5gb slice (4.75 GiB): with 7 slices free the only multi-GPU
    # layouts would be TP/PP across slices, which must be refused; so nothing is planned.
    for fixture in ("gfd-a100-mig-single-1g5gb.yaml", "gfd-a100-mig-mixed.yaml", "gfd-t4-time-sliced.yaml"):
        fleet = fleet_from_objects(nodes(fixture))
        plan = plan_for_spec(spec_of(llmd(gpus={"maxGpus": 7})), fleet)
        assert plan.choice is None, fixture
        assert not plan.frontier, fixture
        # every layout of more than one GPU (TP or PP across slices) is refused for that reason, not memory
        multi = [r for r in plan.rejected if r.layout.gpus_per_replica > 1]
        assert all("never part of a multi-GPU group" in r.reason or "memory" in r.reason for r in multi), fixture
        assert [r for r in plan.rejected if r.layout.gpus_per_replica == 1 and "memory" in r.reason], fixture


def test_big_enough_mig_slices_serve_one_replica_each_never_tp_across_slices():
    # MIG mixed on two A100 40GB, each one 7g.40gb instance (nvidia.com/mig-7g.40gb: NVIDIA cloud-native-docs
    # gpu-sharing.rst lists the resource; no .memory label here, so the profile's 40 GB is used). Llama-3.1-8B
    # in bf16 (A100: no FP8) fits one slice; two slices must serve two replicas, never one TP2/PP2 replica.
    node = copy.deepcopy(nodes("gfd-a100-mig-mixed.yaml")[0])
    labels = node["metadata"]["labels"]
    for k in [k for k in labels if k.startswith("nvidia.com/mig-1g.5gb")]:
        del labels[k]
    labels.update({"nvidia.com/gpu.count": "2", "nvidia.com/mig-7g.40gb.count": "2"})
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0", "nvidia.com/mig-7g.40gb": "2"}
    fleet = fleet_from_objects([node])
    plan = plan_for_spec(spec_of(llmd(gpus={"maxGpus": 2})), fleet)
    assert plan.choice is not None
    assert plan.choice.layout.gpus_per_replica == 1
    assert all(c.layout.gpus_per_replica == 1 for c in plan.frontier)
    refused = {r.layout.label(): r.reason for r in plan.rejected}
    assert {"TP2", "PP2"} <= set(refused)
    assert all("never part of a multi-GPU group" in refused[k] for k in ("TP2", "PP2"))
    # and placement refuses a 2-GPU stage on the slices even if asked directly
    from meshplan.placement import PlacementRequest, place

    topo = build_topology([node])
    res = place(PlacementRequest(replicas=1, stages=1, pods_per_stage=1, gpus_per_pod=2), topo)
    assert not res.placed and res.unplaced


def test_rendered_pods_request_the_nodes_resource():
    from meshplan.api.models import LLMDeployment
    from meshplan.render.pipeline import plan_place_render

    amd = plan_place_render(LLMDeployment.from_manifest(llmd(gpus={"maxGpus": 1})),
                            build_topology(nodes("amd-mi300x.yaml")))
    pod = next(o for o in amd.rendered.objects if o["kind"] == "Pod")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    # the GPU resource of the node's device plugin, beside memory (render.workloads.pod_resources)
    assert {k: v for k, v in limits.items() if "/" in k} == {"amd.com/gpu": "1"}
    exprs = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X_OAM"]} in exprs
    assert not any(e["key"] == "nvidia.com/gpu.product" for e in exprs)
    # MIG mixed: the pods ask for the slice resource
    node = copy.deepcopy(nodes("gfd-a100-mig-mixed.yaml")[0])
    node["metadata"]["labels"].update({"nvidia.com/gpu.count": "2", "nvidia.com/mig-7g.40gb.count": "2"})
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0", "nvidia.com/mig-7g.40gb": "2"}
    mig = plan_place_render(LLMDeployment.from_manifest(llmd(gpus={"maxGpus": 2})), build_topology([node]))
    pods = [o for o in mig.rendered.objects if o["kind"] == "Pod"]
    assert pods and all({k: v for k, v in p["spec"]["containers"][0]["resources"]["limits"].items() if "/" in k}
                        == {"nvidia.com/mig-7g.40gb": "1"} for p in pods)


# ---- nvidia.com/gpu.memory is used --------------------------------------------------------------------

def _h100(memory_mib: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "hgx-0", "labels": {"kubernetes.io/hostname": "hgx-0",
                                                      "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                      "nvidia.com/gpu.memory": str(memory_mib)}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_gpu_memory_label_wins_and_changes_the_plan():
    spec = spec_of(llmd(model={"name": "llama-3.1-70b"}, gpus={"maxGpus": 8},
                        workload={"inputTokens": 2048, "outputTokens": 256, "concurrency": 8}))
    plans = {m: plan_for_spec(spec, fleet_from_objects([_h100(m)])) for m in (81559, 40536, 4864)}
    full, half, tiny = plans[81559], plans[40536], plans[4864]
    assert full.choice is not None and full.choice.gpu == "h100_sxm"      # within 2%: the catalogue's H100
    assert half.choice is not None and half.choice.gpu == "h100_sxm@40536mib"
    assert get_gpu(half.choice.gpu).memory_gib == pytest.approx(40536 / 1024)
    # half the memory: 140 GB of bf16 weights need more GPUs per replica than on the full H100
    assert half.choice.layout.gpus_per_replica > full.choice.layout.gpus_per_replica
    assert tiny.choice is None and "h100_sxm@4864mib" in tiny.reason
    # visible: the plan says the label won, in its notes and in the sentence the Planned condition shows
    assert any("nvidia.com/gpu.memory=40536 MiB differs" in n for n in half.extra["notes"])
    assert "nvidia.com/gpu.memory=40536 MiB differs" in half.reason
    assert not any("differs" in n for n in full.extra.get("notes", [])) and "differs" not in full.reason
    from meshplan.controller.reconcile import Reconciler, World

    out = Reconciler(kube=None, world=World(), compute_domains=False)._decide(
        llmd(model={"name": "llama-3.1-70b"}, gpus={"maxGpus": 8},
             workload={"inputTokens": 2048, "outputTokens": 256, "concurrency": 8}),
        build_topology([_h100(40536)]), [], [], [])
    planned = {c["type"]: c for c in out.status["conditions"]}["Planned"]
    assert planned["status"] == "True" and "nvidia.com/gpu.memory=40536 MiB differs" in planned["message"]


# ---- unknown products are named; declared ones are planned on -----------------------------------------

FOO = "nvidia.com/gpu.product=NVIDIA-Foo-96GB is not in the GPU catalogue"


def test_an_unknown_product_is_named_in_the_planned_condition():
    from meshplan.controller.reconcile import Reconciler, World

    r = Reconciler(kube=None, world=World(), compute_domains=False)
    out = r._decide(llmd(gpus={"maxGpus": 8}), build_topology(nodes("unknown-product.yaml")), [], [], [])
    planned = {c["type"]: c for c in out.status["conditions"]}["Planned"]
    assert planned["status"] == "False" and planned["reason"] == "UnknownGPUProduct"
    assert f"node gpu-7: {FOO}" in planned["message"] and "gpuCatalog" in planned["message"]
    assert "h100_sxm" not in planned["message"]


def test_an_unknown_product_is_named_by_meshplan_plan(tmp_path, capsys):
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(llmd(gpus={"maxGpus": 8})))
    assert main(["plan", str(f), "--nodes", str(FIX / "unknown-product.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"node gpu-7: {FOO}" in out and "--gpu-catalog" in out and "no free GPUs of h100_sxm" not in out


def test_a_declared_custom_gpu_is_planned_on(tmp_path, capsys):
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(llmd(gpus={"maxGpus": 8})))
    assert main(["plan", str(f), "--nodes", str(FIX / "unknown-product.yaml"),
                 "--gpu-catalog", str(FIX / "foo-gpu-catalog.yaml"), "-o", "json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["choice"]["gpu"] == "foo_96gb"
    assert get_gpu("NVIDIA-Foo-96GB").nvlink_domain == 8
    # the operator's path: the same declaration, then a reconcile plans and places on gpu-7
    from meshplan.controller.reconcile import Reconciler, World

    out = Reconciler(kube=None, world=World(), compute_domains=False)._decide(
        llmd(gpus={"maxGpus": 8}), build_topology(nodes("unknown-product.yaml")), [], [], [])
    conds = {c["type"]: c for c in out.status["conditions"]}
    assert conds["Planned"]["status"] == "True" and conds["Placed"]["status"] == "True"
    assert out.placement.placed[0].nodes[0] == "gpu-7"


@pytest.mark.parametrize("entry,field", [
    ({"productLabels": ["X"], "memoryGiB": 1, "memoryBandwidthTBs": 1, "tflops": {"bf16": 1}}, "name"),
    ({"name": "x", "productLabels": ["X"], "memoryGiB": 1, "memoryBandwidthTBs": 1, "tflops": {"bf15": 1}},
     "tflops"),
    ({"name": "x", "productLabels": ["X"], "memoryGiB": 1, "memoryBandwidthTBs": 1, "tflops": {"bf16": 1},
      "nvlinkDomain": 8}, "nvlinkGBs"),
    ({"name": "h100_sxm", "productLabels": ["X"], "memoryGiB": 1, "memoryBandwidthTBs": 1,
      "tflops": {"bf16": 1}}, "built-in"),
    ({"name": "x", "productLabels": ["X"], "memoryGiB": 1, "memoryBandwidthTBs": 1, "tflops": {"bf16": 1},
      "speed": 3}, "speed"),
])
def test_a_bad_declaration_names_the_field(entry, field):
    with pytest.raises(ValueError, match=field):
        parse_gpu_catalog({"gpus": [entry]})


def test_cli_reports_a_bad_gpu_catalog_file(tmp_path, capsys):
    bad = tmp_path / "cat.yaml"
    bad.write_text("gpus:\n  - name: x\n")
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(llmd()))
    assert main(["plan", str(f), "--nodes", str(FIX / "unknown-product.yaml"), "--gpu-catalog", str(bad)]) == 2
    assert "gpus[0].productLabels: required" in capsys.readouterr().err


# ---- offline planning against one's own cluster ---------------------------------------------------------

def test_nodes_file_as_kubectl_prints_it_yaml_or_json_and_pods_in_use(tmp_path, capsys):
    import json

    doc = yaml.safe_load((FIX / "amd-mi300x.yaml").read_text())
    as_json = tmp_path / "nodes.json"
    as_json.write_text(json.dumps(doc))
    pods = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "other"},
         "spec": {"nodeName": "k8s-node-01", "containers": [{"name": "c", "resources": {
             "limits": {"amd.com/gpu": "6"}}}]}, "status": {"phase": "Running"}}]}
    pods_f = tmp_path / "pods.yaml"
    pods_f.write_text(yaml.safe_dump(pods))
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(llmd(gpus={"maxGpus": 8})))
    assert main(["plan", str(f), "--nodes", str(as_json)]) == 0
    free_all = capsys.readouterr().out
    assert main(["plan", str(f), "--nodes", str(as_json), "--pods", str(pods_f), "-o", "json"]) == 0
    busy = json.loads(capsys.readouterr().out)
    assert "model llama-3.1-8b on mi300x" in free_all and "(8 free GPUs)" in free_all
    # 6 of the 8 MI300X are held by another pod (amd.com/gpu limit): the plan may use the 2 left
    assert busy["choice"]["gpu"] == "mi300x" and busy["choice"]["total_gpus"] <= 2
    assert main(["plan", str(f), "--nodes", str(as_json), "--pods", str(pods_f)]) == 0
    assert "(2 free GPUs)" in capsys.readouterr().out
    assert main(["render", str(f), "--nodes", str(as_json), "--pods", str(pods_f)]) == 0
    rendered = capsys.readouterr().out
    assert "amd.com/gpu: '1'" in rendered or "amd.com/gpu: '2'" in rendered
    assert main(["plan", str(f), "--pods", str(pods_f)]) == 2


def test_a_file_without_nodes_is_refused_by_name(tmp_path, capsys):
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(llmd()))
    empty = tmp_path / "nodes.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    assert main(["plan", str(f), "--nodes", str(empty)]) == 2
    assert "no Node objects found" in capsys.readouterr().err


def test_shipped_fleets_plan_as_before_with_the_resolved_gpus():
    from meshplan.planner.fleet import load_fleet

    for name, gpu in (("hgx-h100", "h100_sxm"), ("gb200-nvl72", "gb200")):
        fleet = load_fleet(name)
        assert fleet.gpus() == (gpu,) and not fleet.unknown and not fleet.notes
    assert set(load_fleet("mixed").gpus()) == {"h200_sxm", "l40s", "gb200"}
