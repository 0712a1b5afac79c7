"""The operator end to end: `meshplan run` against the real control plane, kwok running the pods.

One operator process per module, scoped to the namespaces `mp-op-*` that these
tests create. Each test applies LLMDeployments (the repository's examples,
pinned with a node selector to one simulated fleet) and checks what issue 5
asks: Available, one NVLink domain per replica, the planned engine arguments
and NCCL environment on the pods, drift undone, insufficient capacity reported
with numbers and recovered from, rolling changes that keep ready replicas, and
garbage collection on delete.
"""

from __future__ import annotations

import copy
import importlib.util
import hashlib
import os
import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml


REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
NS_GLOB = "mp-op-*"

_spec = importlib.util.spec_from_file_location("operator_runner", Path(__file__).with_name("operator_runner.py"))
operator_runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(operator_runner)
OperatorProcess = operator_runner.OperatorProcess


@pytest.fixture(scope="module")
def operator(cluster, operator_kubeconfig, request):
    yield from operator_runner.serve(cluster, operator_kubeconfig, request, NS_GLOB)


@pytest.fixture
def ns(cluster, operator, request):
    """A namespace the operator serves; the test's LLMDeployments and their pods are gone after it."""
    name = f"mp-op-{request.node.name[5:25].lower().replace('_', '-').strip('-')}-" \
           f"{hashlib.sha1((request.node.nodeid + str(os.getpid())).encode()).hexdigest()[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "llmd", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    _wait(lambda: not _pods(cluster, name), 60, "pods of the test gone", cluster, operator)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ----------------------------------------------------------------------------- helpers


def _example(file: str, fleet: str, **spec: Any) -> dict[str, Any]:
    m = yaml.safe_load((EXAMPLES / file).read_text())
    m["spec"].setdefault("gpus", {})["nodeSelector"] = {"meshplan.dev/fleet": fleet}
    for k, v in spec.items():
        m["spec"][k] = v
    return m


def _pinned(name: str, fleet: str, product: str, tensor: int, replicas: int, max_gpus: int) -> dict[str, Any]:
    """The Llama-3.1-70B example with a pinned layout and no SLO: what these tests need is a
    known GPU count per replica, not the planner's choice (which the planner's tests cover)."""
    m = _example("llama-3.1-70b-hgx-h100.yaml", fleet, replicas=replicas, autoscaling={"enabled": False})
    m["metadata"]["name"] = name
    m["spec"].pop("slo", None)
    m["spec"]["objective"] = "maxThroughput"
    m["spec"]["model"] = {"name": "llama-3.1-70b"}
    m["spec"]["parallelism"] = {"tensor": tensor, "pipeline": 1}
    m["spec"]["gpus"] = {"products": [product], "maxGpus": max_gpus, "nodeSelector": {"meshplan.dev/fleet": fleet}}
    return m


def _apply(cluster, ns: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def _get(cluster, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    r = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _pods(cluster, ns: str) -> list[dict[str, Any]]:
    return json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]


def _cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, cluster=None, operator=None) -> Any:
    v = operator_runner.wait_until(pred, timeout_s)
    if not v:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
    return v


def _available(cluster, ns: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check():
        o = _get(cluster, ns, "llmd", name)
        last["status"] = (o or {}).get("status")
        return o if (_cond(o, "Available").get("status") == "True"
                     and o["status"].get("observedGeneration") == o["metadata"]["generation"]) else None
    try:
        return _wait(check, timeout_s, f"{ns}/{name} Available")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {json.dumps(last.get('status'))[:3000]}") from None


def _nodes(cluster) -> dict[str, dict[str, str]]:
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in items}


def _domain(labels: dict[str, str]) -> str:
    return labels.get("nvidia.com/gpu.clique") or labels["kubernetes.io/hostname"]


def _ready_groups(pods: list[dict[str, Any]]) -> int:
    groups: dict[str, list[bool]] = {}
    for p in pods:
        if p["metadata"].get("deletionTimestamp"):
            continue
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
        groups.setdefault(p["metadata"]["labels"]["meshplan.dev/replica"], []).append(ready)
    size = {p["metadata"]["labels"]["meshplan.dev/replica"]:
            int(next(e["value"] for e in p["spec"]["containers"][0]["env"] if e["name"] == "MESHPLAN_NNODES"))
            for p in pods}
    return sum(1 for g, r in groups.items() if len(r) == size[g] and all(r))


TP_FLAG = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size", "trtllm": "--tp_size"}


# ----------------------------------------------------------------------------- tests


def _provide_weights_claim(cluster, ns: str, m: dict[str, Any]) -> None:
    """An example that loads its weights from `pvc://CLAIM/...` needs that claim, as a user's cluster has it:
    a PersistentVolumeClaim bound to a (here hostPath, never written) PersistentVolume, so the scheduler's
    volume binding admits the pods. The PV is cluster-scoped and named after the namespace."""
    uri = ((m["spec"]["model"].get("weights") or {}).get("uri") or "")
    if not uri.startswith("pvc://"):
        return
    claim = uri[len("pvc://"):].split("/")[0]
    pv = f"{ns}-{claim}"[:63].rstrip("-")
    objs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "10Ti"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": f"/var/lib/meshplan-e2e/{pv}"},
                  "claimRef": {"namespace": ns, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": ns},
         "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "10Ti"}}}},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    _wait(lambda: (_get(cluster, ns, "pvc", claim) or {}).get("status", {}).get("phase") == "Bound", 60,
          f"PVC {claim} bound")


@pytest.mark.parametrize("file,fleet,overrides", [
    ("llama-3.1-70b-hgx-h100.yaml", "hgx-h100", {}),
    ("gpt-moe-1.8t-gb200-nvl72.yaml", "gb200-nvl72", {}),
    ("llama-3.1-8b-1gpu.yaml", "mixed", {}),
    # the example's node selector names an AWS instance type the simulated fleet does not label
    ("mixtral-8x7b-l40s.yaml", "mixed", {}),
    ("deepseek-r1-h200.yaml", "mixed", {}),
], ids=["hgx-h100-llama-70b", "gb200-nvl72-gpt-moe", "mixed-llama-8b", "mixed-mixtral-l40s", "mixed-deepseek-r1"])
def test_example_becomes_available_on_one_nvlink_domain_per_replica(cluster, ns, file, fleet, overrides):
    m = _example(file, fleet, **copy.deepcopy(overrides))
    m["spec"]["gpus"]["nodeSelector"] = {"meshplan.dev/fleet": fleet}
    name = m["metadata"]["name"]
    _provide_weights_claim(cluster, ns, m)
    _apply(cluster, ns, m)
    obj = _available(cluster, ns, name, timeout_s=120)
    st = obj["status"]
    assert _cond(obj, "Planned")["status"] == "True"
    assert st["readyReplicas"] >= st["desiredReplicas"] >= 1
    assert st["selector"] == f"meshplan.dev/deployment={name},meshplan.dev/role=leader"
    plan = st["plan"]
    # the explanation describes what runs (desiredReplicas), the search's own DP is in searchReason
    assert plan["reason"].startswith(f"running {plan['layout']} x {st['desiredReplicas']} replica(s) = "
                                     f"{st['desiredReplicas'] * plan['gpusPerReplica']} GPU"), plan["reason"]
    assert plan["searchReason"].startswith(f"{m['spec'].get('objective', 'balanced')}: ")
    nodes = _nodes(cluster)
    pods = _pods(cluster, ns)
    assert pods and all(p["spec"].get("nodeName") for p in pods)
    by_group: dict[str, list[dict]] = {}
    for p in pods:
        by_group.setdefault(p["metadata"]["labels"]["meshplan.dev/replica"], []).append(p)
    assert len(by_group) == st["desiredReplicas"]
    for group, members in by_group.items():
        assert len(members) * int(members[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) \
            == plan["gpusPerReplica"]
        assert all(nodes[p["spec"]["nodeName"]]["meshplan.dev/fleet"] == fleet for p in members)
        # the plan fits one NVLink domain here, so the whole replica sits in one
        assert len({_domain(nodes[p["spec"]["nodeName"]]) for p in members}) == 1, \
            f"replica {group} spans domains: {[p['spec']['nodeName'] for p in members]}"
        assert not any(p["spec"].get("schedulingGates") for p in members)
    leader = next(p for p in pods if p["metadata"]["labels"]["meshplan.dev/role"] == "leader")
    c = leader["spec"]["containers"][0]
    engine = leader["metadata"]["labels"]["app.kubernetes.io/name"]
    argv = c.get("command", []) + c.get("args", [])
    text = " ".join(argv)
    flag = TP_FLAG[engine]
    # the engine's own spelling of the planned layout (SGLang's --tp-size covers TP x EP with DP attention)
    from meshplan.planner.engines import engine_layout
    from meshplan.planner.types import Layout

    want = engine_layout(Layout(tp=plan["tp"], ep=plan["ep"], pp=plan["pp"]), engine).flags[flag]
    assert f"{flag} {want}" in text or f"{flag}={want}" in text, text
    env = {e["name"]: e.get("value") for e in c["env"]}
    # every NCCL variable the render explains on the pod is set to the explained value
    explained = [line.split(" ", 2)[1] for line in leader["metadata"]["annotations"]["meshplan.dev/explain"].splitlines()
                 if line.startswith("env ") and "(NCCL default)" not in line]
    for pair in explained:
        k, v = pair.split("=", 1)
        assert env.get(k) == v.rstrip(":"), (k, v, env.get(k))
    if plan["gpusPerReplica"] > 1 and "L40S" not in (plan.get("gpuProduct") or ""):
        assert explained and any(k.startswith("NCCL_") for k in env), sorted(env)   # NVLink/MNNVL settings
    # a user override from the spec wins over the defaults
    for e in m["spec"].get("nccl", {}).get("env", []):
        assert env.get(e["name"]) == e.get("value")


def test_nim_multi_node_group_is_gang_placed_and_available(cluster, ns):
    """NVIDIA NIM 1.x multi-node (examples/deepseek-r1-nim-multinode.yaml): DeepSeek-R1 TP8 x PP2 as one group of
    two pods on two HGX H100 nodes, the leader with NIM's MPI role and hostfile, the worker with its sshd role,
    both mounting the ssh key Secret the operator creates. kwok runs no NIM (its image needs an NGC key and a
    GPU): what is checked is what the API server, scheduler and operator do with the rendered group."""
    m = _example("deepseek-r1-nim-multinode.yaml", "hgx-h100-ib", autoscaling={"enabled": False})
    m["spec"]["engine"].pop("env")         # NGC_API_KEY valueFrom needs the admin's enginePolicy.allowEnvValueFrom
    name = m["metadata"]["name"]
    _apply(cluster, ns, m)
    obj = _available(cluster, ns, name, timeout_s=120)
    assert obj["status"]["plan"]["layout"] == "TP8·PP2" and obj["status"]["plan"]["gpusPerReplica"] == 16
    pods = sorted(_pods(cluster, ns), key=lambda p: int(p["metadata"]["labels"]["meshplan.dev/rank"]))
    assert len(pods) == 2 and {p["metadata"]["labels"]["meshplan.dev/replica"] for p in pods} == {"0"}
    nodes = _nodes(cluster)
    # the whole group placed at once: both pods released from the gang gate, on two nodes of the fleet
    assert all(p["spec"].get("nodeName") and not p["spec"].get("schedulingGates") for p in pods)
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    assert all(nodes[p["spec"]["nodeName"]]["meshplan.dev/fleet"] == "hgx-h100-ib" for p in pods)
    assert _ready_groups(pods) == 1
    leader, worker = pods
    le = {e["name"]: e.get("value") for e in leader["spec"]["containers"][0]["env"]}
    we = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert (le["NIM_MULTI_NODE"], le["NIM_LEADER_ROLE"], le["NIM_NODE_RANK"], le["NIM_NUM_COMPUTE_NODES"]) == \
        ("1", "1", "0", "2")
    assert (we["NIM_MULTI_NODE"], we["NIM_LEADER_ROLE"], we["NIM_NODE_RANK"], we["NIM_NUM_COMPUTE_NODES"]) == \
        ("1", "0", "1", "2")
    assert "command" not in leader["spec"]["containers"][0]
    hostfile = leader["metadata"]["annotations"]["meshplan.dev/nim-mpi-hostfile"]
    assert hostfile == f"localhost slots=8\n{worker['metadata']['name']}.{worker['spec']['subdomain']}.{ns}.svc slots=8\n"
    secret_name = f"{name}-nim-ssh"
    for p in pods:
        vol = next(v for v in p["spec"]["volumes"] if v["name"] == "nim-ssh-pk")
        assert vol["secret"] == {"secretName": secret_name, "defaultMode": 0o400}
    secret = _get(cluster, ns, "secret", secret_name)
    assert secret is not None and sorted(secret["data"]) == ["private.key"]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]


def test_deleted_and_edited_children_are_restored(cluster, ns, operator):
    # TP8 on 4-GPU GB200 trays: two pods per replica, so a worker pod exists.
    m = _pinned("drift", "gb200-nvl72", "NVIDIA-GB200", tensor=8, replicas=1, max_gpus=8)
    _apply(cluster, ns, m)
    _available(cluster, ns, "drift")
    worker = _get(cluster, ns, "pod", "drift-r0-1")
    assert worker is not None, [p["metadata"]["name"] for p in _pods(cluster, ns)]
    cluster.kubectl("delete", "pod", "drift-r0-1", "-n", ns, "--wait=false")
    cluster.kubectl("delete", "service", "drift", "-n", ns, "--wait=false")
    cluster.kubectl("patch", "service", "drift-r0", "-n", ns, "--type=merge",
                    "-p", json.dumps({"spec": {"selector": {"meshplan.dev/deployment": "hijacked"}}}))
    cluster.kubectl("label", "pod", "drift-r0-0", "-n", ns, "meshplan.dev/role=edited", "--overwrite")
    _wait(lambda: (p := _get(cluster, ns, "pod", "drift-r0-1")) and p["metadata"]["uid"] != worker["metadata"]["uid"]
          and p.get("status", {}).get("phase") == "Running", 60, "worker pod back and running")
    _wait(lambda: _get(cluster, ns, "service", "drift"), 30, "client Service back")
    _wait(lambda: (_get(cluster, ns, "service", "drift-r0") or {}).get("spec", {}).get("selector", {}).get(
        "meshplan.dev/deployment") == "drift", 30, "headless Service selector restored")
    _wait(lambda: (_get(cluster, ns, "pod", "drift-r0-0") or {}).get("metadata", {}).get("labels", {}).get(
        "meshplan.dev/role") == "leader", 30, "leader label restored")
    _available(cluster, ns, "drift")


def _free_hgx_nodes(cluster) -> int:
    """HGX nodes with all 8 GPUs free (the e2e cluster may be shared with other suites)."""
    used: dict[str, int] = {}
    for p in json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]:
        node = p["spec"].get("nodeName") or p["metadata"].get("annotations", {}).get("meshplan.dev/assigned-node")
        if node and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                       for c in p["spec"]["containers"])
            used[node] = used.get(node, 0) + gpus
    return sum(1 for n, labels in _nodes(cluster).items()
               if labels.get("meshplan.dev/fleet") == "hgx-h100" and used.get(n, 0) == 0)


def test_insufficient_capacity_reports_numbers_and_recovers_when_gpus_free_up(cluster, ns):
    whole = _free_hgx_nodes(cluster)       # 4 on a fresh cluster
    assert whole >= 2, "this test needs two HGX nodes without GPU pods"
    # the blocker takes all whole nodes but one; "big" then needs two whole nodes
    blocker = _pinned("blocker", "hgx-h100", "NVIDIA-H100-80GB-HBM3", tensor=8, replicas=whole - 1, max_gpus=32)
    _apply(cluster, ns, blocker)
    _available(cluster, ns, "blocker")
    big = _pinned("big", "hgx-h100", "NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2, max_gpus=32)
    _apply(cluster, ns, big)
    obj = _wait(lambda: (o := _get(cluster, ns, "llmd", "big")) and _cond(o, "Planned").get("status") == "False"
                and o, 60, "big Planned=False")
    planned = _cond(obj, "Planned")
    assert planned["reason"] == "InsufficientCapacity"
    assert "needs 16 GPUs" in planned["message"], planned["message"]
    free = int(planned["message"].split(" are free")[0].rsplit(" ", 1)[1])
    assert free < 16 and "free GPUs per NVLink domain: hgx-h100-" in planned["message"], planned["message"]
    assert not [p for p in _pods(cluster, ns) if p["metadata"]["labels"]["meshplan.dev/deployment"] == "big"]
    cluster.kubectl("delete", "llmd", "blocker", "-n", ns, "--wait=true")
    obj = _available(cluster, ns, "big", timeout_s=90)
    assert obj["status"]["readyReplicas"] == 2
    assert _cond(obj, "Planned")["status"] == "True"


def test_model_change_rolls_groups_without_dropping_ready_replicas(cluster, ns):
    # (no servedName: it is immutable; the served name follows the model)
    m = _pinned("roll", "hgx-h100", "NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2, max_gpus=16)
    _apply(cluster, ns, m)
    before = _available(cluster, ns, "roll")
    old_hashes = {p["metadata"]["labels"]["meshplan.dev/plan-hash"] for p in _pods(cluster, ns)}
    m["spec"]["model"] = {"name": "llama-3.1-8b"}
    m["spec"]["parallelism"] = {"tensor": "auto", "pipeline": 1}
    _apply(cluster, ns, m)
    lowest = 99
    deadline = time.monotonic() + 150
    done = False
    while time.monotonic() < deadline:
        pods = _pods(cluster, ns)
        lowest = min(lowest, _ready_groups(pods))
        obj = _get(cluster, ns, "llmd", "roll")
        hashes = {p["metadata"]["labels"]["meshplan.dev/plan-hash"] for p in pods}
        if (obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
                and _cond(obj, "Available").get("status") == "True"
                and _cond(obj, "Progressing").get("status") == "False" and hashes.isdisjoint(old_hashes)):
            done = True
            break
        time.sleep(0.3)
    assert done, f"rollout did not finish: {obj['status']}"
    assert lowest >= before["status"]["readyReplicas"] == 2, f"ready replicas dropped to {lowest}"
    assert obj["status"]["plan"]["layout"] != before["status"]["plan"]["layout"] or \
        obj["status"]["plan"] != before["status"]["plan"]


def test_deleting_the_llmdeployment_removes_every_child(cluster, ns):
    m = _example("llama-3.1-8b-1gpu.yaml", "hgx-h100")
    m["metadata"]["name"] = "gone"
    _apply(cluster, ns, m)
    _available(cluster, ns, "gone")
    assert _pods(cluster, ns)
    obj = _get(cluster, ns, "llmd", "gone")
    assert not obj["metadata"].get("finalizers"), "no finalizer: deletion must not need the operator"
    cluster.kubectl("delete", "llmd", "gone", "-n", ns, "--wait=true", "--timeout=30s")
    _wait(lambda: not _pods(cluster, ns), 60, "pods garbage-collected")
    _wait(lambda: not json.loads(cluster.kubectl("get", "services", "-n", ns, "-l", "meshplan.dev/deployment=gone",
                                                 "-o", "json").stdout)["items"], 60, "Services garbage-collected")


def test_reconciles_of_an_unchanged_world_write_nothing(cluster, ns):
    m = _example("llama-3.1-8b-1gpu.yaml", "hgx-h100", replicas=2)
    m["spec"]["gpus"]["maxGpus"] = 2
    m["metadata"]["name"] = "still"
    _apply(cluster, ns, m)
    _available(cluster, ns, "still")
    time.sleep(2)       # let the last child events settle

    def versions():
        out = {}
        for kind in ("llmd", "pods", "services"):
            for o in json.loads(cluster.kubectl("get", kind, "-n", ns, "-o", "json").stdout)["items"]:
                out[(kind, o["metadata"]["name"])] = o["metadata"]["resourceVersion"]
        return out

    before = versions()
    # the runner resyncs every 5 s: at least two reconciles of "still" happen in this window
    time.sleep(12)
    assert versions() == before


def test_operator_restart_keeps_running_replicas_and_their_plan(cluster, ns, operator):
    m = _pinned("kept", "hgx-h100", "NVIDIA-H100-80GB-HBM3", tensor=4, replicas=2, max_gpus=8)
    m["spec"]["parallelism"]["tensor"] = "auto"        # the planner chooses; the restart must not re-choose
    _apply(cluster, ns, m)
    before = _available(cluster, ns, "kept")
    assert "meshplan.dev/plan" in before["metadata"]["annotations"]
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(cluster, ns)}
    operator.stop()
    operator.start()
    time.sleep(8)          # resume handler + a resync (5 s) have run
    after = _available(cluster, ns, "kept")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(cluster, ns)} == pods_before
    assert after["status"]["plan"] == before["status"]["plan"]
