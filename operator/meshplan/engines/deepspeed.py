"""DeepSpeed-MII: how it spells a layout, what it refuses, and the pod's OpenAI server command line.

Version: DeepSpeed-MII 0.3.3 (PyPI deepspeed-mii, with DeepSpeed 0.16.4, the FastGen / inference-v2
engine). Facts, from the 0.3.3 wheel's own source:

- Server: `python -m mii.entrypoints.openai_api_server` (mii/entrypoints/openai_api_server.py):
  argparse options `--model`, `--tensor-parallel` (default 1), `--replica-num` (default 1),
  `--max-length` (default 32768), `--host` (0.0.0.0), `--port` (8000), `--deployment-name`, ...;
  it calls `mii.serve(model, deployment_name=, tensor_parallel=, replica_num=, max_length=)` and then
  serves `/v1/completions`, `/v1/chat/completions`, `/v1/models` and `GET /health`.
- Parallelism (mii/config.py `ModelConfig`): `tensor_parallel` GPUs per replica (propagated to
  `RaggedInferenceEngineConfig.tensor_parallel.tp_size`) and `replica_num` replicas ("Enables easy
  data parallelism"). No pipeline, expert or data-parallel-attention setting exists. MoE models
  (Mixtral) run with their experts tensor-parallel.
- Placement (mii/backend/server.py `MIIServer`, mii/config.py `_allocate_devices`): without a
  DeepSpeed hostfile MII writes `localhost slots=<visible GPUs>` and places `replica_num` replicas of
  `tensor_parallel` GPUs on it; more hosts need a hostfile and DeepSpeed's pdsh/ssh launcher between
  them, which meshplan does not provision. So one replica is one pod, on one node.
- meshplan's replicas are separate pods that the operator scales and the Service balances; each pod
  runs `--replica-num 1` (MII's in-pod replicas would hide behind one pod's load balancer).
- Scheduler limits (deepspeed/inference/v2/ragged/manager_configs.py `DSStateManagerConfig`:
  max_ragged_batch_size 768 tokens per step, max_ragged_sequence_count 512, max_context 8192 tokens per
  sequence) and the KV-cache memory (`memory_config` mode reserve, 1 GB left free) have no server
  option: MII runs its defaults, so the planner plans at them (FIXED_KNOBS) and refuses others
  (check_knobs) and longer contexts; the KV cache is 16-bit (no FP8 KV); weights load in the
  checkpoint's 16-bit dtype (`quantization_mode` 'wf6af16' exists only in the Python API).
- Metrics: the server has no `/metrics` route (no Prometheus metrics).

The planner prices MII as vLLM (`PRICED_AS`): both schedule a per-step token budget mixing prefill
chunks with decodes (FastGen's Dynamic SplitFuse ~ vLLM's chunked prefill) and size the KV cache from
what the weights leave; no calibration data exists for MII, so the plan says so.
"""

from __future__ import annotations

from typing import Any

from meshplan.engines.base import (
    SIXTEEN_BIT,
    sixteen_bit_only,
    EngineCommand,
    EngineLayout,
    Explanation,
    PodRole,
    RenderError,
    ServingOptions,
    flag_items,
    flatten,
    merge_extra,
)
from meshplan.planner.types import Candidate, Layout

NAME = "deepspeed"
TITLE = "DeepSpeed-MII"
VERSION = "0.3.3"
DEFAULT_IMAGE = ""          # DeepSpeed publishes no serving image
NO_IMAGE_REASON = ("DeepSpeed-MII publishes no container image: build one with deepspeed-mii==0.3.3 "
                   "(and a CUDA DeepSpeed) and name it")
PRICED_AS = "vllm"
PRICED_AS_REASON = ("DeepSpeed-MII is priced as vLLM: no calibration data exists for MII; both run a per-step "
                    "token budget that mixes prefill chunks with decodes (FastGen Dynamic SplitFuse) and size "
                    "the KV cache from the memory the weights leave")
SUPPORTED_WEIGHT_DTYPES = SUPPORTED_KV_DTYPES = SIXTEEN_BIT
SERVER_MODULE = "mii.entrypoints.openai_api_server"
# DSStateManagerConfig defaults (deepspeed/inference/v2/ragged/manager_configs.py, DeepSpeed 0.16.4)
MII_MAX_RAGGED_BATCH_SIZE = 768
MII_MAX_RAGGED_SEQUENCE_COUNT = 512
# The planner plans MII at the (chunk, batch) it runs (planner.plan_inputs_from_spec): no option changes them.
FIXED_KNOBS = (MII_MAX_RAGGED_BATCH_SIZE, MII_MAX_RAGGED_SEQUENCE_COUNT)
MII_MAX_CONTEXT = 8192        # DSStateManagerConfig.max_context: tokens per sequence, prompt + output
MAX_CONTEXT = MII_MAX_CONTEXT  # the planner refuses longer workloads (planner.search._context_refusal)
# deepspeed/inference/v2/engine_factory.py (DeepSpeed 0.16.4): the model types FastGen implements
FASTGEN_MODEL_TYPES = ("opt", "llama", "mistral", "mixtral", "falcon", "phi", "phi3", "qwen", "qwen2", "qwen2_moe")
# Why no engine metrics: the autoscaler reports it in ScalingActive.
NO_METRICS_REASON = ("DeepSpeed-MII 0.3.3 exports no Prometheus metrics (mii/entrypoints/openai_api_server.py has "
                     "no /metrics route): name the TTFT/ITL histograms, request counter and queue/running gauges "
                     "of your own exporter in spec.autoscaling.metrics, or disable autoscaling")


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    if layout.pp > 1:
        return (f"{TITLE} {VERSION} has no pipeline parallelism (mii/config.py ModelConfig: tensor_parallel and "
                f"replica_num only): pp={layout.pp} cannot run; pin spec.parallelism.pipeline 1 or use vllm/sglang")
    if layout.ep > 1:
        return (f"{TITLE} {VERSION} has no expert parallelism (MoE experts run tensor-parallel): ep={layout.ep} "
                "cannot run; pin spec.parallelism.expert 1 or use vllm/sglang")
    if getattr(model, "kv_lora_rank", 0) or getattr(model, "linear_attention_layers", 0):
        return (f"{TITLE} {VERSION} (DeepSpeed 0.16.4 FastGen) implements only {', '.join(FASTGEN_MODEL_TYPES)} "
                f"(deepspeed/inference/v2/engine_factory.py): {getattr(model, 'name', 'this model')} uses "
                "MLA or linear attention; use vllm/sglang")
    heads = getattr(model, "num_attention_heads", 0) or 0
    if heads and heads % layout.tp:
        return (f"{TITLE} shards the {heads} attention heads over tensor_parallel {layout.tp}: choose tp from "
                f"the divisors of {heads}")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    if pods > 1:
        return (f"{TITLE} cannot run one replica of {layout.label()} across {pods} pods: MII places a replica's "
                f"{layout.tp} GPUs on one host (mii/backend/server.py writes `localhost slots=N`; more hosts need a "
                "DeepSpeed hostfile and pdsh/ssh between pods, which meshplan does not provision); choose a "
                "tensor-parallel size that fits one node")
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """MII has no server option for the step token budget or the batch limit: only its defaults
    (max_ragged_batch_size 768, max_ragged_sequence_count 512) are what runs."""
    if (chunk_size and chunk_size != MII_MAX_RAGGED_BATCH_SIZE) or \
            (max_num_seqs and max_num_seqs != MII_MAX_RAGGED_SEQUENCE_COUNT):
        return (f"{TITLE} {VERSION} has no option for the step token budget or the batch limit: it runs "
                f"max_ragged_batch_size {MII_MAX_RAGGED_BATCH_SIZE} and max_ragged_sequence_count "
                f"{MII_MAX_RAGGED_SEQUENCE_COUNT} (DeepSpeed 0.16.4 DSStateManagerConfig), not chunk {chunk_size} / "
                f"batch {max_num_seqs}; unpin spec.parallelism.chunkSize and maxNumSeqs")
    return None


def check_precision(model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    return sixteen_bit_only(TITLE, model, weight_dtype, kv_dtype)


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    if layout.pp > 1 or layout.ep > 1:
        raise ValueError(check_layout(layout))
    # chunk/batch: no option (check_knobs refuses any but MII's defaults, which the planner plans at)
    flags: dict[str, Any] = {"--tensor-parallel": layout.tp, "--replica-num": 1}
    return EngineLayout(engine=NAME, flags=flags, attention_tp=layout.tp, moe_tp=layout.tp, exact=True)


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    src = f"DeepSpeed-MII {VERSION} mii/entrypoints/openai_api_server.py"
    if candidate.weight_dtype not in SUPPORTED_WEIGHT_DTYPES and candidate.weight_dtype != serving.checkpoint_dtype:
        raise RenderError(f"spec.precision.weights {candidate.weight_dtype}: {TITLE} {VERSION} loads the checkpoint's "
                          "16-bit weights (its server has no quantization option); pin spec.precision.weights bf16")
    if candidate.kv_dtype not in SUPPORTED_KV_DTYPES:
        raise RenderError(f"spec.precision.kvCache {candidate.kv_dtype}: {TITLE} {VERSION} keeps a 16-bit KV cache "
                          "(no KV-cache dtype option); pin spec.precision.kvCache bf16")
    flags: dict[str, Any] = {"--model": serving.model, "--host": "0.0.0.0", "--port": serving.port}
    flags.update(el.flags)
    explain.append(Explanation("--replica-num", "1", "one MII replica per pod: meshplan's replicas are separate pods "
                               "the operator scales", src))
    if serving.max_model_len and serving.max_model_len > MII_MAX_CONTEXT:
        raise RenderError(f"spec.workload.maxContext {serving.max_model_len}: {TITLE} {VERSION} holds at most "
                          f"{MII_MAX_CONTEXT} tokens per sequence (DeepSpeed 0.16.4 DSStateManagerConfig.max_context, "
                          "no server option); lower it or use another engine")
    flags["--max-length"] = serving.max_model_len or MII_MAX_CONTEXT
    explain.append(Explanation("--max-length", str(flags["--max-length"]), "maximum prompt + output tokens per "
                               "request" + ("" if serving.max_model_len else
                                            f": the engine's sequence limit max_context {MII_MAX_CONTEXT} (the "
                                            "server's own default 32768 exceeds it)"), src))
    if serving.revision:
        raise RenderError(f"spec.model.weights.uri revision {serving.revision!r}: {TITLE} {VERSION} has no revision "
                          "option; point spec.model.weights at a local copy of that revision (pvc://)")
    if serving.served_name:
        explain.append(Explanation("servedName", serving.served_name, "not passed: the MII OpenAI server names the "
                                   "model by --model", src, "warning"))
    if not serving.prefix_caching:
        explain.append(Explanation("prefixCaching", "false", "DeepSpeed-MII has no prefix caching to turn off", src))
    if serving.scheduling_policy == "priority":
        explain.append(Explanation("schedulingPolicy", "priority", "DeepSpeed-MII serves requests first come, first "
                                   "served (no priority scheduling)", src, "warning"))
    if serving.cuda_graphs == "disabled":
        explain.append(Explanation("cudaGraphs", "disabled", "DeepSpeed-MII's server has no CUDA graph option; "
                                   "nothing to disable", src, "warning"))
    args = flatten(merge_extra(flag_items(flags), serving.extra_args, serving.allow_plan_override, explain))
    return EngineCommand(("python", "-m", SERVER_MODULE), tuple(args), True, (("http", serving.port),),
                         tuple(explain))
