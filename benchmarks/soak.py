"""Soak (reliability scenario 13): create/update/delete churn for a while; does the operator's RSS stay flat?

    python benchmarks/soak.py --minutes 30                  # the issue's run
    python benchmarks/soak.py --minutes 5                   # what docs/reliability.md reports from this session
    python benchmarks/soak.py --minutes 5 --private         # on a private control plane

On the running dev cluster (else a private one), with its own kwok GPU nodes
(`meshplan.dev/fleet=rel-soak`: `--h100-nodes` HGX H100 nodes and two GB200
domains of 4 trays), one namespace and one `meshplan run` child process. Every
`--period-s` one of `--slots` LLMDeployment slots is changed at random
(seeded): created when empty, else scaled 1 <-> 2, switched between two
pinned layouts (TP8 <-> TP4: a rolling replacement), or deleted.

Prints: the operations done, the machine's 1-minute load average during the
churn (median and max, sampled every period: the figures are only as good as
the CPU the operator got), the operator's RSS sampled every 5 s (VmRSS),
its slope over the run after a warm-up (least squares, MiB per hour, and the
start/end medians of the first/last minute), peak RSS (VmHWM), tracebacks in
its log, moves of a deployment to its other allowed GPU product (its
planned product full: `decide.fallback_target`), and after the churn stops,
seconds until every remaining object is Available with no pod of a deleted
object left (exit 1 if that never happens).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.operator_bench import _free_port, llmd_manifest  # noqa: E402
from benchmarks.scale import RssSampler, create_nodes, is_available, log, rss_kib  # noqa: E402

FLEET = "rel-soak"


def slope_mib_per_h(samples: list[tuple[float, int]]) -> float:
    if len(samples) < 3:
        return float("nan")
    t0 = samples[0][0]
    xs = [(t - t0) / 3600 for t, _ in samples]
    ys = [v / 1024 for _, v in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def manifest(name: str, replicas: int, tensor: int) -> dict:
    return llmd_manifest(name, tensor=tensor, replicas=replicas, max_gpus=16,
                         products=("NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200"), fleet=FLEET)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--slots", type=int, default=12)
    ap.add_argument("--period-s", type=float, default=2.0)
    ap.add_argument("--h100-nodes", type=int, default=16)
    ap.add_argument("--warmup-minutes", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--private", action="store_true", help="start a private control plane even if one runs")
    args = ap.parse_args()

    import tempfile

    from meshplan.api.crd import build_crd
    from meshplan.controller.process import OperatorProcess
    from meshplan.devcluster import Cluster

    cluster, private = Cluster(log=log), False
    if args.private or not cluster.running():
        cluster = Cluster(state_dir=Path(tempfile.mkdtemp(prefix="meshplan-soak-")), log=log)
        cluster.up([], prometheus=False, timeout=240)
        private = True
    kc = cluster.kubectl
    ns = f"mprel-soak-{int(time.time()) % 1000000}"
    fleet = {"name": FLEET, "nodeGroups": [
        {"namePrefix": f"{FLEET}-h100", "count": args.h100_nodes, "gpusPerNode": 8,
         "product": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "family": "hopper"},
        *({"namePrefix": f"{FLEET}-nvl{d}", "count": 4, "gpusPerNode": 4, "product": "NVIDIA-GB200",
           "memoryMiB": 189471, "family": "blackwell", "clique": f"{FLEET}-nvl{d}.0", "arch": "arm64"}
          for d in range(2))]}
    op = None
    ok = False
    try:
        kc("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(build_crd()))
        kc("wait", "--for=condition=Established", "crd/llmdeployments.meshplan.dev", "--timeout=60s")
        create_nodes(cluster, fleet)
        kc("create", "namespace", ns)
        op = OperatorProcess(cluster.kubeconfig, [ns], "--metrics-port", str(_free_port()),
                             resync_s=60.0).start(timeout_s=120)
        sampler = RssSampler(op.proc.pid, period_s=5.0)
        sampler.start()
        rng = random.Random(args.seed)
        slots: dict[str, dict | None] = {f"soak-{i:02d}": None for i in range(args.slots)}
        ops = {"create": 0, "scale": 0, "relayout": 0, "delete": 0, "failed": 0}
        load_1min: list[float] = []
        t_start = time.monotonic()
        end = t_start + args.minutes * 60
        while time.monotonic() < end:
            name = rng.choice(list(slots))
            m = slots[name]
            try:
                if m is None:
                    m = manifest(name, rng.choice([1, 2]), rng.choice([8, 4]))
                    kc("apply", "-n", ns, "-f", "-", input=json.dumps(m))
                    ops["create"] += 1
                else:
                    action = rng.choice(["scale", "scale", "relayout", "delete"])
                    if action == "delete":
                        kc("delete", "llmd", name, "-n", ns, "--wait=false")
                        m = None
                    elif action == "scale":
                        m["spec"]["replicas"] = 3 - m["spec"]["replicas"]
                        kc("apply", "-n", ns, "-f", "-", input=json.dumps(m))
                    else:
                        m["spec"]["parallelism"]["tensor"] = 12 - m["spec"]["parallelism"]["tensor"]
                        kc("apply", "-n", ns, "-f", "-", input=json.dumps(m))
                    ops[action] += 1
                slots[name] = m
            except Exception as exc:  # noqa: BLE001 - count and go on (e.g. a delete still in progress)
                ops["failed"] += 1
                log(f"{name}: {exc}")
            load_1min.append(os.getloadavg()[0])
            time.sleep(args.period_s)
        churn_s = time.monotonic() - t_start
        # settle: every remaining object Available, no pods of deleted ones
        t_settle = time.monotonic()
        settled = None
        live = {n for n, m in slots.items() if m is not None}
        while time.monotonic() - t_settle < 300:
            items = json.loads(kc("get", "llmd", "-n", ns, "-o", "json").stdout)["items"]
            pods = json.loads(kc("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
            owners = {p["metadata"]["labels"].get("meshplan.dev/deployment") for p in pods}
            if {o["metadata"]["name"] for o in items} == live and all(is_available(o) for o in items) \
                    and owners <= live:
                settled = time.monotonic() - t_settle
                break
            time.sleep(1)
        sampler.stop()
        samples = sampler.samples
        warm = [(t, v) for t, v in samples if t - t_start >= args.warmup_minutes * 60]
        first = [v for t, v in samples if t - t_start < 60]
        last = [v for t, v in samples if t_start + churn_s - t < 60 and t <= t_start + churn_s]
        peak = rss_kib(op.proc.pid)
        print(f"churn: {churn_s / 60:.1f} min, {sum(ops.values())} operations {ops} on {args.slots} slots "
              f"every {args.period_s:.0f} s")
        print(f"load average (1 min) during the churn: median {statistics.median(load_1min):.1f}, "
              f"max {max(load_1min):.1f} ({os.cpu_count()} CPUs)")
        print(f"operator RSS: first minute median {statistics.median(first) / 1024:.1f} MiB, last minute median "
              f"{statistics.median(last) / 1024:.1f} MiB, slope after {args.warmup_minutes:.0f} min warm-up "
              f"{slope_mib_per_h(warm):+.1f} MiB/h ({len(warm)} samples), peak (VmHWM) {peak['VmHWM'] / 1024:.1f} MiB")
        print(f"settled: {len(live)} remaining objects Available and no orphan pods after "
              f"{settled if settled is not None else float('nan'):.1f} s")
        log_text = op.log_path.read_text(errors='replace')
        print(f"operator log: {log_text.count('Traceback')} traceback(s); "
              f"{log_text.count('planned again on')} move(s) to another GPU product (PlanMovedProduct)")
        if settled is None:   # say why: each object not Available with its conditions, and stray pods
            for o in items:
                if not is_available(o):
                    st = o.get("status") or {}
                    conds = "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')[:300]}"
                                      for c in st.get("conditions", []) if c["status"] != "True")
                    print(f"  not settled: {o['metadata']['name']} generation {o['metadata']['generation']} "
                          f"observed {st.get('observedGeneration')} ready {st.get('readyReplicas')}/"
                          f"{o['spec'].get('replicas')}: {conds}")
            for p in pods:
                owner = p["metadata"]["labels"].get("meshplan.dev/deployment")
                if owner not in live:
                    print(f"  orphan pod: {p['metadata']['name']} of {owner} ({p.get('status', {}).get('phase')})")
            if {o["metadata"]["name"] for o in items} != live:
                print(f"  objects: expected {sorted(live)}, found {sorted(o['metadata']['name'] for o in items)}")
        ok = settled is not None
    finally:
        if op is not None:
            op.stop()
        if private:
            cluster.down(quiet=True)
        else:
            kc("delete", "namespace", ns, "--wait=false", check=False)
            kc("delete", "nodes", "-l", f"meshplan.dev/fleet={FLEET}", "--wait=false", check=False)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
