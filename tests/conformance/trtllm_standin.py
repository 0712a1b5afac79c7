"""What stands in for TensorRT-LLM 1.2.1's own parser and LLM-API model in the conformance suite.

Why not the engine's code: `pip install tensorrt-llm==1.2.1` (or `--no-deps`) fails on this machine
and in CI. The package index serves `tensorrt_llm-1.2.1.tar.gz` (10 kB), a `wheel-stub` placeholder
whose build step downloads the real wheel from pypi.nvidia.com, which is not reachable
(`URLError: <urlopen error [Errno -2] Name or service not known>`, then wheel_stub's
"The installation of tensorrt-llm for version 1.2.1 failed"). So `tensorrt_llm.llmapi.llm_args`
and `tensorrt_llm.commands.serve` cannot be imported. The tagged source cannot be had either: the
GitHub mirror of NVIDIA/TensorRT-LLM is 2.5 GB (over the 500 MB a fetch may bring), CI reaches no
GitHub, and the code index stores one copy per file that is not the v1.2.1 tag.

What stands in (our code, built on the same libraries the engine uses: click for `trtllm-serve`,
pydantic for `LlmArgs`):

- `serve_command()`: a real click command with trtllm-serve's option names, exactly as
  `meshplan.catalog.engine_options.TRTLLM_OPTIONS` lists them (extracted from
  tensorrt_llm/commands/serve.py by benchmarks/engine_options/extract_options.py; its SOURCES entry
  names the commit), the types of the options meshplan renders from the trtllm-serve reference
  (nvidia.github.io/TensorRT-LLM commands/trtllm-serve: int/float/choice), its three switches as
  flags, and MODEL as the one positional argument. click matches option names exactly, so a
  misspelt or removed option fails with click's own "No such option" message, as trtllm-serve does.
- `TorchLlmArgsSubset` and the nested models: pydantic models with `extra="forbid"` (TensorRT-LLM's
  `StrictBaseModel`) holding the LLM-API fields meshplan writes, with their 1.2-era types
  (nvidia.github.io/TensorRT-LLM llm-api/reference TorchLlmArgs, KvCacheConfig, MoeConfig,
  MoeLoadBalancerConfig, CudaGraphConfig pages), so an unknown key or a wrong type fails with
  pydantic's message; plus the cross-field rules TensorRT-LLM applies at start-up that a plan can
  break (`configuration_problems`, each with its source).
This is weaker than the engine's own code: a field added or renamed between the pages read and
1.2.1 is not seen. It says so in every failure message.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import click
from pydantic import BaseModel, ConfigDict, Field

import meshplan.render  # noqa: F401,E402  (package import order: planner before engines)
from meshplan.catalog.engine_options import TRTLLM_OPTIONS  # noqa: E402

STANDIN = ("stand-in for TensorRT-LLM 1.2.1 (its wheel and tagged source are not reachable here; "
           "tests/conformance/trtllm_standin.py)")

# types of the options meshplan renders (trtllm-serve reference: `--tp_size <tp_size>` etc.)
_INT = {"--max_batch_size", "--max_num_tokens", "--max_seq_len", "--tp_size", "--pp_size", "--ep_size", "--port",
        "--max_beam_width", "--num_postprocess_workers", "--gpus_per_node", "--cp_size", "--cluster_size"}
_FLOAT = {"--kv_cache_free_gpu_memory_fraction"}
_CHOICES = {"--backend": ["pytorch", "tensorrt", "trt", "_autodeploy"],
            "--log_level": ["internal_error", "error", "warning", "info", "verbose", "debug", "trace"]}
_FLAGS = {"--trust_remote_code", "--fail_fast_on_attention_window_too_large", "--enable_chunked_prefill"}


def serve_command() -> click.Command:
    params: list[click.Parameter] = [click.Argument(["model"])]
    for names in TRTLLM_OPTIONS:
        if "--help" in names:
            continue
        names_set = set(names)
        kw: dict[str, Any] = {}
        if names_set & _FLAGS:
            kw["is_flag"] = True
        elif names_set & _INT:
            kw["type"] = int
        elif names_set & _FLOAT:
            kw["type"] = float
        else:
            choice = next((_CHOICES[n] for n in names if n in _CHOICES), None)
            kw["type"] = click.Choice(choice) if choice else str
        params.append(click.Option(list(names), **kw))

    def _callback(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    return click.Command("trtllm-serve", params=params, callback=_callback)


def parse_serve(argv: list[str]) -> dict[str, Any]:
    """click's parse of `trtllm-serve ARGV` (raises click.UsageError with click's message)."""
    cmd = serve_command()
    ctx = cmd.make_context("trtllm-serve", list(argv), resilient_parsing=False)
    return dict(ctx.params)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")       # tensorrt_llm.llmapi.utils.StrictBaseModel


class KvCacheConfig(_Strict):
    enable_block_reuse: bool = True
    free_gpu_memory_fraction: Optional[float] = None
    dtype: str = "auto"


class MoeLoadBalancerConfig(_Strict):
    num_slots: Optional[int] = None
    initial_global_assignments: Optional[dict[int, list[int]]] = None
    layer_updates_per_iter: int = 0


class MoeConfig(_Strict):
    backend: Literal["AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"] = "AUTO"
    max_num_tokens: Optional[int] = None
    load_balancer: Optional[Union[MoeLoadBalancerConfig, str]] = None


class CudaGraphConfig(_Strict):
    batch_sizes: Optional[list[int]] = None
    max_batch_size: int = 0
    enable_padding: bool = False


class MTPDecodingConfig(_Strict):
    """`speculative_config` for MTP: tensorrt_llm/llmapi/llm_args.py MTPDecodingConfig (NVIDIA/TensorRT-LLM main, read
    through the code index: `decoding_type: Literal["MTP"]`, `num_nextn_predict_layers: PositiveInt = 1`,
    relaxed-acceptance and vanilla switches; DecodingBaseConfig's max_draft_len) and the LLM-API YAML of
    examples/models/core/deepseek_v3/README.md "Multi-Token Prediction (MTP)" (`decoding_type: MTP`,
    `num_nextn_predict_layers: N`). The discriminator is required here: TorchLlmArgs picks the config class by it."""

    decoding_type: Literal["MTP"]
    num_nextn_predict_layers: int = Field(default=1, gt=0)
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    max_draft_len: Optional[int] = None


class CacheTransceiverConfig(_Strict):
    """`cache_transceiver_config` of a disaggregated context/generation server: tensorrt_llm/llmapi/llm_args.py
    CacheTransceiverConfig (StrictBaseModel; read through the code index, 1.x copies: `backend:
    Optional[Literal["DEFAULT", "UCX", "NIXL", "MPI"]]`, `max_tokens_in_buffer: Optional[int]`; later main adds
    MOONCAKE and transceiver_runtime, not accepted here) and examples/disaggregated/README.md ("valid options include
    DEFAULT, UCX, NIXL, and MPI")."""

    backend: Optional[Literal["DEFAULT", "UCX", "NIXL", "MPI"]] = None
    max_tokens_in_buffer: Optional[int] = Field(default=None, gt=0)


class TorchLlmArgsSubset(_Strict):
    """The TorchLlmArgs fields meshplan writes to --extra_llm_api_options (others are not allowed here)."""

    dtype: str = "auto"
    enable_attention_dp: bool = False
    moe_expert_parallel_size: Optional[int] = None
    moe_tensor_parallel_size: Optional[int] = None
    enable_chunked_prefill: bool = False
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    moe_config: MoeConfig = Field(default_factory=MoeConfig)
    cuda_graph_config: Optional[CudaGraphConfig] = Field(default_factory=CudaGraphConfig)
    speculative_config: Optional[MTPDecodingConfig] = None
    # prefill/decode disaggregation (examples/disaggregated/README.md: the context servers' config sets
    # disable_overlap_scheduler: True; TorchLlmArgs.disable_overlap_scheduler: bool = False)
    cache_transceiver_config: Optional[CacheTransceiverConfig] = None
    disable_overlap_scheduler: bool = False


class ServerGroup(_Strict):
    num_instances: int = Field(gt=0)
    urls: list[str]


class DisaggServerConfig(_Strict):
    """The `trtllm-serve disaggregated -c CONFIG` YAML keys meshplan writes (examples/disaggregated/README.md,
    disagg_config.yaml: hostname, port, backend, context_servers / generation_servers with num_instances and urls;
    tensorrt_llm/serve disagg config parsing takes urls as host:port)."""

    hostname: str
    port: int
    backend: Literal["pytorch"]
    context_servers: ServerGroup
    generation_servers: ServerGroup


def disagg_router_problems(cfg: DisaggServerConfig) -> list[str]:
    """What the router config must hold (the README: one URL per instance, host:port each)."""
    out = []
    for name, group in (("context_servers", cfg.context_servers), ("generation_servers", cfg.generation_servers)):
        if group.num_instances != len(group.urls):
            out.append(f"{name}.num_instances {group.num_instances} != {len(group.urls)} urls")
        out += [f"{name} url {u!r} is not host:port" for u in group.urls
                if ":" not in u or not u.rsplit(":", 1)[1].isdigit() or "://" in u]
    return out


def disaggregated_command() -> click.Command:
    """`trtllm-serve disaggregated`'s options (trtllm-serve reference, nvidia.github.io/TensorRT-LLM
    commands/trtllm-serve: -c/--config_file, -m/--metadata_server_config_file, -t/--server_start_timeout,
    -r/--request_timeout, -l/--log_level)."""
    params = [click.Option(["-c", "--config_file"], type=str, required=True),
              click.Option(["-m", "--metadata_server_config_file"], type=str),
              click.Option(["-t", "--server_start_timeout"], type=int),
              click.Option(["-r", "--request_timeout"], type=int),
              click.Option(["-l", "--log_level"], type=click.Choice(_CHOICES["--log_level"]))]
    return click.Command("disaggregated", params=params, callback=lambda **kw: kw)


def parse_disaggregated(argv: list[str]) -> dict[str, Any]:
    ctx = disaggregated_command().make_context("trtllm-serve disaggregated", list(argv), resilient_parsing=False)
    return dict(ctx.params)


def configuration_problems(params: dict[str, Any], args: TorchLlmArgsSubset, *, world: int,
                           experts: int, heads: int) -> list[str]:
    """Start-up rules of TensorRT-LLM a plan can break (each names its source)."""
    out: list[str] = []
    tp, pp = params.get("tensor_parallel_size") or 1, params.get("pipeline_parallel_size") or 1
    ep = args.moe_expert_parallel_size or params.get("moe_expert_parallel_size") or 1
    moe_tp = args.moe_tensor_parallel_size or (tp // ep if ep > 1 else tp)
    if tp * pp != world:
        out.append(f"tp_size {tp} x pp_size {pp} != {world} MPI ranks (tensorrt_llm/mapping.py: world_size = tp*pp*cp)")
    if experts and moe_tp * ep != tp:
        out.append(f"moe_tp_size {moe_tp} * moe_ep_size {ep} != tp_size {tp} (tensorrt_llm/mapping.py Mapping asserts "
                   "moe_tp_size * moe_ep_size == tp_size)")
    if ep > 1 and experts and experts % ep:
        out.append(f"{experts} experts do not divide by moe_expert_parallel_size {ep}")
    if not args.enable_attention_dp and heads and heads % tp:
        out.append(f"{heads} attention heads do not divide by tp_size {tp}")
    lb = args.moe_config.load_balancer
    if isinstance(lb, MoeLoadBalancerConfig) and lb.num_slots is not None:
        if lb.num_slots % ep:
            out.append(f"moe_config.load_balancer.num_slots {lb.num_slots} does not divide by the EP size {ep} "
                       "(MoeLoadBalancer: slots per rank = num_slots // ep_size)")
        if experts and lb.num_slots < experts:
            out.append(f"moe_config.load_balancer.num_slots {lb.num_slots} < {experts} experts")
    if args.kv_cache_config.dtype not in ("auto", "fp8"):
        out.append(f"kv_cache_config.dtype {args.kv_cache_config.dtype!r}: TorchLlmArgs sets a KV format only for "
                   "'fp8' (sync_quant_config_with_kv_cache_config_dtype warns and ignores others)")
    bs, tokens = params.get("max_batch_size"), params.get("max_num_tokens")
    if bs is not None and bs < 1 or tokens is not None and tokens < 1:
        out.append(f"max_batch_size {bs} / max_num_tokens {tokens} must be positive")
    return out
