"""The inference engines meshplan runs, one module each behind one interface (`engines.base.EngineModule`).

`get(kind)` returns the module for `spec.engine.kind`. Adding an engine: one module implementing
the interface, its entry in `MODULES`, and its golden files.
"""

from __future__ import annotations

from types import ModuleType

from meshplan.engines import deepspeed, nim, sglang, trtllm, vllm

MODULES: dict[str, ModuleType] = {m.NAME: m for m in (vllm, sglang, trtllm, nim, deepspeed)}
ENGINES: tuple[str, ...] = tuple(MODULES)
DEFAULT_IMAGES: dict[str, str] = {k: m.DEFAULT_IMAGE for k, m in MODULES.items()}


def get(kind: str) -> ModuleType:
    try:
        return MODULES[kind]
    except KeyError:
        raise ValueError(f"engine {kind!r} is not supported; use one of {', '.join(ENGINES)}") from None


def title(kind: str) -> str:
    return MODULES[kind].TITLE if kind in MODULES else kind


def priced_as(kind: str) -> str:
    """The engine whose performance model and defaults price `kind` (NIM and DeepSpeed-MII: vLLM; the
    module's PRICED_AS and PRICED_AS_REASON say why)."""
    return getattr(MODULES.get(kind), "PRICED_AS", kind)


def supported_dtypes(kind: str) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """(weight dtypes, KV dtypes) the engine can be told to run; None: any the planner chooses."""
    m = MODULES.get(kind)
    return getattr(m, "SUPPORTED_WEIGHT_DTYPES", None), getattr(m, "SUPPORTED_KV_DTYPES", None)
