"""Reliability scenarios 12 and 13 as opt-in tests: the benchmarks, smaller, with their claims asserted.

The figures in docs/reliability.md come from the full commands
(`python benchmarks/scale.py`, `python benchmarks/soak.py --minutes N`); these
tests run them at a size that fits a CI-class machine and check what the
issue requires: every object reconciled, a later change handled in under
5 seconds, the churn settling with no orphan pods, no tracebacks. Each starts
a private control plane (the benchmarks' default), so they never disturb the
session's shared cluster. MESHPLAN_RELIABILITY_FULL=1 enables them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str, timeout_s: float) -> str:
    r = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    print(r.stdout)
    assert r.returncode == 0, f"{argv} exited {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


def test_scale_all_reconciled_and_a_later_change_handled_within_5s(full_only):
    out = _run("benchmarks/scale.py", "--nodes", "300", "--objects", "60", timeout_s=900)
    n = re.search(r"(\d+) LLMDeployments .*: (\d+) Available", out)
    assert n and n.group(1) == n.group(2), out
    handled = float(re.search(r"handled \(observedGeneration\) after ([0-9.na]+) s", out).group(1))
    assert handled < 5.0, out
    assert "0 traceback(s)" in out


def test_soak_settles_without_orphans_or_tracebacks(full_only):
    out = _run("benchmarks/soak.py", "--minutes", "3", "--private", timeout_s=900)
    assert "no orphan pods after nan" not in out, out
    assert "0 traceback(s)" in out, out
