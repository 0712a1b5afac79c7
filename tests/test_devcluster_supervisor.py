"""The dev cluster's supervisor (issue 17, finding 11: after an API server restart the kube-scheduler
exited with "Scheduler cache is corrupted" and nothing restarted it).

The components here are real processes (`sh`, `sleep`) standing in for the control-plane binaries,
which are not built on every machine that runs tests/; the supervisor and `Cluster` code under test
are the real ones. e2e/reliability/test_redteam_churn.py restarts the real API server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from meshplan.devcluster.cluster import Cluster, _alive
from meshplan.devcluster.supervisor import BACKOFF_S, STABLE_S, Supervisor, restart_delay

CRASH = ["sh", "-c", "echo 'E1201 scheduler.go:1 \"Scheduler cache is corrupted\"'; exit 1"]


def _state_dir(tmp_path: Path, name: str, argv: list[str], started: float) -> tuple[Path, int]:
    sd = tmp_path / "run"
    (sd / "logs").mkdir(parents=True)
    with open(sd / "logs" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (sd / "state.json").write_text(json.dumps({"pids": {name: proc.pid}, "argv": {name: argv},
                                               "started": started}))
    proc.wait()         # exited (reaped: as good as dead to `_alive`)
    return sd, proc.pid


def _pid(sd: Path, name: str) -> int:
    return json.loads((sd / "state.json").read_text())["pids"][name]


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:     # a zombie counts as dead; the supervisor reaps it
        time.sleep(0.05)


def test_restart_delay_backs_off_and_is_bounded():
    assert restart_delay(0) == 0.0
    assert [restart_delay(n) for n in range(1, 5)] == [1.0, 2.0, 4.0, 8.0]
    assert restart_delay(100) == BACKOFF_S[-1] == 30.0


def test_exited_component_is_restarted_with_back_off_and_the_exit_is_recorded(tmp_path):
    now = [1000.0]
    sd, first = _state_dir(tmp_path, "kube-scheduler", CRASH, started=now[0] - 3600)
    sup = Supervisor(sd, clock=lambda: now[0])
    assert sup.tick()
    second = _pid(sd, "kube-scheduler")
    assert second != first, "not restarted"
    rec = json.loads((sd / "supervisor.json").read_text())["components"]["kube-scheduler"]
    assert rec["restarts"] == 1 and "Scheduler cache is corrupted" in rec["lastExit"], rec
    assert "status unknown" in rec["lastExit"]          # started by `up`, not by the supervisor
    _wait_dead(second)
    now[0] += 0.5                                        # it exited at once: back-off 1 s
    sup.tick()
    assert _pid(sd, "kube-scheduler") == second
    rec = json.loads((sd / "supervisor.json").read_text())["components"]["kube-scheduler"]
    assert rec["lastExit"].startswith("exit code 1"), rec
    now[0] += 1.0
    sup.tick()
    third = _pid(sd, "kube-scheduler")
    assert third != second
    rec = json.loads((sd / "supervisor.json").read_text())["components"]["kube-scheduler"]
    assert rec["restarts"] == 2 and rec["pid"] == third
    _wait_dead(third)
    now[0] += STABLE_S + 1                               # ran a while (by the clock): at once again
    sup.tick()
    assert _pid(sd, "kube-scheduler") != third
    _wait_dead(_pid(sd, "kube-scheduler"))


def test_held_component_is_left_down_until_released_and_that_is_no_restart(tmp_path):
    now = [1000.0]
    sd, first = _state_dir(tmp_path, "kube-apiserver", ["sleep", "0"], started=0.0)
    (sd / "held").mkdir()
    (sd / "held" / "kube-apiserver").touch()
    sup = Supervisor(sd, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 5
        assert sup.tick()
    assert _pid(sd, "kube-apiserver") == first
    rec = json.loads((sd / "supervisor.json").read_text())["components"]["kube-apiserver"]
    assert rec["held"] is True and rec["restarts"] == 0 and "lastExit" not in rec
    (sd / "held" / "kube-apiserver").unlink()
    now[0] += 1
    sup.tick()
    assert _pid(sd, "kube-apiserver") != first
    rec = json.loads((sd / "supervisor.json").read_text())["components"]["kube-apiserver"]
    assert rec["restarts"] == 0 and rec["lastStartAt"]
    _wait_dead(_pid(sd, "kube-apiserver"))


def test_state_dir_removed_stops_the_supervisor(tmp_path):
    sd, _ = _state_dir(tmp_path, "kwok", ["sleep", "0"], started=0.0)
    (sd / "state.json").unlink()
    assert Supervisor(sd).tick() is False


def test_cluster_supervisor_process_restarts_a_killed_component_and_down_leaves_no_process(tmp_path):
    """The real supervisor process as `up` starts it: a component killed with SIGKILL is back within
    seconds, `status()` reports the restart, `stop`/`start` hold and release it, and `down` stops the
    supervisor and every component."""
    sd = tmp_path / "run"
    c = Cluster(state_dir=sd, bin_dir=tmp_path / "bin", log=lambda m: None)
    (sd / "logs").mkdir(parents=True)
    st = {"pids": {}, "started": time.time()}
    c._spawn(st, "kube-scheduler", ["sleep", "300"])
    c._spawn_supervisor(st)
    try:
        sup = c.state()["supervisor"]
        first = c.state()["pids"]["kube-scheduler"]
        os.killpg(first, 9)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and c.state()["pids"]["kube-scheduler"] == first:
            time.sleep(0.2)
        second = c.state()["pids"]["kube-scheduler"]
        assert second != first and _alive(second), "the supervisor did not restart the killed component"
        status = c.status()
        rec = status["supervisor"]["components"]["kube-scheduler"]
        assert status["supervisor"]["alive"] and rec["restarts"] == 1, status
        assert status["running"] == {"kube-scheduler": second}
        c.stop("kube-scheduler")
        time.sleep(2.5)
        assert not c.running(), "a held component was restarted"
        third = c.start("kube-scheduler", timeout=15)
        assert third not in (first, second) and _alive(third)
        assert c.status()["supervisor"]["components"]["kube-scheduler"]["restarts"] == 1
    finally:
        stopped = c.down(quiet=True)
    assert "kube-scheduler" in stopped
    assert not _alive(sup) and not _alive(third)
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert f"meshplan.devcluster.supervisor {sd}" not in out, out
    assert sys.executable  # the supervisor ran with this interpreter
