"""Predicted against observed, end to end (issue 20, build 3): real control plane, real Prometheus,
`meshplan run` as a process, and a synthetic vLLM fleet whose latencies are k x the plan's prediction.

The fleet (`e2e/autoscale_fleet.py`, `scaled_prediction_model`) is a fake engine, the only one that
can run here at GPU speed: it stands for a real engine k times slower than the planner predicted.
(e2e/test_real_vllm.py checks the same on the real CPU vLLM server of the engine-conformance issue,
whose ratio to the prediction is whatever the load makes it, cross-checked against our own PromQL.)

Asserted:
- status.observed shows the fleet's percentiles (p50 ~ k x predicted ITL/TTFT) next to the plan's
  predictions, and tokens/s per GPU and per user;
- PredictionDrift=True (ObservedSlowerThanPredicted) with the numbers;
- the correction factor reaches k (within 10 %: the histogram's 5 % buckets) within
  `drift.evaluations_to_converge(k)` (+1) evaluations and stays there;
- the autoscaler sizes with it: status.observed.capacityRps ~ predictedCapacityRps / k, and the
  decision's message quotes that per-replica capacity.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from meshplan.autoscale import drift


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


operator_runner = _load("operator_runner")
fleet_mod = _load("autoscale_fleet")

NS_GLOB = "mp-dr-*"
K = 4.0                   # the fleet runs 4x slower than predicted
OUTPUT_TOKENS = 128


@pytest.fixture(scope="module")
def operator(cluster, operator_kubeconfig, request):
    yield from operator_runner.serve(cluster, operator_kubeconfig, request, NS_GLOB,
                                     "--prometheus-url", cluster.prometheus_url, tail_lines=200)


@pytest.fixture
def ns(cluster, operator, request):
    name = "mp-dr-" + hashlib.sha1((request.node.nodeid + str(os.getpid())).encode()).hexdigest()[:8]
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "llmd", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _get(cluster, ns: str, name: str) -> dict[str, Any]:
    r = cluster.kubectl("get", "llmd", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def _wait(pred, timeout_s: float, what: str, show=lambda: None):
    v = operator_runner.wait_until(pred, timeout_s)
    if not v:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {json.dumps(show())[:3000]}")
    return v


def _manifest(name: str) -> dict[str, Any]:
    """Llama-3.1-70B FP8, TP4 on GB200; an SLO loose enough that k x the prediction still meets it,
    so only the correction (not a latency breach) changes what the autoscaler sizes with."""
    return {
        "apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name},
        "spec": {
            "model": {"name": "llama-3.1-70b"}, "precision": {"weights": "fp8"}, "engine": {"kind": "vllm"},
            "workload": {"inputTokens": 1024, "outputTokens": OUTPUT_TOKENS},
            "slo": {"ttftMs": 600000, "itlMs": 60000, "percentile": 99},
            "objective": "maxThroughput",
            "parallelism": {"tensor": 4},
            "gpus": {"products": ["NVIDIA-GB200"], "maxGpus": 64, "nodeSelector": {"meshplan.dev/fleet": "gb200-nvl72"}},
            "replicas": 1,
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2, "upWindowSeconds": 10,
                            "downWindowSeconds": 600, "cooldownSeconds": 600},
        },
    }


def test_drift_fires_and_the_correction_converges_and_sizes_capacity(cluster, operator, ns):
    name = "drift"
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_manifest(name)))
    obj = _wait(lambda: (lambda o: o if ((o.get("status") or {}).get("plan") or {}).get("predicted") else None)(
        _get(cluster, ns, name)), 90, "a plan with predictions", lambda: _get(cluster, ns, name).get("status"))
    predicted = obj["status"]["plan"]["predicted"]
    model = fleet_mod.scaled_prediction_model(predicted, K, OUTPUT_TOKENS)
    fleet = fleet_mod.FollowingFleet(cluster, ns, name, rps=0.5, model=model,
                                     ttft_target_s=K * predicted.get("ttftP50Ms", predicted["ttftMs"]) / 1000.0,
                                     itl_target_s=K * predicted["itlMs"] / 1000.0).start()
    history: list[tuple[int, float]] = []
    try:
        def drifted():
            o = _get(cluster, ns, name)
            obs = (o.get("status") or {}).get("observed") or {}
            if obs.get("correctionEvaluations"):
                history.append((obs["correctionEvaluations"], obs["itlCorrection"]))
            c = _cond(o, "PredictionDrift")
            return o if c.get("status") == "True" and obs.get("correctionEvaluations", 0) >= bound + 2 else None

        bound = drift.evaluations_to_converge(K, 0.05)
        assert bound == 5
        o = _wait(drifted, 240, f"PredictionDrift=True and {bound + 2} correction evaluations",
                  lambda: {"ready": fleet.ready_replicas, "status": _get(cluster, ns, name).get("status")})
        # keep watching a little: the factor stays converged
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            o2 = _get(cluster, ns, name)
            obs2 = (o2.get("status") or {}).get("observed") or {}
            if obs2.get("correctionEvaluations"):
                history.append((obs2["correctionEvaluations"], obs2["itlCorrection"]))
                o = o2
            time.sleep(0.5)
        def quoted():
            reason = ((_get(cluster, ns, name).get("status") or {}).get("autoscaling") or {}).get("reason", "")
            m = re.search(r"([0-9.eE+-]+) req/s per replica at SLO", reason)
            return float(m.group(1)) if m else None

        per = _wait(quoted, 60, "the autoscaler's decision quoting its per-replica capacity",
                    lambda: (_get(cluster, ns, name).get("status") or {}).get("autoscaling"))
    finally:
        fleet.stop()

    cond = _cond(o, "PredictionDrift")
    print(f"\ndrift e2e: predicted {predicted}; observed {o['status'].get('observed')}; history "
          f"{sorted(set(history))}; quoted capacity {per}")
    assert cond["reason"] == "ObservedSlowerThanPredicted", cond
    assert "observed/predicted: ITL x" in cond["message"], cond
    obs = o["status"]["observed"]
    # the fleet's real percentiles, read from Prometheus, next to the plan's predictions
    assert obs["predictedItlMs"] == pytest.approx(predicted["itlMs"], rel=0.01)
    assert obs["itlP50Ms"] == pytest.approx(K * predicted["itlMs"], rel=0.10), obs
    # the observed p50 TTFT is compared with the plan's steady-state median (ttftP50Ms)
    assert "ttftP50Ms" in predicted and obs["predictedTtftMs"] == pytest.approx(predicted["ttftP50Ms"], abs=0.1)
    assert obs["ttftP50Ms"] == pytest.approx(K * predicted["ttftP50Ms"], rel=0.10), obs
    assert obs["itlP99Ms"] >= obs["itlP50Ms"] and obs["ttftP99Ms"] >= obs["ttftP50Ms"]
    assert obs["percentile"] == 99 and obs["itlMs"] == pytest.approx(obs["itlP99Ms"], rel=0.01)
    assert obs["tokensPerSecondPerUser"] == pytest.approx(1000.0 / obs["itlP50Ms"], rel=0.02)
    assert obs["tokensPerSecondPerGpu"] > 0
    # converged within the bound, and stayed
    seen = sorted(set(history))
    late = [(n, f) for n, f in seen if n >= bound + 1]
    assert late, seen
    assert all(abs(f / K - 1.0) <= 0.10 for _, f in late), seen
    assert obs["itlCorrection"] == pytest.approx(K, rel=0.10) and obs["ttftCorrection"] == pytest.approx(K, rel=0.10)
    # the autoscaler's per-replica capacity uses it
    assert obs["capacityRps"] == pytest.approx(obs["predictedCapacityRps"] / K, rel=0.12), obs
    assert per == pytest.approx(obs["predictedCapacityRps"] / K, rel=0.12), (per, obs)
