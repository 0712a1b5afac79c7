"""LLMDeployment spec (pydantic models of meshplan.api) -> the renderer's plain options.

Pure and small: the controller and `meshplan render` both call
`options_from_spec`, so the mapping from spec fields to engine/pod/NCCL settings
exists once.

Weights: `spec.model.weights.uri` -> `render.weights.weights_source` (what the
engine loads, volumes, mounts, credential variables from Secrets, vLLM's
`--load-format runai_streamer` for s3:// and gs://, the model-cache volume);
unset -> the catalogue entry's Hugging Face repository (from its `source`),
else the model name (an HF id). An engine that cannot open the scheme is
refused at render time with the reason (and by `validate_semantics`).
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.render import NetworkOptions, PodOptions
from meshplan.render.engine_args import ServingOptions
from meshplan.render.weights import scheme_of, weights_source

_HF_SOURCE = re.compile(r"huggingface\.co/([^/]+/[^/]+)")


def weights_location(model_spec: Any, catalogue_source: str = "", engine: str = "vllm") -> tuple[str, str | None]:
    """(what the engine loads, revision or None) for `spec.model`."""
    src = weights_source(model_spec, engine, _catalogue_repo(catalogue_source))
    return src.model, src.revision


def _catalogue_repo(catalogue_source: str) -> str | None:
    m = _HF_SOURCE.search(catalogue_source or "")
    return m.group(1) if m else None


def _env_dicts(env: Any) -> tuple[dict[str, Any], ...]:
    return tuple(e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in env or ())


def _checkpoint_dtype(spec: Any, model_arch: Any) -> str:
    """The checkpoint's dtype: the ModelArch's, else spec.model.architecture.weightDtype, else bf16."""
    if model_arch is not None:
        return getattr(model_arch, "native_dtype", "bf16") or "bf16"
    arch = spec.model.architecture
    return (getattr(arch, "weight_dtype", None) if arch is not None else None) or "bf16"


def planned_context(workload: Any) -> int:
    """The maximum sequence length (prompt + output) every engine is told: `spec.workload.maxContext`, else
    `inputTokens + outputTokens`.

    That is the context the planner sized KV memory for (`planner.types.Workload.context`, used by
    `planner.memory.memory_fit` as `context_tokens`: "one sequence must be able to reach" it). Without the
    flag the engines size for the model's full context from config.json (`max_position_embeddings`, 128K for
    Llama-3.1, 160K for DeepSeek-R1): vLLM refuses to start when one such sequence does not fit its KV cache,
    and SGLang / TensorRT-LLM budget their schedulers for it. So it is always rendered (vLLM
    `--max-model-len`, SGLang `--context-length`, trtllm-serve `--max_seq_len`: the engine modules), and a
    longer request is refused by the engine with its own error instead of the plan being wrong.
    """
    explicit = getattr(workload, "max_context", None)
    return int(explicit) if explicit else int(workload.input_tokens) + int(workload.output_tokens)


def options_from_spec(spec: Any, model_arch: Any = None) -> tuple[ServingOptions, NetworkOptions, PodOptions]:
    """Renderer options from an `LLMDeploymentSpec` (and its `ModelArch`, for the checkpoint's dtype)."""
    source = getattr(model_arch, "source", "") if model_arch is not None else ""
    if model_arch is None and spec.model.architecture is None:
        try:
            from meshplan.catalog.models import get_model

            model_arch = get_model(spec.model.name)
            source = model_arch.source
        except (ImportError, KeyError):
            model_arch = None
    engine = spec.engine
    ckpt_bytes = checkpoint_bytes(model_arch, _checkpoint_dtype(spec, model_arch))
    if spec.model.architecture is not None and model_arch is None:
        try:
            from meshplan.planner import model_from_spec

            ckpt_bytes = checkpoint_bytes(model_from_spec(spec.model), _checkpoint_dtype(spec, None))
        except Exception:   # noqa: BLE001 - the planner reports a bad architecture; sizing then uses 0
            ckpt_bytes = 0.0
    moe_arch = model_arch   # the model the planner planned (a spec.model.architecture too): the EPLB rule reads it
    if moe_arch is None and spec.model.architecture is not None:
        try:
            from meshplan.planner import model_from_spec

            moe_arch = model_from_spec(spec.model)
        except Exception:   # noqa: BLE001 - the planner reports a bad architecture
            moe_arch = None
    wsrc = weights_source(spec.model, engine.kind, _catalogue_repo(source), checkpoint_bytes=ckpt_bytes)
    serving = ServingOptions(
        engine=engine.kind,
        model=wsrc.model,
        served_name=spec.model.served_name,
        revision=wsrc.revision,
        load_format=wsrc.load_format,
        weights_refusal=wsrc.refusal,
        checkpoint_dtype=_checkpoint_dtype(spec, model_arch),
        prefix_caching=engine.prefix_caching,
        scheduling_policy=engine.scheduling_policy,
        expert_load_balancing=engine.expert_load_balancing,
        cuda_graphs=engine.cuda_graphs,
        num_experts=getattr(moe_arch, "num_experts", 0) or 0,     # the EPLB rule's expert count (engines.*)
        model_name=getattr(moe_arch, "name", "") or "",            # the EPLB rule's model family (engines.*)
        speculative=_speculative(engine),
        max_model_len=planned_context(spec.workload),
        max_model_len_why=("spec.workload.maxContext" if spec.workload.max_context else
                           f"spec.workload.inputTokens {spec.workload.input_tokens} + outputTokens "
                           f"{spec.workload.output_tokens}: the context the plan sized KV memory for (set "
                           "spec.workload.maxContext for longer requests)"),
        extra_args=tuple(engine.extra_args),
        allow_plan_override=engine.allow_plan_override,
    )
    network = NetworkOptions(
        transport=spec.nccl.transport,
        socket_ifname=spec.nccl.socket_ifname,
        ib_hca=spec.nccl.ib_hca,
        env=_env_dicts(spec.nccl.env),
    )
    weights = spec.model.weights
    secret = None
    if weights is not None and weights.credentials_secret_ref is not None and any(
            e["name"] == "HF_TOKEN" for e in wsrc.env):
        secret = (weights.credentials_secret_ref.name, weights.credentials_secret_ref.key)
    cache = spec.model.cache
    # the checkpoint lands on the node's disk when the engine downloads it from Hugging Face into the
    # container (HF_HOME under /root/.cache) or into an emptyDir model cache; not with a PVC cache
    downloads = scheme_of(weights.uri if weights is not None else None) in ("", "hf") and not (
        cache is not None and cache.claim_name)
    resources = spec.resources.model_dump(by_alias=True, exclude_none=True) if spec.resources else None
    pods = PodOptions(
        image=engine.image,
        env=_env_dicts(engine.env),
        node_selector=tuple(sorted((spec.gpus.node_selector or {}).items())),
        weights_secret=secret,
        weights_env=tuple(e for e in wsrc.env if e["name"] != "HF_TOKEN"),  # HF_TOKEN: weights_secret
        volumes=wsrc.volumes,
        volume_mounts=wsrc.mounts,
        resources=resources or None,
        download_bytes=ckpt_bytes if downloads else 0.0,
    )
    return serving, network, pods


def _speculative(engine: Any) -> Any:
    """spec.engine.speculative as the planner prices it (`planner.speculative_from_spec`), None when off."""
    from meshplan.planner import speculative_from_spec

    return speculative_from_spec(engine)


def checkpoint_bytes(model_arch: Any, dtype: str) -> float:
    """Bytes of the whole checkpoint at its own dtype (what a download writes), from the planner's weight
    model on one GPU (planner.memory.weight_bytes_per_gpu); 0 when the model is unknown."""
    if model_arch is None:
        return 0.0
    from meshplan.planner.memory import weight_bytes_per_gpu
    from meshplan.planner.types import Layout

    try:
        return float(weight_bytes_per_gpu(model_arch, Layout(), dtype))
    except (ValueError, AttributeError):
        return 0.0


__all__ = ["options_from_spec", "planned_context", "weights_location"]
