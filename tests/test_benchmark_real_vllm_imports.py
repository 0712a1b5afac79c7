"""benchmarks/real_vllm.py loads the e2e helpers it drives, as its usage line runs it (`PYTHONPATH=operator`,
from the repository root). Nothing in CI runs the benchmark itself (minutes of a real vLLM under load), so a
helper moved or renamed in e2e/ broke it silently once: StatusWatch became e2e/reliability/kit.py's Watch
(2026-12-03) and e2e/test_real_vllm.py began to import the `e2e` package, which the benchmark's sys.path lacked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHECK = r"""
import re, runpy
src = open("benchmarks/real_vllm.py").read()
g = runpy.run_path("benchmarks/real_vllm.py", run_name="benchmark")
mods = {"rv": g["_load"]("real_vllm"), "test": g["_load"]("test_real_vllm"), "chart_credentials": g["_load"]("chart_credentials")}
used = sorted(set(re.findall(r"\b(rv|test|chart_credentials)\.([A-Za-z_]\w*)", src)))
assert len(used) >= 10, used
missing = [f"{m}.{n}" for m, n in used if not hasattr(mods[m], n)]
assert not missing, missing
from e2e.reliability.kit import Watch
print("imports ok", len(used))
"""


# -P: the repository root is not put on sys.path for us (a script's own directory, benchmarks/, would be), so the
# benchmark's own sys.path line is what makes the `e2e` package importable, as when it runs as a script.


def test_the_benchmark_loads_its_e2e_helpers_as_its_usage_line_runs_it():
    env = {**os.environ, "PYTHONPATH": "operator"}
    r = subprocess.run([sys.executable, "-P", "-c", CHECK], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "imports ok" in r.stdout, r.stderr[-3000:]
