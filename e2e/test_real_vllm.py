"""A real vLLM in the loop: the rendered pod's argv serves, Prometheus scrapes it, the autoscaler scales on it.

Issue 15, Build item 3. What is real and what stands in:

- The LLMDeployment is examples/llama-3.1-8b-1gpu.yaml with autoscaling on (short windows) and
  `gpus.maxGpus: 3` (the example's 1 is the deployment's GPU ceiling, all replicas together, so it
  would cap autoscaling at one replica). The operator plans, places and renders it as always. On a CPU
  without AVX-512 or AMX (an AVX2-only EPYC) `spec.precision.kvCache` is pinned to bf16 before it is
  applied: vLLM's CPU attention refuses the FP8 KV cache the planner picks for an H100
  (`real_vllm.cpu_precision`, vLLM's own test asked of the engine venv's torch).
- The leader pod of replica 0 is read back from the API server and its engine container's
  command + args run as a real `vllm serve` (vLLM 0.32.0, the CPU build from the package index, engine
  venv `vllm-0.32.0`). Only what a CPU machine forces is changed, and the test asserts the diff is
  exactly that list (`real_vllm.cpu_launch`): the model becomes a config-only tiny Llama directory
  (the real Llama-3.1-8B config.json, sizes shrunk, a tokenizer trained here), `--load-format dummy`,
  host/port, VLLM_CPU_KVCACHE_SPACE and the offline switches. Nothing downloads.
- Its /metrics is scraped by a real Prometheus through the relabelling of the chart's engine
  PodMonitor: `helm template` renders charts/meshplan/templates/podmonitor-engines.yaml, the
  PodMonitor becomes the scrape config the Prometheus Operator generates for it, and the target's
  `__meta_kubernetes_*` labels are built from the pod object as Prometheus' pod discovery builds
  them (file SD stands in for pod SD: no kubelet runs pods here). So the series carry the labels
  they carry in production (namespace, meshplan_dev_deployment, pod, container, endpoint, job).
- Load comes from a real load generator, `vllm bench serve` (same venv).
- Only one real server fits two CPU cores: replicas 1..N-1 that the autoscaler adds are kwok pods
  (scheduled, Running and Ready, running nothing) and export no metrics. The autoscaler's queries sum
  over the deployment's pods, so what it reads is the real server's series: its TTFT/ITL histograms,
  request counter, running/waiting gauges and KV usage. The extra replicas do not take load (the
  load generator talks to the real server), so latency falls only when the load stops; the test
  shows the decision chain up on real latency under load, and down after it.
  The policy's scale-up also counts the queued requests against the planner's per-replica capacity
  (an H100's, far above this CPU's); the test asserts the latency ratio alone is above the threshold.
- SLO thresholds: the spec's SLO stays the example's (TTFT 500 ms, ITL 30 ms at p99, which the plan
  was made for). The autoscaling thresholds (ratios to that SLO) are set from a measured baseline:
  the autoscaler's own observed ratios while the server serves one request at a time, and the load
  generator's p99 of the same run, as ratios to the SLO; up = 3x the larger baseline ratio (at most 10, the API's bound), down = half of up. During the baseline the
  thresholds are parked at up 10 / down 0.1, so nothing scales before they are chosen.

Predicted against observed on the same run (issue 20, Done when; `check_observed_and_drift`): a
`kubectl get --watch` (e2e/reliability/kit.py `Watch`) records every status write, so every correction
evaluation is seen. The load stays on until both correction factors have reached the load's
observed/predicted ratio (about a rate window, 30 s, longer than before), then:
- status.observed is the real server's: TTFT/ITL at the SLO percentile and p50/p99 and tokens/s per GPU
  agree (within 10 %) with our own `histogram_quantile` / `rate` over the same Prometheus at the
  evaluation's second (status.observed.time, whole seconds) and the next; tokens/s per user is 1 / ITL p50;
  the predictions beside them are status.plan.predicted;
- every evaluation moves each factor from its previous value toward that evaluation's observed p50 /
  predicted, never past it (the EWMA in log space: 0.01 slack for the status' rounding);
- each factor converges (within 10 % of its evaluation's target) within the bound stated in
  `convergence` (evaluations_to_converge from the factor before the load's ratio settled, + 1; at most 8)
  and the load's TTFT ratio is far above the 1.5x threshold (a CPU engine against a GB200 plan);
- PredictionDrift turned True / ObservedSlowerThanPredicted, its message's factors those of the
  evaluation it names;
- the autoscaler's per-replica capacity is the corrected one: status.observed.capacityRps is Little's law
  over the corrected latencies (predictedCapacityRps x (TTFT + out x ITL) / (fT TTFT + out x fI ITL)), far
  below the predicted, and each decision's message quotes it (or the policy's learned capacity when lower).
The drift is evaluated with every autoscaler evaluation (upWindowSeconds / 4 = 2.5 s here), so no setting
had to be added to make it fast enough for e2e.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from e2e.reliability.kit import Watch
from meshplan.autoscale import drift
from meshplan.controller.autoscaling import rate_window_s

REPO = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


operator_runner = _load("operator_runner")
chart_credentials = _load("chart_credentials")
rv = _load("real_vllm")

NS = f"mp-real-{hashlib.sha1(str(os.getpid()).encode()).hexdigest()[:6]}"
NAME = "llama-8b"
UP_WINDOW_S, DOWN_WINDOW_S, COOLDOWN_S = 10, 20, 10
MAX_REPLICAS = 3
CAPTURE_ENV = "MESHPLAN_CAPTURE_VLLM_METRICS"   # path: write the server's /metrics after the load
# The autoscaler's rate/quantile window for UP_WINDOW_S (controller.autoscaling.rate_window_s: 2 x the up
# window within [30 s, 2 m]); status.observed's percentiles are over it, so is the PromQL cross-check.
RATE_WINDOW_S = int(rate_window_s(UP_WINDOW_S))
CONVERGED = 0.10           # "converged": the factor within 10 % of its evaluation's observed/predicted
PROMQL_TOLERANCE = 0.10    # status.observed against our own PromQL at the evaluation's second (and the next)


def manifest(up: float, down: float) -> dict[str, Any]:
    m = yaml.safe_load((REPO / "examples" / "llama-3.1-8b-1gpu.yaml").read_text())
    rv.cpu_precision(m)          # the one CPU-forced change to the spec (none where vLLM's CPU build takes fp8 KV)
    m["spec"]["gpus"]["maxGpus"] = MAX_REPLICAS
    m["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
                                "upWindowSeconds": UP_WINDOW_S, "downWindowSeconds": DOWN_WINDOW_S,
                                "cooldownSeconds": COOLDOWN_S, "upThreshold": up, "downThreshold": down,
                                "maxStepDown": MAX_REPLICAS}
    return m


def podmonitor(cluster) -> dict[str, Any]:
    """The chart's engine PodMonitor as `helm template` renders it (chart defaults, PodMonitor enabled)."""
    text = chart_credentials.render(cluster, ["templates/podmonitor-engines.yaml"], "meshplan-system",
                                    values={"engineMetrics.podMonitor.enabled": True})
    # the chart renders one PodMonitor for the engines serving /metrics and one for NIM's /v1/metrics
    (doc,) = [d for d in yaml.safe_load_all(text) if d and d["metadata"]["name"].endswith("-engines")]
    return doc


def selects_namespace(doc: dict[str, Any], namespace: str) -> bool:
    sel = doc["spec"].get("namespaceSelector") or {}
    return bool(sel.get("any")) or namespace in (sel.get("matchNames") or [])


@pytest.fixture(scope="module")
def engine_python():
    try:
        return rv.engine_python()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def pm(cluster):
    return podmonitor(cluster)


@pytest.fixture(scope="module")
def prom(pm):
    p = rv.RelabelPrometheus(rv.podmonitor_scrape_config(pm)).start()
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module")
def operator(cluster, operator_kubeconfig, prom, request):
    # `kubectl wait` right after the CRD is created can fail with "<nil> is of the type <nil>" (the
    # CRD has no status.conditions yet): apply and wait for Established here first, by polling.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    established = operator_runner.wait_until(lambda: "True" in cluster.kubectl(
        "get", "crd", "llmdeployments.meshplan.dev", "-o",
        "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False).stdout, 60)
    assert established, "the LLMDeployment CRD never became Established"
    yield from operator_runner.serve(cluster, operator_kubeconfig, request, "mp-real-*",
                                     "--prometheus-url", prom.url, tail_lines=200)


@pytest.fixture
def procs():
    """Every process the test starts, stopped in reverse order whatever happens."""
    started: list = []
    yield started
    for p in reversed(started):
        p.stop()


def _get(cluster, kind: str, name: str) -> dict[str, Any]:
    r = cluster.kubectl("get", kind, name, "-n", NS, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def _auto(o: dict[str, Any]) -> dict[str, Any]:
    return (o.get("status") or {}).get("autoscaling") or {}


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, show: Callable[[], Any] = lambda: None) -> Any:
    v = operator_runner.wait_until(pred, timeout_s, interval_s=1.0)
    if not v:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {json.dumps(show())[:3000]}")
    return v


def _first_write(watch, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The first version of the object the watch saw for which `pred` holds."""
    return next((o for _, o in watch.snapshot() if pred(o)), None)


def _pods(cluster) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "pods", "-n", NS, "-l", f"meshplan.dev/deployment={NAME}", "-o", "json")
    return json.loads(r.stdout)["items"]


def _ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])


def _log_dist(a: float, b: float) -> float:
    return abs(math.log(a) - math.log(b))


SETTLED_EVALUATIONS = 3    # evaluations with a rate window full of load that give the load's steady ratio


def _tracks(e, prev, kind: str) -> bool:
    """The factor is within CONVERGED of its evaluation's target, plus that evaluation's own move of the
    target: a real engine's ratio keeps moving (the queue builds, the shared CPUs' speed varies), and any
    average lags a moving target by about its move (with weight 1/2 the log distance after an evaluation
    is half of the distance before plus the target's move)."""
    r = getattr(e, f"{kind}_target")
    r0 = getattr(prev, f"{kind}_target", None) if prev is not None else None
    move = _log_dist(r, r0) if r0 else 0.0
    return _log_dist(getattr(e, kind), r) <= math.log1p(CONVERGED) + move


def convergence(evs: list, t_load: float, t_full: float) -> dict[str, Any]:
    """Where each correction factor reached the load's observed/predicted ratio, and its bound.

    The load's steady ratio per factor, `steady`: the median target (p50 / predicted) of the evaluations
    whose rate window holds only load (evaluation time >= t_full), once SETTLED_EVALUATIONS exist.
    `first`: the first evaluation under load (time >= t_load) whose target is within CONVERGED of
    `steady` (the observed ratio itself steps up over a few evaluations: the queue builds). `bound`:
    what `update_correction`'s geometric approach needs from the factor before `first` to `first`'s
    target (`drift.evaluations_to_converge`, within CONVERGED), + 1 evaluation for the target's own
    noise under a real load; at most evaluations_to_converge(MAX/MIN factor) + 1 = 8 for any step.
    `at`: the first evaluation from `first` on whose factor tracks its target (`_tracks`).
    """
    lim = math.log1p(CONVERGED)
    out: dict[str, Any] = {"converged": False, "steady": {}, "first": {}, "at": {}, "bound": {}, "took": {}}
    full = [e for e in evs if e.time >= t_full and e.itl_target and e.ttft_target]
    if len(full) < SETTLED_EVALUATIONS:
        return out
    by_n = {e.n: e for e in evs}
    for kind in ("itl", "ttft"):
        steady = sorted(getattr(e, f"{kind}_target") for e in full)[len(full) // 2]
        load = [e for e in evs if e.time >= t_load and getattr(e, f"{kind}_target")]
        first = next((e for e in load if _log_dist(getattr(e, f"{kind}_target"), steady) <= lim), None)
        if first is None:
            return out
        before = [e for e in evs if e.n < first.n]
        f0 = getattr(before[-1], kind) if before else 1.0
        bound = drift.evaluations_to_converge(getattr(first, f"{kind}_target") / f0, CONVERGED) + 1
        at = next((e for e in load if e.n >= first.n and _tracks(e, by_n.get(e.n - 1), kind)), None)
        if at is None:
            return out
        out["steady"][kind], out["first"][kind], out["at"][kind], out["bound"][kind] = steady, first, at, bound
        out["took"][kind] = at.n - first.n + 1
    out["converged"] = True
    out["last"] = full[-1]
    return out


def _cond(o: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (o.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def check_observed_and_drift(cluster, prom, watch, conv: dict[str, Any], t_load_wall: float,
                             mark: Callable[[str], None]) -> None:
    """Issue 20's Done-when on the real server: status.observed is its real percentiles (checked against
    our own PromQL over the same Prometheus), PredictionDrift fired with its numbers, the correction moved
    toward observed/predicted every evaluation and converged within its bound, and the autoscaler's
    per-replica capacity is the corrected one."""
    objects = watch.snapshot()
    evs = rv.evaluations(objects)
    print("[real-vllm] correction by evaluation (n, t s after the load reached the server: ITL x (target), "
          "TTFT x (target)): " + "; ".join(
              f"{e.n} @{e.time - t_load_wall:+.0f}s: {e.itl:.3g} ({e.itl_target or float('nan'):.3g}), "
              f"{e.ttft:.3g} ({e.ttft_target or float('nan'):.3g})" for e in evs))

    # -- converged within the stated bound, to the load's ratio, which is far off the prediction
    for kind in ("itl", "ttft"):
        at = conv["at"][kind]
        assert conv["took"][kind] <= conv["bound"][kind] <= 8, (kind, conv)
        assert _tracks(at, {e.n: e for e in evs}.get(at.n - 1), kind), (kind, at)
    assert conv["steady"]["ttft"] > 1.0 + drift.DRIFT_THRESHOLD, conv     # a CPU engine under load: slower
    at = conv["last"]               # the newest evaluation of a window full of load: for the checks below

    # -- every evaluation moves each factor toward that evaluation's observed/predicted (never past it)
    by_n = {e.n: e for e in evs}
    pairs = [(by_n[n - 1], e) for n, e in by_n.items() if n - 1 in by_n]
    slack = 0.01                      # the status' rounding (factors to 4 decimals, p50 to 0.01 ms)
    for a, b in pairs:
        for kind in ("itl", "ttft"):
            f0, f1, r = getattr(a, kind), getattr(b, kind), getattr(b, f"{kind}_target")
            if r is None:
                assert _log_dist(f0, f1) <= slack, (kind, a, b)          # nothing observed: unchanged
                continue
            lo, hi = sorted((math.log(f0), math.log(r)))
            assert lo - slack <= math.log(f1) <= hi + slack, (kind, f0, f1, r, a.n, b.n)
            assert _log_dist(f1, r) <= _log_dist(f0, r) + slack, (kind, f0, f1, r)
    load_pairs = [p for p in pairs if p[1].time >= t_load_wall]
    assert len(pairs) >= 6 and len(load_pairs) >= 4, [(a.n, b.n) for a, b in pairs]

    # -- status.observed is the server's real percentiles: our own PromQL over the same Prometheus
    obs, o = at.observed, at.obj
    w = f"{RATE_WINDOW_S}s"
    sel = f'namespace="{NS}",meshplan_dev_deployment="{NAME}"'
    plan = o["status"]["plan"]
    gpus = o["status"]["readyReplicas"] * plan["gpusPerReplica"]
    queries = {
        "itlP50Ms": (f"histogram_quantile(0.5, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{{sel}}}[{w}])))", 1000.0),
        "itlP99Ms": (f"histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{{sel}}}[{w}])))", 1000.0),
        "ttftP50Ms": (f"histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[{w}])))", 1000.0),
        "ttftP99Ms": (f"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[{w}])))", 1000.0),
        "tokensPerSecondPerGpu": (f"sum(rate(vllm:generation_tokens_total{{{sel}}}[{w}]))", 1.0 / gpus),
    }
    assert obs["percentile"] == 99                       # the SLO's: itlMs / ttftMs are the p99 again
    queries["itlMs"], queries["ttftMs"] = queries["itlP99Ms"], queries["ttftP99Ms"]
    checked = {}
    for field_, (q, scale) in queries.items():
        vals = [float(r[0]["value"][1]) * scale for r in (prom.query(q, at=at.time + d) for d in (0, 1)) if r]
        assert vals and all(math.isfinite(v) for v in vals), (field_, q, vals)
        lo, hi = min(vals) / (1 + PROMQL_TOLERANCE), max(vals) * (1 + PROMQL_TOLERANCE)
        assert lo <= obs[field_] <= hi, (field_, obs[field_], vals, q)
        checked[field_] = (obs[field_], [round(v, 2) for v in vals])
    assert obs["tokensPerSecondPerUser"] == pytest.approx(1000.0 / obs["itlP50Ms"], rel=0.01), obs
    assert obs["itlP99Ms"] >= obs["itlP50Ms"] and obs["ttftP99Ms"] >= obs["ttftP50Ms"]
    mark(f"status.observed at evaluation {at.n} against PromQL at its second (and the next): {checked}; "
         f"tokens/s per user {obs['tokensPerSecondPerUser']} (1 / ITL p50)")

    # -- next to the plan's predictions; the factors' targets are exactly observed p50 / those
    pred = plan["predicted"]
    assert obs["predictedItlMs"] == pytest.approx(pred["itlMs"], abs=0.01)
    # the observed p50 TTFT is compared with the plan's steady-state median TTFT (ttftP50Ms)
    assert obs["predictedTtftMs"] == pytest.approx(pred["ttftP50Ms"], abs=0.1)
    assert obs["predictedTokensPerSecondPerGpu"] == pytest.approx(pred["tokensPerSecondPerGpu"], abs=0.01)
    mark(f"predicted (status.plan.predicted, layout {plan.get('layout')}): TTFT {pred['ttftMs']} ms (median "
         f"{pred['ttftP50Ms']} ms), ITL "
         f"{pred['itlMs']} ms, {pred['tokensPerSecondPerGpu']} tokens/s per GPU; observed p50 TTFT "
         f"{obs['ttftP50Ms']} ms, ITL {obs['itlP50Ms']} ms, {obs['tokensPerSecondPerGpu']} tokens/s per GPU")

    # -- PredictionDrift turned True, slower than predicted, with the numbers of an evaluation seen
    drifts = [(t, _cond(x, drift.COND_PREDICTION_DRIFT)) for t, x in objects]
    slow = [(t, c) for t, c in drifts if c.get("status") == "True" and c.get("reason") == "ObservedSlowerThanPredicted"]
    assert slow, sorted({(c.get("status"), c.get("reason")) for _, c in drifts})
    assert drifts[0][1].get("status") != "True" or drifts[0][1].get("reason") != "ObservedSlowerThanPredicted"
    t_drift, c = slow[-1]
    m = re.search(r"observed/predicted: ITL x([0-9.e+-]+), TTFT x([0-9.e+-]+) over (\d+) evaluation", c["message"])
    assert m, c
    e = by_n.get(int(m.group(3)))
    assert e is not None, (c, sorted(by_n))
    assert float(m.group(1)) == pytest.approx(e.itl, rel=0.01) and float(m.group(2)) == pytest.approx(e.ttft, rel=0.01)
    assert max(e.itl, e.ttft) > 1.0 + drift.DRIFT_THRESHOLD
    steps = [(t, (x.get("status"), x.get("reason"))) for t, x in drifts]
    changes = [f"{st}/{r} @{t - t_load_wall:+.0f}s" for i, (t, (st, r)) in enumerate(steps)
               if i == 0 or steps[i - 1][1] != (st, r)]
    mark(f"PredictionDrift over time (s after the load reached the server): {', '.join(changes)}; last: {c['message']}")

    # -- the autoscaler's per-replica capacity is the corrected one: Little's law over the corrected
    # latencies (status.observed.capacityRps), and the decision's message quotes it (or the policy's
    # learned capacity, whichever is lower: policy._per_replica_rps)
    out_tokens = manifest(1, 0.5)["spec"]["workload"]["outputTokens"]
    quoted = []
    for ev in [x for x in evs if x.time >= t_load_wall]:
        ob = ev.observed
        service = pred["ttftMs"] + out_tokens * pred["itlMs"]
        corrected = ev.ttft * pred["ttftMs"] + out_tokens * ev.itl * pred["itlMs"]
        assert ob["capacityRps"] == pytest.approx(ob["predictedCapacityRps"] * service / corrected, rel=0.01), ob
        a = _auto(ev.obj)
        q = re.search(r"([0-9.eE+-]+) req/s per replica at SLO", a.get("reason", ""))
        if q:
            learned = a.get("learnedCapacityRps")
            expect = min(ob["capacityRps"], learned) if isinstance(learned, (int, float)) else ob["capacityRps"]
            assert float(q.group(1)) == pytest.approx(expect, rel=0.01), (q.group(1), ob, a)
            quoted.append((ev.n, float(q.group(1)), ob["capacityRps"], learned))
    assert quoted, [(_auto(x.obj).get("reason") or "")[:200] for x in evs[-5:]]
    # ... and before the policy learned a capacity of its own, the corrected figure itself, already below the
    # plan's (how far below depends on how many evaluations ran before the first breach taught the policy one:
    # a loaded machine gives fewer; the corrected figure's own convergence is asserted just below)
    assert any(lr is None and q == pytest.approx(c, rel=0.01) and c < at.observed["predictedCapacityRps"]
               for _, q, c, lr in quoted), quoted
    assert at.observed["capacityRps"] < at.observed["predictedCapacityRps"] / (1 + drift.DRIFT_THRESHOLD), at.observed
    mark(f"capacity per replica: predicted {at.observed['predictedCapacityRps']} req/s, corrected "
         f"{at.observed['capacityRps']} req/s; the decisions quote (n, quoted, corrected, learned) {quoted[:2] + quoted[-2:]}")


def test_real_vllm_serves_is_scraped_with_podmonitor_labels_and_is_autoscaled(
        cluster, operator, prom, pm, engine_python, procs, tmp_path):
    t0 = time.monotonic()
    marks: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        marks.append((what, time.monotonic() - t0))
        print(f"[real-vllm] {time.monotonic() - t0:6.1f}s {what}", flush=True)

    cluster.kubectl("create", "namespace", NS)
    try:
        cluster.kubectl("create", "secret", "generic", "hf-token", "-n", NS,
                        "--from-literal=token=hf_e2e_not_a_real_token")
        cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(manifest(up=10.0, down=0.1)))
        watch = Watch(cluster, NS, "llmd", NAME).start()      # every status write, for the drift checks
        procs.append(watch)
        model_dir = rv.tiny_model_dir()
        cfg = rv.write_tiny_model(model_dir)
        mark(f"tiny model written ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
             f"vocab {cfg['vocab_size']})")

        leader = _wait(lambda: next((p for p in _pods(cluster) if p["metadata"]["labels"].get("meshplan.dev/role")
                                     == "leader" and p["metadata"]["labels"].get("meshplan.dev/replica") == "0"
                                     and _ready(p)), None),
                       120, "the leader pod of replica 0, Ready", lambda: _get(cluster, "llmd", NAME).get("status"))
        mark(f"leader pod {leader['metadata']['name']} Ready on {leader['spec'].get('nodeName')}")
        (c,) = [c for c in leader["spec"]["containers"] if c["name"] == "engine"]
        rendered = c["command"] + c["args"]
        print(f"[real-vllm] rendered argv: {rendered}")
        assert "--tensor-parallel-size" in rendered and rendered[rendered.index("--tensor-parallel-size") + 1] == "1"
        # the plan's KV dtype, as rendered: the planner's fp8 where this CPU's vLLM takes it, else the pinned bf16
        # (the model's dtype: no --kv-cache-dtype flag)
        kv = rendered[rendered.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in rendered else "auto"
        assert kv == ("fp8" if rv.cpu_runs_fp8_kv() else "auto"), rendered

        port = rv.free_port()
        launch = rv.cpu_launch(leader, model_dir, port, {("hf-token", "token"): "hf_e2e_not_a_real_token"})
        # The diff between the pod's container and what runs is exactly what a CPU machine forces.
        served = rendered[rendered.index("--served-model-name") + 1]
        assert launch.changes == [
            f"model {rendered[2]} -> {model_dir}",
            "--host 0.0.0.0 -> 127.0.0.1",
            f"--port 8000 -> {port}",
            "+ --load-format dummy",
            "+ env VLLM_CPU_KVCACHE_SPACE=1",
            "+ env HF_HUB_OFFLINE=1",
            "+ env VLLM_NO_USAGE_STATS=1",
            "+ env DO_NOT_TRACK=1",
            "env PATH: the engine venv's bin first",
        ], launch.changes
        changed = {2, rendered.index("--host") + 1, rendered.index("--port") + 1}
        assert [a for i, a in enumerate(launch.argv) if i not in changed] == \
            [a for i, a in enumerate(rendered) if i not in changed] + ["--load-format", "dummy"]

        server = rv.RealVllm(launch, tmp_path / "vllm.log").start()
        procs.append(server)
        # Prometheus: the pod's discovery labels, through the PodMonitor's relabelling.
        assert selects_namespace(pm, NS)
        prom.register(leader["metadata"]["name"], f"127.0.0.1:{port}",
                      rv.pod_sd_labels(leader, "engine", pm["spec"]["podMetricsEndpoints"][0]["port"]))
        up_s = server.wait_healthy(400)
        mark(f"vllm serve healthy after {up_s:.0f}s")
        t_req = time.monotonic()
        out = server.complete(served, "The operator plans a layout for", max_tokens=16)
        mark(f"/v1/completions: {out['usage']} in {time.monotonic() - t_req:.2f}s")
        assert out["model"] == served and out["usage"]["completion_tokens"] == 16 and out["choices"][0]["text"]

        series = _wait(lambda: prom.query(f'vllm:request_success_total{{namespace="{NS}"}}'), 30,
                       "the real server's series in Prometheus", prom.targets_api)
        labels = series[0]["metric"]
        print(f"[real-vllm] series labels in Prometheus: {labels}")
        assert labels["namespace"] == NS and labels["meshplan_dev_deployment"] == NAME
        assert labels["pod"] == leader["metadata"]["name"] and labels["container"] == "engine"
        assert labels["endpoint"] == "http"
        assert labels["job"] == f"{pm['metadata']['namespace']}/{pm['metadata']['name']}"
        assert labels["model_name"] == served
        assert not [k for k in labels if k.startswith("__meta")]

        # Baseline: one request at a time, read by the autoscaler itself.
        bench_dir = tmp_path / "bench"
        bench_dir.mkdir()
        base = rv.Bench(server, served, model_dir, bench_dir, input_len=128, output_len=32, num_prompts=12,
                        request_rate="inf", max_concurrency=1, label="baseline").start()
        procs.append(base)
        ratios: list[tuple[float, float]] = []

        def sample_ratios():
            a = _auto(_get(cluster, "llmd", NAME))
            if a.get("ttftRatio") is not None and a.get("itlRatio") is not None and (a.get("requestRate") or 0) > 0:
                ratios.append((a["ttftRatio"], a["itlRatio"]))
            return not base.running() and ratios
        _wait(sample_ratios, 120, "the baseline run with the autoscaler's ratios",
              lambda: _auto(_get(cluster, "llmd", NAME)))
        base_res = base.wait(30)
        # p99 of a dozen requests is noisy: the baseline is the larger of the autoscaler's readings and the
        # load generator's own p99 (client side), each as a ratio to the SLO.
        slo = manifest(1, 0.5)["spec"]["slo"]
        r_ttft = max([r for r, _ in ratios] + [base_res["p99_ttft_ms"] / slo["ttftMs"]])
        r_itl = max([r for _, r in ratios] + [base_res["p99_itl_ms"] / slo["itlMs"]])
        up = round(min(10.0, 3 * max(r_ttft, r_itl, 0.05)), 3)
        down = round(up / 2, 3)
        mark(f"baseline: bench p99 TTFT {base_res['p99_ttft_ms']:.1f} ms, p99 ITL {base_res['p99_itl_ms']:.1f} ms; "
             f"autoscaler ratios ttft <= {r_ttft:.3f}, itl <= {r_itl:.3f} -> upThreshold {up}, downThreshold {down}")
        uid = leader["metadata"]["uid"]
        cluster.kubectl("patch", "llmd", NAME, "-n", NS, "--type=merge", "-p", json.dumps(
            {"spec": {"autoscaling": {"upThreshold": up, "downThreshold": down}}}))

        # Load: far more concurrent requests than --max-num-seqs, so they queue inside vLLM. The generator
        # samples all prompts before sending (seconds per thousand), so the load is made long by the output
        # (the spec's outputTokens, 256), not by more prompts: 1200 x 256 tokens outlast the phase, which
        # ends when the correction has converged (measured: 2,200 output tokens/s at best, i.e. >= 140 s).
        max_seqs = int(rendered[rendered.index("--max-num-seqs") + 1])
        load = rv.Bench(server, served, model_dir, bench_dir, input_len=256,
                        output_len=manifest(1, 0.5)["spec"]["workload"]["outputTokens"], num_prompts=1200,
                        request_rate="inf", max_concurrency=4 * max_seqs, label="load").start()
        procs.append(load)
        mark(f"load: {4 * max_seqs} concurrent requests (--max-num-seqs {max_seqs})")

        def queued() -> float:
            r = prom.query(f'sum(vllm:num_requests_waiting{{namespace="{NS}",meshplan_dev_deployment="{NAME}"}})')
            return float(r[0]["value"][1]) if r else 0.0
        _wait(lambda: queued() > 0, 120, "the load's requests queued in vLLM", load.tail)
        t_load = time.monotonic()
        t_load_wall = time.time()
        mark("load reached the server (requests waiting)")
        # The decision's own status write, from the watch: while the correction moves, every evaluation
        # writes status, so a poll can read the next evaluation's (from 3 to 3) instead.
        o = _wait(lambda: _first_write(watch, lambda o: _auto(o).get("toReplicas", 1) >= 2), 150,
                  "a scale-up under load", lambda: _auto(_get(cluster, "llmd", NAME)))
        a = _auto(o)
        mark(f"scaled up 1 -> {a['toReplicas']} {time.monotonic() - t_load:.0f}s into the load: {a['reason'][:300]}; "
             f"observed p99 TTFT {a.get('observedTtftMs')} ms, ITL {a.get('observedItlMs')} ms, "
             f"{a.get('requestRate')} req/s, {a.get('requestsWaiting')} waiting")
        assert a["fromReplicas"] == 1 and a["toReplicas"] >= 2
        assert a["observedTtftMs"] is not None and a["observedItlMs"] is not None
        assert max(a["ttftRatio"], a["itlRatio"]) > up, a           # the real latency is above the threshold
        # ... with the load queued in vLLM (seen at 0 once, in a clean-clone CI on 2026-12-02: the message now carries the
        # whole status, the gauge as Prometheus holds it over the last 30 s, and the load generator's log)
        if not (a.get("requestsWaiting") or 0) > 0:
            g = f'vllm:num_requests_waiting{{namespace="{NS}",meshplan_dev_deployment="{NAME}"}}'
            raise AssertionError(f"the scale-up's status shows no queued requests: {json.dumps(a)}\n"
                                 f"waiting now {prom.query(f'sum({g})')}, min/max over 30 s "
                                 f"{prom.query(f'min(min_over_time({g}[30s]))')} / "
                                 f"{prom.query(f'max(max_over_time({g}[30s]))')}\nload:\n{load.tail(30)}")
        scaled_at = datetime.strptime(a["lastScaleTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert scaled_at.timestamp() >= t_load_wall - 1, "scaled up before the load reached the server"
        assert a["metricsHealthy"] is True
        peak = _wait(lambda: (lambda n: n if n >= 2 else None)(len({p["metadata"]["labels"]["meshplan.dev/replica"]
                                                                for p in _pods(cluster) if _ready(p)})),
                     60, "the new replicas' (kwok) pods Ready", lambda: [p["metadata"]["name"] for p in _pods(cluster)])
        mark(f"{peak} replica groups Ready (replica 0 real, the others kwok pods)")
        assert _get(cluster, "pod", leader["metadata"]["name"])["metadata"]["uid"] == uid, \
            "the threshold patch or the scale-up replaced the real server's pod"
        # Predicted vs observed (issue 20): keep the load on until the correction factors reached the
        # load's observed/predicted ratio (a rate window full of load, then the bounded evaluations).
        t_full = t_load_wall + RATE_WINDOW_S
        conv = _wait(lambda: (lambda c: c if c["converged"] else None)(
                         convergence(rv.evaluations(watch.snapshot()), t_load_wall, t_full)),
                     RATE_WINDOW_S + 90, "the correction factors converging under load",
                     lambda: {"load running": load.running(), "last": [
                         (e.n, e.itl, e.itl_target, e.ttft, e.ttft_target)
                         for e in rv.evaluations(watch.snapshot())[-6:]]})
        assert load.running(), "the load ended before the correction converged (its target was the load's)"
        mark("correction converged under load: " + "; ".join(
            f"{k.upper()} x{conv['at'][k].__dict__[k]} at evaluation {conv['at'][k].n} (target "
            f"x{conv['at'][k].__dict__[k + '_target']:.3g}; steady x{conv['steady'][k]:.3g}), {conv['took'][k]} "
            f"evaluation(s) after the observed ratio settled at evaluation {conv['first'][k].n} (bound {conv['bound'][k]})"
            for k in ("itl", "ttft")))
        load.stop()
        mark("load stopped")
        check_observed_and_drift(cluster, prom, watch, conv, t_load_wall, mark)
        if os.environ.get(CAPTURE_ENV):
            Path(os.environ[CAPTURE_ENV]).write_text(server.metrics())

        o = _wait(lambda: _first_write(watch, lambda o: _auto(o).get("toReplicas") == 1 and
                                       (_auto(o).get("fromReplicas") or 0) >= 2),
                  30 + DOWN_WINDOW_S + 60, "the scale-down to 1 after the load",
                  lambda: _auto(_get(cluster, "llmd", NAME)))
        a = _auto(o)
        _wait(lambda: (_get(cluster, "llmd", NAME).get("status") or {}).get("desiredReplicas") == 1, 30,
              "status.desiredReplicas 1 after the scale-down", lambda: _get(cluster, "llmd", NAME).get("status"))
        mark(f"scaled down -> 1: {a['reason'][:300]}")
        assert a["metricsHealthy"] is True
        t_scaled = datetime.strptime(a["lastScaleTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert t_scaled > scaled_at and a["fromReplicas"] >= 2
        assert server.proc.poll() is None, "the real server died during the test"
        print("[real-vllm] timeline: " + "; ".join(f"{w} @ {s:.0f}s" for w, s in marks))
    finally:
        for p in reversed(procs):
            p.stop()
        cluster.kubectl("delete", "llmd", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
