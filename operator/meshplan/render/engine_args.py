"""Engine command lines from a plan: vLLM, SGLang, TensorRT-LLM, single- and multi-node.

Pure. The parallel flags come from the one layout -> engine mapping,
`meshplan.planner.engines.engine_layout` (never re-derived here); this module
adds precision, serving features, the multi-node bootstrap and the user's
`extraArgs`, and explains every choice.

Multi-node bootstrap (one pod per node slice; rank 0 is the leader, reachable as
`<leader pod>.<group headless Service>.<namespace>.svc`):
- vLLM, TP/PP across pods: the multiprocessing backend's multi-node mode
  (vLLM docs "Running vLLM with MultiProcessing", vllm-project/vllm#30509):
  every pod runs `vllm serve ... --nnodes N --node-rank R --master-addr LEADER
  --master-port 29501`, workers add `--headless` (no API server). No Ray.
- vLLM, expert parallel (`--data-parallel-size ep`) across pods: vLLM's
  data-parallel deployment (docs "Data Parallel Deployment"): each pod runs its
  local DP ranks, `--data-parallel-size-local L --data-parallel-address LEADER
  --data-parallel-rpc-port 13345`, workers add `--data-parallel-start-rank` and
  `--headless`. A DP rank must not straddle pods (tp divides GPUs per pod) and
  PP must be 1; otherwise rendering refuses with the fix.
- SGLang: `--dist-init-addr LEADER:5000 --nnodes N --node-rank R` on every pod
  (SGLang server arguments); only rank 0 serves HTTP.
- TensorRT-LLM: one MPI world (Dynamo/LWS TRT-LLM multi-node examples): workers
  run `sshd` on port 2222, the leader runs `mpirun -H pod0:g,pod1:g ...
  trtllm-llmapi-launch trtllm-serve ...` and forwards the environment with `-x`.
  The image must ship OpenMPI and sshd with a shared key (the stock
  tensorrt-llm release image ships both; keys are the cluster's business). The leader's
  `/bin/sh -c` script only writes the LLM-API options file and `exec "$@"`s the command line,
  which follows it as arguments: no user value is ever shell text.

extraArgs: flags are compared by normalised name (`--max_num_seqs` ==
`--max-num-seqs`, vLLM's `-tp` == `--tensor-parallel-size`). Plan-owned flags
(meshplan.api.models.PLAN_OWNED_FLAGS) are dropped with a warning unless
`allowPlanOverride`; bootstrap flags (addresses, ranks, ports, `--headless`) are
always dropped; any other flag the renderer also sets is replaced by the user's
value and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import yaml

from meshplan.planner.engines import check_knobs, check_pods, engine_layout
from meshplan.planner.types import Candidate, Engine
from meshplan.render.nccl import Explanation

# Operator defaults when spec.engine.image is unset (pinned tags, override per deployment).
DEFAULT_IMAGES: dict[str, str] = {
    "vllm": "vllm/vllm-openai:v0.12.0",            # has --nnodes/--node-rank multi-node (vLLM #30509)
    "sglang": "lmsysorg/sglang:v0.5.5",
    "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:1.1.0",
}
HTTP_PORT = 8000
VLLM_MASTER_PORT = 29501      # vLLM ParallelConfig.master_port default
VLLM_DP_RPC_PORT = 13345      # port used in vLLM's data-parallel deployment docs
SGLANG_DIST_PORT = 5000       # port used in SGLang's multi-node docs (--dist-init-addr host:5000)
TRTLLM_SSH_PORT = 2222
HEALTH_PATH = "/health"       # vLLM, SGLang and trtllm-serve all serve GET /health
TRTLLM_OPTIONS_PATH = "/tmp/meshplan-llm-api-options.yaml"
TRTLLM_SCRIPT_NAME = "meshplan-trtllm"   # $0 of the leader's `sh -c` script

# Engine default memory fraction meshplan renders when the plan gives none: 0.9
# (vLLM --gpu-memory-utilization default; the planner's memory_fit default, which
# prices SGLang and TRT-LLM with the same figure).
DEFAULT_MEMORY_FRACTION = 0.9

_PLAN_OWNED = {
    "tensor-parallel-size", "tp-size", "tp", "pipeline-parallel-size", "pp-size", "pp",
    "data-parallel-size", "dp-size", "dp", "expert-parallel-size", "ep-size", "ep", "moe-ep-size",
    "enable-expert-parallel", "enable-dp-attention", "max-num-seqs", "max-num-batched-tokens",
    "max-running-requests", "chunked-prefill-size", "max-batch-size", "max-num-tokens", "kv-cache-dtype",
}
try:  # single source when the API package is present
    from meshplan.api.models import PLAN_OWNED_FLAGS as _API_FLAGS

    _PLAN_OWNED = set(_API_FLAGS) | {"ep"}
except ImportError:  # pragma: no cover - the API package is part of the distribution
    pass

_BOOTSTRAP = {
    "nnodes", "node-rank", "master-addr", "master-port", "headless", "data-parallel-size-local",
    "data-parallel-start-rank", "data-parallel-address", "data-parallel-rpc-port", "dist-init-addr",
    "host", "port", "distributed-executor-backend", "extra-llm-api-options", "backend",
    "served-model-name",   # spec.model.servedName owns it (immutable); the API refuses it in extraArgs
}
_SHORT_ALIASES = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
                  "ep": "enable-expert-parallel"}


def norm_flag(flag: str) -> str:
    """`--Max_Num_Seqs` -> `max-num-seqs`; `--no-enable-x` -> `enable-x`; vLLM `-tp` -> long name."""
    single = flag.startswith("-") and not flag.startswith("--")
    name = flag.lstrip("-").split("=", 1)[0].replace("_", "-").lower()
    if single and name in _SHORT_ALIASES:
        return _SHORT_ALIASES[name]
    if name.startswith("no-"):
        name = name[3:]
    return name


def parse_args(tokens: Sequence[str]) -> list[tuple[str, list[str]]]:
    """['--a', '1', '--b', '--c=2'] -> [('--a', ['1']), ('--b', []), ('--c', ['2'])]."""
    out: list[tuple[str, list[str]]] = []
    for t in tokens:
        if t.startswith("-") and not _is_number(t):
            if "=" in t and t.startswith("--"):
                k, v = t.split("=", 1)
                out.append((k, [v]))
            else:
                out.append((t, []))
        elif out:
            out[-1][1].append(t)
        else:
            out.append(("", [t]))
    return out


def _is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class ServingOptions:
    """Engine settings that do not come from the plan (spec.engine, spec.model)."""

    engine: Engine = "vllm"
    model: str = ""                         # what the engine loads: HF repo id or a path
    served_name: str | None = None
    revision: str | None = None
    load_format: str | None = None          # vLLM --load-format (runai_streamer for s3:// / gs://)
    weights_refusal: str = ""               # why this engine cannot open the weights (render.weights)
    checkpoint_dtype: str = "bf16"          # dtype of the checkpoint's weights
    prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    expert_load_balancing: str = "auto"     # auto | enabled | disabled (api.models spelling)
    cuda_graphs: str = "auto"               # auto | enabled | disabled (api.models spelling)
    memory_fraction: float | None = None
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    allow_plan_override: bool = False
    port: int = HTTP_PORT


@dataclass(frozen=True)
class PodRole:
    """Where one pod sits in its replica group."""

    rank: int = 0
    pods: int = 1
    gpus_per_pod: int = 1
    leader_host: str = "localhost"
    peer_hosts: tuple[str, ...] = ()        # every pod's DNS name by rank (TRT-LLM's MPI host list)
    env_names: tuple[str, ...] = ()         # variables mpirun must forward (TRT-LLM)

    @property
    def leader(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class EngineCommand:
    command: tuple[str, ...]
    args: tuple[str, ...]
    serves_http: bool
    ports: tuple[tuple[str, int], ...]
    explain: tuple[Explanation, ...] = field(default=())


class RenderError(ValueError):
    """A plan that the chosen engine cannot be started with; the message names the fix."""


def _flag_items(flags: dict[str, Any]) -> list[tuple[str, list[str]]]:
    out = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        out.append((k, [] if v is True else [str(v)]))
    return out


def _merge_extra(base: list[tuple[str, list[str]]], extra: Sequence[str], allow_override: bool,
                 explain: list[Explanation]) -> list[tuple[str, list[str]]]:
    index = {norm_flag(k): i for i, (k, _) in enumerate(base) if k}
    out = list(base)
    for flag, values in parse_args(extra):
        shown = " ".join([flag, *values]).strip()
        if not flag:
            out.append((flag, values))
            continue
        n = norm_flag(flag)
        if n in _BOOTSTRAP:
            explain.append(Explanation(flag, " ".join(values), "extraArgs cannot set bootstrap/port flags; ignored",
                                       "meshplan.render.engine_args", "warning"))
            continue
        if n in _PLAN_OWNED and not allow_override:
            explain.append(Explanation(flag, " ".join(values),
                                       "extraArgs sets a flag the plan owns; ignored (pin it in spec.parallelism/"
                                       "spec.precision or set spec.engine.allowPlanOverride)",
                                       "meshplan.api PLAN_OWNED_FLAGS", "warning"))
            continue
        if n in index:
            old = out[index[n]]
            out[index[n]] = (flag, values)
            same = norm_flag(old[0]) == n and old[1] == values and old[0].startswith("--no-") == flag.startswith("--no-")
            explain.append(Explanation(flag, " ".join(values),
                                       f"extraArgs replaces meshplan's `{' '.join([old[0], *old[1]])}`"
                                       + (" (plan override allowed: predictions may not describe what runs)"
                                          if n in _PLAN_OWNED else ""),
                                       "spec.engine.extraArgs", "info" if same else "warning"))
        else:
            out.append((flag, values))
            index[n] = len(out) - 1
            explain.append(Explanation(flag, " ".join(values), f"from spec.engine.extraArgs: {shown}"))
    return out


def _flatten(items: list[tuple[str, list[str]]]) -> list[str]:
    out: list[str] = []
    for k, vs in items:
        if k:
            out.append(k)
        out.extend(vs)
    return out


def _weight_flags(engine: Engine, weight_dtype: str, checkpoint_dtype: str,
                  explain: list[Explanation]) -> dict[str, Any]:
    """Precision flags for the weights (engine docs: vLLM/SGLang --dtype and --quantization)."""
    if engine == "trtllm":
        if weight_dtype != checkpoint_dtype and weight_dtype not in ("bf16", "fp16"):
            explain.append(Explanation("weights", weight_dtype,
                                       "TensorRT-LLM reads quantization from the checkpoint (ModelOpt): point "
                                       f"spec.model.weights at a {weight_dtype} checkpoint",
                                       "TensorRT-LLM quantization docs", "warning"))
        return {}
    if weight_dtype in ("bf16", "fp16"):
        return {"--dtype": "bfloat16" if weight_dtype == "bf16" else "float16"}
    if weight_dtype == checkpoint_dtype:
        explain.append(Explanation("weights", weight_dtype, "the checkpoint is already quantized; the engine "
                                   "reads the method from its config"))
        return {}
    if weight_dtype == "fp8":
        explain.append(Explanation("--quantization", "fp8", "plan chose FP8 weights: quantize the "
                                   f"{checkpoint_dtype} checkpoint online", "vLLM/SGLang quantization docs"))
        return {"--quantization": "fp8"}
    explain.append(Explanation("weights", weight_dtype,
                               f"{weight_dtype} weights need a pre-quantized checkpoint (AWQ/GPTQ/ModelOpt); point "
                               "spec.model.weights at one", "vLLM/SGLang quantization docs", "warning"))
    return {}


def engine_command(candidate: Candidate, serving: ServingOptions, role: PodRole) -> EngineCommand:
    """Command line of one pod of a replica group."""
    engine = serving.engine
    layout = candidate.layout
    explain: list[Explanation] = []
    fraction = serving.memory_fraction or DEFAULT_MEMORY_FRACTION
    el = engine_layout(layout, engine, chunk_size=candidate.chunk_size, max_num_seqs=candidate.max_num_seqs,
                       memory_fraction=fraction, kv_dtype=candidate.kv_dtype)
    # How the replica is split into pods: the planner's search asks the same predicate
    # (planner.engines.check_layout with gpus_per_node), so a planned layout passes it.
    refused = check_pods(layout, engine, role.pods, role.gpus_per_pod) or \
        check_knobs(engine, candidate.chunk_size, candidate.max_num_seqs)
    if refused:
        raise RenderError(refused)
    src = f"plan {layout.label()} (meshplan.planner.engines)"
    for k, v in el.flags.items():
        n = norm_flag(k)
        if n in ("max-num-batched-tokens", "chunked-prefill-size", "max-num-tokens"):
            why = "plan chunk size: prefill tokens per engine step"
        elif n in ("max-num-seqs", "max-running-requests", "max-batch-size"):
            why = "plan batch limit: sequences per replica"
        elif "fraction" in n or "utilization" in n:
            why = ("from spec" if serving.memory_fraction else
                   "default 0.9: the engine default the planner's memory fit assumes")
        elif "kv-cache" in n:
            why = "plan KV-cache dtype"
        else:
            why = f"parallel layout {layout.label()}"
        explain.append(Explanation(k, "true" if v is True else str(v), why, src))
    for note in el.notes:
        explain.append(Explanation("layout", layout.label(), note, src, "warning"))

    if serving.weights_refusal:
        raise RenderError(serving.weights_refusal)
    flags: dict[str, Any] = {}
    ports: list[tuple[str, int]] = []
    serves_http = role.leader
    multi = role.pods > 1
    leader = role.leader_host

    if engine == "vllm":
        command = ("vllm", "serve")
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
        flags.update(_weight_flags(engine, candidate.weight_dtype, serving.checkpoint_dtype, explain))
        if serving.max_model_len:
            flags["--max-model-len"] = serving.max_model_len
        flags["--enable-prefix-caching" if serving.prefix_caching else "--no-enable-prefix-caching"] = True
        flags["--scheduling-policy"] = serving.scheduling_policy
        if serving.cuda_graphs == "disabled":
            flags["--enforce-eager"] = True
        if layout.ep > 1 and serving.expert_load_balancing != "disabled":
            flags["--enable-eplb"] = True
            explain.append(Explanation("--enable-eplb", "true", "expert parallelism over several GPUs: balance hot "
                                       "experts (spec.engine.expertLoadBalancing)", "vLLM EPLB docs"))
        if multi and layout.ep > 1:
            local = role.gpus_per_pod // layout.tp
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
        args = _flatten(_merge_extra(head + _flag_items(flags), serving.extra_args, serving.allow_plan_override,
                                     explain))
        return EngineCommand(command, tuple(args), serves_http, tuple([("http", serving.port)] + ports),
                             tuple(explain))

    if engine == "sglang":
        command = ("python3", "-m", "sglang.launch_server")
        flags["--model-path"] = serving.model
        flags["--host"] = "0.0.0.0"
        flags["--port"] = serving.port
        if serving.served_name:
            flags["--served-model-name"] = serving.served_name
        if serving.revision:
            flags["--revision"] = serving.revision
        flags.update(el.flags)
        flags.update(_weight_flags(engine, candidate.weight_dtype, serving.checkpoint_dtype, explain))
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
        if layout.ep > 1 and serving.expert_load_balancing != "disabled":
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
        args = _flatten(_merge_extra(_flag_items(flags), serving.extra_args, serving.allow_plan_override, explain))
        return EngineCommand(command, tuple(args), serves_http, tuple([("http", serving.port)] + ports),
                             tuple(explain))

    # trtllm
    if multi and not role.leader:
        explain.append(Explanation("command", "sshd", "TensorRT-LLM runs one MPI world: worker pods host MPI ranks "
                                   "started by the leader's mpirun", "TensorRT-LLM/Dynamo multi-node examples"))
        return EngineCommand(("/usr/sbin/sshd",), ("-D", "-p", str(TRTLLM_SSH_PORT)), False,
                             (("ssh", TRTLLM_SSH_PORT),), tuple(explain))
    flags["--host"] = "0.0.0.0"
    flags["--port"] = serving.port
    flags["--backend"] = "pytorch"
    flags.update(el.flags)
    _weight_flags(engine, candidate.weight_dtype, serving.checkpoint_dtype, explain)
    if serving.max_model_len:
        flags["--max_seq_len"] = serving.max_model_len
    options: dict[str, Any] = dict(el.config)
    options["enable_chunked_prefill"] = True
    kv = dict(options.get("kv_cache_config") or {})
    kv["enable_block_reuse"] = serving.prefix_caching
    options["kv_cache_config"] = kv
    if serving.cuda_graphs == "disabled":
        options["cuda_graph_config"] = None
    if serving.scheduling_policy == "priority":
        explain.append(Explanation("schedulingPolicy", "priority", "trtllm-serve has no request-priority "
                                   "scheduling; requests are served first come, first served",
                                   "trtllm-serve docs", "warning"))
    if serving.served_name:
        explain.append(Explanation("servedName", serving.served_name, "not passed to trtllm-serve: clients address "
                                   "the model by its path/repository name", "trtllm-serve docs", "warning"))
    flags["--extra_llm_api_options"] = TRTLLM_OPTIONS_PATH
    explain.append(Explanation("--extra_llm_api_options", TRTLLM_OPTIONS_PATH,
                               "LLM-API settings without a CLI flag: " + ", ".join(sorted(options)),
                               "TensorRT-LLM LLM API reference"))
    serve = ["trtllm-serve", serving.model] + _flatten(
        _merge_extra(_flag_items(flags), serving.extra_args, serving.allow_plan_override, explain))
    if multi:
        world = role.pods * role.gpus_per_pod
        hosts = ",".join(f"{h}:{role.gpus_per_pod}" for h in role.peer_hosts)
        launch = ["mpirun", "--allow-run-as-root", "-np", str(world), "-H", hosts,
                  "--mca", "plm_rsh_args", f"-p {TRTLLM_SSH_PORT} -o StrictHostKeyChecking=no"]
        for name in role.env_names:
            launch += ["-x", name]
        serve = launch + ["trtllm-llmapi-launch"] + serve
        ports.append(("ssh", TRTLLM_SSH_PORT))
        explain.append(Explanation("mpirun -np", str(world), f"one MPI world over {role.pods} pods "
                                   f"({role.gpus_per_pod} ranks each), environment forwarded with -x",
                                   "TensorRT-LLM/Dynamo multi-node examples"))
    text = yaml.safe_dump(options, sort_keys=True).strip()
    # The script holds only what the operator wrote (the LLM-API options, from the plan); the command
    # line, which carries user values (model, extraArgs), follows as the script's own arguments and
    # is run with `exec "$@"`: sh never parses a user value (issue #17, shell injection).
    script = f"cat > {TRTLLM_OPTIONS_PATH} <<'EOF'\n{text}\nEOF\nexec \"$@\"\n"
    return EngineCommand(("/bin/sh", "-c"), (script, TRTLLM_SCRIPT_NAME, *serve), serves_http,
                         tuple([("http", serving.port)] + ports), tuple(explain))
