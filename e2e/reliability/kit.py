"""Helpers of the reliability suite: private GPU fleets, scoped operators, reads and waits.

Isolation on a shared dev cluster: every module gets its own namespaces
(`mprel-<module>-*`), its own operator process scoped to them, and, where a
scenario changes capacity (cordons, NotReady, adding nodes), its own kwok GPU
nodes with a distinct `meshplan.dev/fleet` label and node names starting with
`rel-`, deleted afterwards. Deployments select their fleet with
`spec.gpus.nodeSelector`, so nothing here competes with other tests' GPUs.

The LLMDeployment manifests are the repository's pinned-layout example
(`e2e/test_operator._pinned`: a known GPU count per replica, independent of
the performance model); reads and waits are test_operator's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from meshplan.controller.process import OperatorProcess
from meshplan.devcluster.cluster import free_port
from meshplan.devcluster.fleets import FLEET_LABEL

from e2e.test_operator import (  # noqa: F401 - re-exported for the suite
    _apply as apply,
    _available as available,
    _cond as cond,
    _get as get,
    _pinned as pinned,
    _pods as pods,
    _wait as wait,
)

REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"
GB200 = "NVIDIA-GB200"
FULL = bool(os.environ.get("MESHPLAN_RELIABILITY_FULL"))


def ensure_crd(cluster) -> None:
    from e2e.operator_runner import apply_crd

    apply_crd(cluster)


# ----------------------------------------------------------------------------- fleets


def h100_group(prefix: str, count: int, zone: str = "zone-a") -> dict[str, Any]:
    """`count` HGX H100 nodes (8 GPUs, each node its own NVLink domain), as e2e/fleets/hgx-h100.yaml."""
    return {"namePrefix": prefix, "count": count, "zone": zone, "gpusPerNode": 8, "product": H100,
            "memoryMiB": 81559, "family": "hopper", "cpu": "224", "memory": "2Ti"}


def gb200_group(prefix: str, count: int, clique: str, zone: str = "zone-a") -> dict[str, Any]:
    """`count` GB200 trays (4 GPUs) of one multi-node NVLink domain `clique`, as e2e/fleets/gb200-nvl72.yaml."""
    return {"namePrefix": prefix, "count": count, "zone": zone, "gpusPerNode": 4, "product": GB200,
            "memoryMiB": 189471, "family": "blackwell", "clique": clique, "arch": "arm64", "cpu": "144",
            "memory": "960Gi"}


class Fleet:
    """kwok GPU nodes owned by one test module; `delete()` removes every one of them."""

    def __init__(self, cluster, name: str, groups: list[dict[str, Any]]):
        assert name.startswith("rel-"), name
        self.cluster, self.name = cluster, name
        self.fleet = {"name": name, "nodeGroups": groups}
        self.nodes: list[str] = []

    @property
    def selector(self) -> dict[str, str]:
        return {FLEET_LABEL: self.name}

    def add(self, groups: list[dict[str, Any]] | None = None) -> list[str]:
        from meshplan.devcluster.fleets import fleet_nodes

        fleet = {"name": self.name, "nodeGroups": groups or self.fleet["nodeGroups"]}
        self.cluster.apply_fleet(fleet)
        names = [n["metadata"]["name"] for n in fleet_nodes(fleet)]
        self.nodes += [n for n in names if n not in self.nodes]
        wait(lambda: all(node_ready(self.cluster, n) for n in names), 60, f"nodes {names} Ready")
        return names

    def delete(self) -> None:
        if self.nodes:
            self.cluster.kubectl("delete", "nodes", "-l", f"{FLEET_LABEL}={self.name}", "--wait=false",
                                 check=False)
            self.nodes = []


def node(cluster, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)


def node_ready(cluster, name: str) -> bool:
    r = cluster.kubectl("get", "node", name, "-o", "json", check=False)
    if r.returncode:
        return False
    n = json.loads(r.stdout)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))


def make_not_ready(cluster, name: str) -> None:
    """The node's kubelet goes silent: kwok stops managing it and its Ready condition turns False
    (the node lifecycle controller then taints it not-ready, as for a real lost node)."""
    cluster.kubectl("annotate", "node", name, "kwok.x-k8s.io/node-")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=strategic", "-p", json.dumps(
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletStoppedPosting",
                                    "message": "reliability test: node lost", "lastHeartbeatTime": now,
                                    "lastTransitionTime": now}]}}))


# ----------------------------------------------------------------------------- operator


_CREDENTIALS: dict[tuple[str, str, str], str] = {}


def operator_kubeconfig(cluster, release: str = "e2e", values: dict[str, Any] | None = None) -> str:
    """The Helm chart's ServiceAccount credentials (e2e/chart_credentials.py), made once per cluster and
    chart values: the suite's operators have the chart's RBAC and nothing more, so a missing right fails
    a scenario. MESHPLAN_E2E_OPERATOR_ADMIN=1: cluster-admin (debugging), as in e2e/conftest.py."""
    import tempfile

    from e2e.chart_credentials import operator_kubeconfig as make

    key = (str(cluster.kubeconfig), release, json.dumps(values or {}, sort_keys=True))
    if key not in _CREDENTIALS:
        path = Path(tempfile.mkdtemp(prefix="meshplan-rel-sa-")) / "sa.kubeconfig"
        _CREDENTIALS[key] = str(make(cluster, path, release=release, values=values))
    return _CREDENTIALS[key]


def operator(cluster, namespace_glob: str, *extra: str, metrics: bool = True,
             kubeconfig: str | None = None, resync_s: float = 5.0) -> OperatorProcess:
    """A `meshplan run` subprocess scoped to `namespace_glob`, with a metrics port when asked, running as
    the chart's ServiceAccount (`operator_kubeconfig`) unless `kubeconfig` says otherwise."""
    args = list(extra)
    port = None
    if metrics:
        port = free_port()
        args += ["--metrics-port", str(port)]
    op = OperatorProcess(kubeconfig or operator_kubeconfig(cluster), [namespace_glob], *args, resync_s=resync_s)
    op.metrics_port = port      # type: ignore[attr-defined]
    return op


def h200_ib_group(prefix: str, count: int, zone: str = "zone-a") -> dict[str, Any]:
    """`count` HGX H200 nodes advertising `rdma/ib` (as operator/meshplan/fleets/hgx-h200-ib.yaml does)."""
    return {"namePrefix": prefix, "count": count, "zone": zone, "gpusPerNode": 8, "product": "NVIDIA-H200",
            "memoryMiB": 143771, "family": "hopper", "cpu": "224", "memory": "2Ti", "rdma": {"rdma/ib": 8}}


def serve_module(cluster, request, namespace_glob: str, *extra: str, log_lines: int = 120):
    """Body of a module-scoped `op` fixture: one operator for the module (`extra`: more `meshplan run`
    arguments), its log tail printed on failure."""
    ensure_crd(cluster)
    o = start(operator(cluster, namespace_glob, *extra))
    failed = request.session.testsfailed
    yield o
    o.stop()
    if request.session.testsfailed > failed:
        print(f"\n----- operator log (tail) -----\n{o.tail(log_lines)}")


def metric(op: OperatorProcess, name: str, labels: str = "") -> float:
    """One sample of the operator's /metrics (0 when absent)."""
    port = getattr(op, "metrics_port", None)
    assert port, "operator started without a metrics port"
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = f"{name}{{{labels}}}" if labels else name
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == want:
            total += float(value)
    return total


def reconciles(op: OperatorProcess) -> float:
    return metric(op, "meshplan_reconciles_total", 'result="ok"')


def kill9(op: OperatorProcess) -> None:
    assert op.proc is not None
    os.killpg(op.proc.pid, signal.SIGKILL)
    op.proc.wait(10)


# ----------------------------------------------------------------------------- reads


def namespace(cluster, prefix: str, suffix: str) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"{prefix}-{suffix}".lower())[:60].strip("-")
    cluster.kubectl("create", "namespace", name)
    return name


def drop_namespace(cluster, ns: str, timeout_s: float = 60) -> None:
    cluster.kubectl("delete", "llmd", "--all", "-n", ns, "--wait=true", f"--timeout={int(timeout_s)}s", check=False)
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def groups(pod_list: list[dict[str, Any]], deployment: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Live (not terminating) pods by replica group, optionally of one deployment."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in pod_list:
        labels = p["metadata"].get("labels") or {}
        if p["metadata"].get("deletionTimestamp") or (deployment and labels.get("meshplan.dev/deployment") != deployment):
            continue
        out.setdefault(f"{labels.get('meshplan.dev/deployment')}/{labels.get('meshplan.dev/replica')}", []).append(p)
    return out


def group_size(p: dict[str, Any]) -> int:
    return int(next(e["value"] for e in p["spec"]["containers"][0]["env"] if e["name"] == "MESHPLAN_NNODES"))


def half_running(pod_list: list[dict[str, Any]]) -> list[str]:
    """Groups with some ungated (released) pod while another rank is missing: what must never last."""
    bad = []
    for key, members in groups(pod_list).items():
        released = [p for p in members if not p["spec"].get("schedulingGates")]
        if released and len(members) < group_size(members[0]):
            bad.append(f"{key}: {len(members)}/{group_size(members[0])} pods, {len(released)} released")
    return bad


def events(cluster, ns: str, name: str | None = None) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    return [e for e in items if name is None or e["involvedObject"].get("name") == name]


def versions(cluster, ns: str) -> dict[tuple[str, str], str]:
    """resourceVersion of the LLMDeployments, pods and Services of a namespace."""
    out = {}
    for kind in ("llmd", "pods", "services"):
        for o in json.loads(cluster.kubectl("get", kind, "-n", ns, "-o", "json").stdout)["items"]:
            out[(kind, o["metadata"]["name"])] = o["metadata"]["resourceVersion"]
    return out


def start(op: OperatorProcess) -> OperatorProcess:
    """(Re)start: a fresh log file first, because `OperatorProcess.start` waits for the startup line
    in a log it appends to, so a restart would otherwise return at once on the previous run's line."""
    import tempfile

    if op.proc is not None:
        op.log_path = Path(tempfile.mkstemp(prefix="meshplan-operator-", suffix=".log")[1])
    op.start()
    port = getattr(op, "metrics_port", None)
    if port:
        wait(lambda: _metrics_up(port), 30, "operator metrics endpoint")
    return op


def _metrics_up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
        return True
    except OSError:
        return False


def json_values(lines):
    """The JSON values in a stream of text lines, each as soon as its last line arrives, however kubectl lays them
    out: `get --watch -o json` pretty-prints each object over many lines, `--output-watch-events` writes each event
    on one line (kubectl v1.36.3, read off the dev cluster). A value is tried only at a line ending in "}"."""
    decoder, buf = json.JSONDecoder(), ""
    for line in lines:
        buf += line
        if not line.rstrip().endswith("}"):
            continue
        while True:
            buf = buf.lstrip()
            if not buf:
                break
            try:
                obj, end = decoder.raw_decode(buf)
            except ValueError:                      # not complete yet: read on
                break
            buf = buf[end:]
            yield obj


class Watch:
    """`kubectl get RESOURCE... --watch -o json` in the background: every version of the objects the API server
    sends (none missed between polls, as a poll of a fast kwok rollout can miss a sub-second state), each stamped
    with this machine's wall clock on arrival. `what` is kubectl's (`"llmd", NAME` or `"pods", "-l", SELECTOR`);
    with `events=True` each item is the watch event `{"type": ADDED|MODIFIED|DELETED, "object": ...}`."""

    def __init__(self, cluster, namespace: str, *what: str, events: bool = False) -> None:
        self.argv = [str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get", *what,
                     "-n", namespace, "--watch", "-o", "json", *(["--output-watch-events"] if events else [])]
        self.objects: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> "Watch":
        self.err = tempfile.TemporaryFile("w+")          # a file, not a pipe: an unread pipe could stall kubectl
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self.err,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for obj in json_values(self.proc.stdout):
            with self.lock:
                self.objects.append((time.time(), obj))

    def stderr(self) -> str:
        """What kubectl wrote to stderr so far (for a failure message)."""
        if self.proc is None:
            return ""
        self.err.seek(0)
        return self.err.read()

    def snapshot(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return list(self.objects)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
