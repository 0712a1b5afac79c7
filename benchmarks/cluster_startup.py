"""Measure the local GPU cluster: warm start time and peak memory.

    python benchmarks/cluster_startup.py [--fleet all] [--runs 2]

Starts a fresh cluster (new PKI, new etcd) in a temporary state directory with
the binaries already built, records the seconds until every node of the fleets
is Ready, then the peak resident memory (VmHWM) of each component, and stops it.
The cold build time is measured separately:

    GOCACHE=$(mktemp -d) GOMODCACHE=$(mktemp -d) MESHPLAN_E2E_CACHE=$(mktemp -d) \\
        bash -c 'time bash e2e/build-control-plane.sh'
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from meshplan.devcluster import Cluster
from meshplan.devcluster.fleets import fleet_names


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", action="append", default=None)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    fleets = args.fleet or ["all"]
    if "all" in fleets:
        fleets = fleet_names()
    for run in range(args.runs):
        state = Path(tempfile.mkdtemp(prefix="meshplan-bench-"))
        c = Cluster(state_dir=state, log=lambda m: None)
        t0 = time.monotonic()
        c.up(fleets, prometheus=True, timeout=300)
        ready_s = time.monotonic() - t0
        time.sleep(5)  # let controllers settle on the new nodes
        peaks = {name: peak_rss_mib(pid) for name, pid in c.running().items()}
        c.down(quiet=True)
        total = sum(peaks.values())
        detail = ", ".join(f"{k} {v:.0f}" for k, v in peaks.items())
        print(f"run {run + 1}: fleets={'+'.join(fleets)} ready in {ready_s:.1f} s; "
              f"peak RSS {total:.0f} MiB ({detail})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
