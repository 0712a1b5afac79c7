"""Smoke tests of the local GPU cluster against the real API server and scheduler."""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from meshplan.devcluster.fleets import fleet_names, fleet_nodes, load_fleet


_runner_spec = importlib.util.spec_from_file_location("operator_runner", Path(__file__).with_name("operator_runner.py"))
_runner = importlib.util.module_from_spec(_runner_spec)
_runner_spec.loader.exec_module(_runner)
_wait = _runner.wait_until                     # (pred, timeout_s, interval_s): the truthy value, or the last falsy one


def _pod(name, gpus, node_selector=None):
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector or {},
            "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


@pytest.mark.parametrize("fleet", fleet_names())
def test_fleet_nodes_ready_with_gpus_and_labels(cluster, fleet):
    expected = {n["metadata"]["name"]: n for n in fleet_nodes(load_fleet(fleet))}
    got = json.loads(cluster.kubectl("get", "nodes", "-l", f"meshplan.dev/fleet={fleet}", "-o", "json").stdout)["items"]
    assert {n["metadata"]["name"] for n in got} == set(expected)
    for node in got:
        want = expected[node["metadata"]["name"]]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == want["status"]["allocatable"]["nvidia.com/gpu"]
        for res in ("rdma/ib", "rdma/roce_a", "nvidia.com/hostdev", "vpc.amazonaws.com/efa"):   # RDMA fleets
            assert node["status"]["allocatable"].get(res) == want["status"]["allocatable"].get(res), res
        for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory",
                    "topology.kubernetes.io/zone"):
            assert node["metadata"]["labels"][key] == want["metadata"]["labels"][key]
        assert (node["metadata"]["labels"].get("nvidia.com/gpu.clique")
                == want["metadata"]["labels"].get("nvidia.com/gpu.clique"))


def test_eight_gpu_pod_runs_on_an_eight_gpu_node(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(
        _pod("eight", 8, {"meshplan.dev/fleet": "hgx-h100"})))

    def running():
        p = json.loads(cluster.kubectl("get", "pod", "eight", "-n", namespace, "-o", "json").stdout)
        return p if p["status"].get("phase") == "Running" else None

    pod = _wait(running, 90)
    assert pod, "pod asking for 8 GPUs never reached Running"
    node = json.loads(cluster.kubectl("get", "node", pod["spec"]["nodeName"], "-o", "json").stdout)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_nine_gpu_pod_stays_pending_with_scheduler_reason(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_pod("nine", 9)))

    def unschedulable():
        p = json.loads(cluster.kubectl("get", "pod", "nine", "-n", namespace, "-o", "json").stdout)
        conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return (p, conds[0]) if conds and conds[0].get("reason") == "Unschedulable" else None

    got = _wait(unschedulable, 60)
    assert got, "scheduler never reported the 9-GPU pod Unschedulable"
    pod, cond = got
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert "Insufficient nvidia.com/gpu" in cond["message"]


def test_server_side_apply_with_field_manager(cluster, namespace):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": namespace},
          "data": {"a": "1"}}
    cluster.kubectl("apply", "--server-side", "--field-manager=meshplan", "-f", "-", input=json.dumps(cm))
    got = json.loads(cluster.kubectl("get", "configmap", "ssa", "-n", namespace, "-o", "json",
                                     "--show-managed-fields").stdout)
    managers = {m["manager"]: m for m in got["metadata"]["managedFields"]}
    assert "meshplan" in managers and managers["meshplan"]["operation"] == "Apply"
    # a second manager changing the same field conflicts unless it forces
    cm["data"]["a"] = "2"
    other = cluster.kubectl("apply", "--server-side", "--field-manager=someone-else", "-f", "-",
                            input=json.dumps(cm), check=False)
    assert other.returncode != 0 and "conflict" in other.stderr.lower()
    # the owner re-applying without the field gives it up (SSA's removal semantics)
    cluster.kubectl("apply", "--server-side", "--field-manager=meshplan", "-f", "-",
                    input=json.dumps({**cm, "data": {"b": "x"}}))
    got = json.loads(cluster.kubectl("get", "configmap", "ssa", "-n", namespace, "-o", "json").stdout)
    assert got["data"] == {"b": "x"}


def test_prometheus_scrapes_loopback_target_and_answers_histogram_quantile(cluster):
    from prometheus_client import CollectorRegistry, Histogram, start_http_server

    reg = CollectorRegistry()
    h = Histogram("smoke_latency_seconds", "smoke test latency", buckets=(0.1, 0.2, 0.5, 1.0, 2.0), registry=reg)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    port = server.server_address[1]
    stop = threading.Event()

    def feed():  # 90% of observations at 0.15 s, 10% at 1.5 s
        i = 0
        while not stop.is_set():
            h.observe(1.5 if i % 10 == 9 else 0.15)
            i += 1
            time.sleep(0.005)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    cluster.add_scrape_target("smoke", f"127.0.0.1:{port}", {"deployment": "smoke"})
    q = 'histogram_quantile(0.5, sum by (le) (rate(smoke_latency_seconds_bucket{deployment="smoke"}[5s])))'
    q99 = q.replace("0.5,", "0.99,")

    def query(expr):
        url = f"{cluster.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            res = json.load(r)["data"]["result"]
        return float(res[0]["value"][1]) if res else None

    try:
        p50 = _wait(lambda: (v := query(q)) is not None and not math.isnan(v) and v, 60)
        p99 = query(q99)
    finally:
        stop.set()
        cluster.remove_scrape_target("smoke")
        server.shutdown()
    # bucket-aware: the median lies in the (0.1, 0.2] bucket, p99 in (1.0, 2.0]
    assert p50 and 0.1 < p50 <= 0.2
    assert p99 and 1.0 < p99 <= 2.0
