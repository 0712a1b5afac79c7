"""Golden files of rendered manifests: compare, or rewrite with MESHPLAN_UPDATE_GOLDEN=1.

Shared by tests/test_render_golden.py (engine x fleet) and tests/test_render_weights.py (weights forms).
A missing golden fails (it is never written silently); a difference fails with a unified diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MESHPLAN_UPDATE_GOLDEN") == "1"


def check_golden(objects: list[dict[str, Any]], path: Path, test_file: str) -> None:
    """Fail unless `objects`, dumped as YAML, equal the golden file at `path` (rewrite it when UPDATE)."""
    text = yaml.safe_dump_all(objects, sort_keys=True, width=120, allow_unicode=True)
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path} missing: run MESHPLAN_UPDATE_GOLDEN=1 pytest {test_file}")
        path.write_text(text, encoding="utf-8")
        return
    want = path.read_text(encoding="utf-8")
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "rendered", n=2))
        pytest.fail(f"rendered manifests differ from {path} (MESHPLAN_UPDATE_GOLDEN=1 to accept):\n{diff[:6000]}")
