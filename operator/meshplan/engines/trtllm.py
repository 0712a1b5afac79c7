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
ever shell text. The release image ships no ssh keys, so the operator provisions them: one
Secret per deployment (`ssh_secret_name`, made by `meshplan.engines.trtllm_ssh`, created and
owned by the controller) with a client key pair, a host key and `known_hosts`, mounted read-only
(mode 0400) on every pod of a multi-node group; sshd and ssh are pointed at those files by
command-line options, so nothing of the image is changed (docs/trtllm-multinode.md).

Version: TensorRT-LLM 1.2.1 (`VERSION`), the newest release. Its PyPI package is a 10 kB
wheel-stub that downloads the real wheel from NVIDIA's own index at install time, which this
project cannot reach; tests/conformance/test_trtllm.py says which check stands in.
"""

from __future__ import annotations

from typing import Any, Sequence

import yaml

from meshplan.engines.base import (
    HTTP_PORT,
    Disaggregation,
    disagg_backend,
    EngineCommand,
    EngineLayout,
    Explanation,
    PodRole,
    ServingOptions,
    flag_items,
    flatten,
    merge_extra,
    mtp_refusal,
    RenderError,
)
from meshplan.planner.types import Candidate, Layout
from dataclasses import dataclass

NAME = "trtllm"
TITLE = "TensorRT-LLM"
# The NGC release image of 1.2.1, spelled as the TensorRT-LLM docs spell release tags (no "v":
# `nvcr.io/nvidia/tensorrt-llm/release:1.0.0` in "Run benchmarking with trtllm-serve", 1.0.0 docs;
# the same scheme for every release since). 1.2.1 is the newest release (PyPI lists tensorrt-llm
# 1.2.1); 1.1.0, pinned before, was a year behind (issue #15).
VERSION = "1.2.1"
DEFAULT_IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{VERSION}"

TRTLLM_SSH_PORT = 2222
TRTLLM_OPTIONS_PATH = "/tmp/meshplan-llm-api-options.yaml"
TRTLLM_SCRIPT_NAME = "meshplan-trtllm"   # $0 of the leader's `sh -c` script
TRTLLM_SSHD_SCRIPT_NAME = "meshplan-trtllm-sshd"   # $0 of a worker's `sh -c` script

# Operator-provisioned ssh material (meshplan.engines.trtllm_ssh makes it; the controller owns the Secret).
SSH_VOLUME = "trtllm-ssh"
SSH_DIR = "/etc/meshplan/ssh"
SSH_CLIENT_KEY = "id_ed25519"               # the leader's mpirun -> ssh identity
SSH_HOST_KEY = "ssh_host_ed25519_key"       # every worker's sshd host key
SSH_AUTHORIZED_KEYS = "authorized_keys"     # the client key's public half
SSH_KNOWN_HOSTS = "known_hosts"             # `* ssh-ed25519 <host public key>`: ssh verifies the workers
SSH_SECRET_KEYS = (SSH_CLIENT_KEY, SSH_HOST_KEY, SSH_AUTHORIZED_KEYS, SSH_KNOWN_HOSTS)
SSH_FILE_MODE = 0o400   # ssh and sshd refuse private keys readable by group/others (sshkey_perm_ok)

# A worker: sshd of the image, told where the operator's files are. /run/sshd is sshd's privilege
# separation directory (sshd exits "Missing privilege separation directory" without it); sshd must
# be started by absolute path to re-exec. StrictModes=no: a Secret volume's directories are not
# the 0755 root-owned tree StrictModes insists on for authorized_keys; the files themselves are
# 0400 and read-only. SetEnv hands mpirun's remote `orted` the container's own PATH and
# LD_LIBRARY_PATH (an ssh session starts with sshd's default PATH, which lacks the image's MPI).
SSHD_SCRIPT = (
    "mkdir -p /run/sshd\n"
    f"exec /usr/sbin/sshd -D -e -p {TRTLLM_SSH_PORT} -h {SSH_DIR}/{SSH_HOST_KEY}"
    f" -o AuthorizedKeysFile={SSH_DIR}/{SSH_AUTHORIZED_KEYS} -o StrictModes=no"
    " -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no"
    ' -o "SetEnv=PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH"\n'
)
# The leader's ssh client options for mpirun (Open MPI `plm_rsh_args`): the operator's identity and
# known_hosts, host keys checked (no StrictHostKeyChecking=no), never a password prompt.
SSH_CLIENT_ARGS = (f"-p {TRTLLM_SSH_PORT} -i {SSH_DIR}/{SSH_CLIENT_KEY} -o UserKnownHostsFile={SSH_DIR}/{SSH_KNOWN_HOSTS}"
                   " -o StrictHostKeyChecking=yes -o BatchMode=yes")


def ssh_secret_name(deployment: str) -> str:
    """The Secret holding one deployment's ssh material (created and owned by the controller)."""
    from meshplan.render.workloads import child_name

    return child_name(deployment, "trtllm-ssh")


def ssh_volumes(deployment: str) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """(volumes, volume mounts) of a multi-node group's pods: the Secret, read-only, mode 0400."""
    vol = {"name": SSH_VOLUME, "secret": {"secretName": ssh_secret_name(deployment), "defaultMode": SSH_FILE_MODE}}
    mount = {"name": SSH_VOLUME, "mountPath": SSH_DIR, "readOnly": True}
    return (vol,), (mount,)


# ---- the plan's knobs as trtllm-serve's flags mean them -------------------------------------

@dataclass(frozen=True)
class RankKnobs:
    """Same fields as the planner's per-engine knob mapping (vLLM's `EngineKnobs`): flag values, and what
    one replica then runs."""

    chunk_size: int | None            # --max_num_tokens
    max_num_seqs: int | None          # --max_batch_size
    replica_max_num_seqs: int | None  # sequences one replica runs at once with that flag
    ranks: int = 1                    # schedulers per replica the batch limit applies to


def attention_dp(layout: Layout) -> bool:
    """Attention DP over the whole stage: EP without TP (see the module doc)."""
    return layout.ep > 1 and layout.tp == 1


def knobs(layout: Layout, chunk_size: int | None, max_num_seqs: int | None) -> RankKnobs:
    """The ONE mapping of the plan's knobs to trtllm-serve's flags (search prices it, `layout` renders it).

    Under attention DP every DP rank runs its own scheduler and `max_batch_size` is per rank
    (TensorRT-LLM "Parallelism in TensorRT LLM": with enable_attention_dp requests are routed to
    the DP ranks, each with its own batch; the AIConfigurator/TRT-LLM wide-EP recipes give
    max_batch_size per GPU): the plan's per-replica S becomes max(1, S // ranks) per rank, and
    the replica runs that times the ranks. `max_num_tokens` is per rank too, which is what the
    plan's chunk means (planner.perf: each attention-DP rank's step carries `chunk` tokens).
    """
    ranks = layout.ep if attention_dp(layout) else 1
    if not max_num_seqs:
        return RankKnobs(chunk_size, max_num_seqs, max_num_seqs, ranks)
    per_rank = max(1, int(max_num_seqs) // ranks)
    return RankKnobs(chunk_size, per_rank, per_rank * ranks, ranks)


# ---- precision ------------------------------------------------------------------------------

# kv_cache_config.dtype values trtllm-serve's PyTorch backend turns into a KV format: "auto" (the
# model's dtype, or what the checkpoint's quantization config says) and "fp8"
# (TorchLlmArgs.sync_quant_config_with_kv_cache_config_dtype sets kv_cache_quant_algo FP8 for
# "fp8" only and merely warns for any other value; tensorrt_llm/llmapi/llm_args.py).
KV_DTYPES = {"bf16": None, "fp16": None, "fp8": "fp8"}


def precision_refusal(weight_dtype: str, kv_dtype: str, checkpoint_dtype: str) -> str | None:
    """Why trtllm-serve cannot run these weights / KV dtypes from this checkpoint (None when it can).

    TensorRT-LLM reads weight quantization from the checkpoint (ModelOpt's hf_quant_config.json /
    config.json quantization_config; "Quantization" in the TensorRT-LLM docs): it has no online
    quantization, so the planned weight dtype must be the checkpoint's (bf16 <-> fp16 is a cast,
    the LLM-API `dtype`).

    `checkpoint_dtype` "" means not known (a model without a real checkpoint, e.g. the seeds' gpt-moe-1.8t):
    then only the KV dtype is checked.
    """
    ckpt = checkpoint_dtype
    if ckpt and weight_dtype != ckpt and not (weight_dtype in ("bf16", "fp16") and ckpt in ("bf16", "fp16")):
        return (f"spec.precision.weights {weight_dtype}: TensorRT-LLM reads weight quantization from the checkpoint "
                f"(no online quantization) and this checkpoint ships {ckpt} weights: point spec.model.weights at a "
                f"{weight_dtype} checkpoint (e.g. NVIDIA ModelOpt's) or set spec.precision.weights to auto or {ckpt}")
    if kv_dtype not in KV_DTYPES:
        return (f"spec.precision.kvCache {kv_dtype}: trtllm-serve sets only an fp8 KV cache from its options "
                "(kv_cache_config.dtype; other KV formats come from the checkpoint's quantization config): "
                "set spec.precision.kvCache to fp8, bf16 or auto")
    return None


def check_precision(model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    """The engine interface's precision rule (the search asks it once): `precision_refusal` with the checkpoint's
    dtype when it is known (a real config.json or spec.model.architecture.weightDtype), else "" (not known)."""
    ckpt = (getattr(model, "native_dtype", "") or "bf16") if getattr(model, "checkpoint_fixed", False) else ""
    return precision_refusal(weight_dtype, kv_dtype, ckpt)


# ---- EPLB -----------------------------------------------------------------------------------

def redundant_experts(layout: Layout, model: Any = None, balancing: str = "auto") -> int:
    """Redundant expert slots TensorRT-LLM runs for `layout` (0: no load balancer): only with
    expertLoadBalancing enabled (auto renders none), one per EP rank (moe_expert_parallel_size = ep;
    `base.one_per_rank`, num_slots = experts + this). The planner's memory fit and `load_balancer` read it."""
    from meshplan.engines.base import one_per_rank

    if balancing != "enabled" or layout.ep <= 1:
        return 0
    return one_per_rank(getattr(model, "num_experts", 0) or 0, layout.ep)


def load_balancer(serving: ServingOptions, moe_ep: int, explain: list[Explanation]) -> dict[str, Any] | None:
    """`moe_config.load_balancer` for `expertLoadBalancing: enabled`, or None (with the reason).

    TensorRT-LLM's MoE load balancer (MoeLoadBalancerConfig: `num_slots`, `layer_updates_per_iter`;
    TensorRT-LLM "Wide Expert Parallelism" docs and examples/wide_ep) places `num_slots` expert
    copies over the EP ranks; slots beyond the experts are the redundant copies it moves to hot
    experts, and `layer_updates_per_iter > 0` makes it rebalance online. meshplan gives every EP
    rank one redundant slot: num_slots = experts + EP size (the wide-EP example's DeepSeek-R1 EP32:
    256 experts, 288 slots), which divides by the EP size because the experts do (check_layout).
    """
    if serving.expert_load_balancing != "enabled":
        return None
    if moe_ep <= 1 or not serving.num_experts:
        why = ("the layout has no expert parallelism" if moe_ep <= 1 else
               "the model's expert count is not known, so the slots cannot be sized")
        explain.append(Explanation("expertLoadBalancing", "enabled", f"not rendered: {why}",
                                   "TensorRT-LLM MoE load balancer", "warning"))
        return None
    from meshplan.engines.base import eplb_model

    extra = redundant_experts(Layout(1, moe_ep), eplb_model(serving), serving.expert_load_balancing)
    slots = serving.num_experts + extra
    explain.append(Explanation("moe_config.load_balancer", f"num_slots {slots}",
                               f"{serving.num_experts} experts + {extra} redundant (one per EP rank), rebalanced "
                               "online (layer_updates_per_iter 1)", "TensorRT-LLM wide-EP load balancer"))
    return {"num_slots": slots, "layer_updates_per_iter": 1}


# Wide EP (issue 18): the planner's DeepEP names -> TensorRT-LLM's all-to-all methods (AlltoallMethodType
# DeepEP / DeepEPLowLatency, tensorrt_llm/_torch/modules/fused_moe/fused_moe_wide_ep.py), run by the wide-EP MoE
# backend (`moe_config.backend: WIDEEP`, MoeConfig of the LLM API 1.2.1; tests/conformance/trtllm_standin.py)
# and forced with TRTLLM_FORCE_ALLTOALL_METHOD (read by select_alltoall_method_type before its own choice;
# without it TensorRT-LLM picks MNNVL or nothing on HGX). Both need attention DP. TensorRT-LLM 1.2.1 has no
# dual-batch-overlap option: no BATCH_OVERLAP_FLAG, so the planner never prices one for it.
A2A_BACKENDS = {"deepep-normal": "DeepEP", "deepep-low-latency": "DeepEPLowLatency"}
A2A_ENV = "TRTLLM_FORCE_ALLTOALL_METHOD"


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    experts = getattr(model, "num_experts", 0) or 0
    if layout.ep > 1 and experts and experts % layout.ep:
        return f"TensorRT-LLM needs the {experts} experts to divide by moe_expert_parallel_size {layout.ep}"
    if a2a_backend in A2A_BACKENDS and layout.ep > 1 and not attention_dp(layout):
        return (f"TensorRT-LLM's DeepEP all-to-all (moe_config.backend WIDEEP) runs with attention DP only, and "
                f"{layout.label()} runs attention TP{layout.tp * layout.ep}; use tp=1 or spec.engine.allToAll default")
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
    adp = attention_dp(layout)
    config["enable_attention_dp"] = adp
    exact = not (tp > 1 and ep > 1)
    if adp:
        eff = dict(attention_tp=1, attention_dp=ep, moe_tp=1, moe_ep=ep)
    else:
        eff = dict(attention_tp=tp * ep, attention_dp=1, moe_tp=tp, moe_ep=ep)
    if not exact:
        notes.append(f"TensorRT-LLM runs attention either TP or DP over a whole stage: attention runs "
                     f"TP{tp * ep} (not TP{tp}xDP{ep}); MoE runs TP{tp}xEP{ep} as planned")
    k = knobs(layout, chunk_size, max_num_seqs)
    if k.chunk_size:
        flags["--max_num_tokens"] = k.chunk_size
    if k.max_num_seqs:
        flags["--max_batch_size"] = k.max_num_seqs
        if k.ranks > 1:
            notes.append(f"--max_batch_size {k.max_num_seqs} per attention-DP rank: {k.ranks} ranks run "
                         f"{k.replica_max_num_seqs} sequences per replica (planned {max_num_seqs})")
    if memory_fraction:
        flags["--kv_cache_free_gpu_memory_fraction"] = memory_fraction
    if kv_dtype == "fp8":
        config["kv_cache_config"] = {"dtype": "fp8"}
    if ep > 1 and a2a_backend in A2A_BACKENDS:
        config["moe_config"] = {"backend": "WIDEEP"}
    return EngineLayout(engine=NAME, flags=flags, config=config, pp=pp, exact=exact, notes=tuple(notes), **eff)


def check_speculative(model: Any, speculative: Any) -> str | None:
    """TensorRT-LLM 1.2 runs DeepSeek-V3/R1 MTP (`speculative_config: {decoding_type: MTP, num_nextn_predict_layers:
    N}`, examples/models/core/deepseek_v3/README.md "Multi-Token Prediction (MTP)"; more layers than the checkpoint
    ships run its one MTP module autoregressively, tech blog 1 "Autoregressive MTP Layers")."""
    return mtp_refusal(TITLE, model, speculative)


def speculative_config(speculative: Any, explain: list[Explanation]) -> dict[str, Any] | None:
    """The LLM-API `speculative_config` for spec.engine.speculative (None when off)."""
    if speculative is None or speculative.method == "off":
        return None
    explain.append(Explanation("speculative_config", f"MTP, num_nextn_predict_layers {speculative.tokens}",
                               f"spec.engine.speculative: {speculative.tokens} draft token(s) per step from the "
                               f"checkpoint's MTP module; planned at acceptance rate {speculative.acceptance_rate:.2f} = "
                               f"{speculative.expected_tokens:.2f} tokens per step",
                               f"TensorRT-LLM {VERSION} examples/models/core/deepseek_v3/README.md (MTP); "
                               "tensorrt_llm/llmapi/llm_args.py MTPDecodingConfig"))
    return {"decoding_type": "MTP", "num_nextn_predict_layers": int(speculative.tokens)}



# ---- prefill/decode disaggregation (issue 19) -----------------------------------------------------------
# TensorRT-LLM disaggregated serving (examples/disaggregated/README.md and docs features/disagg-serving.md,
# 1.x): each role is its own `trtllm-serve` whose extra LLM-API YAML holds `cache_transceiver_config`
# (CacheTransceiverConfig in tensorrt_llm/llmapi/llm_args.py: `backend` one of DEFAULT, UCX, NIXL, MPI, and
# `max_tokens_in_buffer`, "recommended >= the maximum ISL"); context (prefill) servers set
# `disable_overlap_scheduler: true` ("The overlap scheduler for context servers is currently disabled, as it is
# not yet supported in disaggregated context server architectures", the README's ctx config). The router is
# `trtllm-serve disaggregated -c disagg_config.yaml` with `hostname`, `port`, `backend: pytorch`,
# `context_servers: {num_instances, urls}` and `generation_servers: {num_instances, urls}` (same README).
# Which backend DEFAULT means moved between releases (UCX in the 1.0 README, NIXL in later docs), so meshplan
# renders the backend explicitly (UCX unless asked).
DISAGG_TRANSFER_BACKENDS = {"ucx": "UCX", "nixl": "NIXL", "mpi": "MPI"}
DISAGG_DEFAULT_BACKEND = "ucx"
TRTLLM_DISAGG_CONFIG_PATH = "/tmp/meshplan-disagg-config.yaml"
TRTLLM_ROUTER_SCRIPT_NAME = "meshplan-trtllm-router"


def disagg_flags(disagg: Disaggregation, layout_: Layout, explain: list[Explanation],
                 max_tokens_in_buffer: int | None = None) -> dict[str, Any]:
    """The role's LLM-API settings (TensorRT-LLM has no CLI flag for them: they go into the extra options YAML);
    the ONE rule every caller uses."""
    backend = disagg_backend(TITLE, disagg, DISAGG_TRANSFER_BACKENDS, DISAGG_DEFAULT_BACKEND)
    transceiver: dict[str, Any] = {"backend": backend}
    if max_tokens_in_buffer:
        transceiver["max_tokens_in_buffer"] = int(max_tokens_in_buffer)
    out: dict[str, Any] = {"cache_transceiver_config": transceiver}
    src = f"TensorRT-LLM {VERSION} examples/disaggregated/README.md; llm_args.py CacheTransceiverConfig"
    explain.append(Explanation("cache_transceiver_config.backend", backend, f"{disagg.role} "
                               f"({'context' if disagg.role == 'prefill' else 'generation'}) server: KV moves over "
                               f"{backend}" + (f", buffer {max_tokens_in_buffer} tokens (the context length)"
                                               if max_tokens_in_buffer else ""), src))
    if disagg.role == "prefill":
        out["disable_overlap_scheduler"] = True
        explain.append(Explanation("disable_overlap_scheduler", "true", "context servers run without the overlap "
                                   "scheduler in disaggregated serving", src))
    return out


def router_command(prefill: Sequence[str], decode: Sequence[str], port: int = HTTP_PORT,
                   disagg: Disaggregation | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command, args) of `trtllm-serve disaggregated -c CONFIG` in front of the context (prefill) and generation
    (decode) servers (`host:port` each): the config YAML is written by the container's shell first."""
    if not prefill or not decode:
        raise RenderError("a disaggregated deployment needs at least one prefill and one decode endpoint for the "
                          f"router (got {len(prefill)} prefill, {len(decode)} decode)")
    text = yaml.safe_dump(router_config(prefill, decode, port), sort_keys=True).strip()
    script = f"cat > {TRTLLM_DISAGG_CONFIG_PATH} <<'EOF'\n{text}\nEOF\nexec \"$@\"\n"
    return ("/bin/sh", "-c"), (script, TRTLLM_ROUTER_SCRIPT_NAME, "trtllm-serve", "disaggregated", "-c",
                               TRTLLM_DISAGG_CONFIG_PATH)


def router_config(prefill: Sequence[str], decode: Sequence[str], port: int = HTTP_PORT) -> dict[str, Any]:
    """disagg_config.yaml of `trtllm-serve disaggregated` (examples/disaggregated/README.md)."""
    return {"hostname": "0.0.0.0", "port": int(port), "backend": "pytorch",
            "context_servers": {"num_instances": len(prefill), "urls": list(prefill)},
            "generation_servers": {"num_instances": len(decode), "urls": list(decode)}}


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    # The KV dtype is refused here too; the weights' rule needs to know whether the checkpoint's dtype is
    # real (the planner's search knows: check_precision there), so the renderer warns.
    refused = precision_refusal(candidate.weight_dtype, candidate.kv_dtype, "")
    if refused:
        raise RenderError(refused)
    ckpt = serving.checkpoint_dtype or "bf16"
    if precision_refusal(candidate.weight_dtype, candidate.kv_dtype, ckpt):
        explain.append(Explanation("weights", candidate.weight_dtype,
                                   "TensorRT-LLM reads quantization from the checkpoint (ModelOpt): point "
                                   f"spec.model.weights at a {candidate.weight_dtype} checkpoint",
                                   "TensorRT-LLM quantization docs", "warning"))
    flags: dict[str, Any] = {}
    ports: list[tuple[str, int]] = []
    multi = role.pods > 1
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    if multi:
        volumes, mounts = ssh_volumes(role.deployment)
    if multi and not role.leader:
        explain.append(Explanation("command", "sshd", "TensorRT-LLM runs one MPI world: worker pods host MPI ranks "
                                   "started by the leader's mpirun over ssh; host key and authorized key from the "
                                   f"operator's Secret {ssh_secret_name(role.deployment)}",
                                   "TensorRT-LLM/Dynamo multi-node examples"))
        return EngineCommand(("/bin/sh", "-c"), (SSHD_SCRIPT, TRTLLM_SSHD_SCRIPT_NAME), False,
                             (("ssh", TRTLLM_SSH_PORT),), tuple(explain), volumes, mounts)
    flags["--host"] = "0.0.0.0"
    flags["--port"] = serving.port
    flags["--backend"] = "pytorch"
    flags.update(el.flags)
    if serving.max_model_len:
        flags["--max_seq_len"] = serving.max_model_len
    options: dict[str, Any] = dict(el.config)
    if candidate.weight_dtype != ckpt and candidate.weight_dtype in ("bf16", "fp16") and ckpt in ("bf16", "fp16"):
        options["dtype"] = "bfloat16" if candidate.weight_dtype == "bf16" else "float16"
    options["enable_chunked_prefill"] = True
    kv = dict(options.get("kv_cache_config") or {})
    kv["enable_block_reuse"] = serving.prefix_caching
    options["kv_cache_config"] = kv
    lb = load_balancer(serving, el.moe_ep, explain)
    if lb:
        options["moe_config"] = {**(options.get("moe_config") or {}), "load_balancer": lb}
    a2a = A2A_BACKENDS.get(getattr(candidate, "a2a_backend", "") or "") if candidate.layout.ep > 1 else None
    env: tuple[tuple[str, str], ...] = ()
    if a2a:
        env = ((A2A_ENV, a2a),)
        explain.append(Explanation("moe_config.backend", "WIDEEP", f"the plan's all-to-all {candidate.a2a_backend}: "
                                   "TensorRT-LLM's wide-EP MoE backend runs DeepEP's kernels",
                                   "TensorRT-LLM 1.2.1 MoeConfig; fused_moe_wide_ep.py"))
        explain.append(Explanation(f"env {A2A_ENV}", a2a, "forces DeepEP's "
                                   f"{'low-latency' if a2a == 'DeepEPLowLatency' else 'normal'} kernels (TensorRT-LLM "
                                   "otherwise chooses MNNVL or none on HGX); forwarded to every MPI rank",
                                   "TensorRT-LLM fused_moe_wide_ep.py select_alltoall_method_type"))
    if serving.disagg is not None:
        options.update(disagg_flags(serving.disagg, candidate.layout, explain, serving.max_model_len))
    if serving.cuda_graphs == "disabled":
        options["cuda_graph_config"] = None
    spec_cfg = speculative_config(serving.speculative, explain)
    if spec_cfg:
        options["speculative_config"] = spec_cfg
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
                  "--mca", "plm_rsh_args", SSH_CLIENT_ARGS]
        for name in (*role.env_names, *(n for n, _ in env if n not in role.env_names)):
            launch += ["-x", name]
        serve = launch + ["trtllm-llmapi-launch"] + serve
        ports.append(("ssh", TRTLLM_SSH_PORT))
        explain.append(Explanation("mpirun -np", str(world), f"one MPI world over {role.pods} pods "
                                   f"({role.gpus_per_pod} ranks each), environment forwarded with -x; ssh with the "
                                   f"operator's key and known_hosts (Secret {ssh_secret_name(role.deployment)})",
                                   "TensorRT-LLM/Dynamo multi-node examples"))
    text = yaml.safe_dump(options, sort_keys=True).strip()
    script = f"cat > {TRTLLM_OPTIONS_PATH} <<'EOF'\n{text}\nEOF\nexec \"$@\"\n"
    return EngineCommand(("/bin/sh", "-c"), (script, TRTLLM_SCRIPT_NAME, *serve), role.leader,
                         tuple([("http", serving.port)] + ports), tuple(explain), volumes, mounts, env=env)
