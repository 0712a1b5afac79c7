"""How one `Layout` is spelled by each inference engine, and which layouts an engine cannot run.

The planner thinks in the blog's notation (`types.Layout`): a replica is
`tp x ep x pp` GPUs; inside one pipeline stage, attention runs tensor-parallel
over `tp` GPUs and data-parallel over the `ep` groups, and every expert is split
`tp` ways inside its group of the `ep` expert groups (MoE-TP = tp, MoE-EP = ep).
No engine spells it that way, and each can express only part of it. This module
is the ONE mapping from a layout to each engine's parallel arguments; the
renderer and the search both call it.

Engine facts (checked against the engines' documentation):

- vLLM (docs.vllm.ai "Expert Parallel Deployment", "Data Parallel Deployment",
  engine arguments): `--tensor-parallel-size`, `--pipeline-parallel-size`,
  `--data-parallel-size`, `--enable-expert-parallel`. With expert parallelism the
  EP group is TP x DP over the same GPUs and every expert lives whole on one GPU
  (MoE-TP is 1). So the blog's `tp x ep` stage becomes
  `--tensor-parallel-size tp --data-parallel-size ep --enable-expert-parallel`,
  attention TP x DP exactly as the blog has it, experts spread over all
  `tp*ep` GPUs. vLLM requires the attention heads to divide by the TP size.
  Chunk: `--max-num-batched-tokens`; batch: `--max-num-seqs`; memory:
  `--gpu-memory-utilization` (fraction of TOTAL memory).
- SGLang (docs.sglang.io "Server Arguments", "Expert Parallelism"):
  `--tp-size` is every GPU of the stage, `--dp-size` with `--enable-dp-attention`
  splits attention into DP groups (attention TP = tp-size / dp-size),
  `--ep-size` partitions the TP ranks into expert groups (MoE-TP =
  tp-size / ep-size), `--pp-size`. So the blog layout maps exactly:
  `--tp-size tp*ep --dp-size ep --enable-dp-attention --ep-size ep`.
  The DeepEP all-to-all backend (`--moe-a2a-backend deepep`) needs
  ep-size = tp-size, i.e. MoE-TP 1: only layouts with `tp == 1` can use it.
  Chunk: `--chunked-prefill-size`; batch: `--max-running-requests`; memory:
  `--mem-fraction-static` (fraction of TOTAL memory).
- TensorRT-LLM (nvidia.github.io/TensorRT-LLM "Parallelism in TensorRT LLM",
  "Expert Parallelism", `trtllm-serve` options): `--tp_size` is every GPU of the
  stage, `--pp_size`, `--ep_size` (= moe_expert_parallel_size), and in the
  LLM-API YAML `moe_tensor_parallel_size` and `enable_attention_dp`; GPUs per
  worker = tp*pp*attention_dp = moe_tp*moe_ep*pp (AIConfigurator's notation,
  used by the calibration data). MoE maps exactly (moe_tp = tp, moe_ep = ep).
  Attention is EITHER TP over the whole stage OR DP over the whole stage, so it
  is exact only when `tp == 1` (attention DP) or `ep == 1` (attention TP); for
  `tp > 1 and ep > 1` attention runs TP over `tp*ep` GPUs and the mapping says
  so in `notes`. Chunk: `--max_num_tokens`; batch: `--max_batch_size`; memory:
  `--kv_cache_free_gpu_memory_fraction` (fraction of FREE memory after weights).

`DP` of the layout is independent replicas (separate engine instances, one per
replica, scaled by the operator), so it never appears in the engine flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.planner.types import Engine, Layout

ENGINES: tuple[Engine, ...] = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class EngineLayout:
    """A layout as one engine runs it.

    `flags` are command-line flags of the engine's server (flag -> value; `True`
    for a bare switch); `config` are entries of the engine's config file where the
    engine has no flag (TensorRT-LLM's LLM-API YAML). The effective degrees say what
    the engine really does, which may differ from the blog layout (see `exact`).
    """

    engine: Engine
    flags: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    attention_tp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    pp: int = 1
    exact: bool = True                   # the engine runs exactly the blog layout
    notes: tuple[str, ...] = ()

    @property
    def gpus_per_replica(self) -> int:
        return self.attention_tp * self.attention_dp * self.pp

    def argv(self) -> list[str]:
        """Flags as a command-line argument list (bare switches without a value)."""
        out: list[str] = []
        for flag, value in self.flags.items():
            if value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            else:
                out.extend([flag, str(value)])
        return out


def replica_pods(layout: Layout, gpus_per_node: int) -> tuple[int, int]:
    """(pods, GPUs per pod) of one replica on nodes of `gpus_per_node` GPUs: each pipeline stage is split
    into pods of the largest divisor of its GPUs that fits one node (`placement.request_for_layout`, which
    the renderer follows: one pod per node slice, one stage after the other)."""
    from meshplan.placement import gpus_per_pod_for

    stage = layout.tp * layout.ep
    g = gpus_per_pod_for(stage, max(1, gpus_per_node))
    return layout.pp * (stage // g), g


def check_pods(layout: Layout, engine: Engine, pods: int, gpus_per_pod: int) -> str | None:
    """Why `engine` cannot run one replica of `layout` as `pods` pods of `gpus_per_pod` GPUs (None when it can).

    vLLM's expert parallelism is its data-parallel deployment (module doc): across pods each pod runs
    whole DP ranks (`--data-parallel-size-local`), so a DP rank of TP GPUs must sit inside one pod, and
    that mode has no pipeline stages (vLLM docs "Data Parallel Deployment": DP ranks of TP only). SGLang
    (`--nnodes`) and TensorRT-LLM (one MPI world) run any split.
    """
    if engine == "vllm" and layout.ep > 1 and pods > 1 and (layout.pp > 1 or gpus_per_pod % layout.tp):
        return (f"vLLM cannot run {layout.label()} across {pods} pods of {gpus_per_pod} GPUs: its "
                f"data-parallel (expert-parallel) ranks of TP{layout.tp} must each sit inside one pod and PP "
                f"must be 1; pin spec.parallelism.tensor to a divisor of {gpus_per_pod} and pipeline 1, "
                "or use spec.engine.kind sglang")
    return None


def check_knobs(engine: Engine, chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """Why `engine` refuses this chunk size / batch limit pair (None when it accepts it).

    vLLM: `SchedulerConfig.verify_max_model_len` raises "max_num_batched_tokens (C) must be greater than
    or equal to max_num_seqs (S)" at startup (vllm/config/scheduler.py, v0.11-v0.12; every running
    sequence takes at least one token of the step's budget). SGLang and TensorRT-LLM cap the batch by
    the token budget at run time instead of refusing the pair.
    """
    if engine == "vllm" and chunk_size and max_num_seqs and chunk_size < max_num_seqs:
        return (f"vLLM refuses --max-num-batched-tokens {chunk_size} below --max-num-seqs {max_num_seqs} "
                "(vllm/config/scheduler.py: max_num_batched_tokens must be >= max_num_seqs); raise "
                "spec.parallelism.chunkSize or lower spec.parallelism.maxNumSeqs")
    return None


def check_layout(layout: Layout, engine: Engine, model: Any = None, *, a2a_backend: str | None = None,
                 gpus_per_node: int | None = None) -> str | None:
    """Why `engine` cannot run `layout` (None when it can).

    `model` (a `catalog.models.ModelArch`, optional) enables the rules that need
    the architecture: heads divisible by TP, experts enough for the EP group.
    `a2a_backend="deepep"` asks SGLang for DeepEP, which needs MoE-TP 1.
    `gpus_per_node` enables the rules on how a replica is split into pods
    (`check_pods`, the predicate the renderer applies to the pods it renders).
    """
    if engine not in ENGINES:
        return f"engine {engine!r} is not supported; use one of {', '.join(ENGINES)}"
    if gpus_per_node:
        why = check_pods(layout, engine, *replica_pods(layout, gpus_per_node))
        if why:
            return why
    heads = getattr(model, "num_attention_heads", 0) or 0
    experts = getattr(model, "num_experts", 0) or 0
    if model is not None and layout.ep > 1 and experts == 0:
        return f"ep={layout.ep} needs a mixture-of-experts model; {getattr(model, 'name', 'this model')} is dense"
    if engine in ("vllm", "sglang") and heads and heads % layout.tp:
        # vLLM ModelConfig.verify_with_parallel_config / SGLang attention TP: heads must split evenly.
        return (f"{_NAMES[engine]} needs the {heads} attention heads to divide by the attention TP size "
                f"{layout.tp}; choose tp from the divisors of {heads}")
    if engine == "vllm" and layout.ep > 1 and experts:
        group = layout.tp * layout.ep
        if experts < group or experts % group:
            return (f"vLLM places whole experts over EP = TP x DP = {layout.tp}x{layout.ep} = {group} GPUs, "
                    f"and {experts} experts do not split evenly over {group} GPUs")
    if engine == "sglang" and layout.ep > 1:
        if experts and experts % layout.ep:
            return f"SGLang needs the {experts} experts to divide by --ep-size {layout.ep}"
        if a2a_backend == "deepep" and layout.tp > 1:
            return (f"SGLang DeepEP needs --ep-size = --tp-size (MoE-TP 1), but TP{layout.tp}xEP{layout.ep} "
                    f"splits each expert {layout.tp} ways; use tp=1 or the default all-to-all backend")
    if engine == "trtllm" and layout.ep > 1 and experts and experts % layout.ep:
        return f"TensorRT-LLM needs the {experts} experts to divide by moe_expert_parallel_size {layout.ep}"
    return None


_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def engine_layout(
    layout: Layout,
    engine: Engine,
    model: Any = None,
    *,
    chunk_size: int | None = None,
    max_num_seqs: int | None = None,
    memory_fraction: float | None = None,
    kv_dtype: str | None = None,
    a2a_backend: str | None = None,
) -> EngineLayout:
    """The engine's spelling of one replica of `layout` (raises ValueError if it cannot run it)."""
    reason = check_layout(layout, engine, model, a2a_backend=a2a_backend)
    if reason:
        raise ValueError(reason)
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    notes: list[str] = []
    flags: dict[str, Any] = {}
    config: dict[str, Any] = {}
    if engine == "vllm":
        flags["--tensor-parallel-size"] = tp
        flags["--pipeline-parallel-size"] = pp
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
    elif engine == "sglang":
        flags["--tp-size"] = tp * ep
        flags["--pp-size"] = pp
        if ep > 1:
            flags["--dp-size"] = ep
            flags["--enable-dp-attention"] = True
            flags["--ep-size"] = ep
            if a2a_backend:
                flags["--moe-a2a-backend"] = a2a_backend
        exact = True
        eff = dict(attention_tp=tp, attention_dp=ep, moe_tp=tp, moe_ep=ep)
        if chunk_size:
            flags["--chunked-prefill-size"] = chunk_size
        if max_num_seqs:
            flags["--max-running-requests"] = max_num_seqs
        if memory_fraction:
            flags["--mem-fraction-static"] = memory_fraction
        if kv_dtype == "fp8":
            flags["--kv-cache-dtype"] = "fp8_e4m3"
    else:  # trtllm
        flags["--tp_size"] = tp * ep
        flags["--pp_size"] = pp
        if ep > 1:
            flags["--ep_size"] = ep
            config["moe_expert_parallel_size"] = ep
            config["moe_tensor_parallel_size"] = tp
        attention_dp = ep > 1 and tp == 1
        config["enable_attention_dp"] = attention_dp
        exact = not (tp > 1 and ep > 1)
        if attention_dp:
            eff = dict(attention_tp=1, attention_dp=ep, moe_tp=1, moe_ep=ep)
        else:
            eff = dict(attention_tp=tp * ep, attention_dp=1, moe_tp=tp, moe_ep=ep)
        if not exact:
            notes.append(f"TensorRT-LLM runs attention either TP or DP over a whole stage: attention runs "
                         f"TP{tp * ep} (not TP{tp}xDP{ep}); MoE runs TP{tp}xEP{ep} as planned")
        if chunk_size:
            flags["--max_num_tokens"] = chunk_size
        if max_num_seqs:
            flags["--max_batch_size"] = max_num_seqs
        if memory_fraction:
            flags["--kv_cache_free_gpu_memory_fraction"] = memory_fraction
        if kv_dtype == "fp8":
            config["kv_cache_config"] = {"dtype": "fp8"}
    return EngineLayout(engine=engine, flags=flags, config=config, pp=pp, exact=exact, notes=tuple(notes), **eff)


__all__ = ["ENGINES", "EngineLayout", "check_knobs", "check_layout", "check_pods", "engine_layout", "replica_pods"]
