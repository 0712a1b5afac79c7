"""The e2e suite's handle on a running operator, and its polling helper.

- `OperatorProcess` is `meshplan.controller.process.OperatorProcess` (the
  implementation lives in the package because `meshplan demo` starts the
  operator the same way); kept here so tests import one name.
- `serve(...)`: the body of a module-scoped operator fixture: CRDs applied and
  Established, one operator serving a namespace glob (optionally with a
  /metrics port), stopped afterwards, its log tail printed when a test of the
  module failed.
- `wait_until(pred, timeout_s)`: poll until `pred()` is truthy; returns that
  value, or the last falsy one at the deadline (callers assert with their
  own message).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from meshplan.controller.process import OperatorProcess

__all__ = ["OperatorProcess", "apply_crd", "serve", "wait_until"]

REPO = Path(__file__).resolve().parent.parent


def wait_until(pred: Callable[[], Any], timeout_s: float = 60.0, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval_s)
    return last


def apply_crd(cluster: Any, name: str = "llmdeployments.meshplan.dev", timeout_s: float = 60) -> None:
    """Apply crds/ and wait until the CRD is Established.

    `kubectl wait --for=condition=Established` right after the apply fails at once ("status.conditions
    accessor error: <nil>") when the API server has not written the CRD's first conditions yet, which a
    loaded machine and a CRD with many CEL rules make likely; so first wait for the conditions to exist."""
    import json

    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))

    def conditions() -> bool:
        r = cluster.kubectl("get", "crd", name, "-o", "json", check=False)
        return r.returncode == 0 and bool((json.loads(r.stdout).get("status") or {}).get("conditions"))

    wait_until(conditions, timeout_s, 0.2)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", f"--timeout={int(timeout_s)}s")


def serve(cluster: Any, kubeconfig: str, request: Any, ns_glob: str, *args: str, metrics: bool = False,
          tail_lines: int = 150) -> Iterator[OperatorProcess]:
    apply_crd(cluster)
    metrics_url = None
    if metrics:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = (*args, "--metrics-port", str(port))
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    op = OperatorProcess(kubeconfig, [ns_glob], *args).start()
    op.metrics_url = metrics_url
    failed_before = request.session.testsfailed
    try:
        yield op
    finally:
        op.stop()
        if request.session.testsfailed > failed_before:
            print(f"\n----- meshplan operator log (tail) -----\n{op.tail(tail_lines)}")
