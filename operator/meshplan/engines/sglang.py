"""SGLang: how it spells a layout, what it refuses, and the pod's `sglang.launch_server` command line.

Facts (docs.sglang.io "Server Arguments", "Expert Parallelism"): `--tp-size` is every GPU of the
stage, `--dp-size` with `--enable-dp-attention` splits attention into DP groups (attention TP =
tp-size / dp-size), `--ep-size` partitions the TP ranks into expert groups (MoE-TP = tp-size /
ep-size), `--pp-size`. So the blog layout maps exactly: `--tp-size tp*ep --dp-size ep
--enable-dp-attention --ep-size ep`. The DeepEP all-to-all backend (`--moe-a2a-backend deepep`)
needs ep-size = tp-size, i.e. MoE-TP 1: only layouts with `tp == 1` can use it. Chunk:
`--chunked-prefill-size`; batch: `--max-running-requests`; memory: `--mem-fraction-static`
(fraction of TOTAL memory).

Multi-node: `--dist-init-addr LEADER:5000 --nnodes N --node-rank R` on every pod (SGLang server
arguments); only rank 0 serves HTTP. SGLang (`--nnodes`) runs any split of a replica into pods.
"""

from __future__ import annotations

from typing import Any

from meshplan.engines.base import (
    EngineCommand,
    EngineLayout,
    Explanation,
    PodRole,
    ServingOptions,
    flag_items,
    flatten,
    merge_extra,
    weight_flags,
)
from meshplan.planner.types import Candidate, Layout

NAME = "sglang"
TITLE = "SGLang"
DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.5"

SGLANG_DIST_PORT = 5000       # port used in SGLang's multi-node docs (--dist-init-addr host:5000)


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    heads = getattr(model, "num_attention_heads", 0) or 0
    experts = getattr(model, "num_experts", 0) or 0
    if heads and heads % layout.tp:
        return (f"{TITLE} needs the {heads} attention heads to divide by the attention TP size "
                f"{layout.tp}; choose tp from the divisors of {heads}")
    if layout.ep > 1:
        if experts and experts % layout.ep:
            return f"SGLang needs the {experts} experts to divide by --ep-size {layout.ep}"
        if a2a_backend == "deepep" and layout.tp > 1:
            return (f"SGLang DeepEP needs --ep-size = --tp-size (MoE-TP 1), but TP{layout.tp}xEP{layout.ep} "
                    f"splits each expert {layout.tp} ways; use tp=1 or the default all-to-all backend")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """SGLang caps the batch by the token budget at run time instead of refusing the pair."""
    return None


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    flags: dict[str, Any] = {"--tp-size": tp * ep, "--pp-size": pp}
    if ep > 1:
        flags["--dp-size"] = ep
        flags["--enable-dp-attention"] = True
        flags["--ep-size"] = ep
        if a2a_backend:
            flags["--moe-a2a-backend"] = a2a_backend
    if chunk_size:
        flags["--chunked-prefill-size"] = chunk_size
    if max_num_seqs:
        flags["--max-running-requests"] = max_num_seqs
    if memory_fraction:
        flags["--mem-fraction-static"] = memory_fraction
    if kv_dtype == "fp8":
        flags["--kv-cache-dtype"] = "fp8_e4m3"
    return EngineLayout(engine=NAME, flags=flags, pp=pp, exact=True,
                        attention_tp=tp, attention_dp=ep, moe_tp=tp, moe_ep=ep)


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    layout_ = candidate.layout
    flags: dict[str, Any] = {}
    ports: list[tuple[str, int]] = []
    multi = role.pods > 1
    leader = role.leader_host
    flags["--model-path"] = serving.model
    flags["--host"] = "0.0.0.0"
    flags["--port"] = serving.port
    if serving.served_name:
        flags["--served-model-name"] = serving.served_name
    if serving.revision:
        flags["--revision"] = serving.revision
    flags.update(el.flags)
    flags.update(weight_flags(NAME, candidate.weight_dtype, serving.checkpoint_dtype, explain))
    # SGLang serves /metrics only when asked; the autoscaler reads its latency histograms there
    flags["--enable-metrics"] = True
    explain.append(Explanation("--enable-metrics", "true", "expose sglang:* Prometheus metrics for SLO "
                               "autoscaling (off by default in SGLang)",
                               "docs.sglang.io/references/production_metrics"))
    if serving.max_model_len:
        flags["--context-length"] = serving.max_model_len
    if not serving.prefix_caching:
        flags["--disable-radix-cache"] = True
    if serving.scheduling_policy == "priority":
        flags["--enable-priority-scheduling"] = True
    else:
        flags["--schedule-policy"] = "fcfs"
    if serving.cuda_graphs == "disabled":
        flags["--disable-cuda-graph"] = True
    if layout_.ep > 1 and serving.expert_load_balancing != "disabled":
        flags["--enable-eplb"] = True
        explain.append(Explanation("--enable-eplb", "true", "expert parallelism over several GPUs: balance hot "
                                   "experts (spec.engine.expertLoadBalancing)", "SGLang server arguments"))
    if multi:
        flags["--dist-init-addr"] = f"{leader}:{SGLANG_DIST_PORT}"
        flags["--nnodes"] = role.pods
        flags["--node-rank"] = role.rank
        ports.append(("dist", SGLANG_DIST_PORT))
        explain.append(Explanation("--dist-init-addr", f"{leader}:{SGLANG_DIST_PORT}",
                                   f"the replica spans {role.pods} pods; rank 0 serves HTTP",
                                   "SGLang server arguments (multi-node)"))
    args = flatten(merge_extra(flag_items(flags), serving.extra_args, serving.allow_plan_override, explain))
    return EngineCommand(("python3", "-m", "sglang.launch_server"), tuple(args), role.leader,
                         tuple([("http", serving.port)] + ports), tuple(explain))
