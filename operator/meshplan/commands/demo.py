"""`meshplan demo`: the whole story on your laptop, in one command.

    meshplan demo                                  # HGX H100 fleet, Llama-3.1-70B example
    meshplan demo --fleet gb200-nvl72 --example examples/gpt-moe-1.8t-gb200-nvl72.yaml

1. brings up the local control plane with simulated GPU nodes (`meshplan
   dev-cluster up --fleet FLEET`), or reuses the one already running;
2. installs the LLMDeployment CRD (generated from the API models);
3. starts the operator (`meshplan run`) scoped to the demo namespace;
4. applies the example LLMDeployment and waits until it is Available (kwok
   plays the kubelets, so pods "run" without GPUs);
5. prints what meshplan decided: the plan with its predicted TTFT, ITL and
   tokens/s per GPU and per user and why, the alternatives, where each replica
   landed (NVLink domain, nodes), and the engine command and NCCL environment
   rendered onto the leader pod;
6. stops the operator and leaves the cluster up to poke at with kubectl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DEFAULT_EXAMPLE = REPO / "examples" / "llama-3.1-70b-hgx-h100.yaml"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="local GPU cluster + operator + an example LLMDeployment, explained",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleet", default="hgx-h100", help="fleet to start when no dev cluster runs (default hgx-h100)")
    p.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE, help="LLMDeployment manifest to apply")
    p.add_argument("--namespace", default="meshplan-demo")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for Available")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def run(args: argparse.Namespace) -> int:
    import yaml

    from meshplan.api.crd import build_crd
    from meshplan.controller.process import OperatorProcess
    from meshplan.devcluster import Cluster, ClusterError

    cluster = Cluster(log=lambda m: _say(m))
    try:
        if cluster.running():
            _say(f"reusing the dev cluster already running ({cluster.state_dir})")
        else:
            _say(f"starting the local control plane with the {args.fleet} fleet (first start takes a minute)")
            cluster.up([args.fleet], prometheus=True)
        kc = lambda *a, **kw: cluster.kubectl(*a, **kw)  # noqa: E731
        _say("installing the LLMDeployment CRD")
        kc("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(build_crd()))
        kc("wait", "--for=condition=Established", "crd/llmdeployments.meshplan.dev", "--timeout=60s")
        if kc("get", "namespace", args.namespace, check=False).returncode != 0:
            kc("create", "namespace", args.namespace)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    manifest = yaml.safe_load(args.example.read_text())
    name = manifest["metadata"]["name"]
    _say(f"starting the operator (meshplan run --namespace {args.namespace})")
    op = OperatorProcess(cluster.kubeconfig, [args.namespace], resync_s=30.0)
    try:
        op.start()
        _say(f"applying {args.example.name} ({manifest['spec']['model']['name']})")
        cluster.kubectl("apply", "-n", args.namespace, "-f", "-", input=json.dumps(manifest))
        obj = _wait_available(cluster, args.namespace, name, args.timeout)
        if obj is None:
            print(f"error: {name} did not become Available in {args.timeout:.0f}s; status:", file=sys.stderr)
            got = cluster.kubectl("get", "llmd", name, "-n", args.namespace, "-o", "json", check=False)
            if got.returncode == 0:
                print(json.dumps(json.loads(got.stdout).get("status", {}), indent=2), file=sys.stderr)
            print(f"operator log:\n{op.tail(40)}", file=sys.stderr)
            return 1
        pods = json.loads(cluster.kubectl("get", "pods", "-n", args.namespace, "-l",
                                          f"meshplan.dev/deployment={name}", "-o", "json").stdout)["items"]
        print()
        print(summary(obj, pods))
    finally:
        op.stop()
    print()
    _say("operator stopped; the cluster keeps running:")
    print(f"    export KUBECONFIG={cluster.kubeconfig}")
    print(f"    kubectl get llmd,pods,svc -n {args.namespace}")
    print(f"    kubectl describe llmd {name} -n {args.namespace}")
    print("    meshplan dev-cluster down          # stop it")
    return 0


def _wait_available(cluster: Any, ns: str, name: str, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        got = cluster.kubectl("get", "llmd", name, "-n", ns, "-o", "json", check=False)
        if got.returncode == 0:
            obj = json.loads(got.stdout)
            st = obj.get("status") or {}
            conds = {c["type"]: c for c in st.get("conditions") or []}
            line = f"{st.get('readyReplicas', 0)}/{st.get('desiredReplicas', '?')} replicas ready"
            if line != last:
                _say(line)
                last = line
            if conds.get("Available", {}).get("status") == "True" and \
                    st.get("observedGeneration") == obj["metadata"].get("generation"):
                return obj
            planned = conds.get("Planned", {})
            if planned.get("status") == "False":
                _say(f"not planned yet: {planned.get('reason')}: {planned.get('message', '')[:300]}")
        time.sleep(1.0)
    return None


def summary(obj: dict[str, Any], pods: list[dict[str, Any]]) -> str:
    """The readable report: plan, predictions, why, alternatives, placement, engine command, NCCL env."""
    st = obj["status"]
    plan = st.get("plan") or {}
    pred = plan.get("predicted") or {}
    lines = [f"LLMDeployment {obj['metadata']['namespace']}/{obj['metadata']['name']}: "
             f"{obj['spec']['model']['name']} is Available ({st.get('readyReplicas')}/{st.get('desiredReplicas')} "
             "replicas ready)", ""]
    lines.append(f"Plan        {plan.get('layout')} per replica x {st.get('desiredReplicas')} replica(s) = "
                 f"{plan.get('gpusPerReplica', 0) * (st.get('desiredReplicas') or 0)} GPUs of {plan.get('gpuProduct')}")
    lines.append(f"            weights {plan.get('weightsDtype')}, KV cache {plan.get('kvCacheDtype')}, chunk "
                 f"{plan.get('chunkSize')} tokens, up to {plan.get('maxNumSeqs')} sequences per replica, "
                 f"{plan.get('memoryPerGpuGib')} GiB per GPU")
    lines.append(f"Predicted   TTFT {pred.get('ttftMs')} ms, ITL {pred.get('itlMs')} ms, "
                 f"{pred.get('tokensPerSecondPerGpu')} tokens/s per GPU, "
                 f"{pred.get('tokensPerSecondPerUser')} tokens/s per user")
    if plan.get("reason"):
        lines.append(f"Why         {plan['reason']}")        # what is deployed, at desiredReplicas
    if plan.get("searchReason"):
        lines.append(f"Search      {plan['searchReason']}")  # what the SLO search saw (its own DP)
    for i, alt in enumerate(st.get("alternatives") or [], 1):
        ap = alt.get("predicted") or {}
        lines.append(f"Alternative {i}: {alt.get('layout')} ({alt.get('gpusPerReplica')} GPUs/replica): "
                     f"{ap.get('tokensPerSecondPerGpu')} tok/s/GPU at {ap.get('tokensPerSecondPerUser')} tok/s/user, "
                     f"TTFT {ap.get('ttftMs')} ms")
    lines.append("")
    lines.append("Placement   (each replica's tensor/expert-parallel group inside one NVLink domain)")
    for r in st.get("placement") or []:
        lines.append(f"  replica {r['index']}: domain {r.get('nvlinkDomain')}, nodes {', '.join(r.get('nodes', []))}, "
                     f"{r.get('gpus')} GPUs, {'ready' if r.get('ready') else 'starting'}")
    leader = next((p for p in sorted(pods, key=lambda p: p["metadata"]["name"])
                   if p["metadata"]["labels"].get("meshplan.dev/role") == "leader"), None)
    if leader is not None:
        c = leader["spec"]["containers"][0]
        lines.append("")
        lines.append(f"Engine command on {leader['metadata']['name']} ({c['image']}):")
        argv = list(c.get("command") or []) + list(c.get("args") or [])
        lines.append("  " + " \\\n    ".join(_shell_words(argv)))
        nccl = [e for e in c.get("env") or [] if e["name"].startswith(("NCCL_", "UCX_", "FI_"))]
        if nccl:
            lines.append("NCCL environment:")
            for e in nccl:
                lines.append(f"  {e['name']}={e.get('value', '<from secret>')}")
        why = (leader["metadata"].get("annotations") or {}).get("meshplan.dev/explain")
        if why:
            lines.append("Why these settings:")
            lines += [f"  {w}" for w in why.splitlines()[:12]]
    lines.append("")
    lines.append("Conditions: " + ", ".join(f"{c['type']}={c['status']} ({c['reason']})"
                                            for c in st.get("conditions") or []))
    return "\n".join(lines)


def _shell_words(argv: list[str]) -> list[str]:
    """Group `--flag value` pairs on one line each for reading."""
    out: list[str] = []
    for a in argv:
        if out and not a.startswith("-") and not any(w.startswith("-") for w in out):
            out[-1] = f"{out[-1]} {a}"          # the program and its subcommand/positional words
        elif out and not a.startswith("-") and out[-1].startswith("-") and " " not in out[-1]:
            out[-1] = f"{out[-1]} {a}"
        else:
            out.append(a)
    return out
