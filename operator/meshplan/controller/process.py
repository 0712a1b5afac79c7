"""Run `meshplan run` as a child process (the operator exactly as users run it).

Used by `meshplan demo`, the e2e suite and the benchmarks. The operator is
scoped to the given namespaces (globs allowed); its log goes to a file, and
`tail()` returns the end of it for failure messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class OperatorProcess:
    def __init__(self, kubeconfig: Path | str, namespaces: list[str], *extra: str, resync_s: float = 5.0):
        self.kubeconfig = str(kubeconfig)
        self.namespaces = namespaces
        self.extra = list(extra)
        self.resync_s = resync_s
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="meshplan-operator-", suffix=".log")[1])

    def start(self, timeout_s: float = 60.0) -> "OperatorProcess":
        argv = [sys.executable, "-m", "meshplan.cli", "run", "--kubeconfig", self.kubeconfig,
                "--resync-seconds", str(self.resync_s),
                "--foreign-usage-seconds", str(min(self.resync_s, 15.0)), *self.extra]
        if os.environ.get("MESHPLAN_OPERATOR_VERBOSE"):
            argv.append("--verbose")
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        log = open(self.log_path, "ab")
        # A restart appends to the same log: look for the startup line only in what this run writes.
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"meshplan run exited with {self.proc.returncode}:\n{self.tail()}")
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                started = b"Activity 'startup' succeeded" in f.read()
            if started:
                return self
            time.sleep(0.2)
        raise RuntimeError(f"meshplan run did not start in {timeout_s:.0f}s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"
