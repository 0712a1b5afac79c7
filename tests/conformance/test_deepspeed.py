"""DeepSpeed-MII 0.3.3 conformance: every pod meshplan renders for engine.kind deepspeed starts MII's server.

Pods are rendered the way `meshplan render` does (plan_place_render on a shipped fleet) for the
layout families DeepSpeed-MII can run (one GPU, TP inside a node, 16-bit precisions, serving toggles,
extraArgs); each pod's argv is parsed by MII's own argparse and becomes MII's pydantic MIIConfig with
the replicas placed on the pod's GPUs, inside the deepspeed-mii-0.3.3 venv (tests/conformance/
deepspeed_probe.py, ONE subprocess). The families it cannot run (TP x PP across nodes, EP, FP8) are
refused by the planner with the reason, so they are never rendered. DeepSpeed imports on CPU (its
cpu accelerator); no GPU is simulated because no MII code on this path asks for one (MIIServer would
count the GPUs for the hostfile: the probe writes the pod's GPU count instead, as MIIServer does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import run_in_venv
import meshplan.planner  # noqa: F401  (first: meshplan.engines.base imports the planner's types)
from meshplan.api.extra_args import extra_args_problems, option_index
from meshplan.api.models import LLMDeployment
from meshplan.catalog.engine_options_deepspeed import DEEPSPEED_OPTIONS
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import deepspeed as ds
from meshplan.planner import plan_for_spec
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

ROOT = Path(__file__).resolve().parents[2]
VENV = "deepspeed-mii-0.3.3"
PROBE = Path(__file__).with_name("deepspeed_probe.py")
FIXTURES = ROOT / "tests" / "fixtures" / "models"
CONFIGS = {"llama-3.1-8b": "meta-llama--Meta-Llama-3.1-8B_config.json",
           "llama-3.1-70b": "meta-llama--Meta-Llama-3.1-70B_config.json"}
IMAGE = "registry.example.com/serving/deepspeed-mii:0.3.3"
HGX = build_topology(fleet_nodes(load_fleet(str(ROOT / "operator/meshplan/fleets/hgx-h100.yaml"))), [],
                     ready_if_unknown=True)


def _manifest(example: str, **spec_patch) -> dict:
    m = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    eng = m["spec"].setdefault("engine", {})
    if eng.get("kind") != "deepspeed":
        eng.clear()
    eng.update(kind="deepspeed", image=IMAGE)
    m["spec"].setdefault("gpus", {}).pop("products", None)
    for key, value in spec_patch.items():
        if isinstance(value, dict):
            m["spec"].setdefault(key, {}).update(value)
        else:
            m["spec"][key] = value
    return m


# (case id, example, spec patch): the layout families DeepSpeed-MII runs
RUNS = [
    ("example-deepspeed", "llama-3.1-8b-deepspeed", {}),
    ("example-1gpu", "llama-3.1-8b-1gpu", {}),
    ("example-nim-as-deepspeed", "llama-3.1-8b-nim", {}),
    ("one-gpu", "llama-3.1-8b-deepspeed", {"parallelism": {"tensor": 1}}),
    ("tp2", "llama-3.1-8b-deepspeed", {"parallelism": {"tensor": 2}, "gpus": {"maxGpus": 8}}),
    ("tp4", "llama-3.1-8b-deepspeed", {"parallelism": {"tensor": 4}, "gpus": {"maxGpus": 8}}),
    ("tp8", "llama-3.1-8b-deepspeed", {"parallelism": {"tensor": 8}, "gpus": {"maxGpus": 8}}),
    ("70b-tp4", "llama-3.1-70b-hgx-h100", {"precision": {"weights": "bf16", "kvCache": "bf16"},
                                           "parallelism": {"tensor": 4, "pipeline": 1, "expert": 1},
                                           "workload": {"maxContext": 8192}}),
    ("weights-fp16", "llama-3.1-8b-deepspeed", {"precision": {"weights": "fp16", "kvCache": "fp16"}}),
    ("weights-bf16-kv-bf16", "llama-3.1-8b-deepspeed", {"precision": {"weights": "bf16", "kvCache": "bf16"}}),
    ("precision-auto-fp8-floor", "llama-3.1-8b-deepspeed", {"precision": {"weights": "auto", "kvCache": "auto",
                                                                          "accuracyFloor": "fp8"}}),
    ("max-context-8192", "llama-3.1-8b-deepspeed", {"workload": {"maxContext": 8192}}),
    ("prefix-caching-off", "llama-3.1-8b-deepspeed", {"engine": {"prefixCaching": False}}),
    ("priority", "llama-3.1-8b-deepspeed", {"engine": {"schedulingPolicy": "priority"}}),
    ("cuda-graphs-off", "llama-3.1-8b-deepspeed", {"engine": {"cudaGraphs": "disabled"}}),
    ("eplb-enabled", "llama-3.1-8b-deepspeed", {"engine": {"expertLoadBalancing": "enabled"}}),
    ("extra-args", "llama-3.1-8b-deepspeed", {"engine": {"extraArgs": ["--response-role", "bot",
                                                                     "--chat-template", "{{ messages }}"]}}),
]

# the families it cannot run: refused by the planner (never rendered), each with the reason
REFUSED = [
    ("tp-x-pp", "llama-3.1-70b-hgx-h100", {"precision": {"weights": "bf16", "kvCache": "bf16"},
                                           "parallelism": {"tensor": 8, "pipeline": 2}, "gpus": {"maxGpus": 16},
                                           "workload": {"maxContext": 8192}},
     "TP8·PP2 across 2 pods"),
    ("ep", "mixtral-8x7b-l40s", {"precision": {"weights": "bf16", "kvCache": "bf16"},
                                 "parallelism": {"expert": 2, "tensor": 1}}, "no expert parallelism"),
    ("kv-fp8", "llama-3.1-8b-deepspeed", {"precision": {"kvCache": "fp8"}}, "fp8 KV cache"),
    ("weights-fp8", "llama-3.1-8b-deepspeed", {"precision": {"weights": "fp8", "kvCache": "bf16"}},
     "fp8 weights"),
    ("chunk-pinned", "llama-3.1-8b-deepspeed", {"parallelism": {"chunkSize": 2048}}, "no option for the step"),
    ("long-context", "llama-3.1-8b-deepspeed", {"workload": {"maxContext": 32768}}, "at most 8192 tokens"),
    ("deepseek-mla", "deepseek-r1-h200", {"precision": {"kvCache": "bf16"}, "parallelism": {"expert": 1}},
     "MLA"),
]


def _render(case_id: str, example: str, patch: dict) -> list[dict]:
    llmd = LLMDeployment.from_manifest(_manifest(example, **patch))
    res = plan_place_render(llmd, HGX)
    assert res.rendered is not None, f"{case_id}: {res.message}"
    cases = []
    for g in res.rendered.groups:
        for pod in g.pods:
            c = pod["spec"]["containers"][0]
            assert c["command"] == ["python", "-m", ds.SERVER_MODULE]
            gpus = int(next(v for k, v in c["resources"]["limits"].items() if k.endswith("/gpu")))
            cases.append({"id": f"{case_id}/{pod['metadata']['name']}", "argv": c["args"], "gpus_per_pod": gpus,
                          "config_json": (FIXTURES / CONFIGS[llmd.spec.model.name]).read_text(),
                          "plan": res.plan.choice.layout.tp,
                          "knobs": (res.plan.choice.chunk_size, res.plan.choice.max_num_seqs)})
    return cases


@pytest.fixture(scope="module")
def probed() -> tuple[list[dict], dict]:
    cases = [c for cid, ex, patch in RUNS for c in _render(cid, ex, patch)]
    out = run_in_venv(VENV, PROBE, {"cases": [{k: c[k] for k in ("id", "argv", "gpus_per_pod", "config_json")}
                                              for c in cases]})
    return cases, out


def test_every_rendered_pod_parses_and_builds_its_mii_config(probed):
    cases, out = probed
    assert out["mii_version"].strip() == ds.VERSION
    by_id = {r["id"]: r for r in out["results"]}
    bad = [f"{r['id']}: {r.get('error')}" for r in out["results"] if not r["ok"]]
    assert not bad, "DeepSpeed-MII refuses:\n" + "\n".join(bad)
    for c in cases:
        r = by_id[c["id"]]
        # the plan's layout is what MII runs: TP = the plan's, one replica on exactly the pod's GPUs
        assert r["tp_size"] == c["plan"] and r["replica_num"] == 1, c["id"]
        assert r["replica_gpus"] == [list(range(c["gpus_per_pod"]))], c["id"]
        # the planner planned at the step budget / batch limit MII runs (its own DSStateManagerConfig)
        assert c["knobs"] == (r["max_ragged_batch_size"], r["max_ragged_sequence_count"]) == ds.FIXED_KNOBS
        assert r["max_context"] == ds.MII_MAX_CONTEXT and r["max_length"] <= r["max_context"]
    assert {c["id"].split("/")[0] for c in cases} == {cid for cid, _, _ in RUNS}


def test_meshplan_option_table_is_mii_s_own_parser(probed):
    _, out = probed
    assert sorted(map(tuple, out["options"])) == sorted(DEEPSPEED_OPTIONS)


def test_fastgen_model_types_are_the_engine_factory_s(probed):
    _, out = probed
    assert tuple(out["fastgen_model_types"]) == tuple(sorted(ds.FASTGEN_MODEL_TYPES))


def test_a_flag_mii_does_not_have_fails_with_mii_s_own_message():
    # the probe must be able to fail: vLLM's spelling of the TP flag is not MII's
    cfg = (FIXTURES / CONFIGS["llama-3.1-8b"]).read_text()
    out = run_in_venv(VENV, PROBE, {"cases": [
        {"id": "vllm-spelling", "argv": ["--model", "m", "--tensor-parallel-size", "2"], "gpus_per_pod": 2,
         "config_json": cfg},
        {"id": "more-gpus-than-pod", "argv": ["--model", "m", "--tensor-parallel", "4"], "gpus_per_pod": 2,
         "config_json": cfg}]})
    r = {x["id"]: x for x in out["results"]}
    assert not r["vllm-spelling"]["ok"] and "unrecognized arguments: --tensor-parallel-size" in \
        r["vllm-spelling"]["error"]
    assert not r["more-gpus-than-pod"]["ok"] and "Only able to place 0 replicas" in r["more-gpus-than-pod"]["error"]


@pytest.mark.parametrize("case_id,example,patch,why", REFUSED, ids=[r[0] for r in REFUSED])
def test_layouts_mii_cannot_run_are_refused_by_the_planner_with_the_reason(case_id, example, patch, why):
    llmd = LLMDeployment.from_manifest(_manifest(example, **patch))
    plan = plan_for_spec(llmd.spec, HGX)
    assert plan.choice is None, f"{case_id}: planned {plan.choice.layout.label()}"
    assert why in plan.reason or any(why in r.reason for r in plan.rejected), plan.reason


def test_extra_args_use_mii_s_spellings():
    assert extra_args_problems("deepspeed", ["--response-role", "bot"]) == []
    problems = extra_args_problems("deepspeed", ["--tensor-parallel-size", "2", "--api-keys", "k"])
    assert any("--tensor-parallel-size" in p and "DeepSpeed-MII 0.3.3" in p for p in problems), problems
    assert any("--api-keys" in p for p in problems), problems
    assert "--replica-num" in option_index("deepspeed")


def test_the_engine_rule_names_each_missing_parallelism():
    from meshplan.planner.types import Layout

    assert "no pipeline parallelism" in ds.check_layout(Layout(tp=8, pp=2))
    assert "no expert parallelism" in ds.check_layout(Layout(tp=1, ep=2))
    assert ds.check_layout(Layout(tp=8)) is None
    assert "2 pods" in ds.check_pods(Layout(tp=16), 2, 8) and ds.check_pods(Layout(tp=8), 1, 8) is None
