"""Start, stop and inspect the local control plane (see package docstring).

Start order (cluster-harness.md): etcd (/health) -> kube-apiserver (/readyz)
-> kube-controller-manager (/healthz, then ServiceAccount `default` exists)
-> kube-scheduler (/healthz) -> kwok -> GPU Nodes (Ready) -> Prometheus
(/-/ready). Every process gets a free loopback port, its own log file and its
own process session, so it outlives `meshplan dev-cluster up`; the pids go to
`state.json` and `down` stops them in reverse order.

Once everything is up, `up` starts the supervisor (`supervisor.py`): a
component that exits is started again with back-off, and `status` shows the
restarts (count, last exit, when). `stop(component)` holds a component down on
purpose (fault tests) until `start(component)`; `down` stops the supervisor
first, then the components.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from . import fleets as fleetmod
from .pki import Pki, make_pki

START_ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "prometheus"]


class ClusterError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("MESHPLAN_E2E_CACHE", Path.home() / ".cache" / "meshplan-e2e"))


def default_state_dir() -> Path:
    return Path(os.environ.get("MESHPLAN_DEV_STATE", cache_dir() / "run"))


def default_bin_dir() -> Path:
    return Path(os.environ.get("MESHPLAN_E2E_BIN", cache_dir() / "bin"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Cluster:
    state_dir: Path = field(default_factory=default_state_dir)
    bin_dir: Path = field(default_factory=default_bin_dir)
    log: Callable[[str], None] = print

    # ---- paths and state -------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, st: dict[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self.state_file)

    def running(self) -> dict[str, int]:
        """Component -> pid of the processes of this state dir that are alive."""
        return {n: p for n, p in self.state().get("pids", {}).items() if _alive(p)}

    @property
    def prometheus_url(self) -> str | None:
        port = self.state().get("ports", {}).get("prometheus")
        return f"http://127.0.0.1:{port}" if port else None

    @property
    def targets_dir(self) -> Path:
        return self.state_dir / "prometheus" / "targets"

    def binary(self, name: str) -> str:
        p = self.bin_dir / name
        if p.exists():
            return str(p)
        found = shutil.which(name)
        if found:
            return found
        raise ClusterError(f"{name} not found in {self.bin_dir} or PATH: run e2e/build-control-plane.sh first")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        proc = subprocess.run([self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def api_client(self):
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    # ---- processes --------------------------------------------------------
    def _spawn(self, st: dict[str, Any], name: str, argv: list[str]) -> None:
        logf = open(self.state_dir / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.state_dir)
        logf.close()
        st.setdefault("pids", {})[name] = proc.pid
        st.setdefault("argv", {})[name] = argv          # the supervisor starts it again with the same argv
        self._save(st)

    def _spawn_supervisor(self, st: dict[str, Any]) -> None:
        import sys

        import meshplan

        env = dict(os.environ)
        src = str(Path(meshplan.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        logf = open(self.state_dir / "logs" / "supervisor.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "meshplan.devcluster.supervisor", str(self.state_dir)],
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.state_dir, env=env)
        logf.close()
        st["supervisor"] = proc.pid
        self._save(st)

    def _wait(self, st: dict[str, Any], name: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pid = st["pids"].get(name)
        while time.monotonic() < deadline:
            if pid is not None and not _alive(pid):
                raise ClusterError(f"{name} exited during start-up; last log lines:\n"
                                   f"{_tail(self.state_dir / 'logs' / f'{name}.log')}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
                pass
            time.sleep(0.25)
        raise ClusterError(f"{name} not ready after {timeout:.0f}s; last log lines:\n"
                           f"{_tail(self.state_dir / 'logs' / f'{name}.log')}")

    def _https_ok(self, port: int, path: str, pki: Pki | None = None) -> bool:
        ctx = ssl.create_default_context()
        if pki is None:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.load_verify_locations(str(pki.ca_crt))
            ctx.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=2) as r:
            return r.status == 200

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200

    # ---- up / down / status ---------------------------------------------------
    def up(self, fleet_names: list[str], prometheus: bool = True, timeout: float = 180,
           supervise: bool = True) -> bool:
        """Start everything; returns False (and starts nothing) if already running."""
        alive = self.running()
        if alive:
            self.log(f"dev cluster already running from {self.state_dir} "
                     f"({', '.join(f'{n}={p}' for n, p in alive.items())}); kubeconfig: {self.kubeconfig}")
            return False
        if self.state_dir.exists():
            self._remove_state()
        fleet_objs = [fleetmod.load_fleet(f) for f in fleet_names]  # fail fast on a bad fleet name
        t0 = time.monotonic()
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        pki = make_pki(self.state_dir / "pki")
        ports = {n: free_port() for n in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager",
                                         "kube-scheduler", "kwok", "prometheus")}
        etcd_data = Path("/dev/shm") / f"meshplan-etcd-{ports['etcd']}" if Path("/dev/shm").is_dir() \
            else self.state_dir / "etcd"
        st: dict[str, Any] = {"ports": ports, "pids": {}, "etcd_data": str(etcd_data), "fleets": fleet_names,
                              "kubeconfig": str(self.kubeconfig), "started": time.time()}
        self._save(st)
        try:
            self._start_all(st, pki, ports, etcd_data, prometheus, timeout)
            for fleet in fleet_objs:
                self.apply_fleet(fleet)
            self._wait_nodes_ready(sum(int(g["count"]) for f in fleet_objs for g in f["nodeGroups"]), timeout)
        except BaseException:
            self.down(quiet=True, keep_logs=True)
            raise
        st["ready_seconds"] = round(time.monotonic() - t0, 1)
        self._save(st)
        if supervise:
            self._spawn_supervisor(st)
        self.log(f"dev cluster up in {st['ready_seconds']}s; kubeconfig: {self.kubeconfig}")
        return True

    def _start_all(self, st, pki: Pki, ports, etcd_data: Path, prometheus: bool, timeout: float) -> None:
        sd = self.state_dir
        self._spawn(st, "etcd", [
            self.binary("etcd"), "--name=meshplan", f"--data-dir={etcd_data}",
            f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-cluster=meshplan=http://127.0.0.1:{ports['etcd-peer']}",
            "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296", "--log-level=warn",
        ])
        self._wait(st, "etcd", lambda: self._http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), timeout)

        self._spawn(st, "kube-apiserver", [
            self.binary("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['kube-apiserver']}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={sd / 'pki' / 'apiserver-extra'}",
            f"--tls-cert-file={pki.apiserver_crt}", f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_crt}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])
        self.write_kubeconfig(pki, ports["kube-apiserver"])
        self._wait(st, "kube-apiserver",
                   lambda: self._https_ok(ports["kube-apiserver"], "/readyz", pki), timeout)

        common = [f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                  f"--authorization-kubeconfig={self.kubeconfig}", "--leader-elect=false",
                  "--bind-address=127.0.0.1"]
        self._spawn(st, "kube-controller-manager", [
            self.binary("kube-controller-manager"), *common, f"--secure-port={ports['kube-controller-manager']}",
            f"--cert-dir={sd / 'pki' / 'kcm'}",
            f"--root-ca-file={pki.ca_crt}", f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
            "--profiling=false", "--v=1",
        ])
        self._wait(st, "kube-controller-manager",
                   lambda: self._https_ok(ports["kube-controller-manager"], "/healthz"), timeout)
        self._wait(st, "kube-controller-manager",
                   lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                        check=False, timeout=10).returncode == 0, timeout)

        self._spawn(st, "kube-scheduler", [
            self.binary("kube-scheduler"), *common, f"--secure-port={ports['kube-scheduler']}",
            f"--cert-dir={sd / 'pki' / 'scheduler'}", "--profiling=false", "--v=1",
        ])
        self._wait(st, "kube-scheduler", lambda: self._https_ok(ports["kube-scheduler"], "/healthz"), timeout)

        # kwok v0.7.0 ships default node and pod stages (Pending -> Running/Ready).
        self._spawn(st, "kwok", [
            self.binary("kwok"), f"--kubeconfig={self.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={fleetmod.KWOK_ANNOTATION}=fake",
            "--manage-all-nodes=false", "--node-lease-duration-seconds=40", "--cidr=10.0.0.1/16",
            "--node-ip=10.0.0.1", f"--server-address=127.0.0.1:{ports['kwok']}",
        ])
        self._wait(st, "kwok", lambda: self._http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), timeout)

        if prometheus:
            self.targets_dir.mkdir(parents=True, exist_ok=True)
            cfg = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [{
                    "job_name": "meshplan-e2e",
                    "file_sd_configs": [{"files": [str(self.targets_dir / "*.json")], "refresh_interval": "1s"}],
                }],
            }
            (sd / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(cfg))
            self._spawn(st, "prometheus", [
                self.binary("prometheus"), f"--config.file={sd / 'prometheus' / 'prometheus.yml'}",
                f"--storage.tsdb.path={sd / 'prometheus' / 'data'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=2h", "--log.level=warn",
            ])
            self._wait(st, "prometheus",
                       lambda: self._http_ok(f"http://127.0.0.1:{ports['prometheus']}/-/ready"), timeout)

    def write_kubeconfig(self, pki: Pki, port: int) -> None:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "meshplan-dev",
            "clusters": [{"name": "meshplan-dev", "cluster": {
                "server": f"https://127.0.0.1:{port}", "certificate-authority": str(pki.ca_crt)}}],
            "users": [{"name": "meshplan-admin", "user": {
                "client-certificate": str(pki.admin_crt), "client-key": str(pki.admin_key)}}],
            "contexts": [{"name": "meshplan-dev", "context": {"cluster": "meshplan-dev", "user": "meshplan-admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))

    def apply_fleet(self, fleet: dict[str, Any]) -> int:
        nodes = fleetmod.fleet_nodes(fleet)
        doc = {"apiVersion": "v1", "kind": "List", "items": nodes}
        self.kubectl("apply", "--server-side", "--field-manager=meshplan-dev-cluster", "-f", "-",
                     input=json.dumps(doc), timeout=300)
        # status is a subresource: make sure capacity/allocatable are as the fleet says
        for n in nodes:
            self.kubectl("patch", "node", n["metadata"]["name"], "--subresource=status", "--type=merge",
                         "-p", json.dumps({"status": {"capacity": n["status"]["capacity"],
                                                      "allocatable": n["status"]["allocatable"]}}))
        self.log(f"fleet {fleet['name']}: {len(nodes)} nodes")
        return len(nodes)

    def _wait_nodes_ready(self, expected: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = 0
        while time.monotonic() < deadline:
            out = self.kubectl("get", "nodes", "-o", "json", check=False, timeout=30)
            if out.returncode == 0:
                items = json.loads(out.stdout)["items"]
                ready = sum(1 for n in items for c in n.get("status", {}).get("conditions", [])
                            if c["type"] == "Ready" and c["status"] == "True")
                if ready >= expected:
                    return
            time.sleep(0.5)
        raise ClusterError(f"only {ready}/{expected} nodes Ready after {timeout:.0f}s; kwok log:\n"
                           f"{_tail(self.state_dir / 'logs' / 'kwok.log')}")

    def add_scrape_target(self, name: str, address: str, labels: dict[str, str] | None = None) -> Path:
        """Register a loopback target with Prometheus (file service discovery)."""
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        p = self.targets_dir / f"{name}.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [address], "labels": labels or {}}]))
        tmp.replace(p)
        return p

    def remove_scrape_target(self, name: str) -> None:
        (self.targets_dir / f"{name}.json").unlink(missing_ok=True)

    def stop(self, component: str, sig: int = signal.SIGTERM) -> None:
        """Stop one component and hold it down (the supervisor leaves it) until `start(component)`
        (e.g. the API server or Prometheus taken away in a fault test)."""
        from .supervisor import held_dir

        held_dir(self.state_dir).mkdir(parents=True, exist_ok=True)
        (held_dir(self.state_dir) / component).touch()
        pid = self.state().get("pids", {}).get(component)
        if pid:
            if sig == signal.SIGTERM:
                _terminate(pid)
            else:
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    pass

    def start(self, component: str, timeout: float = 30) -> int:
        """Release a component held by `stop`: the supervisor starts it again (within its tick).
        Returns the new pid."""
        from .supervisor import held_dir

        old = self.state().get("pids", {}).get(component)
        (held_dir(self.state_dir) / component).unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.state().get("pids", {}).get(component)
            if pid and pid != old and _alive(pid):
                return pid
            time.sleep(0.2)
        raise ClusterError(f"{component} was not started again within {timeout:.0f}s (is the supervisor running? "
                           f"{self.supervisor_status()})")

    def supervisor_status(self) -> dict[str, Any]:
        """The supervisor's pid, whether it runs, and per component what it restarted (supervisor.json)."""
        pid = self.state().get("supervisor")
        try:
            doc = json.loads((self.state_dir / "supervisor.json").read_text())
        except (OSError, ValueError):
            doc = {}
        return {"pid": pid, "alive": bool(pid) and _alive(pid), "components": doc.get("components", {})}

    def down(self, quiet: bool = False, keep_logs: bool = False) -> list[str]:
        sup = self.state().get("supervisor")
        if sup and _alive(sup):
            _terminate(sup)          # first, so it starts nothing that is being stopped
        st = self.state()
        stopped = []
        for name in reversed(START_ORDER):
            pid = st.get("pids", {}).get(name)
            if pid and _alive(pid):
                _terminate(pid)
                stopped.append(name)
        if not keep_logs:
            self._remove_state()
        elif st.get("etcd_data"):
            shutil.rmtree(st["etcd_data"], ignore_errors=True)
        if not quiet:
            self.log(f"dev cluster down: stopped {', '.join(stopped) or 'nothing'}")
        return stopped

    def _remove_state(self) -> None:
        st = self.state()
        if st.get("etcd_data"):
            shutil.rmtree(st["etcd_data"], ignore_errors=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        st = self.state()
        return {
            "state_dir": str(self.state_dir),
            "running": self.running(),
            "expected": list(st.get("pids", {})),
            "ports": st.get("ports", {}),
            "kubeconfig": str(self.kubeconfig) if st else None,
            "prometheus": self.prometheus_url,
            "fleets": st.get("fleets", []),
            "ready_seconds": st.get("ready_seconds"),
            # restarts per component: count, lastExit (code or last log line), lastExitAt, lastStartAt
            "supervisor": self.supervisor_status() if st else None,
        }


def _terminate(pid: int, grace: float = 10.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:  # reap if it is our child (the pytest fixture case)
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
