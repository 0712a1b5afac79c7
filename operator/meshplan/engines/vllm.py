"""vLLM: how it spells a layout, what it refuses, and the pod's `vllm serve` command line.

Facts (docs.vllm.ai "Expert Parallel Deployment", "Data Parallel Deployment", engine arguments):
`--tensor-parallel-size`, `--pipeline-parallel-size`, `--data-parallel-size`,
`--enable-expert-parallel`. With expert parallelism the EP group is TP x DP over the same GPUs
and every expert lives whole on one GPU (MoE-TP is 1): the blog's `tp x ep` stage becomes
`--tensor-parallel-size tp --data-parallel-size ep --enable-expert-parallel`. vLLM requires the
attention heads to divide by the TP size. Chunk: `--max-num-batched-tokens`; batch:
`--max-num-seqs`; memory: `--gpu-memory-utilization` (fraction of TOTAL memory).

Multi-node bootstrap (one pod per node slice; rank 0 is the leader):
- TP/PP across pods: the multiprocessing backend's multi-node mode (vLLM docs "Running vLLM with
  MultiProcessing", vllm-project/vllm#30509): every pod runs `vllm serve ... --nnodes N
  --node-rank R --master-addr LEADER --master-port 29501`, workers add `--headless`. No Ray.
- Expert parallel (`--data-parallel-size ep`) across pods: the data-parallel deployment: each
  pod runs its local DP ranks, `--data-parallel-size-local L --data-parallel-address LEADER
  --data-parallel-rpc-port 13345`, workers add `--data-parallel-start-rank` and `--headless`.
  A DP rank must not straddle pods (tp divides GPUs per pod) and PP must be 1.
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

NAME = "vllm"
TITLE = "vLLM"
DEFAULT_IMAGE = "vllm/vllm-openai:v0.12.0"     # has --nnodes/--node-rank multi-node (vLLM #30509)

VLLM_MASTER_PORT = 29501      # vLLM ParallelConfig.master_port default
VLLM_DP_RPC_PORT = 13345      # port used in vLLM's data-parallel deployment docs


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    heads = getattr(model, "num_attention_heads", 0) or 0
    experts = getattr(model, "num_experts", 0) or 0
    if heads and heads % layout.tp:
        # vLLM ModelConfig.verify_with_parallel_config: heads must split evenly.
        return (f"{TITLE} needs the {heads} attention heads to divide by the attention TP size "
                f"{layout.tp}; choose tp from the divisors of {heads}")
    if layout.ep > 1 and experts:
        group = layout.tp * layout.ep
        if experts < group or experts % group:
            return (f"vLLM places whole experts over EP = TP x DP = {layout.tp}x{layout.ep} = {group} GPUs, "
                    f"and {experts} experts do not split evenly over {group} GPUs")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    """vLLM's expert parallelism is its data-parallel deployment: across pods each pod runs whole DP ranks
    (`--data-parallel-size-local`), so a DP rank of TP GPUs must sit inside one pod, and that mode has no
    pipeline stages (vLLM docs "Data Parallel Deployment": DP ranks of TP only)."""
    if layout.ep > 1 and pods > 1 and (layout.pp > 1 or gpus_per_pod % layout.tp):
        return (f"vLLM cannot run {layout.label()} across {pods} pods of {gpus_per_pod} GPUs: its "
                f"data-parallel (expert-parallel) ranks of TP{layout.tp} must each sit inside one pod and PP "
                f"must be 1; pin spec.parallelism.tensor to a divisor of {gpus_per_pod} and pipeline 1, "
                "or use spec.engine.kind sglang")
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """`SchedulerConfig.verify_max_model_len` raises "max_num_batched_tokens (C) must be greater than or equal
    to max_num_seqs (S)" at startup (vllm/config/scheduler.py, v0.11-v0.12; every running sequence takes at
    least one token of the step's budget)."""
    if chunk_size and max_num_seqs and chunk_size < max_num_seqs:
        return (f"vLLM refuses --max-num-batched-tokens {chunk_size} below --max-num-seqs {max_num_seqs} "
                "(vllm/config/scheduler.py: max_num_batched_tokens must be >= max_num_seqs); raise "
                "spec.parallelism.chunkSize or lower spec.parallelism.maxNumSeqs")
    return None


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    notes: list[str] = []
    flags: dict[str, Any] = {"--tensor-parallel-size": tp, "--pipeline-parallel-size": pp}
    if ep > 1:
        flags["--data-parallel-size"] = ep
        flags["--enable-expert-parallel"] = True
        if a2a_backend:
            flags["--all2all-backend"] = a2a_backend
    exact = not (tp > 1 and ep > 1)
    if not exact:
        notes.append(f"vLLM keeps experts whole: MoE runs EP{tp * ep} (not TP{tp}xEP{ep}); "
                     f"expert memory per GPU is the same")
    eff = dict(attention_tp=tp, attention_dp=ep, moe_tp=1 if ep > 1 else tp, moe_ep=tp * ep if ep > 1 else 1)
    if chunk_size:
        flags["--max-num-batched-tokens"] = chunk_size
    if max_num_seqs:
        flags["--max-num-seqs"] = max_num_seqs
    if memory_fraction:
        flags["--gpu-memory-utilization"] = memory_fraction
    if kv_dtype == "fp8":
        flags["--kv-cache-dtype"] = "fp8"
    return EngineLayout(engine=NAME, flags=flags, pp=pp, exact=exact, notes=tuple(notes), **eff)


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    layout_ = candidate.layout
    flags: dict[str, Any] = {}
    ports: list[tuple[str, int]] = []
    multi = role.pods > 1
    leader = role.leader_host
    head: list[tuple[str, list[str]]] = [("", [serving.model])]
    flags["--host"] = "0.0.0.0"
    flags["--port"] = serving.port
    if serving.served_name:
        flags["--served-model-name"] = serving.served_name
    if serving.revision:
        flags["--revision"] = serving.revision
    if serving.load_format:
        # Run:ai model streamer: vllm serve s3://bucket/path --load-format runai_streamer (also gs://)
        flags["--load-format"] = serving.load_format
        explain.append(Explanation("--load-format", serving.load_format, f"stream the weights from "
                                   f"{serving.model.split('://', 1)[0]}:// with the Run:ai model streamer",
                                   "docs.vllm.ai models/extensions/runai_model_streamer"))
    flags.update(el.flags)
    flags.update(weight_flags(NAME, candidate.weight_dtype, serving.checkpoint_dtype, explain))
    if serving.max_model_len:
        flags["--max-model-len"] = serving.max_model_len
    flags["--enable-prefix-caching" if serving.prefix_caching else "--no-enable-prefix-caching"] = True
    flags["--scheduling-policy"] = serving.scheduling_policy
    if serving.cuda_graphs == "disabled":
        flags["--enforce-eager"] = True
    if layout_.ep > 1 and serving.expert_load_balancing != "disabled":
        flags["--enable-eplb"] = True
        explain.append(Explanation("--enable-eplb", "true", "expert parallelism over several GPUs: balance hot "
                                   "experts (spec.engine.expertLoadBalancing)", "vLLM EPLB docs"))
    if multi and layout_.ep > 1:
        local = role.gpus_per_pod // layout_.tp
        flags["--data-parallel-size-local"] = local
        flags["--data-parallel-address"] = leader
        flags["--data-parallel-rpc-port"] = VLLM_DP_RPC_PORT
        if not role.leader:
            flags["--data-parallel-start-rank"] = role.rank * local
            flags["--headless"] = True
        ports.append(("dp-rpc", VLLM_DP_RPC_PORT))
        explain.append(Explanation("--data-parallel-address", leader, f"{role.pods} pods form one EP group: "
                                   f"{local} DP rank(s) per pod, rank 0 pod serves the API",
                                   "vLLM Data Parallel Deployment docs"))
    elif multi:
        flags["--distributed-executor-backend"] = "mp"
        flags["--nnodes"] = role.pods
        flags["--node-rank"] = role.rank
        flags["--master-addr"] = leader
        flags["--master-port"] = VLLM_MASTER_PORT
        if not role.leader:
            flags["--headless"] = True
        ports.append(("dist", VLLM_MASTER_PORT))
        explain.append(Explanation("--nnodes", str(role.pods), "the replica spans pods: vLLM multiprocessing "
                                   "multi-node mode, workers --headless", "vLLM docs, vllm-project/vllm#30509"))
    args = flatten(merge_extra(head + flag_items(flags), serving.extra_args, serving.allow_plan_override,
                               explain))
    return EngineCommand(("vllm", "serve"), tuple(args), role.leader, tuple([("http", serving.port)] + ports),
                         tuple(explain))
