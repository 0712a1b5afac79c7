"""Operator speed on the local control plane (kwok runs the pods): prints figures, asserts nothing.

    python benchmarks/operator_bench.py                 # reuses a running dev cluster, else starts gb200-nvl72
    python benchmarks/operator_bench.py --objects 50 --replicas 4

1. Gang start: one LLMDeployment of 4 replicas x a 16-GPU layout (TP16 over four
   4-GPU GB200 trays of one NVL72 rack; 16 pods): seconds from `kubectl apply`
   to every pod Running, and to `Available`.
2. Many objects: N single-GPU LLMDeployments applied at once: seconds until all
   are Available, and the reconcile time per object from the operator's own
   histogram (`meshplan_reconcile_duration_seconds`: mean, and p50/p99 read
   from the buckets), then the same after a quiet period (steady-state
   resync reconciles, which should write nothing).

The operator runs as `meshplan run` (a child process, scoped to the bench
namespace), exactly as deployed, with its /metrics endpoint on a free port.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLEET = "gb200-nvl72"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmd_manifest(name: str, tensor: int, replicas: int, max_gpus: int, model: str = "llama-3.1-70b",
                  products: tuple[str, ...] = ("NVIDIA-GB200",), fleet: str = FLEET) -> dict:
    """The benchmarks' LLMDeployment: FP8, ISL/OSL 1024/256, pinned TP (PP 1) on `products` in `fleet`."""
    return {
        "apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name},
        "spec": {
            "model": {"name": model},
            "precision": {"weights": "fp8", "kvCache": "fp8"},
            "workload": {"inputTokens": 1024, "outputTokens": 256},
            "parallelism": {"tensor": tensor, "pipeline": 1},
            "gpus": {"products": list(products), "maxGpus": max_gpus,
                     "nodeSelector": {"meshplan.dev/fleet": fleet}},
            "replicas": replicas,
        },
    }


def _histogram(text: str, name: str) -> tuple[float, float, list[tuple[float, float]]]:
    """(sum, count, [(le, cumulative count)]) of one histogram in Prometheus text format."""
    total = float(re.search(rf"^{name}_sum (\S+)$", text, re.M).group(1))
    count = float(re.search(rf"^{name}_count (\S+)$", text, re.M).group(1))
    buckets = [(float("inf") if le == "+Inf" else float(le), float(v))
               for le, v in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)]
    return total, count, sorted(buckets)


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    total = buckets[-1][1] if buckets else 0
    for le, c in buckets:
        if total and c >= q * total:
            return le
    return float("nan")


def _delta(a, b):
    (s0, c0, b0), (s1, c1, b1) = a, b
    d = dict(b0)
    return s1 - s0, c1 - c0, [(le, v - d.get(le, 0.0)) for le, v in b1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=50)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--quiet-s", type=float, default=70.0, help="steady-state window measured after part 2")
    args = ap.parse_args()

    from meshplan.api.crd import build_crd
    from meshplan.controller.process import OperatorProcess
    from meshplan.devcluster import Cluster

    cluster = Cluster(log=lambda m: print(f"# {m}", file=sys.stderr))
    if not cluster.running():
        cluster.up([FLEET], prometheus=False)
    kc = cluster.kubectl
    kc("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(build_crd()))
    kc("wait", "--for=condition=Established", "crd/llmdeployments.meshplan.dev", "--timeout=60s")
    ns = f"mp-bench-{int(time.time())}"
    kc("create", "namespace", ns)
    port = _free_port()
    op = OperatorProcess(cluster.kubeconfig, [ns], "--metrics-port", str(port), resync_s=60.0).start()
    metrics = lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: E731
    hist = "meshplan_reconcile_duration_seconds"

    def pods():
        return json.loads(kc("get", "pods", "-n", ns, "-o", "json", timeout=60).stdout)["items"]

    def available(names):
        items = json.loads(kc("get", "llmd", "-n", ns, "-o", "json", timeout=60).stdout)["items"]
        ok = {o["metadata"]["name"] for o in items
              if any(c["type"] == "Available" and c["status"] == "True" for c in o.get("status", {}).get("conditions", []))}
        return ok >= set(names)

    try:
        # ---- 1. gang start of 4 x 16-GPU replicas
        m = llmd_manifest("gang", tensor=16, replicas=args.replicas, max_gpus=16 * args.replicas)
        want = args.replicas * 4
        t0 = time.monotonic()
        kc("apply", "-n", ns, "-f", "-", input=json.dumps(m))
        t_running = t_avail = None
        while time.monotonic() - t0 < 300:
            ps = pods()
            if t_running is None and len(ps) == want and all(p.get("status", {}).get("phase") == "Running" for p in ps):
                t_running = time.monotonic() - t0
            if t_running is not None and available(["gang"]):
                t_avail = time.monotonic() - t0
                break
            time.sleep(0.2)
        print(f"gang start: {args.replicas} replicas x TP16 (16 GPUs, 4 pods each, {want} pods): "
              f"all pods Running after {t_running:.2f} s, Available after {t_avail:.2f} s")
        kc("delete", "llmd", "gang", "-n", ns, "--wait=true")
        while pods():
            time.sleep(0.5)

        # ---- 2. many objects
        before = _histogram(metrics(), hist)
        names = [f"m{i:03d}" for i in range(args.objects)]
        docs = {"apiVersion": "v1", "kind": "List",
                "items": [llmd_manifest(n, tensor=1, replicas=1, max_gpus=1, model="llama-3.1-8b") for n in names]}
        t0 = time.monotonic()
        kc("apply", "-n", ns, "-f", "-", input=json.dumps(docs), timeout=300)
        while time.monotonic() - t0 < 600 and not available(names):
            time.sleep(0.5)
        t_all = time.monotonic() - t0
        after = _histogram(metrics(), hist)
        s, c, b = _delta(before, after)
        print(f"{args.objects} LLMDeployments (1 GPU each): all Available after {t_all:.1f} s; "
              f"{int(c)} reconciles, {s / max(c, 1) * 1000:.0f} ms mean per reconcile "
              f"(p50 <= {_quantile(b, 0.5) * 1000:.0f} ms, p99 <= {_quantile(b, 0.99) * 1000:.0f} ms), "
              f"{c / args.objects:.1f} reconciles per object")
        time.sleep(args.quiet_s)
        quiet = _histogram(metrics(), hist)
        s, c, b = _delta(after, quiet)
        print(f"steady state ({args.quiet_s:.0f} s quiet, resync every 60 s): {int(c)} reconciles, "
              f"{s / max(c, 1) * 1000:.0f} ms mean per reconcile (p99 <= {_quantile(b, 0.99) * 1000:.0f} ms)")
    finally:
        op.stop()
        kc("delete", "namespace", ns, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
