"""A synthetic engine fleet that follows what the operator really runs (e2e helper).

One `e2e.exporter.SyntheticEngine` stands for one LLMDeployment's engines:
it exports one series per replica (label `pod`), as one scrape target per pod
would, with the two labels the autoscaler's queries select on (`namespace`,
`meshplan_dev_deployment`). Its replica count is not set by the test: a
follower thread reads the deployment's pods from the API server every
`follow_s` and sets it to the number of READY replica groups (every pod of the
group Ready, judged by `meshplan.controller.decide.live_groups`, the
controller's own definition), so latency falls only once the operator has
actually created, released and started the groups. Prometheus scrapes it
through file service discovery (`Cluster.add_scrape_target`, 1 s interval).

Kept honest: the engine's latency comes from the calibrated replica model
(`meshplan.autoscale.queueing.ReplicaModel`), not from the planner the
operator uses, so the two disagree as a real fleet and its plan would.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from meshplan.controller.decide import live_groups
from meshplan.render.workloads import LABEL_DEPLOYMENT


class FollowingFleet:
    """`role` (a disaggregated deployment's "prefill" or "decode"): the exporter stands for that role's
    engines only: its series carry `meshplan_dev_serving_role` (the label the chart's PodMonitor gives them
    from the pod label meshplan.dev/serving-role) and it follows the READY groups of that role
    (`controller.decide_disagg.role_groups`). `engine_kw` go to the SyntheticEngine (e.g. its KV pool)."""

    def __init__(self, cluster: Any, namespace: str, deployment: str, *, rps: float = 0.0,
                 ttft_target_s: float = 1.0, itl_target_s: float = 0.025, follow_s: float = 1.0,
                 scrape: Any = None, model: Any = None, role: str | None = None, **engine_kw: Any) -> None:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("e2e_exporter", Path(__file__).with_name("exporter.py"))
        exporter = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(exporter)
        self.cluster, self.namespace, self.deployment, self.role = cluster, namespace, deployment, role
        labels = {"namespace": namespace, "meshplan_dev_deployment": deployment}
        if role is not None:
            from meshplan.controller.autoscaling_roles import ROLE_LABEL

            labels[ROLE_LABEL] = role
        self.engine = exporter.SyntheticEngine(
            labels=labels, deployment=f"{deployment}-{role}" if role else None,
            ttft_target_s=ttft_target_s, itl_target_s=itl_target_s, rps=rps, replicas=0, model=model,
            seed=hash((namespace, deployment, role)) & 0xFFFF, **engine_kw)
        self.server = exporter.make_server(self.engine)
        self.port = self.server.server_address[1]
        self.follow_s = follow_s
        self.stop_event = threading.Event()
        self.threads = [
            threading.Thread(target=self.server.serve_forever, daemon=True),
            threading.Thread(target=self.engine.run, args=(self.stop_event, 1.0), daemon=True),
            threading.Thread(target=self._follow, daemon=True),
        ]
        self.scrape = scrape or cluster
        self.target = f"{namespace}-{deployment}" + (f"-{role}" if role else "")
        self.ready_replicas = 0

    def start(self) -> "FollowingFleet":
        for t in self.threads:
            t.start()
        self.scrape.add_scrape_target(self.target, f"127.0.0.1:{self.port}", {})
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.scrape.remove_scrape_target(self.target)

    def set_load(self, rps: float) -> None:
        self.engine.set_load(rps)

    def pods(self) -> list[dict[str, Any]]:
        r = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", f"{LABEL_DEPLOYMENT}={self.deployment}",
                                 "-o", "json", check=False)
        return json.loads(r.stdout)["items"] if r.returncode == 0 else []

    def _follow(self) -> None:
        while not self.stop_event.wait(self.follow_s):
            try:
                if self.role is None:
                    ready = sum(1 for g in live_groups(self.pods()).values() if g.ready())
                else:
                    from meshplan.controller.decide_disagg import role_groups

                    ready = sum(1 for g in role_groups(self.pods())[self.role].values() if g.ready())
            except Exception:  # noqa: BLE001 - a failed read keeps the last count
                continue
            if ready != self.ready_replicas:
                self.ready_replicas = ready
                self.engine.set_replicas(ready)




class OwnPrometheus:
    """A private Prometheus (the Debian `prometheus` binary) for tests that stop it; the one helper
    that starts a real Prometheus in e2e (e2e/real_vllm.py's `RelabelPrometheus` is this with the
    chart PodMonitor's scrape job).

    Same configuration as the dev cluster's (file service discovery, 1 s
    scrape interval), on its own port and data directory, so stopping it
    leaves the shared instance up for the other tests. `scrape_job`: the one
    job's settings (relabelling, path, interval) instead of the plain
    `meshplan-e2e-own` job; its targets always come from file SD in `targets/`.
    """

    def __init__(self, binary: str = "prometheus", port: int | None = None,
                 scrape_job: dict[str, Any] | None = None, prefix: str = "meshplan-prom-") -> None:
        import shutil
        import socket
        import tempfile
        from pathlib import Path

        self.binary = shutil.which(binary) or binary
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.targets = self.dir / "targets"
        self.targets.mkdir()
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_config = {**(scrape_job or {"job_name": "meshplan-e2e-own"}), "file_sd_configs": [
            {"files": [str(self.targets / "*.json")], "refresh_interval": "1s"}]}
        self.proc = None

    def start(self, timeout_s: float = 60.0) -> "OwnPrometheus":
        import subprocess
        import time
        import urllib.request

        import yaml

        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
               "scrape_configs": [self.scrape_config]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=open(self.dir / "log", "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"prometheus did not get ready: {(self.dir / 'log').read_text()[-2000:]}")

    def add_scrape_target(self, name: str, address: str, labels: dict[str, str] | None = None) -> None:
        p = self.targets / f"{name}.json"
        p.with_suffix(".tmp").write_text(json.dumps([{"targets": [address], "labels": labels or {}}]))
        p.with_suffix(".tmp").replace(p)

    def remove_scrape_target(self, name: str) -> None:
        (self.targets / f"{name}.json").unlink(missing_ok=True)

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant query's result vector (at unix time `at`, else now)."""
        import urllib.parse
        import urllib.request

        params = {"query": promql, **({} if at is None else {"time": f"{at:.3f}"})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params), timeout=5) as r:
            return json.loads(r.read())["data"]["result"]

    def targets_api(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=any", timeout=5) as r:
            return json.loads(r.read())["data"]

    def stop(self) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cleanup(self) -> None:
        import shutil

        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["FollowingFleet", "OwnPrometheus"]


def scaled_prediction_model(predicted: dict[str, Any], k: float, output_tokens: int) -> Any:
    """A `ReplicaModel` whose engine runs `k` x the plan's prediction (status.plan.predicted: ttftP50Ms, the
    steady-state median TTFT the observed p50 is compared with, or ttftMs where the plan has none; itlMs) at
    any load: a fake engine for the drift e2e (issue 20), standing in for a real engine
    that is k times slower than predicted (a CPU engine against a GPU plan). No tails (p50 = p99 =
    the mean), batch slots enough that the load never queues."""
    from meshplan.autoscale.queueing import ReplicaModel

    return ReplicaModel(tpot_base_s=k * predicted["itlMs"] / 1000.0, tpot_per_seq_s=0.0,
                        prefill_s=k * predicted.get("ttftP50Ms", predicted["ttftMs"]) / 1000.0, prefill_per_seq_s=0.0,
                        max_num_seqs=100000,
                        output_tokens=output_tokens, ttft_tail_factor=1.0, itl_tail_factor=1.0,
                        source="e2e: k x the plan's prediction")
