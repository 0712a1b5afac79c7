"""A real vLLM (CPU build) under load steps, autoscaled by the operator: TTFT/ITL percentiles and replicas over time.

Usage (from the repository root; needs `make setup`: the control-plane binaries and the engine venv
`vllm-0.32.0`):

    PYTHONPATH=operator .venv/bin/python benchmarks/real_vllm.py
    PYTHONPATH=operator .venv/bin/python benchmarks/real_vllm.py --heavy-prompts 600 --idle-s 90

What it does, with the e2e's helpers (e2e/real_vllm.py) and the same set-up as e2e/test_real_vllm.py:
a private control plane (fleet hgx-h100) + Prometheus whose scrape job is the chart's engine
PodMonitor, the operator, examples/llama-3.1-8b-1gpu.yaml with autoscaling on; the leader pod's
rendered argv runs as a real `vllm serve` (CPU-forced changes only). Then `vllm bench serve` runs
the steps: light (one request at a time), heavy (4 x --max-num-seqs concurrent), idle. Every 2 s it
samples the LLMDeployment's status (the autoscaler's observed p99 TTFT/ITL from Prometheus and the
replica count; status.observed: p50 TTFT/ITL and tokens/s next to the plan's predictions, the
correction factors and the capacity they give, and the PredictionDrift condition). Prints the
per-step client-side percentiles from the load generator, the timeline, observed vs predicted and
the correction factors over time (one row per evaluation seen), and the autoscaling thresholds it
chose from the light step (as the e2e does).
Replicas beyond the first are kwok pods (nothing runs in them); the load goes to the real server.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))          # the e2e package (e2e/reliability/kit.py's Watch, which test_real_vllm imports)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", REPO / "e2e" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--light-prompts", type=int, default=60)
    ap.add_argument("--heavy-prompts", type=int, default=1500)
    ap.add_argument("--idle-s", type=float, default=75.0)
    ap.add_argument("--max-replicas", type=int, default=3)
    args = ap.parse_args(argv)

    rv = _load("real_vllm")
    test = _load("test_real_vllm")
    chart_credentials = _load("chart_credentials")
    from e2e.reliability.kit import Watch
    from meshplan.controller.process import OperatorProcess
    from meshplan.devcluster import Cluster

    work = Path(tempfile.mkdtemp(prefix="meshplan-real-vllm-bench-"))
    t0 = time.monotonic()
    cluster = Cluster(state_dir=work / "cluster", log=lambda m: print(f"[cluster] {m}", flush=True))
    stop: list = []
    samples: list[tuple[float, str, dict]] = []
    phase = ["setup"]
    phase_at: list[tuple[float, str]] = [(time.time(), "setup")]
    wall0 = time.time() - (time.monotonic() - t0)
    try:
        cluster.up(["hgx-h100"], prometheus=False, timeout=240)
        doc = test.podmonitor(cluster)
        prom = rv.RelabelPrometheus(rv.podmonitor_scrape_config(doc)).start()
        stop.append(prom.cleanup)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd/llmdeployments.meshplan.dev", "--timeout=60s")
        kcfg = chart_credentials.operator_kubeconfig(cluster, work / "sa.kubeconfig")
        op = OperatorProcess(kcfg, ["mp-real-*"], "--prometheus-url", prom.url).start()
        stop.append(op.stop)
        ns, name = test.NS, test.NAME
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=hf_bench_not_real")
        m = test.manifest(up=10.0, down=0.1)
        m["spec"]["gpus"]["maxGpus"] = args.max_replicas
        m["spec"]["autoscaling"]["maxReplicas"] = args.max_replicas
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(m))
        watch = Watch(cluster, ns, "llmd", name).start()      # every status write (status.observed over time)
        stop.append(watch.stop)
        model_dir = rv.tiny_model_dir()
        rv.write_tiny_model(model_dir)

        def get() -> dict:
            r = cluster.kubectl("get", "llmd", name, "-n", ns, "-o", "json", check=False)
            return json.loads(r.stdout) if r.returncode == 0 else {}

        def leader():
            r = cluster.kubectl("get", "pods", "-n", ns, "-l", "meshplan.dev/role=leader,meshplan.dev/replica=0",
                                "-o", "json")
            return next(iter(json.loads(r.stdout)["items"]), None)
        deadline = time.monotonic() + 120
        while (pod := leader()) is None and time.monotonic() < deadline:
            time.sleep(1)
        if pod is None:
            raise RuntimeError("no leader pod after 120 s")
        port = rv.free_port()
        launch = rv.cpu_launch(pod, model_dir, port, {("hf-token", "token"): "hf_bench_not_real"})
        print("[bench] argv: " + " ".join(launch.argv), flush=True)
        print("[bench] changes from the pod: " + "; ".join(launch.changes), flush=True)
        server = rv.RealVllm(launch, work / "vllm.log").start()
        stop.append(server.stop)
        prom.register(pod["metadata"]["name"], f"127.0.0.1:{port}",
                      rv.pod_sd_labels(pod, "engine", doc["spec"]["podMetricsEndpoints"][0]["port"]))
        print(f"[bench] vllm serve healthy after {server.wait_healthy(600):.0f}s", flush=True)

        done = threading.Event()

        def sampler() -> None:
            while not done.wait(2.0):
                o = get()
                s = o.get("status") or {}
                samples.append((time.monotonic() - t0, phase[0], {
                    "desired": s.get("desiredReplicas"), "ready": s.get("readyReplicas"),
                    **{k: (s.get("autoscaling") or {}).get(k) for k in
                       ("observedTtftMs", "observedItlMs", "ttftRatio", "itlRatio", "requestRate", "requestsWaiting")},
}))
        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        stop.append(done.set)

        served = launch.argv[launch.argv.index("--served-model-name") + 1]
        max_seqs = int(launch.argv[launch.argv.index("--max-num-seqs") + 1])
        results = {}
        phase[0] = "light"
        phase_at.append((time.time(), "light"))
        results["light"] = rv.Bench(server, served, model_dir, work, input_len=128, output_len=32,
                                    num_prompts=args.light_prompts, request_rate="inf", max_concurrency=1,
                                    label="light").start().wait(600)
        # the autoscaler's own reading of the light step (its evaluation lags the step by a few seconds)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            light = [x for _, p, x in samples if p == "light" and x["ttftRatio"] is not None
                     and (x["requestRate"] or 0) > 0]
            if light:
                break
            time.sleep(1)
        if not light:
            raise RuntimeError("the autoscaler never read the light step (no ratios with requests served)")
        r = max([max(x["ttftRatio"], x["itlRatio"] or 0) for x in light] or [0.05])
        up = round(min(10.0, 3 * max(r, 0.05)), 3)
        down = round(up / 2, 3)
        print(f"[bench] light step: autoscaler ratio <= {r:.3f} -> upThreshold {up}, downThreshold {down}", flush=True)
        cluster.kubectl("patch", "llmd", name, "-n", ns, "--type=merge", "-p", json.dumps(
            {"spec": {"autoscaling": {"upThreshold": up, "downThreshold": down}}}))
        phase[0] = "heavy"
        phase_at.append((time.time(), "heavy"))
        results["heavy"] = rv.Bench(server, served, model_dir, work, input_len=256, output_len=64,
                                    num_prompts=args.heavy_prompts, request_rate="inf",
                                    max_concurrency=4 * max_seqs, label="heavy").start().wait(900)
        phase[0] = "idle"
        phase_at.append((time.time(), "idle"))
        time.sleep(args.idle_s)
        done.set()

        print("\nstep   prompts  conc  req/s   TTFT p50/p99 ms      ITL p50/p99 ms   (client side, vllm bench serve)")
        for step, res in results.items():
            print(f"{step:6} {res['completed']:7d} {res['max_concurrency']:5d} {res['request_throughput']:6.2f}  "
                  f"{res['median_ttft_ms']:8.1f} / {res['p99_ttft_ms']:8.1f}  {res['median_itl_ms']:7.1f} / "
                  f"{res['p99_itl_ms']:7.1f}")
        print("\n   t s  step   desired ready  p99 TTFT ms (ratio)  p99 ITL ms (ratio)  req/s  waiting   "
              "(the autoscaler's status: p99 from Prometheus, ratio to the SLO as the policy uses it, 0 while nothing is served)")
        last = None
        for t, p, x in samples:
            row = (p, x["desired"], x["ready"])
            if row != last or int(t) % 10 < 3:
                fmt = (lambda v, f: "-" if v is None else format(v, f))
                print(f"{t:6.0f}  {p:6} {x['desired']!s:>7} {x['ready']!s:>5}  {fmt(x['observedTtftMs'], '11.1f')} "
                      f"({fmt(x['ttftRatio'], '5.2f')})  {fmt(x['observedItlMs'], '10.1f')} ({fmt(x['itlRatio'], '4.2f')})  "
                      f"{fmt(x['requestRate'], '5.2f')}  {fmt(x['requestsWaiting'], '7.0f')}")
            last = row
        print("\n   t s  step   eval  p50 TTFT ms (predicted)  p50 ITL ms (predicted)  tok/s/GPU (pred.)  "
              "factor TTFT  factor ITL  capacity req/s (predicted)  PredictionDrift   "
              "(status.observed, every correction evaluation the watch saw; t from the evaluation's time)")
        fmt = (lambda v, f: "-" if v is None else format(v, f))
        for ev in rv.evaluations(watch.snapshot()):
            ob = ev.observed
            step = [name for at, name in phase_at if at <= ev.time + 1][-1]
            c = next((c for c in (ev.obj.get("status") or {}).get("conditions") or []
                      if c["type"] == "PredictionDrift"), {})
            print(f"{ev.time - wall0:6.0f}  {step:6} {ev.n:5d}  {fmt(ob.get('ttftP50Ms'), '9.1f')} "
                  f"({fmt(ob.get('predictedTtftMs'), '7.1f')})  {fmt(ob.get('itlP50Ms'), '8.2f')} "
                  f"({fmt(ob.get('predictedItlMs'), '6.2f')})  {fmt(ob.get('tokensPerSecondPerGpu'), '7.1f')} "
                  f"({fmt(ob.get('predictedTokensPerSecondPerGpu'), '7.1f')})  {fmt(ob.get('ttftCorrection'), '10.3f')}"
                  f"  {fmt(ob.get('itlCorrection'), '9.3f')}  {fmt(ob.get('capacityRps'), '8.3f')} "
                  f"({fmt(ob.get('predictedCapacityRps'), '6.3f')})  {c.get('status', '-')}/{c.get('reason', '-')}")
        peak = max((x["desired"] or 0) for _, _, x in samples)
        final = samples[-1][2]["desired"] if samples else None
        print(f"\nreplicas: 1 -> {peak} -> {final}; total {time.monotonic() - t0:.0f}s")
        return 0
    finally:
        for f in reversed(stop):
            try:
                f()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                print(f"[bench] stop: {e}", file=sys.stderr)
        cluster.down(quiet=True)


if __name__ == "__main__":
    sys.exit(main())
