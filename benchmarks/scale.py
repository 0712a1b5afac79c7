"""Scale (reliability scenario 12): a 1,000-node kwok GPU fleet with 200 LLMDeployments.

    python benchmarks/scale.py                              # private control plane, 1,000 nodes, 200 objects
    python benchmarks/scale.py --nodes 200 --objects 40     # smaller
    python benchmarks/scale.py --reuse                      # on the running dev cluster (adds, then deletes, its nodes)
    python benchmarks/scale.py --cpu                        # no cluster: CPU of one reconcile's pure part

Prints figures, asserts only that every object was reconciled (exit 1 otherwise):

- the fleet: `--nodes` kwok GPU nodes, 64% HGX H100 (8 GPUs, one NVLink domain
  per node) and 36% GB200 trays (4 GPUs) in NVL72-style domains of 18 trays
  (`nvidia.com/gpu.clique`), labelled `meshplan.dev/fleet=rel-scale`;
- `--objects` LLMDeployments in 4 namespaces, pinned TP8 layouts (so the count
  of GPUs is known): every 3rd on GB200 (two pods per replica, one domain),
  the rest on H100 (one pod), 1 or 2 replicas;
- the operator is `meshplan run` (a child process) scoped to those
  namespaces, with its /metrics port; its peak RSS is VmHWM from
  /proc/<pid>/status, sampled RSS every second;
- latencies: apply -> Available per object (polled every second), and the
  reconcile duration from the operator's histogram
  `meshplan_reconcile_duration_seconds` (p50/p99 as bucket upper bounds) and
  from its log lines `reconciled <ns>/<name> in <s>s` (exact, reconciles that
  wrote something);
- a later change: `spec.replicas` of one object 1 -> 2 once everything is
  steady; seconds until `status.observedGeneration` matches (handled) and
  until both replicas are ready.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.operator_bench import _delta, _free_port, _histogram, _quantile, llmd_manifest  # noqa: E402

FLEET = "rel-scale"
H100 = "NVIDIA-H100-80GB-HBM3"
GB200 = "NVIDIA-GB200"
HIST = "meshplan_reconcile_duration_seconds"


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def fleet_spec(nodes: int, name: str = FLEET) -> dict:
    """64% H100 nodes, the rest GB200 trays in domains of 18 (a partial last domain is dropped)."""
    gb_trays = (nodes * 36 // 100) // 18 * 18
    groups = [{"namePrefix": f"{name}-h100", "count": nodes - gb_trays, "gpusPerNode": 8, "product": H100,
               "memoryMiB": 81559, "family": "hopper", "cpu": "224", "memory": "2Ti"}]
    for d in range(gb_trays // 18):
        groups.append({"namePrefix": f"{name}-nvl{d}", "count": 18, "gpusPerNode": 4, "product": GB200,
                       "memoryMiB": 189471, "family": "blackwell", "clique": f"{name}-nvl{d}.0", "arch": "arm64",
                       "cpu": "144", "memory": "960Gi"})
    return {"name": name, "nodeGroups": groups}


def create_nodes(cluster, fleet: dict, workers: int = 8) -> list[str]:
    """Create the fleet's Nodes through the API (parallel; `Cluster.apply_fleet` runs one kubectl per node)."""
    from kubernetes import client

    from meshplan.devcluster.fleets import fleet_nodes

    core = client.CoreV1Api(cluster.api_client())
    nodes = fleet_nodes(fleet)

    def one(n: dict) -> None:
        status = n.pop("status")
        try:
            core.create_node(n)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        core.patch_node_status(n["metadata"]["name"], {"status": {"capacity": status["capacity"],
                                                                   "allocatable": status["allocatable"]}})

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, nodes))
    return [n["metadata"]["name"] for n in nodes]


def ready_nodes(cluster, fleet_name: str) -> int:
    """Nodes a GPU pod can be scheduled on: Ready AND without the `node.kubernetes.io/not-ready` taint.
    The node lifecycle controller removes that taint some time after Ready (minutes for 1,000 nodes
    on a loaded machine); until then placement rightly sees no capacity there, which would measure
    kube-controller-manager, not the operator (meshplan.topology.node_info decides schedulability)."""
    from meshplan.topology import node_info

    items = json.loads(cluster.kubectl("get", "nodes", "-l", f"meshplan.dev/fleet={fleet_name}", "-o", "json",
                                       timeout=120).stdout)["items"]
    return sum(1 for n in items if (info := node_info(n)) is not None and info.schedulable)


def llmd(name: str, product: str, replicas: int, fleet: str = FLEET) -> dict:
    return llmd_manifest(name, tensor=8, replicas=replicas, max_gpus=8 * max(replicas, 2), products=(product,),
                         fleet=fleet)


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0])
    return out


class RssSampler(threading.Thread):
    """VmRSS every `period_s` (KiB, with monotonic seconds) until stopped."""

    def __init__(self, pid: int, period_s: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.period_s, self.samples, self._halt = pid, period_s, [], threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append((time.monotonic(), rss_kib(self.pid)["VmRSS"]))
            except (OSError, KeyError):
                pass
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def log_reconcile_seconds(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"reconciled \S+ in ([0-9.]+)s", text)]


def statuses(cluster, namespaces: list[str]) -> dict[tuple[str, str], dict]:
    out = {}
    for ns in namespaces:
        for o in json.loads(cluster.kubectl("get", "llmd", "-n", ns, "-o", "json", timeout=120).stdout)["items"]:
            out[(ns, o["metadata"]["name"])] = o
    return out


def is_available(o: dict) -> bool:
    st = o.get("status") or {}
    return st.get("observedGeneration") == o["metadata"]["generation"] and any(
        c["type"] == "Available" and c["status"] == "True" for c in st.get("conditions", []))


def get_cluster(reuse: bool):
    from meshplan.devcluster import Cluster

    if reuse:
        c = Cluster(log=log)
        if not c.running():
            raise SystemExit("--reuse: no dev cluster runs (meshplan dev-cluster up)")
        return c, False
    c = Cluster(state_dir=Path(tempfile.mkdtemp(prefix="meshplan-scale-")), log=log)
    c.up([], prometheus=False, timeout=240)
    return c, True


def decide_cpu(nodes: int, other_pods: int = 300, runs: int = 30) -> None:
    """Milliseconds of CPU for the part of a reconcile between read and apply (the World's topology
    without the object's own pods, then `Reconciler._decide` with the plan cached), on `nodes` GPU
    nodes of this benchmark's fleet with `other_pods` 8-GPU pods of other deployments. No cluster."""
    from meshplan.controller.reconcile import Reconciler, World
    from meshplan.devcluster.fleets import fleet_nodes
    from meshplan.topology import node_info

    infos = []
    for n in fleet_nodes(fleet_spec(nodes)):
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        info = node_info(n)
        if info is not None:
            infos.append(info)
    usage = [("other", f"d{i}", infos[i % len(infos)].name, 8) for i in range(other_pods)]
    world = World(nodes=lambda: infos, usage=lambda: usage)
    rec = Reconciler(kube=None, world=world, compute_domains=False)
    for product, replicas in ((H100, 2), (GB200, 1)):
        body = llmd("llm-000", product, replicas)
        body["metadata"].update({"namespace": "ns", "uid": f"u-{product}", "generation": 1})
        rec._decide(body, world.topology_without("ns", "llm-000"), [], [], [])     # plans once (then cached)
        took_ms = []
        for _ in range(runs):
            t = time.perf_counter()
            rec._decide(body, world.topology_without("ns", "llm-000"), [], [], [])
            took_ms.append((time.perf_counter() - t) * 1000)
        print(f"decide CPU at {len(infos)} nodes, {other_pods} other pods, {product} x{replicas}: "
              f"median {statistics.median(took_ms):.1f} ms, min {min(took_ms):.1f} ms per reconcile (n={runs})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--namespaces", type=int, default=4)
    ap.add_argument("--reuse", action="store_true", help="use the running dev cluster instead of a private one")
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--cpu", action="store_true", help="only the CPU of one reconcile's pure part (no cluster)")
    args = ap.parse_args()
    if args.cpu:
        decide_cpu(args.nodes)
        return 0

    from meshplan.api.crd import build_crd
    from meshplan.controller.process import OperatorProcess

    cluster, private = get_cluster(args.reuse)
    kc = cluster.kubectl
    tag = str(int(time.time()))[-6:]
    namespaces = [f"mprel-scale-{tag}-{i}" for i in range(args.namespaces)]
    fleet = fleet_spec(args.nodes)
    op = None
    ok = False
    try:
        kc("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(build_crd()))
        for attempt in range(30):     # right after the apply the CRD may have no conditions yet
            if kc("wait", "--for=condition=Established", "crd/llmdeployments.meshplan.dev", "--timeout=60s",
                  check=False).returncode == 0:
                break
            time.sleep(1)
        t0 = time.monotonic()
        names = create_nodes(cluster, fleet)
        while ready_nodes(cluster, FLEET) < len(names):
            if time.monotonic() - t0 > 600:
                raise SystemExit(f"only {ready_nodes(cluster, FLEET)} of {len(names)} nodes schedulable after 600 s")
            time.sleep(2)
        gpus = sum(g["count"] * g["gpusPerNode"] for g in fleet["nodeGroups"])
        print(f"fleet: {len(names)} kwok GPU nodes ({gpus} GPUs, {len(fleet['nodeGroups']) - 1} GB200 NVLink "
              f"domains of 18 trays) Ready and untainted in {time.monotonic() - t0:.1f} s")
        for ns in namespaces:
            kc("create", "namespace", ns)
        port = _free_port()
        op = OperatorProcess(cluster.kubeconfig, [f"mprel-scale-{tag}-*"], "--metrics-port", str(port),
                             resync_s=60.0).start(timeout_s=120)
        import urllib.request

        metrics = lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: E731
        sampler = RssSampler(op.proc.pid)
        sampler.start()
        idle_rss = rss_kib(op.proc.pid)["VmRSS"]
        before = _histogram(metrics(), HIST)

        objs = {}
        for i in range(args.objects):
            product = GB200 if i % 3 == 0 else H100
            objs[(namespaces[i % len(namespaces)], f"llm-{i:03d}")] = llmd(f"llm-{i:03d}", product, 1 + (i % 2))
        want_gpus = sum(8 * o["spec"]["replicas"] for o in objs.values())
        t_apply = time.monotonic()
        for ns in namespaces:
            items = [o for (n, _), o in objs.items() if n == ns]
            kc("apply", "-n", ns, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
               timeout=300)
        applied_s = time.monotonic() - t_apply
        first_avail: dict[tuple[str, str], float] = {}
        while time.monotonic() - t_apply < args.timeout_s and len(first_avail) < len(objs):
            for key, o in statuses(cluster, namespaces).items():
                if key not in first_avail and is_available(o):
                    first_avail[key] = time.monotonic() - t_apply
            time.sleep(1.0)
        all_s = time.monotonic() - t_apply
        after = _histogram(metrics(), HIST)
        s, c, b = _delta(before, after)
        lat = list(first_avail.values())
        logged = log_reconcile_seconds(op.log_path.read_text(errors="replace"))
        print(f"{len(objs)} LLMDeployments ({want_gpus} GPUs asked, applied in {applied_s:.1f} s): "
              f"{len(first_avail)} Available after {all_s:.1f} s; apply->Available p50 {pct(lat, .5):.1f} s, "
              f"p99 {pct(lat, .99):.1f} s, max {max(lat or [float('nan')]):.1f} s")
        print(f"reconciles: {int(c)} ({c / max(len(objs), 1):.1f} per object), mean {s / max(c, 1) * 1000:.0f} ms; "
              f"histogram p50 <= {_quantile(b, .5) * 1000:.0f} ms, p99 <= {_quantile(b, .99) * 1000:.0f} ms; "
              f"log (reconciles that wrote, n={len(logged)}): p50 {pct(logged, .5) * 1000:.0f} ms, "
              f"p99 {pct(logged, .99) * 1000:.0f} ms")

        # a later change to one object
        time.sleep(5)
        ns0, name0 = next(k for k, o in objs.items() if o["spec"]["replicas"] == 1)
        o = statuses(cluster, [ns0])[(ns0, name0)]
        gen = o["metadata"]["generation"]
        t1 = time.monotonic()
        kc("patch", "llmd", name0, "-n", ns0, "--type=merge", "-p", json.dumps({"spec": {"replicas": 2}}))
        handled = ready = None
        while time.monotonic() - t1 < 120 and ready is None:
            cur = json.loads(kc("get", "llmd", name0, "-n", ns0, "-o", "json").stdout)
            st = cur.get("status") or {}
            if handled is None and st.get("observedGeneration", 0) > gen:
                handled = time.monotonic() - t1
            if handled is not None and st.get("readyReplicas") == 2:
                ready = time.monotonic() - t1
            time.sleep(0.1)
        print(f"later change ({ns0}/{name0} replicas 1 -> 2): handled (observedGeneration) after "
              f"{handled if handled is not None else float('nan'):.2f} s, 2 replicas ready after "
              f"{ready if ready is not None else float('nan'):.2f} s (target: handled < 5 s)")
        sampler.stop()
        peak = rss_kib(op.proc.pid)
        rss = [v for _, v in sampler.samples]
        print(f"operator memory: idle {idle_rss / 1024:.0f} MiB, peak RSS (VmHWM) {peak['VmHWM'] / 1024:.0f} MiB, "
              f"now {peak['VmRSS'] / 1024:.0f} MiB, median sampled {statistics.median(rss) / 1024:.0f} MiB "
              f"({len(rss)} samples)")
        errors = op.log_path.read_text(errors="replace").count("Traceback")
        print(f"operator log: {errors} traceback(s)")
        ok = len(first_avail) == len(objs) and handled is not None
    finally:
        if op is not None:
            op.stop()
        if private:
            cluster.down(quiet=True)
        else:
            for ns in namespaces:
                kc("delete", "namespace", ns, "--wait=false", check=False)
            kc("delete", "nodes", "-l", f"meshplan.dev/fleet={FLEET}", "--wait=false", check=False, timeout=300)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
