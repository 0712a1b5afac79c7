"""`meshplan dev-cluster up|down|status|topology`: the local GPU cluster.

See `meshplan.devcluster`. `up` builds nothing: run e2e/build-control-plane.sh
once (the README's run command does both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshplan.devcluster import Cluster, ClusterError
from meshplan.devcluster.fleets import fleet_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dev-cluster", help="start/stop the local control plane with simulated GPU nodes")
    p.add_argument("action", choices=["up", "down", "status", "topology"])
    p.add_argument("--fleet", action="append", default=None,
                   help=f"fleet name or YAML path (repeatable; 'all' = {', '.join(fleet_names())}); default hgx-h100")
    p.add_argument("--state-dir", type=Path, default=None, help="where pids, certs, logs live")
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus")
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for each component")
    p.set_defaults(func=run)


def _cluster(args) -> Cluster:
    return Cluster(state_dir=args.state_dir) if args.state_dir else Cluster()


def run(args) -> int:
    c = _cluster(args)
    try:
        if args.action == "up":
            fleets = args.fleet or ["hgx-h100"]
            if "all" in fleets:
                fleets = fleet_names()
            c.up(fleets, prometheus=not args.no_prometheus, timeout=args.timeout)
            print_topology(c)
            return 0
        if args.action == "down":
            c.down()
            return 0
        if args.action == "status":
            st = c.status()
            print(json.dumps(st, indent=2))
            return 0 if st["running"] else 1
        if args.action == "topology":
            if not c.running():
                print("dev cluster is not running: meshplan dev-cluster up", file=sys.stderr)
                return 1
            print_topology(c)
            return 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 2


def print_topology(c: Cluster) -> None:
    """Nodes, GPUs and NVLink domains as the operator will see them."""
    from meshplan.topology import build_topology, format_topology

    nodes = json.loads(c.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    pods = json.loads(c.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    print(format_topology(build_topology(nodes, pods)))
