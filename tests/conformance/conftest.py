"""Shared fixtures of the engine conformance suite: run code inside an engine's own venv.

The venvs are built by `engines-venv/install.py` (`make setup` builds every non-optional
one). A missing venv FAILS the test with the command that builds it: a conformance test
that did not run is never counted as passing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engines-venv"))
import install as engine_venvs  # noqa: E402


def engine_python(name: str) -> Path:
    py = engine_venvs.python_of(name)
    if py is None:
        pytest.fail(f"engine venv {name!r} is not built: run `.venv/bin/python engines-venv/install.py {name}` "
                    f"(make setup builds the pinned ones)", pytrace=False)
    return py


def run_in_venv(name: str, script: Path, payload: Any, timeout: float = 900, env: dict[str, str] | None = None) -> Any:
    """Run `script` with the venv's python, JSON `payload` on stdin; returns the JSON it prints last."""
    py = engine_python(name)
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full_env.update(env or {})
    proc = subprocess.run([str(py), str(script)], input=json.dumps(payload), capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} in {name} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])
