"""`meshplan render MANIFEST`: the Kubernetes objects meshplan would apply for one LLMDeployment.

    meshplan render examples/llama-3.1-70b-hgx-h100.yaml --fleet hgx-h100
    meshplan render llmd.yaml --fleet gb200-nvl72 --compute-domains --explain
    meshplan render llmd.yaml --kubeconfig ~/.kube/config > children.yaml
    meshplan render llmd.yaml --nodes nodes.yaml --pods pods.yaml   # `kubectl get nodes/pods -o yaml` output

Plans on the fleet's (or cluster's) free GPUs, places the replicas on NVLink
domains and prints the pods, Services and ComputeDomains as YAML, with a
comment header saying what was chosen and where each replica landed.
`--explain` adds why every engine flag and NCCL variable has its value.
All decisions are `meshplan.render.pipeline.plan_place_render` (pure); this
module only reads the manifest, the fleet file or the cluster, and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("render", help="print the pods/Services meshplan would create for an LLMDeployment",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", help="LLMDeployment YAML/JSON file ('-' for stdin)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fleet", help="fleet name (hgx-h100, gb200-nvl72, mixed) or fleet YAML file")
    src.add_argument("--kubeconfig", help="read this cluster's Nodes and Pods for free GPUs")
    src.add_argument("--nodes", metavar="FILE", help="Nodes as `kubectl get nodes -o yaml` (or -o json) prints them")
    from meshplan.commands.plan import add_offline_args

    add_offline_args(p)
    p.add_argument("--compute-domains", action="store_true",
                   help="the NVIDIA DRA ComputeDomain CRD exists: render IMEX claims for multi-node NVLink groups")
    p.add_argument("--no-gate", action="store_true", help="render pods without the gang scheduling gate")
    p.add_argument("--explain", action="store_true", help="add why each flag and NCCL variable is set")
    p.add_argument("--output", "-o", choices=("yaml", "json"), default="yaml")
    p.set_defaults(func=run)


def _own(pods: list, name: str, namespace: str) -> list:
    return [p for p in pods if (p.get("metadata") or {}).get("namespace") == namespace
            and ((p.get("metadata") or {}).get("labels") or {}).get("meshplan.dev/deployment") == name]


def _nodes_and_pods(args: argparse.Namespace, name: str, namespace: str) -> tuple[list, list, bool]:
    if args.fleet:
        from meshplan.devcluster.fleets import fleet_nodes, load_fleet

        return fleet_nodes(load_fleet(args.fleet)), [], True
    if args.nodes:
        from meshplan.commands.plan import read_kube_objects

        pods = read_kube_objects(args.pods, "Pod") if args.pods else []
        own = _own(pods, name, namespace)
        return read_kube_objects(args.nodes, "Node"), [p for p in pods if p not in own], True
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=args.kubeconfig)
    v1 = client.CoreV1Api(api)
    nodes = [api.sanitize_for_serialization(n) for n in v1.list_node().items]
    pods = [api.sanitize_for_serialization(p) for p in
            v1.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items]
    own = _own(pods, name, namespace)
    return nodes, [p for p in pods if p not in own], False


def _header(result: Any, fleet: str) -> list[str]:
    c = result.plan.choice
    lines = [f"meshplan render: {fleet}"]
    lines += [f"note: {n}" for n in result.plan.extra.get("notes", [])]
    if c is None:
        return lines + [f"no feasible plan: {result.plan.reason}"]
    n = result.request.replicas if result.request is not None else c.layout.dp
    lines.append(f"plan: {c.layout.label()} x {n} replica(s) on {c.gpu or result.product} "
                 f"({result.product}), {c.engine}, weights {c.weight_dtype}, KV {c.kv_dtype}, chunk {c.chunk_size}, "
                 f"max seqs {c.max_num_seqs}")
    p = c.prediction
    lines.append(f"predicted: TTFT {p.ttft_ms:.0f} ms, ITL {p.tpot_ms:.1f} ms, {p.tokens_per_s_per_gpu:.0f} tok/s/GPU, "
                 f"{p.tokens_per_s_per_user:.1f} tok/s/user")
    from meshplan.planner.objectives import describe_deployed

    lines.append(f"deployed: {describe_deployed(c, n, result.replicas_why, result.product)}")
    if result.plan.reason:
        lines.append(f"search: {result.plan.reason}")
    req = result.request
    lines.append(f"replica shape: {req.stages} stage(s) x {req.pods_per_stage} pod(s) x {req.gpus_per_pod} GPU(s)")
    for r in result.placement.placed:
        lines.append(f"replica {r.index}: domain(s) {', '.join(r.domains)}; nodes {', '.join(r.nodes)}")
    for u in result.placement.unplaced:
        lines.append(f"UNPLACED {u.reason}")
    return lines


def run(args: argparse.Namespace) -> int:
    import yaml

    from meshplan.commands.plan import load_deployment
    from meshplan.render import RenderError
    from meshplan.render.pipeline import plan_place_render
    from meshplan.topology import build_topology

    from meshplan.commands.plan import load_gpu_catalog_arg

    if args.pods and not args.nodes:
        print("meshplan render: --pods needs --nodes", file=sys.stderr)
        return 2
    if not load_gpu_catalog_arg(args.gpu_catalog, "meshplan render"):
        return 2
    llmd = load_deployment(args.manifest, "meshplan render")
    if llmd is None:
        return 2
    try:
        nodes, pods, from_file = _nodes_and_pods(args, llmd.name, llmd.namespace)
        topology = build_topology(nodes, pods, ready_if_unknown=from_file)
        result = plan_place_render(llmd, topology, compute_domains=args.compute_domains, gated=not args.no_gate)
    except (RenderError, ValueError, KeyError) as exc:
        print(f"meshplan render: {exc}", file=sys.stderr)
        return 2
    header = _header(result, args.fleet or args.kubeconfig or args.nodes)
    if result.rendered is not None and args.explain:
        header.append("why each setting:")
        header += [f"  {e.line()}" for e in result.rendered.explain]
    objects = result.rendered.objects if result.rendered is not None else []
    if args.output == "json":
        print(json.dumps({"summary": header, "objects": objects}, indent=2))
    else:
        print("\n".join(f"# {line}" for line in header))
        if objects:
            print("---")
            print(yaml.safe_dump_all(objects, sort_keys=False, width=120, allow_unicode=True), end="")
    ok = result.plan.choice is not None and result.placement is not None and result.placement.ok
    if not ok:
        print(f"meshplan render: {result.message}", file=sys.stderr)
    return 0 if ok else 1
