"""SGLang conformance: every argv meshplan renders for SGLang parses with SGLang 0.5.23's OWN parser.

The pods are rendered with meshplan's public path (`meshplan render`: plan_place_render on a fleet) for
every examples/*.yaml with engine.kind set to sglang (where SGLang can run the layout), with the serving
toggles (prefix caching, priority scheduling, CUDA graphs, EPLB, extraArgs, KV dtype), and for the
golden layout families (tests/test_render_golden.py: TP8 x PP2 over two HGX nodes, TP4 x EP4 over four
GB200 trays, TP2 on L40S). Every container of every pod (leader and workers) is parsed in ONE
subprocess in the SGLang venv (tests/conformance/sglang_probe.py: ServerArgs.add_cli_args +
parse_args + ServerArgs.from_cli_args, as sglang's prepare_server_args does); a rejected flag fails
with SGLang's own argparse message. SGLANG_* environment names are checked against SGLang's registry
(sglang/srt/environ.py).

The start-up configuration: for every example case the probe then runs ServerArgs.resolve_once() +
check_server_args() (what SGLang 0.5.23 runs at start-up) with the model's real config.json in a local
directory (tests/fixtures/models; the vLLM suite's fixtures and synthesized configs) and a simulated CUDA
device of the planned product. Stood in: `sgl_kernel`, SGLang's compiled CUDA ops, which need the NVIDIA
driver's libcuda.so.1 to load (tried: "ImportError: libcuda.so.1: cannot open shared object file"); the
probe gives its names opaque stand-ins so module-level imports resolve (see sglang_probe.py). The
golden layout families are parsed only (their models are the goldens' hand-built candidates).
"""

from __future__ import annotations

import copy
import glob
from pathlib import Path

import pytest
import yaml
import sys

from conftest import ROOT, run_in_venv
from test_vllm import _gpu_of, _model_dir   # the same config.json fixtures and GPU facts as the vLLM suite

from meshplan.api.models import LLMDeployment
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

VENV = "sglang-0.5.23"
PROBE = Path(__file__).with_name("sglang_probe.py")

# (example, fleet) pairs that plan (the other fleets lack the example's GPU product)
EXAMPLE_FLEETS = {"deepseek-r1-h200.yaml": "mixed", "deepseek-r1-mtp-h200.yaml": "mixed",
                  "llama-3.1-8b-1gpu.yaml": "hgx-h100",
                  "llama-3.1-70b-hgx-h100.yaml": "hgx-h100", "mixtral-8x7b-l40s.yaml": "mixed",
                  "gpt-moe-1.8t-gb200-nvl72.yaml": "gb200-nvl72",
                  # the NIM and DeepSpeed-MII examples, run as SGLang
                  "llama-3.1-8b-nim.yaml": "hgx-h100", "llama-3.1-8b-deepspeed.yaml": "hgx-h100"}

VARIANTS = {
    "as-is": {},
    "no-prefix-cache-priority": {"engine": {"prefixCaching": False, "schedulingPolicy": "priority"}},
    "cuda-graphs-off": {"engine": {"cudaGraphs": "disabled"}},
    "eplb-off": {"engine": {"expertLoadBalancing": "disabled"}},
    "extra-args": {"engine": {"extraArgs": ["--log-level", "warning", "--context-length", "4096"]}},
}


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _deep_merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def _containers(objects: list[dict]):
    for o in objects:
        if o.get("kind") != "Pod":
            continue
        for c in o["spec"]["containers"]:
            yield o["metadata"]["name"], c


def _with_model(argv: list[str]) -> list[str]:
    """The argv with `--model-path`'s value replaced by the probe's placeholder for the config-only directory."""
    out = list(argv)
    i = out.index("--model-path")
    out[i + 1] = "@MODEL@"
    return out


def _cases(tmp: Path) -> list[dict]:
    cases = []
    for path in sorted(glob.glob(str(ROOT / "examples" / "*.yaml"))):
        name = Path(path).name
        doc = yaml.safe_load(Path(path).read_text())
        for variant, over in VARIANTS.items():
            spec = _deep_merge(doc["spec"], over)
            spec.setdefault("engine", {})["kind"] = "sglang"
            spec["engine"].pop("image", None)
            llmd = LLMDeployment.from_manifest({**doc, "spec": spec})
            topo = build_topology(fleet_nodes(load_fleet(EXAMPLE_FLEETS[name])), [], ready_if_unknown=True)
            result = plan_place_render(llmd, topo)
            if result.rendered is None:
                continue  # no SGLang plan for this example on its fleet (e.g. the layout is not one SGLang runs)
            for pod, c in _containers(result.rendered.objects):
                if "sglang.launch_server" not in " ".join(c.get("command", [])):
                    continue
                gpu = _gpu_of(result.plan.choice.gpu, int(c["resources"]["limits"].get("nvidia.com/gpu", 1)))
                cases.append({"id": f"{name}/{variant}/{pod}/{c['name']}", "argv": _with_model(c["args"]),
                              "env": [e["name"] for e in c.get("env", [])], "resolve": True,
                              "model_dir": str(_model_dir(tmp, llmd.spec)),
                              "gpu": {"name": gpu["name"], "capability": [gpu["major"], gpu["minor"]],
                                      "memory_bytes": gpu["memory_bytes"], "count": gpu["count"]},
                              "planned": {"chunk": result.plan.choice.chunk_size,
                                          "context": llmd.spec.workload.max_context or
                                          llmd.spec.workload.input_tokens + llmd.spec.workload.output_tokens}})
    sys.path.insert(0, str(ROOT / "tests"))
    from test_render_golden import SCENARIOS, render_scenario

    for fleet in SCENARIOS:
        for pod, c in _containers(render_scenario("sglang", fleet)):
            cases.append({"id": f"golden-{fleet}/{pod}/{c['name']}", "argv": list(c["args"]),
                          "env": [e["name"] for e in c.get("env", [])], "resolve": False})
    return cases


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cases = _cases(tmp_path_factory.mktemp("sglang-models"))
    # one subprocess per simulated GPU product: SGLang caches what the device reports (get_platform(),
    # lru_cache'd is_sm100_supported ...) for the life of the process, as on a real machine
    groups: dict[str, list[dict]] = {}
    for c in cases:
        groups.setdefault((c.get("gpu") or {}).get("name", ""), []).append(c)
    out: dict = {"results": []}
    for group in groups.values():
        part = run_in_venv(VENV, PROBE, {"cases": group})
        out["results"] += part["results"]
        out.update({k: v for k, v in part.items() if k != "results"})
    return cases, out


def test_every_rendered_sglang_argv_parses_with_sglang_0_5_23(probe):
    cases, out = probe
    assert out["version"] == "0.5.23"
    # the examples that plan with SGLang, all variants, plus the three golden layout families
    assert len(cases) >= 20, [c["id"] for c in cases]
    refused = {r["id"]: r["error"] for r in out["results"] if not r["parsed"]}
    assert not refused, refused


def test_multi_node_ranks_are_all_parsed(probe):
    cases, out = probe
    ranks: dict[str, list[int]] = {}   # replica -> node ranks of its pods (two replicas of TP8 x PP2 on 2 nodes)
    for r in out["results"]:
        if r["id"].startswith("golden-hgx-h100"):
            replica = r["id"].split("/")[1].rsplit("-", 1)[0]
            ranks.setdefault(replica, []).append(r["raw"]["node_rank"])
            assert r["raw"]["nnodes"] == 2
    assert len(ranks) == 2 and all(sorted(v) == [0, 1] for v in ranks.values()), ranks


def test_attention_dp_layout_means_what_the_plan_says(probe):
    """TP4 x EP4 (golden gb200-nvl72): SGLang's own parser reads tp 16, attn-dp 4, ep 4, and a chunk of
    4 x the planned 1024 (SGLang divides it by attn-dp-size: each rank gets 1024)."""
    _, out = probe
    raws = [r["raw"] for r in out["results"] if r["id"].startswith("golden-gb200-nvl72")]
    assert raws
    for raw in raws:
        assert (raw["tp_size"], raw["attn_dp_size"], raw["ep_size"]) == (16, 4, 4)
        assert raw["dp_size"] == 1 and raw["chunked_prefill_size"] == 4 * 1024
        assert raw["chunked_prefill_size"] // raw["attn_dp_size"] % 128 == 0
        assert raw["enable_eplb"] and raw["ep_num_redundant_experts"] == 4


def test_every_rendered_argv_has_a_context_length_or_the_user_set_one(probe):
    _, out = probe
    missing = [r["id"] for r in out["results"] if r["id"].endswith("extra-args") and not r["raw"]["context_length"]]
    assert not missing


def test_sglang_env_names_are_in_sglangs_registry(probe):
    _, out = probe
    assert out["registry_size"] > 100
    unknown = {r["id"]: r["unknown_env"] for r in out["results"] if r["unknown_env"]}
    assert not unknown, unknown


def test_every_example_case_builds_sglangs_start_up_configuration(probe):
    """resolve_once() + check_server_args() accept every rendered example argv, and the resolved config is the
    plan: the chunk each attention-DP rank runs (SGLang's resolution divides --chunked-prefill-size by
    attn-dp-size; meshplan renders chunk x attn-dp-size for that) and the maximum length."""
    cases, out = probe
    by_id = {c["id"]: c for c in cases}
    resolved = [r for r in out["results"] if by_id[r["id"]].get("resolve")]
    assert len(resolved) >= 15, len(resolved)
    failed = {r["id"]: r["error"] + "\n" + r.get("trace", "") for r in resolved if not r["resolved"]}
    assert not failed, failed
    for r in resolved:
        cfg, planned = r["config"], by_id[r["id"]]["planned"]
        if planned["chunk"]:
            # SGLang's resolution divides the rendered --chunked-prefill-size by attn-dp-size: what it keeps is
            # the chunk one rank runs, which must be the plan's
            assert cfg["chunked_prefill_size"] == planned["chunk"], (r["id"], cfg)
        want = 4096 if r["id"].split("/")[1] == "extra-args" else planned["context"]
        assert cfg["context_length"] == want, (r["id"], cfg)


def test_mtp_example_resolves_to_sglangs_nextn_speculative_config(probe):
    """examples/deepseek-r1-mtp-h200.yaml (spec.engine.speculative mtp, 2 tokens) with DeepSeek-R1's real config.json
    (num_nextn_predict_layers 1): SGLang 0.5.23's start-up resolution keeps a chain of 2 draft steps, top-k 1, 3
    tokens verified, under its resolved algorithm (NEXTN is an alias of EAGLE); the examples without it run none."""
    cases, out = probe
    mtp = [r for r in out["results"] if r["id"].startswith("deepseek-r1-mtp-h200.yaml/")]
    assert mtp and all(r["resolved"] for r in mtp), [(r["id"], r["error"]) for r in mtp]
    for r in mtp:
        cfg = r["config"]
        assert cfg["speculative_algorithm"] in ("NEXTN", "EAGLE"), cfg
        assert (cfg["speculative_num_steps"], cfg["speculative_eagle_topk"], cfg["speculative_num_draft_tokens"]) == \
            (2, 1, 3), cfg
    plain = [r for r in out["results"] if r["id"].startswith("deepseek-r1-h200.yaml/") and r["resolved"]]
    assert plain and all(r["config"]["speculative_algorithm"] is None for r in plain)
