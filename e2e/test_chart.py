"""The Helm chart on the real local control plane.

1. Rendered manifests (several value sets) pass the API server's validation
   (server-side dry run).
2. `helm install` (with peering and the standby Deployment) succeeds into a
   namespace that enforces the `restricted` Pod Security Standard, and both
   operator pods are admitted (PSS is enforced when the ReplicaSet creates a pod).
3. The chart's ServiceAccount, through a token from the TokenRequest API
   (`kubectl create token`), has exactly the rights in the committed snapshot
   e2e/golden/chart-sa-can-i.txt (`kubectl auth can-i --list`).
4. The operator, started with the Deployment's own arguments and only that
   ServiceAccount's token (not cluster-admin), reconciles an example
   LLMDeployment to status conditions; the standby, started with the standby
   Deployment's arguments, stays paused until the primary stops, then takes over.
5. `helm uninstall` with live LLMDeployments (finalizer and owned children)
   leaves no LLMDeployment and no child behind; the hook itself returns only
   once the children are gone (foreground deletion).

What kwok cannot do, and how this test deals with it: kwok does not run
containers. The operator pod is only marked Running, and a Job's pod is
marked Completed at once, so during `helm uninstall` the pre-delete hook Job
"succeeds" without its command ever running. The test therefore runs the hook
itself, as the hook would: it applies the hook's own ServiceAccount and RBAC
(read back with `helm get hooks`), takes a token for that ServiceAccount and
runs the Job container's exact command (with this venv's python), then runs
`helm uninstall`. For step 4 the operator runs as a local process, with the
chart's credentials, for the same reason.

The operator is scoped to one namespace (`watch.namespaces`), so other tests
sharing the cluster are unaffected.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

_spec = importlib.util.spec_from_file_location("chart_credentials", Path(__file__).with_name("chart_credentials.py"))
chart_credentials = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chart_credentials)
token_kubeconfig = chart_credentials.token_kubeconfig

REPO = Path(__file__).resolve().parent.parent
CHART = chart_credentials.CHART
GOLDEN = Path(__file__).resolve().parent / "golden" / "chart-sa-can-i.txt"
KUBE_VERSION = chart_credentials.KUBE_VERSION
EXAMPLE = REPO / "examples" / "llama-3.1-8b-1gpu.yaml"
CLEANUP_TIMEOUT_S = 30   # chart value cleanup.timeoutSeconds for this release (default 300)


_runner_spec = importlib.util.spec_from_file_location("operator_runner", Path(__file__).with_name("operator_runner.py"))
_runner = importlib.util.module_from_spec(_runner_spec)
_runner_spec.loader.exec_module(_runner)
_wait = _runner.wait_until                     # (pred, timeout_s, interval_s): the truthy value, or the last falsy one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Helm:
    def __init__(self, cluster):
        self.cluster = cluster
        self.bin = cluster.binary("helm")

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bin, f"--kubeconfig={self.cluster.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc


def kubectl_as(cluster, kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([cluster.binary("kubectl"), f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} (as {kubeconfig.name}) failed: {proc.stderr}")
    return proc


def _json(cluster, *args: str):
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def helm(cluster):
    return Helm(cluster)


@pytest.fixture(scope="module")
def release(cluster, helm, tmp_path_factory):
    """The chart installed into a restricted namespace, watching one workload namespace."""
    suffix = uuid.uuid4().hex[:6]
    ns, work, name = f"meshplan-chart-{suffix}", f"chart-work-{suffix}", f"mp-{suffix}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest",
                    "pod-security.kubernetes.io/warn=restricted")
    cluster.kubectl("create", "namespace", work)
    peering_crds_exist = cluster.kubectl("get", "crd", "kopfpeerings.kopf.dev", check=False).returncode == 0
    values = {
        "watch": {"allNamespaces": False, "namespaces": [work]},
        "peering": {"enabled": True, "name": "meshplan", "createCRDs": not peering_crds_exist,
                    "standby": {"enabled": True}},
        "cleanup": {"timeoutSeconds": CLEANUP_TIMEOUT_S},
    }
    vfile = tmp_path_factory.mktemp("chart") / "values.yaml"
    vfile.write_text(yaml.safe_dump(values))
    installed = helm("install", name, str(CHART), "-n", ns, "-f", str(vfile), "--wait", "--timeout", "120s")
    info = {"ns": ns, "work": work, "name": name, "fullname": f"{name}-meshplan", "install": installed,
            "values": vfile, "tmp": vfile.parent}
    yield info
    helm("uninstall", name, "-n", ns, "--no-hooks", "--wait", check=False)
    for n in (work, ns):
        cluster.kubectl("delete", "namespace", n, "--wait=false", check=False)


# ---- 1. server-side dry run ----------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    {},
    {"watch": {"allNamespaces": False, "namespaces": ["WORK"]}, "computeDomains": {"enabled": True}},
    {"peering": {"enabled": True, "name": "ha", "createCRDs": True, "standby": {"enabled": True}}},
], ids=["defaults", "namespaced-computedomains", "peering-standby"])
def test_rendered_manifests_pass_server_side_dry_run(cluster, helm, values, tmp_path):
    suffix = uuid.uuid4().hex[:6]
    ns, work = f"chart-dry-{suffix}", f"chart-dry-work-{suffix}"
    values = json.loads(json.dumps(values).replace("WORK", work))
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    out = helm("template", f"dry-{suffix}", str(CHART), "-n", ns, "--kube-version", KUBE_VERSION, "-f", str(f)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    # Custom resources whose CRD is created by this same render (the kopf peering
    # objects) cannot be dry-run before the CRD exists; the install test creates them for real.
    crd_kinds = {d["spec"]["names"]["kind"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    checked = [d for d in docs if d["kind"] not in crd_kinds]
    assert len(checked) >= 9
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "namespace", work)
    try:
        proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                               input=yaml.safe_dump_all(checked), check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("(server dry run)") == len(checked)
    finally:
        for n in (ns, work):
            cluster.kubectl("delete", "namespace", n, "--wait=false", check=False)


# ---- 2. install into a restricted namespace -------------------------------------------------------

def test_install_into_restricted_namespace(cluster, release):
    out = release["install"].stdout + release["install"].stderr
    assert "STATUS: deployed" in out
    assert "would violate PodSecurity" not in out
    ns, full = release["ns"], release["fullname"]
    labels = _json(cluster, "get", "namespace", ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for name in (full, f"{full}-standby"):  # the active operator and its paused standby
        dep = _json(cluster, "get", "deployment", name, "-n", ns)
        assert dep["status"].get("readyReplicas") == 1, (name, dep["status"])
    pods = _json(cluster, "get", "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={release['name']}")["items"]
    assert sorted(p["metadata"]["labels"]["meshplan.dev/operator-role"] for p in pods) == ["primary", "standby"]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    # PSS admission ran on this pod: no events of a refused pod on the ReplicaSet
    events = _json(cluster, "get", "events", "-n", ns)["items"]
    assert not [e for e in events if "PodSecurity" in e.get("message", "")]
    # the metrics Service selects the operator pod
    eps = _json(cluster, "get", "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={full}-metrics")
    ports = {p["port"] for s in eps["items"] for p in (s.get("ports") or [])}
    assert ports == {8080}
    peering = _json(cluster, "get", "kopfpeering", "meshplan", "-n", release["work"])
    assert peering["metadata"]["name"] == "meshplan"


# ---- 3. the ServiceAccount's rights ---------------------------------------------------------------

def _can_i_list(cluster, kubeconfig: Path, namespace: str) -> list[str]:
    """Rows of `kubectl auth can-i --list`, whitespace collapsed, verbs sorted (their order follows rule merging)."""
    out = kubectl_as(cluster, kubeconfig, "auth", "can-i", "--list", "-n", namespace).stdout
    rows = []
    for line in out.splitlines()[1:]:
        if not line.strip():
            continue
        row = " ".join(line.split())
        head, _, verbs = row.rpartition(" [")
        rows.append(f"{head} [{' '.join(sorted(verbs.rstrip(']').split()))}]")
    return sorted(rows)


def test_service_account_rights_match_the_snapshot(cluster, release):
    kcfg = token_kubeconfig(cluster, release["fullname"], release["ns"], release["tmp"] / "operator.kubeconfig")
    other = f"chart-other-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", other)
    try:
        sections = {
            "watched namespace": _can_i_list(cluster, kcfg, release["work"]),
            "release namespace": _can_i_list(cluster, kcfg, release["ns"]),
            "any other namespace": _can_i_list(cluster, kcfg, other),
        }
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
    text = "".join(f"# {k} (kubectl auth can-i --list, columns: resources, non-resource URLs, "
                   f"resource names, verbs)\n" + "\n".join(v) + "\n" for k, v in sections.items())
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    want = GOLDEN.read_text()
    assert text == want, "ServiceAccount rights changed (MESHPLAN_UPDATE_GOLDEN=1 rewrites the snapshot " \
        "after review):\n" + "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True)))
    # independent of the snapshot: the things least privilege forbids
    everything = "\n".join(line for v in sections.values() for line in v)
    # Secrets: only what the TensorRT-LLM multi-node ssh Secret needs (create one, read it back, patch its owner);
    # never list or watch, so the operator cannot enumerate the namespace's Secrets
    secret_lines = [ln for ln in everything.splitlines() if ln.startswith("secrets ")]
    assert secret_lines == ["secrets [] [] [create get patch]"], secret_lines
    assert not re.search(r"^\*\.\*", everything, re.M)
    elsewhere = [line for line in sections["any other namespace"] if line.startswith(("pods", "services", "llmd"))]
    assert elsewhere == ["pods [] [] [list]"], "outside its namespaces the operator may only list pods (GPU usage)"
    # and a spot check by the API server itself
    assert kubectl_as(cluster, kcfg, "auth", "can-i", "create", "pods", "-n", release["work"]).stdout.strip() == "yes"
    no = kubectl_as(cluster, kcfg, "auth", "can-i", "create", "pods", "-n", "default", check=False)
    assert no.stdout.strip() == "no"
    assert kubectl_as(cluster, kcfg, "auth", "can-i", "list", "secrets", "-n", release["work"],
                      check=False).stdout.strip() == "no"
    assert kubectl_as(cluster, kcfg, "auth", "can-i", "get", "secrets", "-n", "default",
                      check=False).stdout.strip() == "no"


# ---- 4. the operator with the chart's credentials --------------------------------------------------

class ChartOperator:
    """`meshplan run` with one of the release's Deployments' args and the chart ServiceAccount's token.

    Only the listen addresses change: liveness and metrics on free loopback ports.
    """

    def __init__(self, cluster, release, deployment: str, tag: str):
        if importlib.util.find_spec("meshplan.commands.run") is None:
            pytest.skip("meshplan.commands.run (the kopf operator, issue 5) is not written yet")
        dep = _json(cluster, "get", "deployment", deployment, "-n", release["ns"])
        args = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
        self.liveness, self.metrics_port = _free_port(), _free_port()
        args[args.index("--liveness") + 1] = f"http://127.0.0.1:{self.liveness}/healthz"
        args[args.index("--metrics-port") + 1] = str(self.metrics_port)
        self.args = args
        kcfg = token_kubeconfig(cluster, release["fullname"], release["ns"], release["tmp"] / f"{tag}.kubeconfig")
        self.log = release["tmp"] / f"{tag}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "meshplan"), *args],
                                         env={**os.environ, "KUBECONFIG": str(kcfg), "POD_ID": tag},
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        assert _wait(self._healthy, 60), f"{tag} never answered its liveness endpoint"

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.tail()}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.liveness}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def reconciles_ok(self) -> float:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        m = re.search(r'^meshplan_reconciles_total\{result="ok"\} ([0-9.e+]+)$', body, re.M)
        return float(m.group(1)) if m else 0.0

    def forbidden(self) -> list[str]:
        return [line for line in self.tail(10**7).splitlines() if " 403" in line or "Forbidden" in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _planned(cluster, ns: str, name: str):
    obj = _json(cluster, "get", "llmdeployment", name, "-n", ns)
    conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    return (obj, conds) if "Planned" in conds else None


def test_standby_stays_paused_then_takes_over(cluster, release):
    """The chart's standby (lower kopf peering priority) acts only once the primary stops.

    Runs before the module's `operator` fixture starts: two operators with the
    primary's priority would pause each other.
    """
    work = release["work"]
    primary = ChartOperator(cluster, release, release["fullname"], "primary")
    standby = ChartOperator(cluster, release, f"{release['fullname']}-standby", "standby")
    try:
        assert int(standby.args[standby.args.index("--priority") + 1]) < \
            int(primary.args[primary.args.index("--priority") + 1])
        first = _llmd("before-failover")
        cluster.kubectl("apply", "-n", work, "-f", "-", input=json.dumps(first))
        assert _wait(lambda: _planned(cluster, work, "before-failover"), 120, 1.0), primary.tail()
        assert _wait(lambda: primary.reconciles_ok() >= 1, 30)
        assert standby.reconciles_ok() == 0, "the standby reconciled while the primary was alive"

        primary.stop()  # a pod deletion: SIGTERM, kopf leaves the peering
        cluster.kubectl("apply", "-n", work, "-f", "-", input=json.dumps(_llmd("after-failover")))
        assert _wait(lambda: _planned(cluster, work, "after-failover"), 90, 1.0), \
            f"the standby never took over:\n{standby.tail()}"
        assert standby.reconciles_ok() >= 1
        assert not primary.forbidden() and not standby.forbidden()
    finally:
        primary.stop()
        standby.stop()
        cluster.kubectl("delete", "llmdeployment", "before-failover", "after-failover", "-n", work,
                        "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)


@pytest.fixture(scope="module")
def operator(cluster, release):
    """The primary operator, running from here to the uninstall test."""
    op = ChartOperator(cluster, release, release["fullname"], "operator")
    yield op
    op.stop()


def test_operator_reconciles_with_service_account_credentials(cluster, release, operator):
    work = release["work"]
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", work, "--from-literal=token=hf_e2e")
    cluster.kubectl("apply", "-n", work, "-f", str(EXAMPLE))
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    got = _wait(lambda: _planned(cluster, work, name), 120, 1.0)
    assert got, f"no Planned condition; operator log:\n{operator.tail()}"
    obj, conds = got
    for c in conds.values():
        assert c["status"] in ("True", "False", "Unknown") and c.get("reason"), c
    assert obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    # counted when the reconcile returns, just after its status write
    assert _wait(lambda: operator.reconciles_ok() >= 1, 30), "the reconcile was not counted on the metrics port"
    forbidden = operator.forbidden()
    assert not forbidden, "the operator needed rights the chart does not grant:\n" + "\n".join(forbidden[:20])


# ---- 5. uninstall with live LLMDeployments -----------------------------------------------------------

def _llmd(name: str) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    return doc


def _add_owned_children(cluster, ns: str, owner: dict) -> None:
    """A Pod and a Service owned by the LLMDeployment (blockOwnerDeletion), as the operator creates them."""
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    meta = {"name": f"{owner['metadata']['name']}-child", "ownerReferences": [ref],
            "labels": {"meshplan.dev/deployment": owner["metadata"]["name"]}}
    children = [
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"clusterIP": "None", "selector": meta["labels"], "ports": [{"port": 8000}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
         "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}],
                  "nodeSelector": {"meshplan.dev/fleet": "hgx-h100"}}},
    ]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": children}))


def _owned_children(cluster, ns: str) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for kind in ("pods", "services")
            for o in _json(cluster, "get", kind, "-n", ns)["items"]
            if any(r.get("kind") == "LLMDeployment" for r in o["metadata"].get("ownerReferences", []))]


def _hook_docs(helm, release) -> list[dict]:
    out = helm("get", "hooks", release["name"], "-n", release["ns"]).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["metadata"].get("annotations", {}).get(
        "helm.sh/hook") == "pre-delete"]


def test_uninstall_with_live_llmdeployments_leaves_nothing_behind(cluster, helm, release, request):
    work, ns = release["work"], release["ns"]
    try:  # the operator keeps running through the hook, as the Deployment does in a real cluster
        operator = request.getfixturevalue("operator")
    except pytest.skip.Exception:
        operator = None
    # Live LLMDeployments: one stuck behind meshplan's finalizer (as if the
    # operator were gone: the hook must release it after cleanup.timeoutSeconds),
    # each with owned children.
    names = ["uninstall-a", "uninstall-b"]
    cluster.kubectl("apply", "-n", work, "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [_llmd(n) for n in names]}))
    cluster.kubectl("patch", "llmdeployment", names[0], "-n", work, "--type=merge",
                    "-p", json.dumps({"metadata": {"finalizers": ["meshplan.dev/e2e-stuck"]}}))
    for n in names:
        _add_owned_children(cluster, work, _json(cluster, "get", "llmdeployment", n, "-n", work))
    assert len(_json(cluster, "get", "llmdeployments", "-n", work)["items"]) >= 2

    # The pre-delete hook, run as the hook would run it (see the module docstring).
    hooks = _hook_docs(helm, release)
    job = [d for d in hooks if d["kind"] == "Job"]
    assert len(job) == 1
    rbac = [d for d in hooks if d["kind"] != "Job"]
    assert {d["kind"] for d in rbac} == {"ServiceAccount", "Role", "RoleBinding"}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    pod = job[0]["spec"]["template"]["spec"]
    hook_kcfg = token_kubeconfig(cluster, pod["serviceAccountName"], ns, release["tmp"] / "hook.kubeconfig")
    cmd = list(pod["containers"][0]["command"])
    assert cmd[0] == "python"
    cmd[0] = sys.executable
    t0 = time.monotonic()
    hook = subprocess.run(cmd, env={**os.environ, "KUBECONFIG": str(hook_kcfg)}, capture_output=True,
                          text=True, timeout=CLEANUP_TIMEOUT_S + 120)
    assert hook.returncode == 0, hook.stdout + hook.stderr
    assert "no LLMDeployment left" in hook.stdout
    assert "removing meshplan's finalizers" in hook.stdout and "uninstall-a" in hook.stdout
    assert time.monotonic() - t0 < CLEANUP_TIMEOUT_S + 90
    # foreground deletion: an LLMDeployment is gone only after its children, so none is left already
    assert _owned_children(cluster, work) == [], "the hook returned before the children were deleted"

    if operator is not None:  # helm now deletes the operator Deployment (and its ServiceAccount)
        operator.stop()
    out = helm("uninstall", release["name"], "-n", ns, "--wait", "--timeout", "120s")
    assert "uninstalled" in out.stdout

    assert _json(cluster, "get", "llmdeployments", "-n", work)["items"] == []

    assert _owned_children(cluster, work) == []
    # the release and its hook resources are gone too
    assert not _json(cluster, "get", "deployments,serviceaccounts,jobs", "-n", ns,
                     "-l", f"app.kubernetes.io/instance={release['name']}")["items"]
    crs = _json(cluster, "get", "clusterroles", "-l", f"app.kubernetes.io/instance={release['name']}")["items"]
    assert crs == []
