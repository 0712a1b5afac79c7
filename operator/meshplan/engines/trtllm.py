"""TensorRT-LLM: how it spells a layout, what it refuses, and the pod's `trtllm-serve` command line.

Facts (nvidia.github.io/TensorRT-LLM "Parallelism in TensorRT LLM", "Expert Parallelism",
`trtllm-serve` options): `--tp_size` is every GPU of the stage, `--pp_size`, `--ep_size`
(= moe_expert_parallel_size), and in the LLM-API YAML `moe_tensor_parallel_size` and
`enable_attention_dp`; GPUs per worker = tp*pp*attention_dp = moe_tp*moe_ep*pp (AIConfigurator's
notation, used by the calibration data). MoE maps exactly (moe_tp = tp, moe_ep = ep). Attention is
EITHER TP over the whole stage OR DP over the whole stage, so it is exact only when `tp == 1`
(attention DP) or `ep == 1` (attention TP). Chunk: `--max_num_tokens`; batch: `--max_batch_size`;
memory: `--kv_cache_free_gpu_memory_fraction` (fraction of FREE memory after weights).

Multi-node: one MPI world (Dynamo/LWS TRT-LLM multi-node examples): workers run `sshd` on port
2222, the leader runs `mpirun -H pod0:g,pod1:g ... trtllm-llmapi-launch trtllm-serve ...` and
forwards the environment with `-x`. The leader's `/bin/sh -c` script only writes the LLM-API
options file and `exec "$@"`s the command line, which follows it as arguments: no user value is
ever shell text.
"""

from __future__ import annotations

from typing import Any

import yaml

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

NAME = "trtllm"
TITLE = "TensorRT-LLM"
DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.1.0"

TRTLLM_SSH_PORT = 2222
TRTLLM_OPTIONS_PATH = "/tmp/meshplan-llm-api-options.yaml"
TRTLLM_SCRIPT_NAME = "meshplan-trtllm"   # $0 of the leader's `sh -c` script


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    experts = getattr(model, "num_experts", 0) or 0
    if layout.ep > 1 and experts and experts % layout.ep:
        return f"TensorRT-LLM needs the {experts} experts to divide by moe_expert_parallel_size {layout.ep}"
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    return None      # one MPI world runs any split


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """TensorRT-LLM caps the batch by the token budget at run time instead of refusing the pair."""
    return None


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    notes: list[str] = []
    flags: dict[str, Any] = {"--tp_size": tp * ep, "--pp_size": pp}
    config: dict[str, Any] = {}
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
    return EngineLayout(engine=NAME, flags=flags, config=config, pp=pp, exact=exact, notes=tuple(notes), **eff)


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    flags: dict[str, Any] = {}
    ports: list[tuple[str, int]] = []
    multi = role.pods > 1
    if multi and not role.leader:
        explain.append(Explanation("command", "sshd", "TensorRT-LLM runs one MPI world: worker pods host MPI ranks "
                                   "started by the leader's mpirun", "TensorRT-LLM/Dynamo multi-node examples"))
        return EngineCommand(("/usr/sbin/sshd",), ("-D", "-p", str(TRTLLM_SSH_PORT)), False,
                             (("ssh", TRTLLM_SSH_PORT),), tuple(explain))
    flags["--host"] = "0.0.0.0"
    flags["--port"] = serving.port
    flags["--backend"] = "pytorch"
    flags.update(el.flags)
    weight_flags(NAME, candidate.weight_dtype, serving.checkpoint_dtype, explain)
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
    serve = ["trtllm-serve", serving.model] + flatten(
        merge_extra(flag_items(flags), serving.extra_args, serving.allow_plan_override, explain))
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
    script = f"cat > {TRTLLM_OPTIONS_PATH} <<'EOF'\n{text}\nEOF\nexec \"$@\"\n"
    return EngineCommand(("/bin/sh", "-c"), (script, TRTLLM_SCRIPT_NAME, *serve), role.leader,
                         tuple([("http", serving.port)] + ports), tuple(explain))
