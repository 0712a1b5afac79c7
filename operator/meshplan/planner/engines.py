"""How one `Layout` is spelled by each inference engine, and which layouts an engine cannot run.

The planner thinks in the blog's notation (`types.Layout`): a replica is
`tp x ep x pp` GPUs; inside one pipeline stage, attention runs tensor-parallel
over `tp` GPUs and data-parallel over the `ep` groups, and every expert is split
`tp` ways inside its group of the `ep` expert groups (MoE-TP = tp, MoE-EP = ep).
No engine spells it that way, and each can express only part of it. This module
is the ONE entry to the mapping from a layout to each engine's parallel
arguments, which lives in the engine's module (`meshplan.engines.<kind>`); the
renderer and the search both call it.

Each engine's facts (its flags, what it refuses, with their sources) are in its module:
`meshplan.engines.vllm`, `.sglang`, `.trtllm`.

`DP` of the layout is independent replicas (separate engine instances, one per
replica, scaled by the operator), so it never appears in the engine flags.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshplan.planner.types import Engine, Layout

if TYPE_CHECKING:
    from meshplan.engines.base import EngineLayout


class _Engines:
    """`meshplan.engines`, imported on first use: the engine modules import meshplan.planner.types (whose
    package imports this module), so importing them here at load time would be an import circle."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("meshplan.engines"), name)


_engines = _Engines()


def __getattr__(name: str) -> Any:
    # ENGINES and EngineLayout, re-exported lazily for the same reason
    if name == "ENGINES":
        return _engines.ENGINES
    if name == "EngineLayout":
        return importlib.import_module("meshplan.engines.base").EngineLayout
    raise AttributeError(name)


def replica_pods(layout: Layout, gpus_per_node: int) -> tuple[int, int]:
    """(pods, GPUs per pod) of one replica on nodes of `gpus_per_node` GPUs: each pipeline stage is split
    into pods of the largest divisor of its GPUs that fits one node (`placement.request_for_layout`, which
    the renderer follows: one pod per node slice, one stage after the other)."""
    from meshplan.topology import gpus_per_pod_for

    stage = layout.tp * layout.ep
    g = gpus_per_pod_for(stage, max(1, gpus_per_node))
    return layout.pp * (stage // g), g


def check_pods(layout: Layout, engine: Engine, pods: int, gpus_per_pod: int) -> str | None:
    """Why `engine` cannot run one replica of `layout` as `pods` pods of `gpus_per_pod` GPUs (None when it can);
    the engine module's rule (e.g. `engines.vllm.check_pods`)."""
    return _engines.get(engine).check_pods(layout, pods, gpus_per_pod)


def check_knobs(engine: Engine, chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    """Why `engine` refuses this chunk size / batch limit pair (None when it accepts it)."""
    return _engines.get(engine).check_knobs(chunk_size, max_num_seqs)


def engine_knobs(engine: Engine, layout: Layout, chunk_size: int | None, max_num_seqs: int | None) -> Any:
    """The plan's chunk / per-replica batch limit as `engine`'s flags mean them (`engines.base.EngineKnobs`):
    the engine module's `knobs` where it has one (vLLM: batch limit per DP rank), else the identity. The
    search prices `replica_max_num_seqs`, `check_knobs` and the renderer use the flag values."""
    from meshplan.engines.base import same_knobs

    return getattr(_engines.get(engine), "knobs", same_knobs)(layout, chunk_size, max_num_seqs)


def redundant_experts(engine: Engine, layout: Layout, model: Any = None, balancing: str = "auto") -> int:
    """EPLB's redundant experts `engine` runs for `layout` with spec.engine.expertLoadBalancing `balancing`: the
    engine module's `redundant_experts` rule (e.g. `engines.vllm.redundant_experts`; none where a module has no
    rule). The search holds them in the memory fit and prices their balance; the renderer spells the same count."""
    from meshplan.engines.base import no_redundant_experts

    return getattr(_engines.get(engine), "redundant_experts", no_redundant_experts)(layout, model, balancing)


def check_precision(engine: Engine, model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    """Why `engine` cannot run these weight / KV dtypes for `model` on `gpu` (None when it can): the engine
    module's `check_precision` where it has one (e.g. `engines.vllm.check_precision`)."""
    rule = getattr(_engines.get(engine), "check_precision", None)
    return rule(model, gpu, weight_dtype, kv_dtype) if rule is not None else None


def check_speculative(engine: Engine, model: Any, speculative: Any) -> str | None:
    """Why `engine` cannot run `speculative` (a `types.Speculative`; None or method off: nothing to check) for
    `model`: the engine module's `check_speculative`; an engine without one cannot be told to (NIM, MII)."""
    if speculative is None or getattr(speculative, "method", "off") == "off":
        return None
    rule = getattr(_engines.get(engine), "check_speculative", None)
    if rule is None:
        return (f"spec.engine.speculative.method {speculative.method}: {_engines.title(engine)} cannot be told to run "
                "speculative decoding; set it to off, or use engine vllm, sglang or trtllm")
    return rule(model, speculative)


def check_speculative_layout(layout: Layout, engine: Engine, speculative: Any) -> str | None:
    """Why `engine` cannot run `layout` WITH speculative decoding (None when it can, or when it is off): the engine
    module's `check_speculative_layout` where it has one (SGLang: no pipeline stages); the search and the renderer
    both ask it."""
    if speculative is None or getattr(speculative, "method", "off") == "off":
        return None
    rule = getattr(_engines.get(engine), "check_speculative_layout", None)
    return rule(layout, speculative) if rule is not None else None


def check_layout(layout: Layout, engine: Engine, model: Any = None, *, a2a_backend: str | None = None,
                 gpus_per_node: int | None = None) -> str | None:
    """Why `engine` cannot run `layout` (None when it can).

    `model` (a `catalog.models.ModelArch`, optional) enables the rules that need
    the architecture: heads divisible by TP, experts enough for the EP group.
    `a2a_backend="deepep"` asks SGLang for DeepEP, which needs MoE-TP 1.
    `gpus_per_node` enables the rules on how a replica is split into pods
    (`check_pods`, the predicate the renderer applies to the pods it renders).
    """
    if engine not in _engines.MODULES:
        return f"engine {engine!r} is not supported; use one of {', '.join(_engines.ENGINES)}"
    if gpus_per_node:
        why = check_pods(layout, engine, *replica_pods(layout, gpus_per_node))
        if why:
            return why
    experts = getattr(model, "num_experts", 0) or 0
    if model is not None and layout.ep > 1 and experts == 0:
        return f"ep={layout.ep} needs a mixture-of-experts model; {getattr(model, 'name', 'this model')} is dense"
    return _engines.get(engine).check_layout(layout, model, a2a_backend=a2a_backend)


def engine_layout(
    layout: Layout,
    engine: Engine,
    model: Any = None,
    *,
    chunk_size: int | None = None,
    max_num_seqs: int | None = None,
    memory_fraction: float | None = None,
    kv_dtype: str | None = None,
    a2a_backend: str | None = None,
    batch_overlap: bool = False,
) -> EngineLayout:
    """The engine's spelling of one replica of `layout` (raises ValueError if it cannot run it).

    `batch_overlap` adds the engine module's `BATCH_OVERLAP_FLAG` (vLLM `--enable-dbo`, SGLang
    `--enable-two-batch-overlap`) where the replica is expert-parallel."""
    reason = check_layout(layout, engine, model, a2a_backend=a2a_backend)
    if reason:
        raise ValueError(reason)
    module = _engines.get(engine)
    el = module.layout(layout, chunk_size=chunk_size, max_num_seqs=max_num_seqs,
                       memory_fraction=memory_fraction, kv_dtype=kv_dtype, a2a_backend=a2a_backend or None)
    flag = getattr(module, "BATCH_OVERLAP_FLAG", "")
    if batch_overlap and layout.ep > 1:
        if not flag:
            raise ValueError(f"{_engines.title(engine)} has no dual-/two-batch overlap; set "
                             "spec.engine.batchOverlap to off or auto")
        from dataclasses import replace

        el = replace(el, flags={**el.flags, flag: True})
    return el


__all__ = ["ENGINES", "EngineLayout", "check_knobs", "check_precision", "redundant_experts", "engine_knobs", "check_layout", "check_pods", "engine_layout", "replica_pods"]
