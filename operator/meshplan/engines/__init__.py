"""The inference engines meshplan runs, one module each behind one interface (`engines.base.EngineModule`).

`get(kind)` returns the module for `spec.engine.kind`. Adding an engine: one module implementing
the interface, its entry in `MODULES`, and its golden files.
"""

from __future__ import annotations

from types import ModuleType

from meshplan.engines import sglang, trtllm, vllm

MODULES: dict[str, ModuleType] = {m.NAME: m for m in (vllm, sglang, trtllm)}
ENGINES: tuple[str, ...] = tuple(MODULES)
DEFAULT_IMAGES: dict[str, str] = {k: m.DEFAULT_IMAGE for k, m in MODULES.items()}


def get(kind: str) -> ModuleType:
    try:
        return MODULES[kind]
    except KeyError:
        raise ValueError(f"engine {kind!r} is not supported; use one of {', '.join(ENGINES)}") from None


def title(kind: str) -> str:
    return MODULES[kind].TITLE if kind in MODULES else kind
