"""`meshplan plan MANIFEST`: the frontier, the choice and why, for one LLMDeployment manifest.

    meshplan plan llmd.yaml                       # GPUs from spec.gpus (default h100_sxm)
    meshplan plan llmd.yaml --fleet gb200-nvl72   # restricted to a fleet file's free NVLink domains
    meshplan plan llmd.yaml --kubeconfig ~/.kube/config   # ... or a live cluster's Nodes and Pods
    kubectl get nodes -o yaml > nodes.yaml; kubectl get pods -A -o yaml > pods.yaml
    meshplan plan llmd.yaml --nodes nodes.yaml --pods pods.yaml  # ... or those, offline
    meshplan plan llmd.yaml --nodes nodes.yaml --gpu-catalog my-gpus.yaml   # GPUs the catalogue lacks
    meshplan plan llmd.yaml --output json --plot frontier.png
    meshplan plan llmd.yaml --disaggregation auto # ... and prefill/decode disaggregation, compared with it

The planning itself is `meshplan.planner.plan_for_spec` (pure); this module
only reads files or the cluster, and prints. `--plot` draws the picture of
NVIDIA's trillion-parameter blog: tokens/s/GPU against tokens/s/user, one
curve per layout, the overall frontier, and the choice marked (matplotlib with
the Agg backend, imported only when asked for).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="plan the TP/EP/PP/DP layout of an LLMDeployment manifest",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", help="LLMDeployment YAML/JSON file ('-' for stdin)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--fleet", help="fleet name (hgx-h100, gb200-nvl72, mixed) or fleet YAML file")
    src.add_argument("--kubeconfig", help="read Nodes and Pods of this cluster to find free GPUs")
    src.add_argument("--nodes", metavar="FILE", help="Nodes as `kubectl get nodes -o yaml` (or -o json) prints them")
    add_offline_args(p)
    p.add_argument("--output", "-o", choices=("table", "json", "yaml"), default="table")
    p.add_argument("--plot", metavar="FILE.png", help="write the throughput-vs-interactivity picture")
    p.add_argument("--show-rejected", action="store_true", help="list every rejected layout with its reason")
    p.add_argument("--cross-domain", choices=("auto", "never"), default=None,
                   help="auto (default): an expert-parallel stage larger than every NVLink domain may span the "
                        "domains of one RDMA network block (wide EP); never: every stage stays in one domain")
    p.add_argument("--disaggregation", choices=("auto", "enabled", "disabled"), default=None,
                   help="also plan prefill/decode disaggregation (planner.disagg): auto chooses it or aggregated "
                        "per objective, enabled the best disaggregated, disabled aggregated only")
    p.set_defaults(func=run)


def add_offline_args(p: Any) -> None:
    p.add_argument("--pods", metavar="FILE",
                   help="with --nodes: Pods as `kubectl get pods -A -o yaml` prints them (GPUs in use)")
    p.add_argument("--gpu-catalog", metavar="FILE",
                   help="declare GPUs the catalogue lacks (the chart value gpuCatalog's format, docs/install.md)")


def read_kube_objects(path: str, kind: str) -> list[dict[str, Any]]:
    """Objects of `kind` from a file as kubectl prints them: a `List` with `items` (`kubectl get nodes -o
    yaml|json`), a single object, or several YAML documents. Raises ValueError naming the file."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d]    # JSON is YAML
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read {kind} objects: {exc}") from None
    out: list[dict[str, Any]] = []
    for d in docs:
        if not isinstance(d, dict):
            continue
        items = d.get("items") if d.get("kind", "").endswith("List") or "items" in d else None
        for o in (items if items is not None else [d]):
            if isinstance(o, dict) and o.get("kind", kind) == kind:
                out.append(o)
    if kind == "Node" and not out:
        raise ValueError(f"{path}: no Node objects found; give the output of `kubectl get nodes -o yaml`")
    return out


def load_gpu_catalog_arg(path: str | None, prog: str) -> bool:
    """Register the GPUs declared in `--gpu-catalog FILE`; False after printing why not."""
    if not path:
        return True
    from meshplan.catalog.gpus import load_gpu_catalog

    try:
        load_gpu_catalog(path)
    except (OSError, ValueError) as exc:
        print(f"{prog}: --gpu-catalog {exc}", file=sys.stderr)
        return False
    return True


def _read_manifest(path: str) -> dict[str, Any]:
    from meshplan import kubeyaml

    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    # As kubectl reads it (YAML 1.1 numbers and booleans of go-yaml v2, aliases bounded): what is
    # planned here is what `kubectl apply` would send (meshplan.kubeyaml).
    docs = [d for d in kubeyaml.load_all(text) if d]
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "LLMDeployment":
            return d
    raise ValueError(f"{path}: no LLMDeployment document found (kind: LLMDeployment)")


def load_deployment(path: str, prog: str) -> Any:
    """The LLMDeployment in a manifest file, checked as the operator would; None after printing why not."""
    from meshplan.api.models import LLMDeployment, validate_semantics

    try:
        llmd = LLMDeployment.from_manifest(_read_manifest(path))
    except (OSError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    problems = validate_semantics(llmd.spec)
    for msg in problems:
        print(f"{prog}: {msg}", file=sys.stderr)
    return None if problems else llmd


def fleet_from_kubeconfig(path: str, node_selector: dict[str, str] | None = None) -> Any:
    """Free GPU capacity of a live cluster (the only I/O of the planner's CLI)."""
    from kubernetes import client, config

    from meshplan.planner.fleet import fleet_from_objects

    api = config.new_client_from_config(config_file=path)
    v1 = client.CoreV1Api(api)
    nodes = [api.sanitize_for_serialization(n) for n in v1.list_node(_request_timeout=KUBE_TIMEOUT_S).items]
    pods = [api.sanitize_for_serialization(p) for p in v1.list_pod_for_all_namespaces(
        field_selector="status.phase!=Succeeded,status.phase!=Failed", _request_timeout=KUBE_TIMEOUT_S).items]
    return fleet_from_objects(nodes, pods, node_selector=node_selector, name=path)


KUBE_TIMEOUT_S = 15     # per API request; a planner CLI should fail fast on an unreachable cluster


def run(args: argparse.Namespace) -> int:
    from meshplan.planner import plan_for_spec, plan_to_dict
    from meshplan.planner.fleet import load_fleet

    if args.pods and not args.nodes:
        print("meshplan plan: --pods needs --nodes (the pods' GPUs are charged to those nodes)", file=sys.stderr)
        return 2
    if not load_gpu_catalog_arg(args.gpu_catalog, "meshplan plan"):
        return 2
    llmd = load_deployment(args.manifest, "meshplan plan")
    if llmd is None:
        return 2
    selector = dict(llmd.spec.gpus.node_selector or {})
    try:
        fleet = None
        if args.fleet:
            fleet = load_fleet(args.fleet, node_selector=selector)
        elif args.nodes:
            from meshplan.planner.fleet import fleet_from_objects

            pods = read_kube_objects(args.pods, "Pod") if args.pods else []
            fleet = fleet_from_objects(read_kube_objects(args.nodes, "Node"), pods, node_selector=selector,
                                       name=args.nodes, ready_if_unknown=True)
        elif args.kubeconfig:
            try:
                fleet = fleet_from_kubeconfig(args.kubeconfig, selector)
            except Exception as exc:  # kubeconfig parse errors, connection errors, API errors: all user-facing
                print(f"meshplan plan: cannot read Nodes and Pods through --kubeconfig {args.kubeconfig}: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
                return 2
        result = plan_for_spec(llmd.spec, fleet, keep_curves=bool(args.plot),
                               cross_domain=args.cross_domain)
        dis = None
        if args.disaggregation:
            from meshplan.planner.disagg import disagg_plan_for_spec

            dis = disagg_plan_for_spec(llmd.spec, fleet, mode=args.disaggregation, aggregated=result,
                                       cross_domain=args.cross_domain)
    except (ValueError, KeyError) as exc:
        print(f"meshplan plan: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if args.output in ("json", "yaml"):
        data = plan_to_dict(result, rejected=args.show_rejected)
        if dis is not None:
            from meshplan.planner.disagg import disagg_plan_to_dict

            data["disaggregation"] = disagg_plan_to_dict(dis)
        if args.output == "json":
            print(json.dumps(data, indent=2))
        else:
            import yaml

            print(yaml.safe_dump(data, sort_keys=False))
    else:
        deployed = None
        if result.choice is not None:
            from meshplan.render.pipeline import replicas_and_why

            n, why = replicas_and_why(llmd.spec)
            if n != result.choice.layout.dp:
                deployed = (f"the operator runs {n} replica(s) of {result.choice.layout.label()} ({why}), not the "
                            f"DP{result.choice.layout.dp} the search sized for spec.workload")
        print(format_table(result, show_rejected=args.show_rejected, fleet=fleet, deployed=deployed))
        if dis is not None:
            print(format_disagg(dis))
    if args.plot:
        plot_plan(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if dis is not None and dis.disaggregated:
        return 0
    return 0 if result.choice is not None else 1


def format_disagg(d: Any) -> str:
    """The disaggregation section of `meshplan plan --disaggregation`: the choice compactly, per-role figures,
    the ratio, the KV path and the aggregated comparison."""
    lines = ["", f"Disaggregation ({d.mode}): {'disaggregated' if d.disaggregated else 'aggregated'} "
                 f"{d.label()} — {d.evaluated:,} configurations priced, {d.eligible:,} meet the SLO"]
    c = d.choice
    if c is not None:
        pre, dec, k = c.prefill, c.decode, c.kv_path
        lines += [
            f"  {'chosen' if d.disaggregated else 'best disaggregated'}: {c.label()} on {dec.gpu}, "
            f"{c.total_gpus} GPUs, P:D {c.ratio}",
            f"  prefill: {pre.layout.dp} x "
            f"{pre.layout.label()} ({pre.layout.gpus_per_replica} GPUs each): TTFT "
            f"{pre.prediction.ttft_ms:,.0f} ms (prefill {pre.prediction.prefill_ms:,.0f} ms), "
            f"{pre.prediction.tokens_per_s_per_gpu:,.1f} input tokens/s/GPU",
            f"  decode:  {dec.layout.dp} x {dec.layout.label()} ({dec.layout.gpus_per_replica} GPUs each), batch "
            f"{dec.max_num_seqs}: ITL {dec.prediction.tpot_ms:,.1f} ms, {dec.prediction.tokens_per_s_per_gpu:,.1f} "
            f"output tokens/s/GPU, {dec.prediction.tokens_per_s_per_user:,.1f} tokens/s/user",
            f"  overall: {c.prediction.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at "
            f"{c.prediction.tokens_per_s_per_user:,.1f} tokens/s/user (TTFT {c.prediction.ttft_ms:,.0f} ms, "
            f"ITL {c.prediction.tpot_ms:,.1f} ms)",
            f"  KV path: {k.tier} {k.gb_s:g} GB/s, {k.latency_us:g} µs: {k.bytes_per_request / 2**20:,.1f} MiB per "
            f"request in {k.transfer_ms:,.2f} ms ({k.why}; {k.source})",
        ]
    a = d.aggregated.choice
    if a is not None:
        p = a.prediction
        lines.append(f"  aggregated: {a.layout.label()}" + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else "")
                     + f" ({a.layout.total_gpus} GPUs): {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU at "
                       f"{p.tokens_per_s_per_user:,.1f} tokens/s/user (TTFT {p.ttft_ms:,.0f} ms, ITL "
                       f"{p.tpot_ms:,.1f} ms)")
    lines.append(f"  why: {d.reason}")
    for n in d.extra.get("notes", []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)


_TABLE_ROWS = 25        # frontier rows printed (json/yaml carry every point)


def _row(c: Any, mark: str) -> str:
    p = c.prediction
    dp = f"DP{c.layout.dp}" if c.layout.dp > 1 else ""
    return (f"{mark:1} {c.layout.label():<16} {dp:<6} {c.gpu:<10} {c.layout.total_gpus:>5} {c.chunk_size:>6} "
            f"{c.max_num_seqs:>5} {c.weight_dtype + '/' + c.kv_dtype:<9} {p.tokens_per_s_per_gpu:>10,.1f} "
            f"{p.tokens_per_s_per_user:>9,.1f} {p.ttft_ms:>10,.0f} {p.tpot_ms:>8,.1f}")


def format_table(result: Any, *, show_rejected: bool = False, fleet: Any = None, deployed: str | None = None) -> str:
    head = (f"  {'layout':<16} {'dp':<6} {'gpu':<10} {'gpus':>5} {'chunk':>6} {'seqs':>5} {'dtypes':<9} "
            f"{'tok/s/GPU':>10} {'tok/s/usr':>9} {'TTFT ms':>10} {'ITL ms':>8}")
    lines = [f"model {result.model} on {result.gpu} — objective {result.objective}"
             + (f" — fleet {fleet.name} ({fleet.free_gpus} free GPUs)" if fleet is not None else "")]
    meets = (f"{result.extra.get('eligible', 0):,} meet the SLO" if result.extra.get("slo")
             else "no SLO given")
    lines.append(f"{result.evaluated:,} configurations evaluated, {meets}, {len(result.rejected):,} layouts rejected")
    for note in result.extra.get("notes", []):
        lines.append(f"note: {note}")
    front = list(result.frontier)
    if len(front) > _TABLE_ROWS:                    # thin evenly, always keeping the choice
        step = (len(front) - 1) / (_TABLE_ROWS - 1)
        keep = {round(i * step) for i in range(_TABLE_ROWS)}
        front = [c for n, c in enumerate(front) if n in keep or c == result.choice]
    lines += ["", f"Pareto frontier (throughput vs interactivity; * = choice; {len(front)} of "
                  f"{len(result.frontier)} points):", head]
    for c in front:
        lines.append(_row(c, "*" if c == result.choice else ""))
    lines += ["", "Choice:" if result.choice is not None else "No choice:", f"  {result.reason}"]
    if result.extra.get("topology"):
        lines.append(f"  topology: {result.extra['topology']}")
    if deployed:
        lines.append(f"  deployed: {deployed}")
    if result.choice is not None and result.extra.get("engine_args"):
        lines.append(f"  engine flags: {' '.join(result.extra['engine_args'])}")
        if result.extra.get("engine_config"):
            lines.append(f"  engine config: {result.extra['engine_config']}")
        for n in result.extra.get("engine_notes", []):
            lines.append(f"  note: {n}")
    if result.alternatives:
        lines += ["", "Alternatives:", head] + [_row(c, "") for c in result.alternatives]
    if result.rejected:
        shown = result.rejected if show_rejected else result.rejected[:5]
        lines += ["", f"Rejected layouts ({len(result.rejected)}{'' if show_rejected else ', first 5; --show-rejected for all'}):"]
        lines += [f"  {r.layout.label():<16} {r.reason}" for r in shown]
    return "\n".join(lines)


def plot_plan(result: Any, path: str) -> None:
    """The blog's picture: per-layout curves, the frontier and the choice (PNG)."""
    import matplotlib

    from meshplan.planner import layout_name

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    curves = result.extra.get("shape_frontiers", {})
    # the layouts that reach the overall frontier get a colour and a legend entry; others stay grey
    on_front = {layout_name(c) for c in result.frontier}
    if result.choice is not None:
        on_front.add(layout_name(result.choice))
    for name, pts in curves.items():
        if not pts:
            continue
        xs, ys = zip(*pts)
        if name in on_front:
            ax.plot(xs, ys, marker=".", linewidth=1, label=name)
        else:
            ax.plot(xs, ys, color="0.8", linewidth=0.6, zorder=0)
    if result.frontier:
        fx = [c.prediction.tokens_per_s_per_user for c in result.frontier]
        fy = [c.prediction.tokens_per_s_per_gpu for c in result.frontier]
        ax.plot(fx, fy, color="black", linewidth=2, linestyle="--", label="Pareto frontier (meets the SLO)")
    if result.choice is not None:
        p = result.choice.prediction
        ax.scatter([p.tokens_per_s_per_user], [p.tokens_per_s_per_gpu], s=160, marker="*", color="red", zorder=5,
                   label=f"choice ({result.objective}): {layout_name(result.choice)}")
    ax.set_xlabel("interactivity: tokens/s per user")
    ax.set_ylabel("throughput: tokens/s per GPU")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"{result.model} on {result.gpu}: throughput vs interactivity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
