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
from typing import Any
import glob
from pathlib import Path

import pytest
import yaml
import sys

from conftest import ROOT, run_in_venv
from test_vllm import _gpu_of, _model_dir   # the same config.json fixtures and GPU facts as the vLLM suite

from meshplan.api.models import LLMDeployment
from meshplan.engines import sglang as sglang_engine
from meshplan.engines.base import Disaggregation
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
                  "llama-3.1-8b-nim.yaml": "hgx-h100", "llama-3.1-8b-deepspeed.yaml": "hgx-h100",
                  "deepseek-r1-nim-multinode.yaml": "hgx-h100-ib"}

VARIANTS = {
    "as-is": {},
    "no-prefix-cache-priority": {"engine": {"prefixCaching": False, "schedulingPolicy": "priority"}},
    "cuda-graphs-off": {"engine": {"cudaGraphs": "disabled"}},
    "eplb-off": {"engine": {"expertLoadBalancing": "disabled"}},
    "extra-args": {"engine": {"extraArgs": ["--log-level", "warning", "--context-length", "4096"]}},
}


# (EP size, spec.engine.allToAll, spec.engine.batchOverlap) of the wide-EP cases
WIDE = ((16, "deepep-normal", "on"), (16, "deepep-low-latency", "on"), (32, "deepep-normal", "on"),
        (32, "deepep-low-latency", "on"), (16, "auto", "auto"), (32, "auto", "off"))


def _sglang_manifest(model: str, **spec: Any) -> dict:
    m = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "conf"},
         "spec": {"model": {"name": model}, "engine": {"kind": "sglang"},
                  "workload": {"inputTokens": 1024, "outputTokens": 256, "concurrency": 32}, "replicas": 1}}
    m["spec"].update(spec)
    return m


# Prefill/decode disaggregation (issue 19): DeepSeek-R1 prefill TP8 on one H200 node and decode TP16 x attention
# DP16 x EP16 over two nodes (DeepSeek's own split: prefill small-EP, decode wide-EP), with the pods' RDMA devices;
# dense Llama-3.1-8B on one GPU per role without RDMA (Mooncake over TCP) and with NIXL.
_IB = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
DISAGG_CASES = [
    ("pd-r1-prefill-tp8", _sglang_manifest("deepseek-r1", parallelism={"tensor": 8, "pipeline": 1},
                                           gpus={"maxGpus": 8, "products": ["NVIDIA-H200"]}),
     "hgx-h200-ib", Disaggregation("prefill", ib_devices=_IB)),
    ("pd-r1-decode-ep16", _sglang_manifest("deepseek-r1", parallelism={"tensor": 1, "expert": 16, "pipeline": 1},
                                           gpus={"maxGpus": 16, "products": ["NVIDIA-H200"]}),
     "hgx-h200-ib", Disaggregation("decode", ib_devices=_IB)),
    ("pd-llama-prefill-tcp", _sglang_manifest("llama-3.1-8b", gpus={"maxGpus": 1}), "hgx-h100",
     Disaggregation("prefill")),
    ("pd-llama-decode-tcp", _sglang_manifest("llama-3.1-8b", gpus={"maxGpus": 1}), "hgx-h100",
     Disaggregation("decode")),
    ("pd-llama-prefill-nixl", _sglang_manifest("llama-3.1-8b", gpus={"maxGpus": 1}), "hgx-h100",
     Disaggregation("prefill", "nixl", bootstrap_port=9100)),
    ("pd-llama-decode-nixl", _sglang_manifest("llama-3.1-8b", gpus={"maxGpus": 1}), "hgx-h100",
     Disaggregation("decode", "nixl")),
]


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


def _sglang_cases(tmp: Path, case: str, llmd: Any, result: Any, planned: dict) -> list[dict]:
    """One probe case per SGLang container of every pod of `result` (leader and workers)."""
    out = []
    for pod, c in _containers(result.rendered.objects):
        if "sglang.launch_server" not in " ".join(c.get("command", [])):
            continue
        gpu = _gpu_of(result.plan.choice.gpu, int(c["resources"]["limits"].get("nvidia.com/gpu", 1)))
        out.append({"id": f"{case}/{pod}/{c['name']}", "argv": _with_model(c["args"]),
                    "env": [e["name"] for e in c.get("env", [])], "resolve": True,
                    "model_dir": str(_model_dir(tmp, llmd.spec)),
                    "gpu": {"name": gpu["name"], "capability": [gpu["major"], gpu["minor"]],
                            "memory_bytes": gpu["memory_bytes"], "count": gpu["count"]},
                    "planned": {"chunk": result.plan.choice.chunk_size, **planned,
                                "context": llmd.spec.workload.input_tokens + llmd.spec.workload.output_tokens}})
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
    # wide EP over RDMA (issue 18): DeepSeek-R1 DP16+EP and DP32+EP on the hgx-h200-ib fleet (2 / 4 x 8 H200),
    # DeepEP normal and low-latency, two-batch overlap on, and both left to the planner; every pod resolved
    wide_topo = build_topology(fleet_nodes(load_fleet("hgx-h200-ib")), [], ready_if_unknown=True)
    ds = yaml.safe_load((ROOT / "examples" / "deepseek-r1-h200.yaml").read_text())
    for ep, a2a, ov in WIDE:
        spec = _deep_merge(ds["spec"], {"parallelism": {"tensor": 1, "expert": ep, "pipeline": 1},
                                        "gpus": {"maxGpus": ep}, "engine": {"allToAll": a2a, "batchOverlap": ov}})
        llmd = LLMDeployment.from_manifest({**ds, "spec": spec})
        result = plan_place_render(llmd, wide_topo)
        assert result.rendered is not None, f"wide EP{ep} {a2a}/{ov}: {result.message}"
        cases += _sglang_cases(tmp, f"wide-ep{ep}-{a2a}-tbo-{ov}", llmd, result,
                               {"ep": ep, "a2a": result.plan.choice.a2a_backend,
                                "overlap": result.plan.choice.batch_overlap})
    # meshplan's own choice for DeepSeek-R1 (the example, layout left open) on HGX H100 / H200 over InfiniBand
    for fleet, product in (("hgx-h100-ib", "NVIDIA-H100-80GB-HBM3"), ("hgx-h200-ib", "NVIDIA-H200")):
        spec = _deep_merge(ds["spec"], {"gpus": {"products": [product], "maxGpus": 32}})
        spec["parallelism"] = {}
        llmd = LLMDeployment.from_manifest({**ds, "spec": spec})
        result = plan_place_render(llmd, build_topology(fleet_nodes(load_fleet(fleet)), [], ready_if_unknown=True))
        assert result.rendered is not None, f"auto {fleet}: {result.message}"
        cases += _sglang_cases(tmp, f"auto-deepseek-r1-{fleet}", llmd, result,
                               {"ep": result.plan.choice.layout.ep, "a2a": result.plan.choice.a2a_backend,
                                "overlap": result.plan.choice.batch_overlap})
    # prefill/decode disaggregation (issue 19): each role rendered by the public path with
    # engines.base.Disaggregation set (plan_place_render(disagg=...)); every pod parsed and resolved
    for case, manifest, fleet, disagg in DISAGG_CASES:
        llmd = LLMDeployment.from_manifest(manifest)
        result = plan_place_render(llmd, build_topology(fleet_nodes(load_fleet(fleet)), [], ready_if_unknown=True),
                                   disagg=disagg)
        assert result.rendered is not None, f"{case}: {result.message}"
        role_cases = _sglang_cases(tmp, case, llmd, result, {"disagg": [disagg.role, disagg.transfer_backend,
                                                                         list(disagg.ib_devices)]})
        for c in role_cases:
            c["hcas"] = list(disagg.ib_devices)     # the RDMA devices the pod is given (simulated sysfs)
        cases += role_cases
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


def test_wide_ep_pods_run_deepep_and_two_batch_overlap_as_planned(probe):
    """Every pod of every wide-EP group parses and resolves with SGLang's own checks, with the planned
    --moe-a2a-backend deepep, --deepep-mode and --enable-two-batch-overlap, and its node rank."""
    cases, out = probe
    results = {r["id"]: r for r in out["results"]}
    wide = [c for c in cases if c["id"].startswith("wide-")]
    assert len(wide) == sum(ep // 8 for ep, _, _ in WIDE), [c["id"] for c in wide]
    mode = {"deepep-normal": "normal", "deepep-low-latency": "low_latency"}
    ranks: dict[str, list[int]] = {}
    for c in wide:
        r = results[c["id"]]
        assert r["parsed"] and r["resolved"], (c["id"], r["error"], r.get("trace", "")[-600:])
        raw, planned = r["raw"], c["planned"]
        assert planned["a2a"] in mode, c["id"]                # auto chose DeepEP across the domains too
        assert raw["moe_a2a_backend"] == "deepep" and raw["deepep_mode"] == mode[planned["a2a"]], (c["id"], raw)
        assert raw["enable_two_batch_overlap"] is planned["overlap"], (c["id"], raw)
        if "-tbo-on" in c["id"]:
            assert planned["overlap"], c["id"]
        if "-tbo-off" in c["id"]:
            assert not planned["overlap"], c["id"]
        assert raw["tp_size"] == raw["ep_size"] == raw["attn_dp_size"] == planned["ep"], (c["id"], raw)
        assert raw["nnodes"] == planned["ep"] // 8, (c["id"], raw)
        ranks.setdefault(c["id"].split("/")[0], []).append(raw["node_rank"])
    assert all(sorted(v) == list(range(len(v))) for v in ranks.values()), ranks


def test_meshplans_own_deepseek_r1_choice_on_hgx_parses_and_resolves(probe):
    """`meshplan plan`'s choice for DeepSeek-R1 on HGX H100 and H200 over InfiniBand: every pod resolves."""
    cases, out = probe
    results = {r["id"]: r for r in out["results"]}
    for fleet in ("hgx-h100-ib", "hgx-h200-ib"):
        mine = [c for c in cases if c["id"].startswith(f"auto-deepseek-r1-{fleet}/")]
        assert mine, fleet
        for c in mine:
            r = results[c["id"]]
            assert r["parsed"] and r["resolved"], (c["id"], r["error"], r.get("trace", "")[-600:])
            if c["planned"]["a2a"]:
                assert r["raw"]["moe_a2a_backend"] == "deepep", (c["id"], r["raw"])
    # on H100 no 8-GPU domain holds DeepSeek-R1's FP8 weights: the choice is a wide EP group of several pods
    h100 = [c for c in cases if c["id"].startswith("auto-deepseek-r1-hgx-h100-ib/")]
    assert len(h100) >= 2 and all(c["planned"]["a2a"] for c in h100), [c["id"] for c in h100]


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


def test_disaggregated_roles_resolve_to_sglangs_disaggregation_config(probe):
    """Issue 19: every prefill and decode pod parses and resolves with SGLang 0.5.23's own checks (resolve_once runs
    handle_pd_disaggregation) with the planned --disaggregation-mode, transfer backend (one of SGLang's choices;
    mooncake_tcp resolves to mooncake with MC_FORCE_TCP), bootstrap port on prefill and IB devices where the pod has
    RDMA devices; the decode server runs without the radix cache as SGLang resolves it; the R1 roles keep their
    layouts (prefill TP8, decode TP16 x attention DP16 x EP16 over two pods)."""
    cases, out = probe
    choices = set(out["facts"]["disagg_transfer_backends"])
    assert set(sglang_engine.DISAGG_TRANSFER_BACKENDS.values()) <= choices, choices
    results = {r["id"]: r for r in out["results"]}
    pd = [c for c in cases if c["id"].startswith("pd-")]
    assert len(pd) == len(DISAGG_CASES) + 1, [c["id"] for c in pd]     # the decode EP16 role has two pods
    for c in pd:
        r = results[c["id"]]
        assert r["parsed"] and r["resolved"], (c["id"], r["error"], r.get("trace", "")[-800:])
        role, backend, ib = c["planned"]["disagg"]
        raw, cfg = r["raw"], r["config"]
        want = backend or ("mooncake" if ib else "mooncake_tcp")
        assert raw["disaggregation_mode"] == role == cfg["disaggregation_mode"], (c["id"], raw)
        assert raw["disaggregation_transfer_backend"] == want, (c["id"], raw)
        assert cfg["disaggregation_transfer_backend"] == ("mooncake" if want == "mooncake_tcp" else want), cfg
        assert raw["disaggregation_ib_device"] == (",".join(ib) if ib else None), (c["id"], raw)
        if role == "prefill":
            assert raw["disaggregation_bootstrap_port"] == (9100 if "nixl" in c["id"] else 8998), raw
        else:
            assert cfg["disable_radix_cache"] is True, (c["id"], cfg)
    r1p = results[next(c["id"] for c in pd if c["id"].startswith("pd-r1-prefill"))]["raw"]
    assert (r1p["tp_size"], r1p["ep_size"], r1p["nnodes"]) == (8, 1, 1), r1p
    r1d = [results[c["id"]]["raw"] for c in pd if c["id"].startswith("pd-r1-decode")]
    assert sorted(d["node_rank"] for d in r1d) == [0, 1]
    assert all((d["tp_size"], d["attn_dp_size"], d["ep_size"], d["nnodes"]) == (16, 16, 16, 2) for d in r1d), r1d


ROUTER_VENV = "sglang-router-0.3.2"
ROUTER_PROBE = Path(__file__).with_name("sglang_router_probe.py")


def test_the_pd_router_argv_parses_with_sglang_routers_own_parser():
    """Issue 19: `engines.sglang.router_command` (the PD router in front of the roles) goes through sglang-router
    0.3.2's own parse_router_args + _validate_router_args: PD mode on, every prefill URL with its bootstrap port,
    every decode URL; a misspelt flag fails there (the last case: the router's own refusal is seen)."""
    prefill = ["conf-prefill-r0-0.conf-prefill-r0.default.svc:8000", "conf-prefill-r1-0.conf-prefill-r1.default.svc:8000"]
    decode = ["conf-decode-r0-0.conf-decode-r0.default.svc:8000"]
    cmd, args = sglang_engine.router_command(prefill, decode, port=8080)
    assert cmd == ("python3", "-m", "sglang_router.launch_router")
    cases = [{"id": "pd", "argv": list(args)},
             {"id": "misspelt", "argv": [a.replace("--pd-disaggregation", "--pd-disagregation") for a in args]}]
    out = run_in_venv(ROUTER_VENV, ROUTER_PROBE, {"cases": cases})
    assert out["version"] == "0.3.2"
    pd, bad = out["results"]
    assert pd["ok"], pd
    assert pd["pd_disaggregation"] is True and pd["port"] == 8080 and pd["host"] == "0.0.0.0"
    assert pd["prefill_urls"] == [[f"http://{e}", sglang_engine.SGLANG_BOOTSTRAP_PORT] for e in prefill], pd
    assert pd["decode_urls"] == [f"http://{e}" for e in decode], pd
    assert not bad["ok"] and "unrecognized arguments" in bad["error"], bad
