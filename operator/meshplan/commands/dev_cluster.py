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
    from meshplan.topology import build_topology

    nodes = json.loads(c.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    pods = json.loads(c.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    print(format_topology(build_topology(nodes, pods)))


def format_topology(topo) -> str:
    """A table of NVLink domains: where a TP/EP group may live and how much is free."""
    lines = [f"{len(topo.nodes)} GPU nodes, {topo.total_gpus} GPUs ({topo.free_gpus} free) "
             f"in {len(topo.domains)} NVLink domains"]
    header = f"{'NVLINK DOMAIN':<48} {'ZONE':<8} {'PRODUCT':<22} {'NODES':>5} {'GPUS/NODE':>9} {'GPUS':>5} {'FREE':>5}  LINK"
    lines.append(header)
    for d in sorted(topo.domains, key=lambda d: (d.zone, d.product, d.name)):
        link = ("multi-node NVLink" if d.multi_node else "NVLink") if d.nvlink else "PCIe (no NVLink)"
        lines.append(f"{d.name[:48]:<48} {d.zone:<8} {d.product[:22]:<22} {len(d.nodes):>5} "
                     f"{d.gpus_per_node:>9} {d.total_gpus:>5} {d.free_gpus:>5}  {link}")
    for node, why in topo.excluded:
        lines.append(f"not capacity: {node} ({why})")
    return "\n".join(lines)
