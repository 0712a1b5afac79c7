"""Engine command lines from a plan: vLLM, SGLang, TensorRT-LLM, single- and multi-node.

Pure. The parallel flags come from the one layout -> engine mapping,
`meshplan.planner.engines.engine_layout` (never re-derived here); the engine's
module adds precision, serving features, the multi-node bootstrap and the user's
`extraArgs`, and explains every choice.

Multi-node bootstrap: one pod per node slice; rank 0 is the leader, reachable as
`<leader pod>.<group headless Service>.<namespace>.svc`; how each engine forms its group is in
its module (`meshplan.engines.<kind>`).

extraArgs: flags are compared by normalised name (`--max_num_seqs` ==
`--max-num-seqs`, vLLM's `-tp` == `--tensor-parallel-size`). Plan-owned flags
(meshplan.api.models.PLAN_OWNED_FLAGS) are dropped with a warning unless
`allowPlanOverride`; bootstrap flags (addresses, ranks, ports, `--headless`) are
always dropped; any other flag the renderer also sets is replaced by the user's
value and reported.
"""

from __future__ import annotations

from meshplan import engines as _engines
from meshplan.engines import DEFAULT_IMAGES
from meshplan.engines.base import (  # noqa: F401  (the renderer's public names)
    DEFAULT_MEMORY_FRACTION,
    HEALTH_PATH,
    HTTP_PORT,
    EngineCommand,
    PodRole,
    RenderError,
    ServingOptions,
    norm_flag,
    parse_args,
)
from meshplan.engines.sglang import SGLANG_DIST_PORT  # noqa: F401
from meshplan.engines.trtllm import TRTLLM_OPTIONS_PATH, TRTLLM_SCRIPT_NAME, TRTLLM_SSH_PORT  # noqa: F401
from meshplan.engines.vllm import VLLM_DP_RPC_PORT, VLLM_MASTER_PORT  # noqa: F401
from meshplan.planner.engines import check_knobs, check_pods, engine_knobs, engine_layout
from meshplan.planner.types import Candidate
from meshplan.render.nccl import Explanation

__all__ = ["DEFAULT_IMAGES", "DEFAULT_MEMORY_FRACTION", "EngineCommand", "HEALTH_PATH", "HTTP_PORT", "PodRole",
           "RenderError", "ServingOptions", "engine_command", "norm_flag", "parse_args"]


def engine_command(candidate: Candidate, serving: ServingOptions, role: PodRole) -> EngineCommand:
    """Command line of one pod of a replica group: the plan's flags explained, then the engine module's command."""
    engine = serving.engine
    layout = candidate.layout
    explain: list[Explanation] = []
    fraction = serving.memory_fraction or DEFAULT_MEMORY_FRACTION
    el = engine_layout(layout, engine, chunk_size=candidate.chunk_size, max_num_seqs=candidate.max_num_seqs,
                       memory_fraction=fraction, kv_dtype=candidate.kv_dtype,
                       a2a_backend=getattr(candidate, "a2a_backend", "") or None,
                       batch_overlap=bool(getattr(candidate, "batch_overlap", False)))
    # How the replica is split into pods: the planner's search asks the same predicate
    # (planner.engines.check_layout with gpus_per_node), so a planned layout passes it.
    knobs = engine_knobs(engine, layout, candidate.chunk_size, candidate.max_num_seqs)
    refused = check_pods(layout, engine, role.pods, role.gpus_per_pod) or \
        check_knobs(engine, knobs.chunk_size, knobs.max_num_seqs)
    if refused:
        raise RenderError(refused)
    src = f"plan {layout.label()} (meshplan.planner.engines)"
    for k, v in el.flags.items():
        n = norm_flag(k)
        if n in ("max-num-batched-tokens", "chunked-prefill-size", "max-num-tokens"):
            why = "plan chunk size: prefill tokens per engine step"
        elif n in ("max-num-seqs", "max-running-requests", "max-batch-size"):
            why = "plan batch limit: sequences per replica, or per DP rank where the engine counts it so"
        elif "fraction" in n or "utilization" in n:
            why = ("from spec" if serving.memory_fraction else
                   "0.9: the fraction the planner's memory fit assumes (meshplan's default; the engine's own "
                   "default, where it differs, is explained with it)")
        elif "kv-cache" in n:
            why = "plan KV-cache dtype"
        elif n in ("all2all-backend", "moe-a2a-backend", "deepep-mode"):
            why = (f"plan all-to-all {candidate.a2a_backend or v}: the EP group of {layout.label()} spans NVLink "
                   "domains over RDMA; DeepEP's kernels were priced (normal and low-latency) and chosen by the "
                   "objective (spec.engine.allToAll)")
        elif n in ("enable-dbo", "enable-two-batch-overlap"):
            why = ("plan batch overlap: two micro-batches, one's all-to-all hidden behind the other's compute; "
                   "priced on and off, chosen by the objective (spec.engine.batchOverlap)")
        else:
            why = f"parallel layout {layout.label()}"
        explain.append(Explanation(k, "true" if v is True else str(v), why, src))
    for note in el.notes:
        explain.append(Explanation("layout", layout.label(), note, src, "warning"))

    if serving.weights_refusal:
        raise RenderError(serving.weights_refusal)
    module = _engines.get(engine)
    if serving.disagg is not None and not hasattr(module, "disagg_flags"):
        raise RenderError(f"{module.TITLE} has no prefill/decode disaggregation meshplan can render; serve "
                          "aggregated (spec.serving.disaggregation disabled) or use vllm, sglang or trtllm")
    return module.command(candidate, serving, role, el, explain)
