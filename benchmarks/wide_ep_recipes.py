"""The peers' wide-EP recipes against meshplan: the equivalent pinned LLMDeployment's arguments, and
meshplan's own choice on the same hardware with predicted figures (issue 18, Build 5).

    PYTHONPATH=operator python benchmarks/wide_ep_recipes.py

For each recipe (tests/fixtures/recipes/*.yaml; sources with URL and commit in each file): render the
pinned manifest on the hgx-h200-ib fleet (4 x 8 H200, InfiniBand, rdma/ib), print their flag -> our
flag/value for every row of the equivalence table, the differences and why, then plan the same spec with
the layout, all-to-all and batch overlap left to the planner and print both predictions and the plan's
reason. tests/test_wide_ep_recipes.py asserts every row and the reason.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES_DIR = ROOT / "tests" / "fixtures" / "recipes"
FLEET = "hgx-h200-ib"


@dataclass(frozen=True)
class Recipe:
    name: str
    file: str
    source: str                                   # URL @ commit
    # (their flag or setting, their value, our flag, our value on EVERY pod; None: the flag is absent)
    table: tuple[tuple[str, str, str, str | None], ...]
    # (what differs, why)
    differences: tuple[tuple[str, str], ...] = field(default=())
    pods: int = 2


KSERVE = Recipe(
    "KServe DeepSeek-R1-0528 DP32+EP (DeepEP high-throughput, RoCE)", "kserve-deepseek-r1-dp32-deepep-ht.yaml",
    "github.com/kserve/kserve docs/samples/llmisvc/dp-ep/deepseek-r1-gpu-rdma-roce/"
    "llm-inference-service-dp-ep-deepseek-r1-gpu-deepep-ht.yaml @ 35e18e82310490a6be77d564a6d3c038f9b0cd7a",
    (("parallelism.tensor", "1", "--tensor-parallel-size", "1"),
     ("parallelism.data", "32", "--data-parallel-size", "32"),
     ("parallelism.dataLocal", "8", "--data-parallel-size-local", "8"),
     ("parallelism.expert", "true", "--enable-expert-parallel", "true"),
     ("VLLM_ALL2ALL_BACKEND", "deepep_high_throughput", "--all2all-backend", "deepep_high_throughput"),
     ("--max-model-len", "8192", "--max-model-len", "8192"),
     ("--enforce-eager", "true", "--enforce-eager", "true"),
     ("(no DBO)", "", "--enable-dbo", None),
     ("(no EPLB)", "", "--enable-eplb", None)),
    (("--gpu-memory-utilization 0.95", "meshplan renders 0.9, the fraction its memory fit plans the KV cache "
      "with (no spec field pins it)"),
     ("RoCE: rdma/roce_gdr 1, Multus roce-p2, NCCL_IB_GID_INDEX 3, NVSHMEM/UCX variables",
      "the RDMA resources and NCCL/NVSHMEM environment come from the fleet's nodes (here InfiniBand rdma/ib x 8; "
      "render/nccl.py); a RoCE fleet renders its GID index"),
     ("VLLM_ALL2ALL_BACKEND (environment)", "meshplan passes the same choice as vLLM's --all2all-backend flag"),
     ("prefix caching", "meshplan renders --enable-prefix-caching explicitly (spec.engine.prefixCaching)")),
    pods=4)

LLM_D = Recipe(
    "llm-d wide-EP guide DP16+EP over 2 x 8 (LWS size 2, DBO, EPLB, NIXL)", "llm-d-wide-ep-dp16.yaml",
    "github.com/llm-d/llm-d guides/wide-ep-lws/manifests/modelserver/base/decode.yaml @ "
    "3318b75dcc3e0f7496199a35fd6c624c690490c1",
    (("--tensor-parallel-size", "1", "--tensor-parallel-size", "1"),
     ("--data-parallel-size", "16", "--data-parallel-size", "16"),
     ("--data-parallel-size-local", "8", "--data-parallel-size-local", "8"),
     ("--enable-expert-parallel", "true", "--enable-expert-parallel", "true"),
     ("VLLM_ALL2ALL_BACKEND", "deepep_low_latency", "--all2all-backend", "deepep_low_latency"),
     ("--enable-dbo", "true", "--enable-dbo", "true"),
     ("--enable-eplb", "true", "--enable-eplb", "true"),
     ("--eplb-config num_redundant_experts", "32", "--eplb-config",
      '{"num_redundant_experts":16,"window_size":1000,"step_interval":3000}')),
    (("--dbo-decode-token-threshold 32", "vLLM 0.32.0's default is 32 (ParallelConfig); meshplan prices it and "
      "leaves the flag at its default"),
     ("--eplb-config num_redundant_experts 32 (two per EP rank)",
      "meshplan renders --eplb-config num_redundant_experts 16: one redundant expert per EP rank (272 = 17 per GPU, engines.base.one_per_rank), held in its memory fit and priced; the count has no spec field"),
     ("--kv_transfer_config NixlConnector", "prefill/decode disaggregation with NIXL: meshplan serves "
      "aggregated replicas"),
     ("--data-parallel-hybrid-lb, --async-scheduling, --compilation_config FULL_DECODE_ONLY",
      "not planned: vLLM's defaults (internal load balancing; add them with spec.engine.extraArgs)"),
     ("--data-parallel-rpc-port 5555", "meshplan uses 13345, the port of vLLM's data-parallel docs")),
    pods=2)

DYNAMO = Recipe(
    "Dynamo DEP16 DeepSeek-R1 on 16 Hopper GPUs (decode worker)", "dynamo-dep16-deepseek-r1.yaml",
    "github.com/ai-dynamo/dynamo recipes/deepseek-r1/vllm/disagg/deploy_hopper_16gpu.yaml @ "
    "0044eb903566e0632bdf7bb7388c967d946643af",
    (("--tensor-parallel-size", "1", "--tensor-parallel-size", "1"),
     ("--data-parallel-size", "16", "--data-parallel-size", "16"),
     ("multinode.nodeCount 2 x gpu 8", "8 per node", "--data-parallel-size-local", "8"),
     ("--enable-expert-parallel", "true", "--enable-expert-parallel", "true"),
     ("--all2all-backend", "deepep_low_latency", "--all2all-backend", "deepep_low_latency"),
     ("--enable-dbo", "true", "--enable-dbo", "true"),
     ("--max-model-len", "16384", "--max-model-len", "16384"),
     ("--max-num-seqs", "512", "--max-num-seqs", "512"),
     ("--enable-eplb", "true", "--enable-eplb", "true"),
     ("--eplb-config num_redundant_experts", "32", "--eplb-config",
      '{"num_redundant_experts":16,"window_size":1000,"step_interval":3000}')),
    (("the prefill worker (a second DEP16, deepep_high_throughput)", "meshplan serves aggregated replicas: one "
      "DEP16 group; its all-to-all is priced per step kind (allToAll auto prices both kernels)"),
     ("--enable-eplb (num_redundant_experts 32, two per EP rank)",
      "meshplan renders --eplb-config num_redundant_experts 16: one redundant expert per EP rank (272 = 17 per GPU, engines.base.one_per_rank), held in its memory fit and priced; the count has no spec field"),
     ("--data-parallel-hybrid-lb, --async-scheduling, --compilation_config", "not planned: vLLM's defaults"),
     ("python3 -m dynamo.vllm", "meshplan runs vllm serve (no Dynamo runtime)")),
    pods=2)

RECIPES = (KSERVE, LLM_D, DYNAMO)


def _manifest(recipe: Recipe) -> dict:
    import yaml

    return yaml.safe_load((RECIPES_DIR / recipe.file).read_text())


def flags_of(argv: list[str]) -> dict[str, str]:
    """`--flag value` / `--switch` pairs of an argv (a switch maps to "true")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
                i += 2
                continue
            out[a] = "true"
        i += 1
    return out


def topology():
    import meshplan.planner  # noqa: F401  (first: meshplan.engines imports the planner's types)
    from meshplan.devcluster.fleets import fleet_nodes, load_fleet
    from meshplan.topology import build_topology

    return build_topology(fleet_nodes(load_fleet(FLEET)), [], ready_if_unknown=True)


def render_pinned(recipe: Recipe) -> tuple[object, list[dict[str, str]]]:
    """(the plan's choice, the engine flags of every pod) for the pinned recipe manifest."""
    from meshplan.api.models import LLMDeployment
    from meshplan.render.pipeline import plan_place_render

    res = plan_place_render(LLMDeployment.from_manifest(_manifest(recipe)), topology())
    if res.rendered is None:
        raise RuntimeError(f"{recipe.name}: {res.message or res.plan.reason}")
    pods = []
    for g in res.rendered.groups:
        for p in g.pods:
            for c in p["spec"]["containers"]:
                if list(c.get("command") or [])[:2] == ["vllm", "serve"]:
                    pods.append(flags_of(list(c["args"])))
    return res.plan.choice, pods


def auto_plan(recipe: Recipe):
    """The same spec with the layout, all-to-all and batch overlap left to the planner, on the same fleet."""
    from meshplan.api.models import LLMDeployment
    from meshplan.planner import plan_for_spec

    m = copy.deepcopy(_manifest(recipe))
    spec = m["spec"]
    spec["parallelism"] = {k: v for k, v in spec["parallelism"].items() if k == "maxNumSeqs"}
    spec["engine"]["allToAll"] = "auto"
    spec["engine"]["batchOverlap"] = "auto"
    spec["gpus"]["maxGpus"] = 32                  # the whole fleet: 4 x 8 H200
    spec.pop("replicas", None)                    # replicas (DP) chosen too: the same hardware, any layout
    return plan_for_spec(LLMDeployment.from_manifest(m).spec, topology())


def _fig(c) -> str:
    p = c.prediction
    return (f"{c.layout.label()} x DP{c.layout.dp} ({c.layout.total_gpus} GPUs, {c.a2a_backend or 'default a2a'}"
            f"{', overlap' if c.batch_overlap else ''}): {p.tokens_per_s_per_gpu:,.1f} tok/s/GPU, "
            f"{p.tokens_per_s_per_user:.1f} tok/s/user, TTFT {p.ttft_ms:,.0f} ms, ITL {p.tpot_ms:.1f} ms")


def main() -> int:
    for r in RECIPES:
        choice, pods = render_pinned(r)
        print(f"== {r.name}\n   source: {r.source}\n   manifest: tests/fixtures/recipes/{r.file} ({len(pods)} pods)")
        print(f"   {'theirs':<44} {'value':<24} {'ours':<28} value (every pod)")
        for theirs, tv, ours, ov in r.table:
            got = sorted({p.get(ours, "(absent)") for p in pods})
            print(f"   {theirs:<44} {tv:<24} {ours:<28} {', '.join(got)}")
        for what, why in r.differences:
            print(f"   differs: {what}: {why}")
        print(f"   pinned prediction: {_fig(choice)}")
        plan = auto_plan(r)
        if plan.choice is None:
            print(f"   meshplan's choice: none ({plan.reason})")
        else:
            print(f"   meshplan's choice: {_fig(plan.choice)}")
            print(f"   reason: {plan.reason}")
            if plan.extra.get("topology"):
                print(f"   topology: {plan.extra['topology']}")
        print()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "operator"))
    raise SystemExit(main())
