"""plan -> place -> render for a whole LLMDeployment, and the `meshplan render` command."""

from __future__ import annotations

from pathlib import Path

import yaml
from _gpu_nodes import gb200_nvl72, hgx_h100, l40s

from meshplan.api.models import LLMDeployment
from meshplan.cli import main
from meshplan.planner.types import Candidate, Layout, MemoryFit, Plan, Prediction
from meshplan.render.options import options_from_spec, weights_location
from meshplan.render.pipeline import plan_place_render, product_for_gpu
from meshplan.topology import build_topology

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MEM = MemoryFit(True, 0, 0, 0, 0, 0, 0, 0)
PRED = Prediction(0, 0, 0, 0, 0)


def llmd(**spec) -> LLMDeployment:
    base = {"model": {"name": "llama-3.1-70b"}}
    base.update(spec)
    return LLMDeployment.from_manifest({"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
                                        "metadata": {"name": "l70", "namespace": "ml", "uid": "u-1"},
                                        "spec": base})


def fixed_plan(layout: Layout, gpu: str, engine: str = "vllm") -> Plan:
    c = Candidate(layout, "fp8", "fp8", 1024, 32, MEM, PRED, engine=engine, gpu=gpu)
    return Plan(choice=c, objective="balanced", reason="fixed for the test")


def test_pipeline_places_on_the_planned_product_and_respects_node_selector():
    nodes = hgx_h100(2) + l40s(2, gpus=4)
    nodes[1]["metadata"]["labels"]["pool"] = "llm"
    topo = build_topology(nodes)
    assert product_for_gpu(topo, "l40s") == ("NVIDIA-L40S", 4)
    d = llmd(gpus={"nodeSelector": {"pool": "llm"}})
    res = plan_place_render(d, topo, plan=fixed_plan(Layout(tp=8), "h100_sxm"))
    assert res.product == "NVIDIA-H100-80GB-HBM3" and res.placement.ok
    assert res.placement.placed[0].nodes == ("hgx-1",)           # the only node matching the selector
    pod = res.rendered.groups[0].pods[0]
    assert pod["spec"]["nodeSelector"] == {"pool": "llm"}
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pod["metadata"]["namespace"] == "ml"


def test_pipeline_keeps_existing_and_reports_unplaced():
    topo = build_topology(hgx_h100(2))
    res = plan_place_render(llmd(), topo, plan=fixed_plan(Layout(tp=8, dp=3), "h100_sxm"), existing={0: ["hgx-1"]},
                            replicas=3)
    assert res.placement.replica(0).nodes == ("hgx-1",) and res.placement.replica(0).kept
    assert len(res.rendered.groups) == 2 and len(res.placement.unplaced) == 1
    assert "replica 2" in res.message


def test_pipeline_compute_domains_switch():
    topo = build_topology(gb200_nvl72(1, 8))
    plan = fixed_plan(Layout(tp=8), "gb200")
    with_cd = plan_place_render(llmd(), topo, plan=plan, compute_domains=True)
    without = plan_place_render(llmd(), topo, plan=plan)
    assert with_cd.rendered.groups[0].compute_domain is not None
    assert without.rendered.groups[0].compute_domain is None


def test_options_from_spec_maps_weights_env_and_nccl():
    d = llmd(model={"name": "llama-3.1-70b", "weights": {"uri": "hf://meta-llama/Llama-3.1-70B-Instruct@abc123",
                                                          "credentialsSecretRef": {"name": "hf", "key": "t"}}},
             engine={"kind": "sglang", "prefixCaching": False, "env": [{"name": "X", "value": "1"}],
                     "extraArgs": ["--trust-remote-code"]},
             nccl={"transport": "roce", "ibHca": "mlx5_0", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]})
    serving, network, pods = options_from_spec(d.spec)
    assert (serving.engine, serving.model, serving.revision) == ("sglang", "meta-llama/Llama-3.1-70B-Instruct", "abc123")
    assert serving.prefix_caching is False and serving.extra_args == ("--trust-remote-code",)
    assert network.transport == "roce" and network.ib_hca == "mlx5_0"
    assert network.env == ({"name": "NCCL_DEBUG", "value": "INFO"},)
    assert pods.weights_secret == ("hf", "t") and pods.env == ({"name": "X", "value": "1"},)
    # no weights: the catalogue's Hugging Face repository
    assert weights_location(llmd().spec.model, "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json") \
        == ("meta-llama/Llama-3.1-70B", None)


def test_render_command_prints_the_planned_pods(capsys):
    rc = main(["render", str(EXAMPLES / "llama-3.1-8b-1gpu.yaml"), "--fleet", "hgx-h100", "--explain"])
    out = capsys.readouterr().out
    assert rc == 0
    header = [line for line in out.splitlines() if line.startswith("# ")]
    assert any(line.startswith("# plan: ") for line in header) and any("why each setting" in h for h in header)
    docs = [d for d in yaml.safe_load_all(out) if d]
    pods = [d for d in docs if d["kind"] == "Pod"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert pods and len(services) == 1 + len({p["metadata"]["labels"]["meshplan.dev/replica"] for p in pods})
    layout_line = next(h for h in header if h.startswith("# plan: "))
    tp = layout_line.split()[2].split("·")[0]          # e.g. TP1
    for p in pods:
        args = p["spec"]["containers"][0]["args"]
        assert f"TP{args[args.index('--tensor-parallel-size') + 1]}" == tp


def test_render_command_fails_clearly_without_matching_nodes(capsys, tmp_path):
    manifest = yaml.safe_load((EXAMPLES / "mixtral-8x7b-l40s.yaml").read_text())
    manifest["spec"]["gpus"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "no-such-instance"}
    path = tmp_path / "mixtral-nowhere.yaml"
    path.write_text(yaml.safe_dump(manifest))
    rc = main(["render", str(path), "--fleet", "mixed"])
    err = capsys.readouterr().err
    assert rc == 1 and "no feasible plan" in err


def test_render_places_the_replicas_the_operator_applies_with_the_operators_pods():
    """Defect (issue 16): `meshplan render` of an autoscaled manifest rendered the plan's DP (what the SLO
    search sized for the workload: 6 here) where the operator applies spec.replicas (2, autoscaling
    starts there). Render now counts replicas with the controller's own rule and renders the same pods
    (names, plan hash) the controller's `decide` creates."""
    from meshplan.controller.decide import Inputs, decide, target_for
    from meshplan.controller.reconcile import desired_replicas
    from meshplan.devcluster.fleets import fleet_nodes, load_fleet
    from meshplan.planner import plan_for_spec

    m = yaml.safe_load((EXAMPLES / "llama-3.1-70b-hgx-h100.yaml").read_text())
    m["metadata"].update(namespace="ml", uid="u-1")
    d = LLMDeployment.from_manifest(m)
    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), ready_if_unknown=True)
    res = plan_place_render(d, topo)
    assert d.spec.autoscaling.enabled and res.plan.choice.layout.dp > 2         # the search sized more
    assert desired_replicas(d.spec, None) == 2 == res.request.replicas == len(res.rendered.groups)
    assert "spec.replicas 2, where autoscaling starts" in res.replicas_why and "maxReplicas 8" in res.replicas_why

    plan = plan_for_spec(d.spec, topo)
    out = decide(Inputs(name=d.name, namespace="ml", uid="u-1", generation=1,
                        desired_replicas=desired_replicas(d.spec, None), topology=topo, pods=[], services=[],
                        target=target_for(d.spec, plan, topo)))
    ours = [(p["metadata"]["name"], p["metadata"]["labels"]["meshplan.dev/plan-hash"])
            for g in res.rendered.groups for p in g.pods]
    theirs = [(p["metadata"]["name"], p["metadata"]["labels"]["meshplan.dev/plan-hash"])
              for g in out.rendered.groups for p in g.pods]
    assert ours == theirs


def test_render_command_header_says_where_the_replica_count_comes_from(capsys):
    assert main(["render", str(EXAMPLES / "llama-3.1-70b-hgx-h100.yaml"), "--fleet", "hgx-h100"]) == 0
    out = capsys.readouterr().out
    header = [line for line in out.splitlines() if line.startswith("# ")]
    assert any(line.startswith("# plan: ") and " x 2 replica(s) " in line for line in header), header
    assert any(line.startswith("# deployed: running ") and "x 2 replica(s)" in line and "spec.replicas 2," in line
               and "the SLO search sized DP" in line for line in header), header
    assert any(line.startswith("# search: balanced: ") for line in header)
    assert out.count("\nkind: Pod\n") == 2
