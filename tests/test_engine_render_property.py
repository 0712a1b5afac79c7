"""Property: the planner only proposes layouts its own renderer (and so the engine) can run.

Defect (issue 16): the search chose layouts the renderer then refused, e.g. DeepSeek-R1 on vLLM on HGX
H100 with `maxGpus: 32` (EP8·PP4: "vLLM cannot run EP8·PP4 across 4 pods") and GPT-MoE-1.8T as vLLM on
GB200 (TP2·EP8·PP4). The engines' constraints live in `planner.engines` (`check_layout`, with the GPUs
per node: `check_pods`), and both the search and the renderer ask it.

Every example (examples/*.yaml) with each engine kind (vllm, sglang, trtllm), on every shipped fleet
(operator/meshplan/fleets/*.yaml) where it can be planned, has every frontier point placed and rendered
without error. To stay within a few seconds the knob grid is narrowed (two chunk sizes, three batch
limits, where the example does not pin them) and each distinct frontier layout (TP x EP x PP x DP,
GPU) is rendered once with the knobs of its first frontier point: whether a layout renders does not
depend on the knobs. `spec.gpus.products` is dropped so that each example meets every fleet's GPUs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from meshplan.api.models import LLMDeployment, pinned
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.planner import plan_for_spec, plan_inputs_from_spec
from meshplan.planner.engines import ENGINES
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FLEETS = sorted((ROOT / "operator" / "meshplan" / "fleets").glob("*.yaml"))
TOPOLOGIES = {f.stem: build_topology(fleet_nodes(load_fleet(str(f))), [], ready_if_unknown=True) for f in FLEETS}


# Engines meshplan pins no image for (spec.engine.image required) and which run only part of the layouts:
# an example may fit no fleet with them (e.g. DeepSeek-R1 needs expert parallelism or several nodes).
NO_IMAGE = {"nim": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0",
            "deepspeed": "registry.example.com/deepspeed-mii:0.3.3"}


def _deployment(path: Path, engine: str) -> LLMDeployment:
    m = yaml.safe_load(path.read_text())
    own = m["spec"].setdefault("engine", {}).get("kind", "vllm")
    m["spec"]["engine"]["kind"] = engine
    if engine in NO_IMAGE and own != engine:
        # engines without a pinned image; another engine's extraArgs are not theirs (NIM takes none)
        m["spec"]["engine"]["image"] = NO_IMAGE[engine]
        m["spec"]["engine"].pop("extraArgs", None)
        m["spec"]["engine"].pop("speculative", None)   # NIM and MII cannot be told to (the API refuses it)
    m["spec"].setdefault("gpus", {}).pop("products", None)
    return LLMDeployment.from_manifest(m)


def _narrow(spec):
    space = plan_inputs_from_spec(spec)["space"]
    p = spec.parallelism
    return dataclasses.replace(
        space,
        # pinned, or fixed by the engine (DeepSpeed-MII: planner.plan_inputs_from_spec): one value, kept
        chunk_sizes=space.chunk_sizes if pinned(p.chunk_size) or len(space.chunk_sizes) == 1 else (256, 2048),
        max_num_seqs=space.max_num_seqs if pinned(p.max_num_seqs) or len(space.max_num_seqs) == 1
        else (1, 16, 512))


def test_the_sweep_covers_every_example_engine_and_fleet():
    assert len(EXAMPLES) >= 5 and len(FLEETS) >= 3 and \
        set(ENGINES) == {"vllm", "sglang", "trtllm", "nim", "deepspeed"}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_frontier_point_renders_for_its_engine(path, engine):
    llmd = _deployment(path, engine)
    fitted, rendered, failures, reasons = [], 0, [], []
    for fleet, topology in TOPOLOGIES.items():
        plan = plan_for_spec(llmd.spec, topology, space=_narrow(llmd.spec))
        if not plan.frontier:
            assert plan.reason                        # it does not fit this fleet, and says why
            reasons.append(plan.reason)
            continue
        fitted.append(fleet)
        seen = set()
        for point in plan.frontier:
            key = (point.layout, point.gpu)
            if key in seen:
                continue
            seen.add(key)
            try:
                res = plan_place_render(llmd, topology, plan=dataclasses.replace(plan, choice=point))
            except ValueError as exc:               # RenderError is a ValueError
                failures.append(f"{fleet}: {point.layout.label()} x DP{point.layout.dp} on {point.gpu}: {exc}")
                continue
            assert res.rendered is not None and res.rendered.groups, (fleet, point.layout)
            leader = res.rendered.groups[0].pods[0]["spec"]["containers"][0]
            if engine == "nim":   # configured by environment; the image's entrypoint starts it
                assert "command" not in leader and any(e["name"] == "NIM_TENSOR_PARALLEL_SIZE" for e in leader["env"])
            else:
                assert leader["command"] or leader["args"]
            rendered += 1
    assert not failures, "planned layouts the renderer refuses:\n" + "\n".join(failures)
    if engine == "trtllm" and reasons and all("reads weight quantization from the checkpoint" in r for r in reasons):
        return   # pinned weights the checkpoint does not ship: the search refuses them with TensorRT-LLM's reason
    if engine in NO_IMAGE and not fitted:
        return    # every fleet said why (asserted above); the engine's own examples must fit (below)
    assert fitted, f"{path.name} as {engine} fits none of {sorted(TOPOLOGIES)}"
    assert rendered > 0


@pytest.mark.parametrize("engine", sorted(NO_IMAGE))
def test_the_new_engines_examples_fit_and_render(engine):
    path = ROOT / "examples" / f"llama-3.1-8b-{engine}.yaml"
    llmd = _deployment(path, engine)
    plan = plan_for_spec(llmd.spec, TOPOLOGIES["hgx-h100"])
    assert plan.choice is not None, plan.reason
    res = plan_place_render(llmd, TOPOLOGIES["hgx-h100"], plan=plan)
    assert res.rendered is not None and res.rendered.groups


@pytest.mark.parametrize("example,engine,fleet,patch", [
    # the two cases of the issue: DeepSeek-R1 on vLLM on HGX H100 with 32 GPUs and pipeline stages allowed
    ("deepseek-r1-h200", "vllm", "hgx-h100", {"gpus": {"maxGpus": 32}, "parallelism": {"pipeline": "auto"}}),
    ("gpt-moe-1.8t-gb200-nvl72", "vllm", "gb200-nvl72", {}),
])
def test_the_reported_layouts_are_rejected_by_the_search_with_the_renderers_reason(example, engine, fleet, patch):
    m = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    m["spec"]["engine"]["kind"] = engine
    m["spec"]["gpus"].pop("products", None)
    for key, value in patch.items():
        m["spec"].setdefault(key, {}).update(value)
    llmd = LLMDeployment.from_manifest(m)
    topology = TOPOLOGIES[fleet]
    plan = plan_for_spec(llmd.spec, topology, space=_narrow(llmd.spec))
    assert plan.choice is not None
    refused = [r for r in plan.rejected if "vLLM cannot run" in r.reason]
    assert refused and all(r.layout.ep > 1 and (r.layout.pp > 1 or r.layout.tp > 4) for r in refused)
    assert not any(c.layout.ep > 1 and c.layout.pp > 1 for c in plan.frontier)
    for point in {(c.layout, c.gpu): c for c in plan.frontier}.values():
        plan_place_render(llmd, topology, plan=dataclasses.replace(plan, choice=point))   # raises if refused
