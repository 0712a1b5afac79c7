"""SGLang: how it spells a layout, what it refuses, and the pod's `sglang.launch_server` command line.

Facts (SGLang 0.5.23 source, sglang/srt/arg_groups/; docs.sglang.io "Server Arguments"): `--tp-size`
is every GPU of the stage, `--attn-dp-size` splits attention into DP groups (attention TP =
tp-size / attn-dp-size; 0.5.23 deprecates `--dp-size N --enable-dp-attention` for it, and
`--dp-size` counts replicas again: parallel_hook.handle_deprecated_dp_attention), `--ep-size`
partitions the TP ranks into expert groups (MoE-TP = tp-size / ep-size), `--pp-size`. So the blog
layout maps exactly: `--tp-size tp*ep --attn-dp-size ep --ep-size ep`. The DeepEP all-to-all backend (`--moe-a2a-backend deepep`)
needs ep-size = tp-size, i.e. MoE-TP 1: only layouts with `tp == 1` can use it. Per-rank meaning (SGLang 0.5.23; the one mapping the planner's search and the renderer share):
- chunk: with attention DP SGLang divides `--chunked-prefill-size` by attn-dp-size
  (parallel_hook._handle_data_parallelism) and asserts `chunked_prefill_size must be divisible by
  page_size` on the divided value (validation_hook.check_server_args). The planner's chunk is per
  attention-DP rank (planner.perf: the chunk budget is per rank), so meshplan renders
  chunk x attn-dp and each rank runs the planned chunk; the chunk must be a multiple of 128, the
  largest page size SGLang's backends pick (overrides.py: FA4 128, TRT-LLM/FlashMLA/CuteDSL MLA 64).
- batch: `--max-running-requests` is per server = per replica (each attention-DP worker gets
  N // attn-dp-size: model_executor/pool_configurator.py), the planner's meaning.
- memory: `--mem-fraction-static` is (weights + KV pool) / memory free before the model loads
  (mem_cache/kv_cache_configurator.py `_profile_available_bytes`: KV = free after load - pre-load
  free x (1 - f); distributed/bootstrap.py measure_pre_model_load_memory, i.e. after the CUDA
  context and NCCL). Activations and CUDA graphs live outside it. `mem_fraction_static` renders the
  fraction that gives exactly the planner's KV budget (`static_fraction`).

Multi-node: `--dist-init-addr LEADER:5000 --nnodes N --node-rank R` on every pod (SGLang server
arguments); only rank 0 serves HTTP. SGLang (`--nnodes`) runs any split of a replica into pods.
"""

from __future__ import annotations

from typing import Any, Sequence

from meshplan.engines.base import (
    HTTP_PORT,
    Disaggregation,
    disagg_backend,
    EngineCommand,
    eplb_model,
    family_of,
    one_per_rank,
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
from meshplan.planner.types import Candidate, Layout, MemoryFit

NAME = "sglang"
TITLE = "SGLang"
# SGLang's release images are `lmsysorg/sglang:vX.Y.Z` (docs.sglang.io get-started/install: CUDA 13
# images; `v0.5.19-cu129` was the last CUDA 12 tag). 0.5.23 is the newest release and the version the
# conformance suite (tests/conformance/test_sglang.py) checks the rendered argv against.
DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"

SGLANG_DIST_PORT = 5000       # port used in SGLang's multi-node docs (--dist-init-addr host:5000)

# The planner's DeepEP names (spec.engine.allToAll) -> SGLang 0.5.23 `--moe-a2a-backend deepep` with
# `--deepep-mode` (arg_groups/fields/exec_.py: moe_a2a_backend default "none"; deepep_mode auto | normal |
# low_latency, default auto = low_latency for decode batches, normal for prefill). Two-batch overlap:
# `--enable-two-batch-overlap` (exec_.py, default False).
A2A_BACKENDS = {"deepep-normal": "normal", "deepep-low-latency": "low_latency"}
BATCH_OVERLAP_FLAG = "--enable-two-batch-overlap"

# The largest KV page size SGLang 0.5.23 chooses for any attention backend (arg_groups/overrides.py:
# FA4 128 for MHA, TRT-LLM MLA / FlashMLA / CuteDSL MLA 64, TRT-LLM MHA up to 128). Every per-rank chunk
# must divide by the page size (validation_hook: "chunked_prefill_size must be divisible by page_size").
SGLANG_MAX_PAGE_SIZE = 128

# Model families whose SGLang 0.5.23 model class has no `get_model_config_for_expert_location`: with
# --enable-eplb SGLang sets expert_distribution_recorder_mode="stat" (parallel_hook.handle_eplb_and_dispatch)
# and then asserts at start-up "ExpertLocationMetadata is required for expert distribution recording"
# (eplb/expert_distribution.py ExpertDistributionRecorder.init_new). sglang/srt/models/mixtral.py has none.
EPLB_UNSUPPORTED_FAMILIES = ("mixtral",)

# KV-cache dtype -> SGLang 0.5.23 `--kv-cache-dtype` (arg_groups/fields/model.py choices: auto, fp8_e5m2,
# fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16; nvfp4 needs SM100: kv_cache_hook.py).
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp4": "nvfp4"}


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    heads = getattr(model, "num_attention_heads", 0) or 0
    experts = getattr(model, "num_experts", 0) or 0
    if heads and heads % layout.tp:
        return (f"{TITLE} needs the {heads} attention heads to divide by the attention TP size "
                f"{layout.tp}; choose tp from the divisors of {heads}")
    if layout.ep > 1:
        if experts and experts % layout.ep:
            return f"SGLang needs the {experts} experts to divide by --ep-size {layout.ep}"
        if str(a2a_backend or "").startswith("deepep") and layout.tp > 1:
            return (f"SGLang DeepEP needs --ep-size = --tp-size (MoE-TP 1), but TP{layout.tp}xEP{layout.ep} "
                    f"splits each expert {layout.tp} ways; use tp=1 or the default all-to-all backend")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """SGLang asserts the per-rank chunk divides by the KV page size (up to 128, see SGLANG_MAX_PAGE_SIZE);
    it caps the batch by the token budget at run time instead of refusing the pair."""
    if chunk_size and chunk_size % SGLANG_MAX_PAGE_SIZE:
        return (f"SGLang needs the chunk size ({chunk_size}) to be a multiple of {SGLANG_MAX_PAGE_SIZE}: it asserts "
                f"'chunked_prefill_size must be divisible by page_size' and its attention backends use pages of up to "
                f"{SGLANG_MAX_PAGE_SIZE} tokens; pin spec.parallelism chunkSize to a multiple of {SGLANG_MAX_PAGE_SIZE}")
    return None


def chunked_prefill_size(chunk_size: int, attn_dp: int) -> int:
    """`--chunked-prefill-size` that gives every attention-DP rank `chunk_size` tokens (SGLang divides by attn-dp)."""
    return chunk_size * max(1, attn_dp)


def static_fraction(fit: MemoryFit, total_bytes: float) -> float | None:
    """`--mem-fraction-static` that gives SGLang exactly the KV budget the planner's memory fit assumes.

    Planner (planner/memory.py, vLLM/SGLang branch): KV = usable - weights - activations - runtime.
    SGLang 0.5.23: KV = f x (total - runtime) - weights (runtime = CUDA context + NCCL, gone before the
    pre-load measurement). So f = (usable - activations - runtime) / (total - runtime), rounded down to
    3 decimals. None when the plan carries no memory fit (then the caller renders the plain fraction).
    """
    if fit is None or fit.usable_bytes <= 0 or total_bytes <= 0:
        return None
    pre_load = total_bytes - fit.runtime_bytes
    f = (fit.usable_bytes - fit.activation_bytes - fit.runtime_bytes) / pre_load
    f = int(f * 1000) / 1000
    return f if f > 0 else None


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    flags: dict[str, Any] = {"--tp-size": tp * ep, "--pp-size": pp}
    notes: list[str] = []
    if ep > 1:
        flags["--attn-dp-size"] = ep
        flags["--ep-size"] = ep
        if a2a_backend in A2A_BACKENDS:
            flags["--moe-a2a-backend"] = "deepep"
            flags["--deepep-mode"] = A2A_BACKENDS[a2a_backend]
        elif a2a_backend:
            flags["--moe-a2a-backend"] = a2a_backend
    if chunk_size:
        flags["--chunked-prefill-size"] = chunked_prefill_size(chunk_size, ep)
    if max_num_seqs:
        flags["--max-running-requests"] = max_num_seqs
        if ep > 1 and max_num_seqs % ep:
            notes.append(f"SGLang gives each of the {ep} attention-DP ranks {max_num_seqs} // {ep} = "
                         f"{max(1, max_num_seqs // ep)} running requests (model_executor/pool_configurator.py)")
    if memory_fraction:
        flags["--mem-fraction-static"] = memory_fraction
    if kv_dtype in KV_CACHE_DTYPES:
        flags["--kv-cache-dtype"] = KV_CACHE_DTYPES[kv_dtype]
    return EngineLayout(engine=NAME, flags=flags, pp=pp, exact=True, notes=tuple(notes),
                        attention_tp=tp, attention_dp=ep, moe_tp=tp, moe_ep=ep)


def weight_flags(weight_dtype: str, checkpoint_dtype: str, explain: list[Explanation]) -> dict[str, Any]:
    """SGLang 0.5.23 precision flags for the weights (each engine module spells its own).

    `--quantization` choices (arg_groups/choices.py QUANTIZATION_CHOICES): `fp8` quantizes a BF16/FP16
    checkpoint online, `nvfp4_online` quantizes it to NVFP4 online (layers/quantization/nvfp4_online.py,
    min capability 100: Blackwell). INT8 (`w8a8_int8`) and INT4 (`awq`, `gptq`) read pre-quantized
    checkpoints only: a pinned int8/int4 on a 16-bit checkpoint is refused (RenderError).
    """
    if weight_dtype in ("bf16", "fp16"):
        return {"--dtype": "bfloat16" if weight_dtype == "bf16" else "float16"}
    if weight_dtype == checkpoint_dtype:
        explain.append(Explanation("weights", weight_dtype, "the checkpoint is already quantized; SGLang "
                                   "reads the method from its config"))
        return {}
    if weight_dtype == "fp8":
        explain.append(Explanation("--quantization", "fp8", "plan chose FP8 weights: quantize the "
                                   f"{checkpoint_dtype} checkpoint online", "SGLang 0.5.23 QUANTIZATION_CHOICES"))
        return {"--quantization": "fp8"}
    if weight_dtype == "fp4" and checkpoint_dtype in ("bf16", "fp16"):
        explain.append(Explanation("--quantization", "nvfp4_online", "plan chose FP4 weights: quantize the "
                                   f"{checkpoint_dtype} checkpoint to NVFP4 online (Blackwell, SM 10.0+)",
                                   "SGLang 0.5.23 layers/quantization/nvfp4_online.py"))
        return {"--quantization": "nvfp4_online"}
    raise RenderError(
        f"spec.precision.weights {weight_dtype}: SGLang 0.5.23 cannot quantize a {checkpoint_dtype} checkpoint to "
        f"{weight_dtype} while loading (its int8/int4 methods w8a8_int8, awq, gptq read pre-quantized checkpoints); "
        f"point spec.model.weights at a {weight_dtype} checkpoint or choose weights fp8")


def redundant_experts(layout: Layout, model: Any = None, balancing: str = "auto") -> int:
    """Redundant experts SGLang runs for `layout` (0: no EPLB is rendered): with expertLoadBalancing auto or
    enabled, an EP layout (`--ep-size ep`) of a model SGLang 0.5.23 balances (`eplb_supported`), one per EP rank
    (`base.one_per_rank`: SGLang asserts (experts + redundant) % ep-size == 0, eplb/expert_location.py). The
    planner's memory fit and performance model and `command` read it."""
    if balancing == "disabled" or layout.ep <= 1 or not eplb_supported(model):
        return 0
    return one_per_rank(getattr(model, "num_experts", 0) or 0, layout.ep)


def eplb_supported(model: Any) -> bool:
    """Whether SGLang 0.5.23 can run EPLB for `model` (HF id, catalogue name, or a model with a `name`); see
    EPLB_UNSUPPORTED_FAMILIES."""
    if not isinstance(model, str):
        model = getattr(model, "name", "") or ""
    name = family_of(model)
    try:
        from meshplan.catalog.models import get_model

        name = get_model(model).name.lower()
    except (KeyError, ValueError):
        pass
    return not any(name.startswith(f) for f in EPLB_UNSUPPORTED_FAMILIES)


def check_speculative(model: Any, speculative: Any) -> str | None:
    """SGLang 0.5.23 runs DeepSeek-V3/R1 MTP as `--speculative-algorithm NEXTN` (an alias of EAGLE whose draft is the
    checkpoint's own NextN module: sglang/srt/arg_groups/speculative_hook.py v0.5.23, "NEXTN aliases EAGLE")."""
    return mtp_refusal(TITLE, model, speculative)


def check_speculative_layout(layout: Layout, speculative: Any) -> str | None:
    """SGLang 0.5.23 refuses pipeline stages with speculative decoding outside a PD prefill worker:
    "PP + speculative decoding (MTP) is only supported on prefill nodes (disaggregation-mode=prefill)"
    (sglang/srt/arg_groups/validation_hook.py v0.5.23; only the experimental SGLANG_ENABLE_PP_SPEC lifts it)."""
    if getattr(speculative, "method", "off") != "off" and layout.pp > 1:
        return (f"SGLang 0.5.23 runs speculative decoding (MTP) without pipeline stages only (PP{layout.pp} asked): "
                "'PP + speculative decoding (MTP) is only supported on prefill nodes' (sglang/srt/arg_groups/"
                "validation_hook.py); pin spec.parallelism.pipeline 1 or set spec.engine.speculative.method off")
    return None


def speculative_flags(speculative: Any, explain: list[Explanation]) -> dict[str, Any]:
    """SGLang's flags for spec.engine.speculative: a chain of k drafts (top-k 1) verified as k + 1 tokens, the
    settings of SGLang's DeepSeek MTP docs (docs.sglang.io basic_usage/deepseek "Multi-token Prediction":
    `--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2` for k = 1)."""
    if speculative is None or speculative.method == "off":
        return {}
    k = int(speculative.tokens)
    explain.append(Explanation("--speculative-algorithm", "NEXTN", f"spec.engine.speculative: MTP, {k} draft token(s) "
                               f"per step (chain: --speculative-eagle-topk 1, --speculative-num-draft-tokens {k + 1}); "
                               f"planned at acceptance rate {speculative.acceptance_rate:.2f} = "
                               f"{speculative.expected_tokens:.2f} tokens per step",
                               "sglang/srt/arg_groups/speculative_hook.py v0.5.23"))
    return {"--speculative-algorithm": "NEXTN", "--speculative-num-steps": k, "--speculative-eagle-topk": 1,
            "--speculative-num-draft-tokens": k + 1}



# ---- prefill/decode disaggregation (issue 19) -----------------------------------------------------------
# SGLang 0.5.23 (sglang/srt/arg_groups/fields/disagg.py): `--disaggregation-mode` null | prefill | decode;
# `--disaggregation-transfer-backend`, choices DISAGG_TRANSFER_BACKEND_CHOICES (arg_groups/choices.py: mooncake,
# nixl, ascend, fake, mori, mooncake_tcp; default mooncake); `--disaggregation-bootstrap-port` (the prefill
# server's bootstrap server, default 8998); `--disaggregation-ib-device` (a device or a comma-separated list of
# HCAs, "Supported by Mooncake and NIXL UCX"; default None: the backend picks). "mooncake_tcp" is Mooncake with
# its TCP transport forced (arg_groups/pd_disaggregation_hook.py sets MC_FORCE_TCP=1 and drops the IB device):
# what a pod without RDMA devices runs. ascend (Huawei NPUs) and fake (benchmarks; prefill refuses it) are not
# offered; mori is AMD's.
DISAGG_TRANSFER_BACKENDS = {"mooncake": "mooncake", "nixl": "nixl", "mori": "mori", "mooncake_tcp": "mooncake_tcp"}
DISAGG_IB_BACKENDS = ("mooncake", "nixl")
SGLANG_BOOTSTRAP_PORT = 8998


def disagg_flags(disagg: Disaggregation, layout_: Layout, explain: list[Explanation]) -> dict[str, Any]:
    """The prefill or decode server's disaggregation flags: the ONE rule every caller uses. Without RDMA
    devices the default backend is mooncake_tcp (Mooncake over TCP), with them mooncake on those HCAs."""
    backend = disagg_backend(TITLE, disagg, DISAGG_TRANSFER_BACKENDS,
                             "mooncake" if disagg.ib_devices else "mooncake_tcp")
    src = "SGLang 0.5.23 arg_groups/fields/disagg.py, arg_groups/choices.py"
    flags: dict[str, Any] = {"--disaggregation-mode": disagg.role, "--disaggregation-transfer-backend": backend}
    explain.append(Explanation("--disaggregation-mode", disagg.role, f"this server runs the {disagg.role} phase "
                               f"only; KV moves over {backend}" + ("" if disagg.ib_devices else
                                                                   " (no RDMA devices in the pod: Mooncake's TCP "
                                                                   "transport)"), src))
    if disagg.role == "prefill":
        port = disagg.bootstrap_port or SGLANG_BOOTSTRAP_PORT
        flags["--disaggregation-bootstrap-port"] = port
        explain.append(Explanation("--disaggregation-bootstrap-port", str(port), "the prefill server's bootstrap "
                                   "server, which decode servers reach through the router", src))
    if disagg.ib_devices and backend in DISAGG_IB_BACKENDS:
        flags["--disaggregation-ib-device"] = ",".join(disagg.ib_devices)
        explain.append(Explanation("--disaggregation-ib-device", flags["--disaggregation-ib-device"],
                                   "the RDMA devices the pod was given carry the KV transfer", src))
    return flags


def router_command(prefill: Sequence[str], decode: Sequence[str], port: int = HTTP_PORT,
                   disagg: Disaggregation | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command, args) of SGLang's PD router (sglang-router 0.3.2, sglang_router/launch_router.py and
    router_args.py: `--pd-disaggregation`, `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL`, each repeatable)
    in front of the prefill and decode servers (`host:port` each); the bootstrap port is the one the prefill
    role renders (`disagg.bootstrap_port`, default SGLANG_BOOTSTRAP_PORT)."""
    bootstrap_port = (disagg.bootstrap_port if disagg and disagg.bootstrap_port else SGLANG_BOOTSTRAP_PORT)
    if not prefill or not decode:
        raise RenderError("a disaggregated deployment needs at least one prefill and one decode endpoint for the "
                          f"router (got {len(prefill)} prefill, {len(decode)} decode)")
    args: list[str] = ["--host", "0.0.0.0", "--port", str(port), "--pd-disaggregation"]
    for e in prefill:
        args += ["--prefill", f"http://{e}", str(bootstrap_port)]
    for e in decode:
        args += ["--decode", f"http://{e}"]
    return ("python3", "-m", "sglang_router.launch_router"), tuple(args)


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
    if layout_.ep > 1 and candidate.chunk_size and "--chunked-prefill-size" in el.flags:
        explain.append(Explanation("--chunked-prefill-size", str(el.flags["--chunked-prefill-size"]),
                                   f"the planned {candidate.chunk_size}-token chunk per attention-DP rank x "
                                   f"{layout_.ep} ranks: SGLang divides --chunked-prefill-size by --attn-dp-size",
                                   "SGLang 0.5.23 arg_groups/parallel_hook.py _handle_data_parallelism"))
    if candidate.kv_dtype in ("int8", "int4"):
        raise RenderError(f"spec.precision.kvCache {candidate.kv_dtype}: SGLang 0.5.23 has no {candidate.kv_dtype} KV "
                          "cache (--kv-cache-dtype: auto, fp8_e4m3, fp8_e5m2, mxfp8, bf16, nvfp4, fp4_mx_block16); "
                          "choose kvCache fp8 or auto")
    fraction = el.flags.get("--mem-fraction-static")
    if fraction:
        total = 0.0
        if candidate.gpu:
            try:
                from meshplan.catalog.gpus import get_gpu

                total = get_gpu(candidate.gpu).memory_bytes
            except (KeyError, ValueError):
                total = 0.0
        f = static_fraction(candidate.memory, total)
        if f is not None:
            flags["--mem-fraction-static"] = f
            explain.append(Explanation(
                "--mem-fraction-static", str(f),
                f"SGLang's fraction covers weights + KV of the memory free before loading; {f} gives the planner's "
                f"KV budget (memory fraction {fraction}, less activations "
                f"{candidate.memory.activation_bytes / 2**30:.1f} GiB and runtime "
                f"{candidate.memory.runtime_bytes / 2**30:.1f} GiB)",
                "SGLang 0.5.23 mem_cache/kv_cache_configurator.py _profile_available_bytes"))
    flags.update(weight_flags(candidate.weight_dtype, serving.checkpoint_dtype, explain))
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
        # 0.5.23 deprecates --disable-cuda-graph for --cuda-graph-backend-{decode,prefill}=disabled
        flags["--cuda-graph-backend-decode"] = "disabled"
        flags["--cuda-graph-backend-prefill"] = "disabled"
    refused = check_speculative_layout(layout_, serving.speculative)
    if refused:
        raise RenderError(refused)
    flags.update(speculative_flags(serving.speculative, explain))
    if layout_.ep > 1 and serving.expert_load_balancing != "disabled":
        family = serving.model_name or serving.model
        if not (eplb_supported(serving.model) and eplb_supported(family)):
            if serving.expert_load_balancing == "enabled":
                raise RenderError(f"spec.engine.expertLoadBalancing enabled: SGLang 0.5.23 has no EPLB for "
                                  f"{serving.model} (its model class lacks get_model_config_for_expert_location; "
                                  "start-up asserts 'ExpertLocationMetadata is required'); set it to auto or disabled")
            explain.append(Explanation("--enable-eplb", "false", f"SGLang 0.5.23 has no EPLB for {serving.model} "
                                       "(start-up would assert); expert load balancing not rendered",
                                       "SGLang 0.5.23 eplb/expert_distribution.py", "warning"))
        else:
            n = redundant_experts(layout_, eplb_model(serving), serving.expert_load_balancing)
            if n <= 0:
                explain.append(Explanation("--enable-eplb", "false", "not rendered: the model's expert count is not "
                                           "known, so no redundant experts were planned",
                                           "SGLang 0.5.23 eplb/expert_location.py",
                                           "warning" if serving.expert_load_balancing == "enabled" else "info"))
            else:
                from meshplan.planner.perf import eplb_balance

                flags["--enable-eplb"] = True
                flags["--ep-num-redundant-experts"] = n
                gib = getattr(candidate.memory, "redundant_expert_bytes", 0.0) / 2**30
                b0, b1 = eplb_balance(layout_.ep, 0), eplb_balance(layout_.ep, n)
                explain.append(Explanation("--enable-eplb", "true", "expert parallelism over several GPUs: balance hot "
                                           "experts (spec.engine.expertLoadBalancing)", "SGLang server arguments"))
                explain.append(Explanation(
                    "--ep-num-redundant-experts", str(n),
                    f"{n} redundant experts over --ep-size {layout_.ep} ({(serving.num_experts + n) // layout_.ep} "
                    f"physical experts per rank), {gib:.2f} GiB per GPU held by the plan's memory fit; predicted MoE "
                    f"balance (mean/max rank load) {b0:.2f} -> {b1:.2f}: the busiest rank's expert work "
                    f"{1 - b0 / b1:.0%} shorter", "SGLang 0.5.23 eplb/expert_location.py"))
    if serving.disagg is not None:
        flags.update(disagg_flags(serving.disagg, layout_, explain))
        if serving.disagg.role == "prefill" and role.leader:
            ports.append(("bootstrap", flags["--disaggregation-bootstrap-port"]))
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
