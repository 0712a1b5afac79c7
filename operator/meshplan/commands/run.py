"""`meshplan run`: start the operator (kopf) in this process.

    meshplan run --all-namespaces
    meshplan run --namespace team-a --namespace 'llm-*' --kubeconfig ~/.kube/config
    meshplan run --all-namespaces --peering meshplan --priority 100 --liveness http://0.0.0.0:8080/healthz

Scope: `--namespace` (repeatable, globs allowed) watches LLMDeployments and
their pods there; `--all-namespaces` watches the whole cluster. GPU usage comes
from the pod watch; a namespace-scoped operator also lists the GPU pods of the
other namespaces every `--foreign-usage-seconds` (one LIST per period), since
the nodes' GPUs are shared with them.

`--peering NAME` makes replicas of the operator coordinate through kopf's
peering objects (only the highest priority acts); without it the operator runs
standalone.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("run", help="run the operator", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", action="append", metavar="NS",
                       help="namespace (or glob) to serve; repeatable")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--peering", metavar="NAME", help="kopf peering name (several operator replicas, one acts)")
    peer.add_argument("--standalone", action="store_true", help="no peering (the default)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (highest acts)")
    p.add_argument("--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--resync-seconds", type=float, default=60.0, help="re-check every LLMDeployment this often")
    p.add_argument("--foreign-usage-seconds", type=float, default=15.0,
                   help="namespace-scoped: how often to list GPU pods of other namespaces")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--prometheus-url", metavar="URL", default=os.environ.get("MESHPLAN_PROMETHEUS_URL"),
                   help="Prometheus the autoscaler queries when spec.autoscaling.prometheusUrl is unset "
                        "(default: $MESHPLAN_PROMETHEUS_URL)")
    p.add_argument("--prometheus-endpoint", metavar="NAME=URL", action="append",
                   help="a Prometheus endpoint LLMDeployments may pick by name (spec.autoscaling.prometheus); "
                        "repeatable; --prometheus-url is the one named 'default'; no other URL is ever queried "
                        "(default: $MESHPLAN_PROMETHEUS_ENDPOINTS, NAME=URL entries separated by commas, or JSON)")
    p.add_argument("--gpu-catalog", metavar="FILE", default=os.environ.get("MESHPLAN_GPU_CATALOG") or None,
                   help="declare GPUs the built-in catalogue lacks (the chart value gpuCatalog, mounted as a "
                        "file; default: $MESHPLAN_GPU_CATALOG); a bad entry stops the operator, naming the field")
    p.add_argument("--verbose", "-v", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    if args.gpu_catalog:
        # Read before anything is reconciled: every plan and spec check must see the declared GPUs.
        from meshplan.catalog.gpus import load_gpu_catalog

        try:
            declared = load_gpu_catalog(args.gpu_catalog)
        except (OSError, ValueError) as exc:
            print(f"meshplan run: --gpu-catalog {exc}", file=sys.stderr)
            return 2
        print(f"meshplan run: declared GPUs from {args.gpu_catalog}: {', '.join(g.name for g in declared) or 'none'}",
              file=sys.stderr)

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)
    import kopf

    from meshplan.controller import autoscaling, handlers  # autoscaling: registers the autoscaler's loop
    from meshplan.controller import settings as operator_settings

    handlers.OPTIONS.kubeconfig = os.environ.get("KUBECONFIG") if args.kubeconfig else None
    handlers.OPTIONS.namespaces = tuple(args.namespace or ())
    handlers.OPTIONS.foreign_usage_s = args.foreign_usage_seconds
    handlers.OPTIONS.peering = args.peering
    handlers.OPTIONS.priority = args.priority
    handlers.OPTIONS.resync_s = args.resync_seconds
    autoscaling.DEFAULT_PROMETHEUS_URL = args.prometheus_url
    if args.prometheus_endpoint:
        autoscaling.PROMETHEUS_ENDPOINTS = list(args.prometheus_endpoint)
    try:
        autoscaling.parse_endpoints(autoscaling.PROMETHEUS_ENDPOINTS, args.prometheus_url)
    except autoscaling.EndpointError as exc:
        print(f"meshplan run: {exc} (--prometheus-endpoint / --prometheus-url)", file=sys.stderr)
        return 2
    if args.metrics_port:
        from meshplan import metrics

        metrics.start_metrics_server(args.metrics_port)
    kopf.configure(verbose=args.verbose)
    import asyncio

    asyncio.run(wait_for_api_discovery(handlers.OPTIONS.kubeconfig))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if not args.verbose:
        # kopf logs every handler call at INFO; child events would flood the log.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.namespace:
        # kopf drops the namespaces its watcher lists (controller/settings.py): serve those too
        operator_settings.notice_listed_namespaces()
    kopf.run(
        clusterwide=bool(args.all_namespaces),
        namespaces=args.namespace or (),
        standalone=not args.peering,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
    )
    return 0


async def wait_for_api_discovery(kubeconfig: str | None, timeout_s: float = 60.0) -> bool:
    """Wait until the API server's discovery lists llmdeployments.meshplan.dev.

    kopf finds resources through discovery when it starts (and again only when a
    CRD changes); a CRD installed moments before the operator may be Established
    but not yet in discovery, and kopf would then never watch LLMDeployments.
    """
    import asyncio
    import logging
    import time

    from meshplan.controller.kube import ApiError, Kube, load_credentials

    log = logging.getLogger("meshplan.run")
    kube = Kube(load_credentials(kubeconfig))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                groups = await kube.request("GET", "/apis")
                listed = any(g.get("name") == "meshplan.dev" for g in groups.get("groups") or [])
                doc = await kube.request("GET", "/apis/meshplan.dev/v1alpha1") if listed else {}
                if any(r.get("name") == "llmdeployments" for r in doc.get("resources") or []):
                    return True
            except (ApiError, OSError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                log.warning("llmdeployments.meshplan.dev is not served yet (is the CRD installed?); starting anyway")
                return False
            await asyncio.sleep(0.5)
    finally:
        await kube.close()
