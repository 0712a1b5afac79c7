"""LLMDeployment spec (pydantic models of meshplan.api) -> the renderer's plain options.

Pure and small: the controller and `meshplan render` both call
`options_from_spec`, so the mapping from spec fields to engine/pod/NCCL settings
exists once.

Weights: `spec.model.weights.uri`
- `hf://org/name[@revision]` -> the engine loads `org/name` (with `--revision`);
- `file:///path` -> the engine loads `/path` (a volume the image or the node provides);
- other schemes (s3://, gs://, ...) are passed as given (vLLM streams s3:// and
  gs:// with its Run:ai model streamer; other engines need a local copy).
- unset -> the catalogue entry's Hugging Face repository (from its `source`),
  else the model name.
The credential Secret becomes `HF_TOKEN` (valueFrom.secretKeyRef), never inline.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.render import NetworkOptions, PodOptions
from meshplan.render.engine_args import ServingOptions

_HF_SOURCE = re.compile(r"huggingface\.co/([^/]+/[^/]+)")


def weights_location(model_spec: Any, catalogue_source: str = "") -> tuple[str, str | None]:
    """(what the engine loads, revision or None) for `spec.model`."""
    uri = getattr(getattr(model_spec, "weights", None), "uri", None)
    if uri:
        if uri.startswith("hf://"):
            repo = uri[len("hf://"):]
            if "@" in repo:
                repo, rev = repo.split("@", 1)
                return repo, rev
            return repo, None
        if uri.startswith("file://"):
            return uri[len("file://"):], None
        return uri, None
    m = _HF_SOURCE.search(catalogue_source or "")
    if m:
        return m.group(1), None
    return model_spec.name, None


def _env_dicts(env: Any) -> tuple[dict[str, Any], ...]:
    return tuple(e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in env or ())


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
    model, revision = weights_location(spec.model, source)
    engine = spec.engine
    serving = ServingOptions(
        engine=engine.kind,
        model=model,
        served_name=spec.model.served_name,
        revision=revision,
        checkpoint_dtype=getattr(model_arch, "native_dtype", "bf16") or "bf16",
        prefix_caching=engine.prefix_caching,
        scheduling_policy=engine.scheduling_policy,
        expert_load_balancing=engine.expert_load_balancing,
        cuda_graphs=engine.cuda_graphs,
        max_model_len=spec.workload.max_context,
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
    if weights is not None and weights.credentials_secret_ref is not None:
        secret = (weights.credentials_secret_ref.name, weights.credentials_secret_ref.key)
    pods = PodOptions(
        image=engine.image,
        env=_env_dicts(engine.env),
        node_selector=tuple(sorted((spec.gpus.node_selector or {}).items())),
        weights_secret=secret,
    )
    return serving, network, pods


__all__ = ["options_from_spec", "weights_location"]
