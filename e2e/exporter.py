"""Synthetic LLM engine exporter for the autoscaling e2e tests.

Serves vLLM-named Prometheus metrics for a whole deployment of N replicas
whose latency follows the same replica model as the simulator
(`meshplan.autoscale.queueing`: `step_fleet` over a `ReplicaModel`), so a
real Prometheus scraping it gives the autoscaler the signals a real vLLM
fleet would: raise the load and TTFT/ITL and the queue grow; add replicas and
they fall.

Per replica (label `pod="<deployment>-<i>"`, like one scrape target per pod):
  vllm:time_to_first_token_seconds  histogram  one observation per request
  vllm:inter_token_latency_seconds  histogram  `itl_samples_per_request` per request
  vllm:request_success_total        counter
  vllm:generation_tokens_total      counter  output tokens (the model's output_tokens per request)
  vllm:num_requests_running         gauge
  vllm:num_requests_waiting         gauge
  vllm:kv_cache_usage_perc          gauge  only with kv_tokens_per_replica: running x (input + output/2) tokens / pool
plus constant labels given with --label (e.g. namespace=..., meshplan_dev_deployment=...),
the ones `meshplan.autoscale.promql.scope_matchers` selects on. Removing a
replica removes its series, as a deleted pod's do.

Each tick advances the fleet with the set load as a fluid (latency and queue
are functions of load per replica and the backlog), then draws a Poisson
number of completed requests per replica and observes their latencies.
Samples: TTFT = no-queue TTFT + an exponential tail sized so its p99 is the
model's p99; ITL likewise around the model's TPOT. Histogram buckets are 5 %
apart between 0.3x and 3x of the SLO targets (histogram_quantile interpolates
linearly inside a bucket, so coarse buckets near the target would blur the
ratio the policy acts on), coarser outside.

Control:
  HTTP  GET /metrics; GET|POST /load?rps=12.5; GET|POST /replicas?n=3; GET /state (JSON)
  file  --control-file F: JSON {"rps": .., "replicas": ..} re-read every tick
  code  SyntheticEngine(...).set_load(rps) / .set_replicas(n) / .tick(dt_s)

Run: python -m e2e.exporter --port 9400 --rps 4 --replicas 2 \
         --label namespace=default --label meshplan_dev_deployment=demo
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from meshplan.autoscale.promql import DEFAULT_DEPLOYMENT_LABEL
from meshplan.autoscale.queueing import ReplicaModel, poisson_sample, step_fleet

_LN100 = math.log(100.0)


def buckets_around(targets_s: list[float], lo_s: float = 0.001, hi_s: float = 600.0) -> list[float]:
    """Bucket bounds: x2 steps from lo to hi, plus 5 % steps within 0.3x..3x of each target."""
    edges: set[float] = set()
    b = lo_s
    while b < hi_s:
        edges.add(round(b, 6))
        b *= 2
    edges.add(hi_s)
    for t in targets_s:
        b = 0.3 * t
        while b <= 3 * t:
            edges.add(round(b, 6))
            b *= 1.05
    return sorted(edges)


class SyntheticEngine:
    """A fleet of `replicas` simulated vLLM replicas exporting Prometheus metrics."""

    def __init__(
        self,
        *,
        deployment: str | None = None,
        labels: dict[str, str] | None = None,
        model: ReplicaModel | None = None,
        ttft_target_s: float = 1.0,
        itl_target_s: float = 0.025,
        rps: float = 0.0,
        replicas: int = 1,
        itl_samples_per_request: int = 8,
        seed: int = 0,
        kv_tokens_per_replica: int | None = None,
        input_tokens: int = 1024,
    ) -> None:
        self.model = model or ReplicaModel()
        # KV cache (optional): each running request holds its prompt and, on average, half its output
        # (input_tokens + output_tokens / 2) in a pool of kv_tokens_per_replica tokens per replica;
        # vllm:kv_cache_usage_perc is that fraction, capped at 1 (vLLM's gauge: "1 means 100 percent usage")
        self.kv_tokens, self.input_tokens = kv_tokens_per_replica, input_tokens
        self.labels = dict(labels or {})
        # pods are named after the deployment, as the operator names them
        self.deployment = deployment or self.labels.get(DEFAULT_DEPLOYMENT_LABEL, "demo")
        self.itl_samples = itl_samples_per_request
        self.rng = random.Random(seed)
        self.registry = CollectorRegistry()
        names = ["model_name", "pod", *self.labels]
        ttft_buckets = buckets_around([ttft_target_s])
        itl_buckets = buckets_around([itl_target_s])
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               names, buckets=ttft_buckets, registry=self.registry)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              names, buckets=itl_buckets, registry=self.registry)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.", names,
                                registry=self.registry)
        # vLLM V1's output-token counter (vllm/v1/metrics/loggers.py: "vllm:generation_tokens"; the
        # client library adds `_total`): status.observed's tokens/s reads it
        self._gen_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names,
                                   registry=self.registry)
        self._running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names,
                              registry=self.registry)
        self._waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names,
                              registry=self.registry)
        self._kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names,
                         registry=self.registry) if kv_tokens_per_replica else None
        self._lock = threading.Lock()
        self.rps = 0.0
        self.replicas = 0
        self.backlog = 0.0
        self.last: dict[str, float] = {}
        self.set_load(rps)
        self.set_replicas(replicas)

    # -- control ------------------------------------------------------------

    def set_load(self, rps: float) -> None:
        if not math.isfinite(rps) or rps < 0:
            raise ValueError(f"rps must be a finite number >= 0, got {rps!r}")
        with self._lock:
            self.rps = float(rps)

    def set_model(self, model: ReplicaModel) -> None:
        """Another workload shape from now on (e.g. longer prompts: a larger prefill time; longer outputs)."""
        with self._lock:
            self.model = model

    def _metrics(self) -> tuple:
        return (self._ttft, self._itl, self._success, self._gen_tokens, self._running, self._waiting,
                *((self._kv,) if self._kv is not None else ()))

    def set_replicas(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"replicas must be >= 0, got {n!r}")
        with self._lock:
            for i in range(n, self.replicas):  # replicas going away take their series with them
                for metric in self._metrics():
                    metric.remove(*self._label_values(i))
            for i in range(self.replicas, n):  # new replicas export zeros from the start
                lv = self._label_values(i)
                if self._kv is not None:
                    self._kv.labels(*lv).set(0)
                self._success.labels(*lv)
                self._gen_tokens.labels(*lv)
                self._running.labels(*lv).set(0)
                self._waiting.labels(*lv).set(0)
                self._ttft.labels(*lv)
                self._itl.labels(*lv)
            self.replicas = n

    def state(self) -> dict[str, float]:
        with self._lock:
            return {"rps": self.rps, "replicas": self.replicas, "backlog": self.backlog, **self.last}

    def _label_values(self, i: int) -> tuple[str, ...]:
        return ("synthetic-llama", f"{self.deployment}-{i}", *self.labels.values())

    # -- simulation ---------------------------------------------------------

    def tick(self, dt_s: float) -> None:
        """Advance by `dt_s`: Poisson arrivals at the set load, split evenly over the replicas."""
        with self._lock:
            n = self.replicas
            # Latency and backlog follow the set load (fluid), so they are a function of
            # load per replica; only the number of observations per tick is random.
            step = step_fleet(self.model, self.rps * dt_s, n, self.backlog, dt_s)
            self.backlog = step.backlog
            if n == 0 or step.latency is None:
                self.last = {"ttft_p99_s": math.inf, "itl_p99_s": math.inf}
                return
            lat = step.latency
            ttft_floor = lat.ttft_mean_s
            ttft_tail = max(lat.ttft_p99_s - ttft_floor, 0.0) / _LN100
            itl_floor = lat.itl_mean_s
            itl_tail = max(lat.itl_p99_s - itl_floor, 0.0) / _LN100
            served_per_replica = step.served / n
            for i in range(n):
                lv = self._label_values(i)
                done = poisson_sample(self.rng, served_per_replica)
                ttft_h, itl_h = self._ttft.labels(*lv), self._itl.labels(*lv)
                for _ in range(done):
                    ttft_h.observe(ttft_floor + self.rng.expovariate(1 / ttft_tail) if ttft_tail > 0 else ttft_floor)
                    for _ in range(self.itl_samples):
                        itl_h.observe(itl_floor + self.rng.expovariate(1 / itl_tail) if itl_tail > 0 else itl_floor)
                self._success.labels(*lv).inc(done)
                self._gen_tokens.labels(*lv).inc(done * self.model.output_tokens)
                self._running.labels(*lv).set(round(lat.running))
                self._waiting.labels(*lv).set(round(self.backlog / n))
                if self._kv is not None:
                    held = lat.running * (self.input_tokens + self.model.output_tokens / 2)
                    self._kv.labels(*lv).set(min(1.0, held / self.kv_tokens))
            self.last = {"ttft_p99_s": lat.ttft_p99_s, "itl_p99_s": lat.itl_p99_s, "per_replica_rps": step.per_replica_rps,
                         "running_per_replica": lat.running}

    def run(self, stop: threading.Event, tick_s: float = 1.0, control_file: Path | None = None) -> None:
        last = time.monotonic()
        while not stop.wait(tick_s):
            if control_file is not None:
                self._read_control(control_file)
            now = time.monotonic()
            self.tick(now - last)
            last = now

    def _read_control(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # keep the last good setting while the file is being rewritten
        if "rps" in data:
            self.set_load(float(data["rps"]))
        if "replicas" in data:
            self.set_replicas(int(data["replicas"]))

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)


def make_server(engine: SyntheticEngine, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """HTTP server for /metrics and the control endpoints (call serve_forever in a thread)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/metrics":
                    return self._reply(200, engine.metrics_text(), CONTENT_TYPE_LATEST)
                if url.path == "/load" and "rps" in q:
                    engine.set_load(float(q["rps"]))
                elif url.path == "/replicas" and "n" in q:
                    engine.set_replicas(int(q["n"]))
                elif url.path != "/state":
                    return self._reply(404, b'{"error": "GET /metrics, /state, /load?rps=X or /replicas?n=N"}')
            except ValueError as exc:
                return self._reply(400, json.dumps({"error": str(exc)}).encode())
            self._reply(200, json.dumps(engine.state()).encode())

        do_POST = do_GET

    return ThreadingHTTPServer((host, port), Handler)


def _parse_labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise SystemExit(f"--label {p!r}: write name=value, e.g. namespace=default")
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Synthetic vLLM exporter whose latency follows load per replica.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9400)
    ap.add_argument("--deployment", default=None,
                    help="prefix of the per-replica `pod` label (default: the meshplan_dev_deployment label, else demo)")
    ap.add_argument("--label", action="append", default=[], help="constant label name=value (repeatable)")
    ap.add_argument("--rps", type=float, default=0.0)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--ttft-ms", type=float, default=1000.0, help="SLO target the buckets are fine around")
    ap.add_argument("--itl-ms", type=float, default=25.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--control-file", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    engine = SyntheticEngine(deployment=args.deployment, labels=_parse_labels(args.label), rps=args.rps,
                             replicas=args.replicas, ttft_target_s=args.ttft_ms / 1000, itl_target_s=args.itl_ms / 1000,
                             seed=args.seed)
    server = make_server(engine, args.host, args.port)
    stop = threading.Event()
    sim = threading.Thread(target=engine.run, args=(stop, args.tick_s, args.control_file), daemon=True)
    sim.start()
    print(f"synthetic exporter on http://{args.host}:{server.server_address[1]}/metrics", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
