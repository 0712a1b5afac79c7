"""`plan()`, the LLMDeployment adapter and `meshplan plan MANIFEST`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from meshplan.api.models import LLMDeployment
from meshplan.catalog.models import get_model
from meshplan.cli import main
from meshplan.planner import model_from_spec, plan, plan_for_spec, plan_inputs_from_spec, plan_to_dict
from meshplan.planner.fleet import load_fleet
from meshplan.planner.search import SearchSpace
from meshplan.planner.types import SLO, Workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SMALL = SearchSpace(chunk_sizes=(512, 2048), max_num_seqs=(1, 8, 64, 512))


def manifest(**spec) -> dict:
    base = {"model": {"name": "llama-3.1-8b"}, "gpus": {"products": ["h100"], "maxGpus": 8}}
    base.update(spec)
    return {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "t"}, "spec": base}


def spec_of(**spec):
    return LLMDeployment.from_manifest(manifest(**spec)).spec


def test_plan_returns_choice_reason_frontier_and_engine_args():
    p = plan(get_model("llama-3.1-70b"), "h100", max_gpus=16, objective="maxThroughput", space=SMALL)
    assert p.choice is not None and p.choice.gpu == "h100_sxm"
    assert p.reason.startswith("maxThroughput: ")
    assert p.choice in p.frontier                      # maxThroughput is a frontier point
    assert p.extra["engine_args"][:2] == ["--tensor-parallel-size", str(p.choice.layout.tp)]
    assert all(a.layout.gpus_per_replica != 0 for a in p.alternatives)
    d = plan_to_dict(p)
    assert d["choice"]["tokens_per_s_per_gpu"] == pytest.approx(p.choice.prediction.tokens_per_s_per_gpu, rel=1e-3)
    json.dumps(d)                                       # plain data


def test_the_frontier_shown_is_the_slo_frontier():
    slo = SLO(itl_ms=25)
    p = plan(get_model("llama-3.1-8b"), "h100", max_gpus=8, slo=slo, objective="balanced", space=SMALL)
    assert p.frontier and all(c.prediction.tpot_ms <= 25 for c in p.frontier)
    assert p.choice in p.frontier


def test_several_products_are_compared_and_the_choice_names_its_gpu():
    p = plan(get_model("llama-3.1-8b"), ["l40s", "h200"], max_gpus=8, objective="bestInteractivity", space=SMALL)
    assert set(p.extra["per_gpu"]) == {"l40s", "h200_sxm"}
    assert p.choice.gpu == "h200_sxm"                 # 4.8 TB/s HBM against 0.86 TB/s GDDR6


def test_a_fleet_restricts_products_and_replicas():
    fleet = load_fleet("hgx-h100")
    p = plan(get_model("llama-3.1-70b"), "h100", fleet=fleet, objective="maxThroughput", space=SMALL)
    assert p.choice.layout.total_gpus <= 32 and p.choice.layout.gpus_per_stage <= 8
    none = plan(get_model("llama-3.1-70b"), "gb200", fleet=fleet, space=SMALL)
    assert none.choice is None and "no free GPUs of gb200" in none.reason


def test_min_cost_takes_the_fewest_replicas_that_carry_the_load():
    slo = SLO(ttft_ms=2000, itl_ms=50)
    light = plan(get_model("llama-3.1-8b"), "h100", max_gpus=16, workload=Workload(concurrency=8), slo=slo,
                 objective="minCostWithinSLO", space=SMALL)
    heavy = plan(get_model("llama-3.1-8b"), "h100", max_gpus=16, workload=Workload(concurrency=2000), slo=slo,
                 objective="minCostWithinSLO", space=SMALL)
    assert light.choice is not None and heavy.choice is not None
    assert light.choice.layout.total_gpus <= heavy.choice.layout.total_gpus


def test_adapter_reads_every_planning_field():
    spec = spec_of(
        workload={"inputTokens": 2048, "outputTokens": 128, "concurrency": 64},
        slo={"ttftMs": 900, "itlMs": 30, "minTokensPerSecondPerUser": 25},
        objective="maxThroughput",
        engine={"kind": "sglang"},
        precision={"weights": "fp8", "kvCache": "fp8"},
        parallelism={"tensor": 2, "pipeline": 1, "chunkSize": 1024, "maxNumSeqs": 32},
        replicas=3,
    )
    kw = plan_inputs_from_spec(spec)
    assert kw["workload"] == Workload(isl=2048, osl=128, concurrency=64)
    assert kw["slo"] == SLO(ttft_ms=900, itl_ms=30, percentile=99, min_tokens_per_s_per_user=25)
    assert kw["engine"] == "sglang" and kw["objective"] == "maxThroughput"
    sp = kw["space"]
    assert (sp.tensor, sp.expert, sp.pipeline, sp.chunk_sizes, sp.max_num_seqs) == (2, None, 1, (1024,), (32,))
    assert (sp.weight_dtype, sp.kv_dtype) == ("fp8", "fp8")
    assert kw["replicas"] == 3
    # replicas left at its default, or driven by the autoscaler, leave DP to the planner
    assert plan_inputs_from_spec(spec_of())["replicas"] is None
    auto = spec_of(replicas=2, slo={"ttftMs": 900}, autoscaling={"enabled": True, "maxReplicas": 4})
    assert plan_inputs_from_spec(auto)["replicas"] is None


def test_pinned_knobs_and_replicas_are_respected():
    spec = spec_of(parallelism={"tensor": 2, "chunkSize": 1024, "maxNumSeqs": 32}, replicas=2,
                   objective="maxThroughput")
    p = plan_for_spec(spec)
    c = p.choice
    assert (c.layout.tp, c.layout.dp, c.chunk_size, c.max_num_seqs) == (2, 2, 1024, 32)


def test_a_pinned_batch_limit_beyond_the_kv_cache_is_kept_and_said():
    """Defect (issue 16): a pinned `maxNumSeqs: 512` silently became the KV-cache limit (here 81). It is
    kept (the engine flag is what the user pinned) and the plan says what the cache holds."""
    spec = spec_of(model={"name": "llama-3.1-70b"}, precision={"weights": "fp8"}, objective="maxThroughput",
                   workload={"inputTokens": 4096, "outputTokens": 512, "maxContext": 16384},
                   parallelism={"tensor": 4, "pipeline": 1, "maxNumSeqs": 512})
    p = plan_for_spec(spec)
    c = p.choice
    assert c.max_num_seqs == 512 and c.memory.max_concurrency < 512
    assert all(x.max_num_seqs == 512 for x in p.frontier)
    assert "--max-num-seqs" in p.extra["engine_args"]
    assert p.extra["engine_args"][p.extra["engine_args"].index("--max-num-seqs") + 1] == "512"
    said = f"maxNumSeqs 512 is pinned and kept, although the KV cache of TP4 holds {c.memory.max_concurrency:,} sequences"
    assert said in p.reason and any(said in n for n in p.extra["notes"])


def test_explicit_architecture_matches_the_catalogue_entry():
    m = get_model("gpt-moe-1.8t")
    spec = spec_of(model={"name": "my-moe", "architecture": {
        "layers": m.num_layers, "hiddenSize": m.hidden_size, "attentionHeads": m.num_attention_heads,
        "kvHeads": m.num_kv_heads, "headDim": m.head_dim, "experts": m.num_experts,
        "expertsPerToken": m.experts_per_token, "moeIntermediateSize": m.moe_intermediate_size,
        "vocabSize": m.vocab_size}})
    got = model_from_spec(spec.model)
    assert got.name == "my-moe"
    assert got.total_params == pytest.approx(m.total_params, rel=1e-6)
    assert got.active_params == pytest.approx(m.active_params, rel=1e-6)
    assert got.is_moe and got.num_experts == 16


def test_unknown_product_names_the_field():
    with pytest.raises(ValueError, match=r"spec.gpus.products\[0\]"):
        plan_for_spec(spec_of(gpus={"products": ["tpu-v5"]}))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_plans(path):
    llmd = LLMDeployment.from_manifest(yaml.safe_load(path.read_text()))
    p = plan_for_spec(llmd.spec)
    assert p.evaluated > 0 and p.reason
    if p.choice is not None:
        assert p.choice.memory.fits
        assert llmd.spec.gpus.max_gpus is None or p.choice.layout.total_gpus <= llmd.spec.gpus.max_gpus


def test_cli_table_json_yaml_and_plot(tmp_path, capsys):
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(manifest(objective="maxThroughput", parallelism={"chunkSize": 1024})))
    assert main(["plan", str(f)]) == 0
    out = capsys.readouterr().out
    assert "Pareto frontier" in out and "Choice:" in out and "engine flags: --tensor-parallel-size" in out
    assert main(["plan", str(f), "--output", "json", "--show-rejected"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["objective"] == "maxThroughput" and d["choice"]["chunk_size"] == 1024 and "rejected" in d
    assert main(["plan", str(f), "-o", "yaml", "--fleet", "hgx-h100"]) == 0
    y = yaml.safe_load(capsys.readouterr().out)
    assert y["choice"]["gpu"] == "h100_sxm"
    png = tmp_path / "frontier.png"
    assert main(["plan", str(f), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_bad_manifests_by_field(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(manifest(model={"name": "no-such-model"})))
    assert main(["plan", str(f)]) == 2
    assert "spec.model.name" in capsys.readouterr().err
    g = tmp_path / "none.yaml"
    g.write_text("kind: ConfigMap\n")
    assert main(["plan", str(g)]) == 2
    assert "no LLMDeployment" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "render"])
def test_cli_refuses_a_node_selector_the_api_server_refuses(tmp_path, capsys, command):
    """Defect (issue 16): `meshplan plan` accepted a nodeSelector with selector syntax in a value (the API
    server refuses such a label value, in the CRD's CEL rule and in a pod's nodeSelector)."""
    f = tmp_path / "sel.yaml"
    f.write_text(yaml.safe_dump(manifest(gpus={"products": ["h100"], "maxGpus": 8, "nodeSelector": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3,NVIDIA-H200"}})))
    assert main([command, str(f), "--fleet", "hgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "spec.gpus.nodeSelector['nvidia.com/gpu.product']" in err and "is not a valid label value" in err


def test_node_selectors_as_nodes_carry_them_are_accepted():
    # label keys/values as GPU Feature Discovery and Kubernetes write them (an empty value is a valid value)
    ok = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.clique": "cluster-a.0",
          "topology.kubernetes.io/zone": "us-east-1a", "node-role.kubernetes.io/gpu": "", "Pool_A": "x." + "y" * 60}
    assert spec_of(gpus={"nodeSelector": ok}).gpus.node_selector == ok


def test_cli_plan_says_how_many_replicas_the_operator_runs(capsys):
    assert main(["plan", str(ROOT / "examples" / "llama-3.1-70b-hgx-h100.yaml"), "--fleet", "hgx-h100"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("  deployed: "))
    assert "the operator runs 2 replica(s)" in line and "spec.replicas 2, where autoscaling starts" in line


def test_cli_unreadable_kubeconfig_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "llmd.yaml"
    f.write_text(yaml.safe_dump(manifest()))
    assert main(["plan", str(f), "--kubeconfig", str(tmp_path / "missing-kubeconfig")]) == 2
    assert "cannot read Nodes and Pods through --kubeconfig" in capsys.readouterr().err


def test_wide_ep_spans_domains_tp_never_does_unless_pinned():
    """Issue 18: an EP stage larger than the 8-GPU domain may span domains (wide EP); TP never crosses one
    unless pinned; crossDomain never keeps every stage inside a domain."""
    spec = spec_of(model={"name": "deepseek-r1"}, gpus={"products": ["h200"], "maxGpus": 16},
                   parallelism={"pipeline": 1, "chunkSize": 2048, "maxNumSeqs": 64})
    auto = plan_for_spec(spec)
    assert not any(r.layout.gpus_per_stage > 8 and r.layout.tp <= 8 and "NVLink domain" in r.reason
                   for r in auto.rejected)
    assert all(c.layout.tp <= 8 for c in auto.frontier)
    assert any("TP16 exceeds the 8-GPU NVLink domain" in r.reason for r in auto.rejected)
    never = plan_for_spec(spec, cross_domain="never")
    assert all(c.layout.gpus_per_stage <= 8 for c in never.frontier)
    assert any("crossDomain is never" in r.reason for r in never.rejected)
    assert auto.extra["per_gpu"]["h200_sxm"]["shapes"] > never.extra["per_gpu"]["h200_sxm"]["shapes"]
    pinned = plan_for_spec(spec_of(model={"name": "deepseek-r1"}, gpus={"products": ["h200"], "maxGpus": 16},
                                   parallelism={"tensor": 16, "pipeline": 1, "chunkSize": 2048, "maxNumSeqs": 64}))
    assert not any("exceeds the 8-GPU NVLink domain" in r.reason for r in pinned.rejected)


def test_deepseek_on_hgx_explains_single_node_against_wide_ep():
    """Issue 18 'Done when': on HGX H100 and H200 (RDMA fleets) the plan chooses a layout that renders and
    explains it against the single-node and the wide-EP alternatives."""
    from meshplan.planner.fleet import load_fleet
    from meshplan.render.pipeline import plan_place_render

    for fleet_name, product in (("hgx-h100-ib", "NVIDIA-H100-80GB-HBM3"), ("hgx-h200-ib", "NVIDIA-H200")):
        m = manifest()
        m["spec"].update(model={"name": "deepseek-r1"}, engine={"kind": "sglang"},
                         gpus={"products": [product], "maxGpus": 32},
                         workload={"inputTokens": 1024, "outputTokens": 4096, "concurrency": 256},
                         parallelism={"pipeline": 1})
        llmd = LLMDeployment.from_manifest(m)
        fleet = load_fleet(fleet_name)
        p = plan_for_spec(llmd.spec, fleet)
        line = p.extra["topology"]
        assert "inside one NVLink domain" in line and "wide EP across NVLink domains" in line, line
        if fleet_name == "hgx-h100-ib":
            # 671 GB of FP8 weights do not fit one 8 x 80 GB node: the single-node side says why
            assert "best inside one NVLink domain: none (" in line and "memory" in line
            assert p.choice.layout.gpus_per_stage > 8
        else:
            assert "tokens/s/GPU" in line.split("wide EP")[1]
        res = plan_place_render(llmd, fleet, plan=p)
        assert res.rendered is not None and res.rendered.groups, (fleet_name, p.choice.layout)


def test_deepseek_on_hgx_h100_without_rdma_says_what_is_missing():
    from meshplan.planner.fleet import load_fleet

    m = manifest()
    m["spec"].update(model={"name": "deepseek-r1"}, engine={"kind": "sglang"},
                     gpus={"products": ["NVIDIA-H100-80GB-HBM3"], "maxGpus": 32}, parallelism={"pipeline": 1})
    p = plan_for_spec(LLMDeployment.from_manifest(m).spec, load_fleet("hgx-h100"))
    assert p.choice is None
    assert "every layout was rejected" in p.reason and "no node advertises an RDMA resource" in p.reason


def test_topology_comparison_works_for_a_gpu_outside_the_catalogue():
    """A GpuSpec passed directly (benchmarks/plan_speed.py's blog GPU) is not in the catalogue."""
    import dataclasses

    from meshplan.catalog.gpus import get_gpu

    blog = dataclasses.replace(get_gpu("h100"), name="not-in-catalogue-gpu")
    p = plan(get_model("llama-3.1-8b"), [blog], max_gpus=8, objective="maxThroughput", space=SMALL)
    assert p.choice is not None and "inside one NVLink domain" in p.extra["topology"]
