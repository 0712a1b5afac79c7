"""`meshplan plan --nodes` / `render --nodes` on what `kubectl get nodes -o yaml` prints for the local cluster.

The dev cluster's GPU nodes are kwok nodes labelled as GFD labels them (meshplan.devcluster.fleets). To the
built-in fleets this file adds, for its own tests only (deleted afterwards), kwok nodes carrying label sets
copied from the vendors' documentation (tests/fixtures/nodes: AMD MI300X from the node labeller, an A100 in
MIG single mode): they go through the real API server (labels, the status subresource with `amd.com/gpu`),
and the plan must read them back from kubectl's output as the unit tests read the fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "nodes"
EXAMPLE = REPO / "examples" / "llama-3.1-70b-hgx-h100.yaml"
EXTRA = {"amd-mi300x.yaml": "e2e-plan-mi300x", "gfd-a100-mig-single-1g5gb.yaml": "e2e-plan-a100-mig"}
EXTRA_LABEL = "meshplan.dev/e2e-plan-nodes"


def meshplan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    return subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def extra_nodes(cluster):
    """The vendor label sets as kwok nodes (kwok makes them Ready); removed at the end of the module."""
    from meshplan.devcluster.fleets import KWOK_ANNOTATION

    made = []
    for fixture, name in EXTRA.items():
        node = yaml.safe_load((FIX / fixture).read_text())["items"][0]
        labels = {**node["metadata"]["labels"], "kubernetes.io/hostname": name, "type": "kwok", EXTRA_LABEL: "true"}
        obj = {"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}}, "spec": {}}
        cluster.kubectl("apply", "--server-side", "--field-manager=e2e-plan-nodes", "-f", "-", input=json.dumps(obj))
        made.append(name)
        res = {"cpu": "64", "memory": "512Gi", "pods": "110", **node["status"]["allocatable"]}
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"capacity": res, "allocatable": res}}))
    try:
        yield made
    finally:
        for name in made:
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def _ready(cluster, names) -> bool:
    """Ready, and the node lifecycle controller has lifted its `node.kubernetes.io/not-ready` taint (it lags the
    condition under load; the planner rightly skips a node that still carries it)."""
    items = json.loads(cluster.kubectl("get", "nodes", *names, "-o", "json").stdout)["items"]
    return all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
               and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints") or [])
               for n in items)


def _nodes_yaml(cluster, tmp_path, *args: str) -> Path:
    f = tmp_path / "nodes.yaml"
    f.write_text(cluster.kubectl("get", "nodes", *args, "-o", "yaml").stdout)
    return f


def test_plan_and_render_on_kubectl_get_nodes_of_the_local_cluster(cluster, tmp_path):
    nodes = _nodes_yaml(cluster, tmp_path)
    doc = yaml.safe_load(nodes.read_text())
    assert doc["kind"] == "List" and len(doc["items"]) >= 4
    offline = meshplan("plan", str(EXAMPLE), "--nodes", str(nodes), "-o", "json")
    assert offline.returncode == 0, offline.stderr
    got = json.loads(offline.stdout)
    assert got["choice"]["gpu"] == "h100_sxm"
    # the same Nodes read live through the API give the same plan (one topology builder)
    live = meshplan("plan", str(EXAMPLE), "--kubeconfig", str(cluster.kubeconfig), "-o", "json")
    assert live.returncode == 0, live.stderr
    assert json.loads(live.stdout)["choice"] == got["choice"]
    table = meshplan("plan", str(EXAMPLE), "--nodes", str(nodes))
    assert f"fleet {nodes}" in table.stdout and "model llama-3.1-70b on h100_sxm" in table.stdout

    rendered = meshplan("render", str(EXAMPLE), "--nodes", str(nodes), "-o", "json")
    assert rendered.returncode == 0, rendered.stderr
    objs = json.loads(rendered.stdout)["objects"]
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert pods
    h100_nodes = {n["metadata"]["name"] for n in doc["items"]
                  if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3"}
    for p in pods:
        assert p["metadata"]["annotations"]["meshplan.dev/assigned-node"] in h100_nodes
        assert set(p["spec"]["containers"][0]["resources"]["limits"]) - {"memory"} == {"nvidia.com/gpu"}
    # the rendered pods are what the API server accepts (server-side dry run, no scheduling)
    ns = "default"
    for p in pods[:2]:
        p = {**p, "metadata": {**p["metadata"], "namespace": ns, "ownerReferences": []}}
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(p))


def test_vendor_label_sets_through_the_api_server_plan_as_in_the_unit_tests(cluster, extra_nodes, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("operator_runner", Path(__file__).with_name("operator_runner.py"))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    wait_until = runner.wait_until
    assert wait_until(lambda: _ready(cluster, extra_nodes), 60, 1), "kwok did not make the extra nodes Ready"
    nodes = _nodes_yaml(cluster, tmp_path, "-l", EXTRA_LABEL)
    manifest = tmp_path / "llmd.yaml"

    def plan_on(hostname: str, max_gpus: int) -> subprocess.CompletedProcess:
        manifest.write_text(yaml.safe_dump({
            "apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "chat"},
            "spec": {"model": {"name": "llama-3.1-8b"}, "gpus": {"maxGpus": max_gpus,
                                                               "nodeSelector": {"kubernetes.io/hostname": hostname}},
                     "workload": {"inputTokens": 1024, "outputTokens": 256, "concurrency": 8}}}))
        return meshplan("plan", str(manifest), "--nodes", str(nodes), "-o", "json", "--show-rejected")

    amd = plan_on("e2e-plan-mi300x", 8)
    assert amd.returncode == 0, amd.stderr + amd.stdout[:1500]
    assert json.loads(amd.stdout)["choice"]["gpu"] == "mi300x"
    rendered = meshplan("render", str(manifest), "--nodes", str(nodes), "-o", "json")
    assert rendered.returncode == 0, rendered.stderr
    pods = [o for o in json.loads(rendered.stdout)["objects"] if o["kind"] == "Pod"]
    assert pods and all(set(p["spec"]["containers"][0]["resources"]["limits"]) - {"memory"} == {"amd.com/gpu"} for p in pods)

    mig = plan_on("e2e-plan-a100-mig", 7)
    assert mig.returncode == 1                       # Llama-3.1-8B fits no 1g.5gb slice; no TP/PP across slices
    doc = json.loads(mig.stdout)
    assert doc["choice"] is None and not doc["frontier"]
    assert "a100_sxm_40gb/mig-1g.5gb" in json.dumps(doc["search"])
    multi = [r for r in doc["rejected"] if r["tp"] * r["ep"] * r["pp"] > 1]
    assert multi and all("never part of a multi-GPU group" in r["reason"] or "memory" in r["reason"] for r in multi)
