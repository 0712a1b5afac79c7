"""Runs INSIDE a vLLM venv (stdlib + vLLM only): parse rendered `vllm serve` argv with vLLM's own parser and
build the engine configuration the way `vllm serve` does at start-up.

stdin (JSON): {"cases": [{"id", "argv" (the container args after `vllm serve`), "model_dir" (a local
directory holding the model's real config.json), "gpu": {"name", "major", "minor", "memory_bytes",
"count"}}], "env_names": [...]}
stdout, last line (JSON): {"version", "results": [{"id", "ok", "stage", "error", "config": {...}}],
"env": {"known": [...], "unknown": [...]}, "facts": {...}}

What `vllm serve ARGS` does (vllm/entrypoints/cli/main.py and cli/serve.py, v0.32.0), repeated here:
1. a top-level FlexibleArgumentParser with a `serve` sub-parser built by `ServeSubcommand.subparser_init`
   (`make_arg_parser`), `parse_args(["serve", *ARGS])`; then `ServeSubcommand.validate` (validate_parsed_serve_args);
2. `ServeSubcommand.cmd`'s preamble: the positional model_tag becomes `args.model`; `--headless` sets
   `api_server_count` 0;
3. `AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=OPENAI_API_SERVER, headless=...)`
   (run_headless and the API server's build_async_engine_client do exactly this). VllmConfig's post-init
   also builds the quantization config the model loader uses (`get_quant_config`), so a flag the loader
   refuses (e.g. online `--quantization fp8`) fails here too.

Only what a CPU machine forces is simulated: the model is a directory with the real config.json (no
weights, no tokenizer files; nothing is downloaded: HF_HUB_OFFLINE=1), and vLLM's `current_platform` is
a CudaPlatform whose device queries answer the planned GPU's compute capability, name, memory and count
(vLLM resolves `current_platform` lazily in vllm/platforms/__init__.py; it is set here before any config
module is imported). The CPU build ships no CUDA kernels (`vllm._C_stable_libtorch`, imported by
vllm/platforms/cuda.py to register ops; `vllm.vllm_flash_attn`'s extensions): stand-ins that run nothing
take their place, as no kernel runs while a config is built.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

GPU = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "memory_bytes": 80 * 2**30, "count": 8}


def _install_platform():
    """vLLM's CudaPlatform, device queries answered from GPU (the planned product) instead of NVML."""
    try:
        import vllm._C_stable_libtorch  # noqa: F401  (the GPU wheel has it)
    except ImportError:
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    try:
        import vllm.vllm_flash_attn  # noqa: F401
    except ImportError:
        # The CPU build has no flash-attention extensions; vllm/v1/attention/backends/fa_utils.py imports
        # three of its kernels by name on CUDA (the quantization config's import chain reaches it).
        # Stand-ins that refuse to run: no kernel runs while a config is built.
        fa = types.ModuleType("vllm.vllm_flash_attn")

        def _no_kernel(*_a, **_k):
            raise RuntimeError("flash-attention kernel called in the config-only conformance probe")

        for fn in ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func",
                   "get_scheduler_metadata", "fa_version_unsupported_reason", "is_fa_version_supported"):
            setattr(fa, fn, _no_kernel)
        fa.FA2_AVAILABLE = fa.FA3_AVAILABLE = False
        sys.modules["vllm.vllm_flash_attn"] = fa
    import vllm.platforms as platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    class SimulatedCudaPlatform(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(major=GPU["major"], minor=GPU["minor"])

        @classmethod
        def has_device_capability(cls, capability, device_id: int = 0) -> bool:
            cap = cls.get_device_capability(device_id)
            if isinstance(capability, tuple):
                return (cap.major, cap.minor) >= tuple(capability)
            return cap.to_int() >= capability

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return GPU["name"]

        @classmethod
        def get_device_uuid(cls, device_id: int = 0) -> str:
            return f"GPU-simulated-{device_id}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(GPU["memory_bytes"])

        @classmethod
        def is_fully_connected(cls, physical_device_ids) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return int(GPU["count"])

        @classmethod
        def get_device_numa_node(cls, device_id: int = 0):
            return None

        @classmethod
        def get_all_device_numa_nodes(cls):
            return None

        @classmethod
        def log_warnings(cls):
            pass

    platforms._current_platform = SimulatedCudaPlatform()
    _capability_queries()
    _triton_config()
    return platforms._current_platform


# The CUDA kernel library's capability queries (vllm/_custom_ops.py wraps torch.ops._C ops that the CPU build
# lacks; modules such as quantization/utils/w8a8_utils.py call them at import). Their answers as the CUDA
# build gives them, from vLLM's csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_entry.cu (FP8: SM89
# with CUDA >= 12.4, SM90+; block FP8: SM90+; grouped FP8: SM90, SM100/103) and the FP4 entry (SM100+), for
# the CUDA 12.8+ of the release images.
_CAPABILITY_QUERIES = {
    "cutlass_scaled_mm_supports_fp8": lambda c: c >= 89,
    "cutlass_scaled_mm_supports_block_fp8": lambda c: c >= 90,
    "cutlass_group_gemm_supported": lambda c: c in (90, 100, 103),
    "cutlass_scaled_mm_supports_fp4": lambda c: c >= 100,
    "mxfp4_experts_quant_supported": lambda c: c >= 100,
}


def _triton_config() -> None:
    """The CPU build runs with vLLM's TritonPlaceholder (vllm/triton_utils/importing.py: no GPU driver, so
    HAS_TRITON is False), whose `triton.Config` is a no-op decorator. Kernel modules that filter their autotune
    configs at import on Hopper (model_executor/layers/mamba/ops/ssd_chunk_scan.py `_drop_racy_wgmma_configs`
    reads `num_stages`, `num_warps`, `kwargs`), reached when VllmConfig loads a KV connector class
    (config/vllm.py: KVConnectorFactory.get_connector_class -> nixl/base_worker.py -> v1/worker/utils.py), need a
    Config that holds its arguments as triton's does (triton.Config(kwargs, num_warps=4, num_stages=3)). No
    kernel runs."""
    import vllm.triton_utils as tu

    if getattr(tu, "HAS_TRITON", True):
        return

    class Config:
        def __init__(self, kwargs=None, num_warps=4, num_stages=3, **rest):
            self.kwargs, self.num_warps, self.num_stages = dict(kwargs or {}), num_warps, num_stages
            self.__dict__.update(rest)

    tu.triton.Config = Config


def _capability_queries() -> None:
    import vllm._custom_ops as ops

    for name, answer in _CAPABILITY_QUERIES.items():
        real = getattr(ops, name, None)
        if real is None:
            continue

        def query(cap, _real=real, _answer=answer):
            try:
                return _real(cap)
            except (AttributeError, RuntimeError):   # op not registered in this (CPU) build
                return _answer(int(cap))

        setattr(ops, name, query)


def _parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    return top, cmd


def _summary(cfg) -> dict:
    par, sch, cache, model = cfg.parallel_config, cfg.scheduler_config, cfg.cache_config, cfg.model_config
    eplb = getattr(par, "eplb_config", None)
    quant = getattr(cfg, "quant_config", None)
    return {
        "tensor_parallel_size": par.tensor_parallel_size,
        "pipeline_parallel_size": par.pipeline_parallel_size,
        "data_parallel_size": par.data_parallel_size,
        "data_parallel_size_local": par.data_parallel_size_local,
        "data_parallel_rank": par.data_parallel_rank,
        "enable_expert_parallel": par.enable_expert_parallel,
        "enable_eplb": par.enable_eplb,
        "all2all_backend": getattr(par, "all2all_backend", None),
        "enable_dbo": getattr(par, "enable_dbo", None),
        "num_redundant_experts": getattr(eplb, "num_redundant_experts", None),
        "world_size": par.world_size,
        "nnodes": getattr(par, "nnodes", None),
        "node_rank": getattr(par, "node_rank", None),
        "master_addr": getattr(par, "master_addr", None),
        "distributed_executor_backend": str(par.distributed_executor_backend),
        "max_num_seqs": sch.max_num_seqs,
        "max_num_batched_tokens": sch.max_num_batched_tokens,
        "policy": str(sch.policy),
        "max_model_len": model.max_model_len,
        "dtype": str(model.dtype),
        "quantization": model.quantization,
        "quant_config": type(quant).__name__ if quant is not None else None,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "cache_dtype": cache.cache_dtype,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "enforce_eager": model.enforce_eager,
        # speculative decoding as vLLM resolved it (None when off)
        "speculative_method": getattr(cfg.speculative_config, "method", None),
        "num_speculative_tokens": getattr(cfg.speculative_config, "num_speculative_tokens", None),
        # prefill/decode disaggregation: vLLM's KVTransferConfig as built from --kv-transfer-config (None: off)
        "kv_connector": getattr(cfg.kv_transfer_config, "kv_connector", None),
        "kv_role": getattr(cfg.kv_transfer_config, "kv_role", None),
        "is_kv_producer": getattr(cfg.kv_transfer_config, "is_kv_producer", None),
        "is_kv_consumer": getattr(cfg.kv_transfer_config, "is_kv_consumer", None),
        "speculative_n_predict": getattr(getattr(getattr(cfg.speculative_config, "draft_model_config", None),
                                                 "hf_config", None), "n_predict", None),
    }


def _expert_placement(cfg) -> dict:
    """With EPLB on: vLLM's own count of physical experts (FusedMoE's `determine_expert_counts`) and whether they
    spread evenly over the EP group (FusedMoE refuses otherwise at model construction: "EPLB currently only supports
    even distribution of experts across ranks"; EP = TP x DP with --enable-expert-parallel)."""
    par = cfg.parallel_config
    if not par.enable_eplb:
        return {}
    from vllm.model_executor.layers.fused_moe.layer import determine_expert_counts

    logical = cfg.model_config.get_num_experts()
    physical, _, _ = determine_expert_counts(logical, par.eplb_config.num_redundant_experts, None, False)
    ep = par.tensor_parallel_size * par.data_parallel_size
    return {"logical_experts": logical, "physical_experts": physical, "ep_size": ep,
            "even_over_ep": physical % ep == 0, "window_size": par.eplb_config.window_size,
            "step_interval": par.eplb_config.step_interval}


def run_case(top, cmd, case: dict) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    GPU.update(case.get("gpu") or {})
    out = {"id": case["id"], "ok": False, "stage": "parse", "error": "", "config": {}}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(["serve", *case["argv"]])
    except SystemExit:
        out["error"] = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "parser exited"
        return out
    try:
        out["stage"] = "validate"
        cmd.validate(args)
        out["stage"] = "config"
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        if args.headless:
            args.api_server_count = 0
        engine_args = AsyncEngineArgs.from_cli_args(args)
        cfg = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER,
                                               headless=bool(args.headless))
        out["config"] = _summary(cfg)
        out["stage"] = "experts"
        out["config"]["experts"] = _expert_placement(cfg)
        out["ok"] = True
        out["stage"] = "done"
    except Exception as exc:  # the engine's own refusal, verbatim
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["trace"] = traceback.format_exc()[-3000:]
    return out


def main() -> None:
    payload = json.loads(sys.stdin.read())
    import vllm

    _install_platform()
    import vllm.envs as envs

    top, cmd = _parser()
    results = [run_case(top, cmd, c) for c in payload.get("cases", [])]
    registry = set(getattr(envs, "environment_variables", {}))
    names = payload.get("env_names", [])
    from vllm.config.cache import CacheConfig

    default = CacheConfig.__dataclass_fields__["gpu_memory_utilization"].default
    facts = {"gpu_memory_utilization_default": getattr(default, "default", default)}   # pydantic FieldInfo
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    facts["kv_connectors"] = sorted(KVConnectorFactory._registry)    # the connectors this vLLM registers
    serve = next(a for a in top._actions if a.dest == "subparser").choices["serve"]
    # option strings of each `vllm serve` action, aliases together; BooleanOptionalAction's --no-X left out
    options = [[o for o in a.option_strings if not o.startswith("--no-")] for a in serve._actions if a.option_strings]
    print(json.dumps({"version": getattr(vllm, "__version__", "?"), "results": results, "options": options,
                      "env": {"known": sorted(n for n in names if n in registry),
                              "unknown": sorted(n for n in names if n not in registry)},
                      "registry_size": len(registry), "facts": facts}))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
