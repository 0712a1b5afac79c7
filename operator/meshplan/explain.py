"""Why a rendered setting has its value: the one record the renderer, the engines and NCCL share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Explanation:
    """Why a setting has its value. `subject` is e.g. `env NCCL_P2P_LEVEL` or `--tensor-parallel-size`."""

    subject: str
    value: str
    reason: str
    source: str = ""
    level: str = "info"           # info | warning

    def line(self) -> str:
        src = f" [{self.source}]" if self.source else ""
        tag = "WARNING " if self.level == "warning" else ""
        return f"{self.subject}={self.value}: {tag}{self.reason}{src}"
