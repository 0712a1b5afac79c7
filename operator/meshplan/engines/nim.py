"""NVIDIA NIM for LLMs: how it is told a layout (environment), what it refuses, and the pod's container.

Version: NIM for LLMs 1.8.0 (the LLM-specific containers `nvcr.io/nim/<org>/<model>:1.8.0`). NIM is
configured through environment variables, not a command line; the image's own entrypoint starts the
server (vLLM or TensorRT-LLM backend, chosen by the model profile). Every name here with its source:

- Model profiles (docs.nvidia.com/nim/large-language-models/1.8.0 "Configure Your NIM" and
  "Model Profiles"): each profile is a pre-validated configuration whose tags are the backend
  (`tensorrt_llm`, `vllm`), precision (bf16, fp8), `tp<N>`, `pp<M>` and feat_lora, e.g.
  `tensorrt_llm-trtllm_buildable-bf16-tp8-pp2` ("you will need TP * PP GPUs"); `NIM_MODEL_PROFILE`
  selects one by id or name, otherwise NIM picks one compatible with the GPUs it sees.
- `NIM_TENSOR_PARALLEL_SIZE`, `NIM_PIPELINE_PARALLEL_SIZE`: the TP/PP degree (NVIDIA/k8s-nim-operator
  api/apps/v1alpha1 NIMService multi-node env; NIM docs "Configure Your NIM": "profiles that only use
  1 GPU (for example NIM_TENSOR_PARALLEL_SIZE=1)").
- `NIM_MAX_MODEL_LEN` (context length), `NIM_SERVED_MODEL_NAME` (the model name of the API),
  `NIM_MODEL_NAME` (a local model directory for the multi-LLM NIM), `NIM_ENABLE_KV_CACHE_REUSE=1`
  (prefix caching: "KV Cache Reuse with NVIDIA NIM for LLMs"), `NIM_CACHE_PATH` (default
  /opt/nim/.cache), `NIM_SERVER_PORT` (HTTP port, default 8000), `NGC_API_KEY` (NGC credentials the
  container downloads its profile's weights with; from a Secret in spec.engine.env) — NIM docs
  "Configure Your NIM" and NVIDIA/nim-deploy helm/nim-llm templates, NVIDIA/k8s-nim-operator
  NIMService.GetStandardEnv.
- Health: GET `/v1/health/ready` (readiness/startup) and `/v1/health/live` (NIM docs multi-node
  note; NIM Operator default probes). Metrics: `/v1/metrics` with `time_to_first_token_seconds`,
  `time_per_output_token_seconds`, `e2e_request_latency_seconds`, `num_requests_running`,
  `num_requests_waiting`, `gpu_cache_usage_perc` (NIM docs "Observability").
- Multi-node (NIM docs "Multi-Node Deployment"; nim-deploy helm/nim-llm multi_node_deployment.yaml;
  NIM Operator spec.multiNode.mpi): a LeaderWorkerSet whose leader runs `mpirun` over a per-group
  hostfile ConfigMap with an ssh key Secret, workers run `sshd`, env `NIM_MULTI_NODE=1`,
  `NIM_LEADER_ROLE`, `NIM_NODE_RANK`, `NIM_NUM_COMPUTE_NODES`. meshplan does not provision that MPI
  bootstrap (keys, hostfiles, sshd), so a NIM replica is one pod: layouts that need more pods (a
  replica larger than a node, or pipeline stages, which meshplan renders as one pod each) are refused
  with that reason (check_pods).

Not expressible, so refused: expert parallelism / attention DP (profiles carry tp and pp only), FP8
KV cache and weight precisions (NIM's profile fixes its precision; no environment variable picks
one). The batch limit and step token budget have no NIM variable: the profile's defaults run.

The planner prices NIM as vLLM (`PRICED_AS`): NIM's backends are vLLM and TensorRT-LLM; the
multi-LLM/generic profiles run vLLM, and meshplan cannot know which profile an image will pick.
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
)
from meshplan.planner.types import Candidate, Layout

NAME = "nim"
TITLE = "NVIDIA NIM for LLMs"
VERSION = "1.8.0"
DEFAULT_IMAGE = ""           # NIM images are per model (nvcr.io/nim/<org>/<model>:<version>)
NO_IMAGE_REASON = ("NIM containers are per model, e.g. nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0: name the "
                   "NIM of spec.model")
PRICED_AS = "vllm"
PRICED_AS_REASON = ("NIM is priced as vLLM (its generic/multi-LLM profiles run the vLLM backend; an LLM-specific "
                    "NIM may pick a TensorRT-LLM profile, which meshplan cannot know in advance)")
SUPPORTED_WEIGHT_DTYPES = SUPPORTED_KV_DTYPES = SIXTEEN_BIT
HEALTH_READY_PATH = "/v1/health/ready"
HEALTH_LIVE_PATH = "/v1/health/live"
METRICS_PATH = "/v1/metrics"
CACHE_PATH = "/opt/nim/.cache"
_DOCS = "docs.nvidia.com/nim/large-language-models/1.8.0 (Configure Your NIM)"

# The environment variables this module may set, each with its source (tests/conformance/test_nim.py checks
# the rendered pods against this list: NIM has no package whose registry could be read).
DOCUMENTED_ENV: dict[str, str] = {
    "NIM_TENSOR_PARALLEL_SIZE": "NIM docs Configure Your NIM; NVIDIA/k8s-nim-operator NIMService LWS env",
    "NIM_PIPELINE_PARALLEL_SIZE": "NVIDIA/k8s-nim-operator NIMService LWS env (ParallelismSpec.Pipeline)",
    "NIM_MAX_MODEL_LEN": "NIM docs Configure Your NIM (context length)",
    "NIM_SERVED_MODEL_NAME": "NIM docs Configure Your NIM (model name of the API)",
    "NIM_MODEL_NAME": "NIM docs Configure Your NIM (multi-LLM NIM: model path)",
    "NIM_MODEL_PROFILE": "NIM docs Model Profiles (profile id or name)",
    "NIM_ENABLE_KV_CACHE_REUSE": "NIM docs KV Cache Reuse with NVIDIA NIM for LLMs",
    "NIM_CACHE_PATH": "NIM docs Configure Your NIM; NVIDIA/nim-deploy helm/nim-llm",
    "NIM_SERVER_PORT": "NIM docs environment variables; NVIDIA/k8s-nim-operator NIMService.GetStandardEnv",
    "NGC_API_KEY": "NIM docs Configure Your NIM (NGC credentials, from a Secret)",
}


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    if layout.ep > 1:
        return (f"{TITLE} {VERSION} selects parallelism by model profile, whose tags are tp and pp only: expert "
                f"parallelism ep={layout.ep} cannot be expressed; pin spec.parallelism.expert 1 or use vllm/sglang")
    heads = getattr(model, "num_attention_heads", 0) or 0
    if heads and heads % layout.tp:
        return (f"{TITLE} (vLLM/TensorRT-LLM backends) needs the {heads} attention heads to divide by the tensor "
                f"parallel size {layout.tp}; choose tp from the divisors of {heads}")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    if pods > 1:
        return (f"{TITLE} runs a replica in several pods only with its MPI bootstrap (LeaderWorkerSet leader running "
                "mpirun over a hostfile ConfigMap with an ssh key Secret, workers running sshd; NIM docs Multi-Node "
                f"Deployment, NVIDIA/nim-deploy helm/nim-llm), which meshplan does not provision: {layout.label()} "
                f"needs {pods} pods (meshplan renders each pipeline stage as its own pod); choose pipeline 1 and a "
                "tensor-parallel size that fits one node, or use vllm/sglang")
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    return None      # no NIM variable sets them: explained as not rendered


def check_precision(model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    return sixteen_bit_only(TITLE, model, weight_dtype, kv_dtype)


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    if layout.ep > 1:
        raise ValueError(check_layout(layout))
    notes: list[str] = []
    if chunk_size or max_num_seqs:
        notes.append("NIM has no variable for the step token budget or the batch limit: the selected profile's "
                     f"defaults run, not the planned chunk {chunk_size} / batch {max_num_seqs}")
    # NIM is configured by environment: the layout's "flags" are variables (EngineLayout.config), no argv.
    config = {"NIM_TENSOR_PARALLEL_SIZE": layout.tp, "NIM_PIPELINE_PARALLEL_SIZE": layout.pp}
    return EngineLayout(engine=NAME, flags={}, config=config, attention_tp=layout.tp, moe_tp=layout.tp,
                        pp=layout.pp, exact=True, notes=tuple(notes))


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    if candidate.weight_dtype not in SUPPORTED_WEIGHT_DTYPES and candidate.weight_dtype != serving.checkpoint_dtype:
        raise RenderError(f"spec.precision.weights {candidate.weight_dtype}: {TITLE} {VERSION} takes its precision "
                          "from the model profile and has no variable that sets it; pin spec.precision.weights bf16 "
                          "(or the checkpoint's dtype)")
    if candidate.kv_dtype not in SUPPORTED_KV_DTYPES:
        raise RenderError(f"spec.precision.kvCache {candidate.kv_dtype}: {TITLE} {VERSION} has no variable for the "
                          "KV-cache dtype; pin spec.precision.kvCache bf16")
    if serving.extra_args:
        raise RenderError(f"spec.engine.extraArgs: {TITLE} is configured by environment variables, not a command "
                          "line; set them in spec.engine.env")
    env: dict[str, str] = {k: str(v) for k, v in el.config.items()}
    for k, v in env.items():
        explain.append(Explanation(k, v, f"parallel layout {candidate.layout.label()}: the profile NIM selects must "
                                   "have these tp/pp tags (pin one with NIM_MODEL_PROFILE in spec.engine.env)",
                                   DOCUMENTED_ENV[k]))
    if serving.max_model_len:
        env["NIM_MAX_MODEL_LEN"] = str(serving.max_model_len)
    if serving.served_name:
        env["NIM_SERVED_MODEL_NAME"] = serving.served_name
    if serving.model.startswith("/"):
        env["NIM_MODEL_NAME"] = serving.model
        explain.append(Explanation("NIM_MODEL_NAME", serving.model, "a local model directory (multi-LLM NIM)",
                                   DOCUMENTED_ENV["NIM_MODEL_NAME"]))
    else:
        explain.append(Explanation("model", serving.model, "the NIM image serves its own model: spec.engine.image "
                                   "must be the NIM of this model (the plan was sized from its config.json)", _DOCS,
                                   "warning"))
    if serving.revision:
        raise RenderError(f"spec.model.weights revision {serving.revision!r}: a NIM image pins its model's weights; "
                          "remove the revision or serve a local directory (pvc://) with the multi-LLM NIM")
    env["NIM_ENABLE_KV_CACHE_REUSE"] = "1" if serving.prefix_caching else "0"
    env["NIM_CACHE_PATH"] = CACHE_PATH
    env["NIM_SERVER_PORT"] = str(serving.port)
    explain.append(Explanation("NIM_CACHE_PATH", CACHE_PATH, "NIM downloads the profile's weights here; set "
                               "NGC_API_KEY from a Secret in spec.engine.env for NGC-hosted models",
                               DOCUMENTED_ENV["NIM_CACHE_PATH"]))
    if serving.scheduling_policy == "priority":
        explain.append(Explanation("schedulingPolicy", "priority", "NIM has no variable for priority scheduling; "
                                   "requests are served first come, first served", _DOCS, "warning"))
    if serving.cuda_graphs == "disabled":
        explain.append(Explanation("cudaGraphs", "disabled", "NIM has no variable for CUDA graphs; the profile's "
                                   "backend decides", _DOCS, "warning"))
    # No command/args: the NIM image's entrypoint starts the server from the environment.
    return EngineCommand((), (), True, (("http", serving.port),), tuple(explain),
                         env=tuple(env.items()), health_path=HEALTH_READY_PATH, live_path=HEALTH_LIVE_PATH)
