"""The dev cluster's supervisor: restarts a component that exits, with back-off.

Started by `Cluster.up` once every component is ready (its own process and
session, pid in `state.json` under "supervisor"), stopped first by
`Cluster.down`. Every `TICK_S` it looks at each component of `state.json`:
one that is not alive, and not held (`Cluster.stop` holds a component on
purpose, e.g. to take the API server away in a fault test, until
`Cluster.start`), is started again with the argv `up` used, appending to the
same log, after a back-off that grows while it keeps exiting soon after a start
(`restart_delay`). Why: after an API server restart the kube-scheduler exits
("Scheduler cache is corrupted") and nothing brought it back (issue 17,
finding 11).

What it did is written to `supervisor.json` (it is the only writer of that
file and, while it runs, of `state.json`'s pids): per component the restart
count, when and how it last exited (the exit code when the supervisor started
it, else the last line of its log) and when it was started again.
`meshplan dev-cluster status` shows it. It exits when the state directory is
removed (`down`) or on SIGTERM; components run in their own sessions, so `down`
stops them by pid whatever happened to the supervisor (no orphans either way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

TICK_S = 1.0
STABLE_S = 30.0                                    # ran this long: the next exit starts the back-off over
BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


def restart_delay(quick_exits: int) -> float:
    """Seconds to wait before starting a component that exited `quick_exits` times in a row within
    `STABLE_S` of being started (0: it had run a while, start it at once)."""
    return BACKOFF_S[min(max(quick_exits, 0), len(BACKOFF_S) - 1)]


def _alive(pid: int) -> bool:
    from .cluster import _alive as alive

    return alive(pid)


def _last_log_line(path: Path, limit: int = 300) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def held_dir(state_dir: Path) -> Path:
    return state_dir / "held"


@dataclass
class Supervisor:
    state_dir: Path
    clock: Callable[[], float] = time.time
    children: dict[str, subprocess.Popen] = field(default_factory=dict)
    record: dict[str, dict[str, Any]] = field(default_factory=dict)      # what supervisor.json holds
    started_at: dict[str, float] = field(default_factory=dict)
    down_since: dict[str, float] = field(default_factory=dict)
    quick_exits: dict[str, int] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def _state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _write(self, path: Path, doc: dict[str, Any]) -> None:
        tmp = path.with_suffix(".sup.tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(path)

    def _exit_text(self, name: str, pid: int) -> str:
        child = self.children.get(name)
        log = _last_log_line(self.state_dir / "logs" / f"{name}.log")
        if child is not None and child.pid == pid and child.poll() is not None:
            rc = child.returncode
            how = f"exit code {rc}" if rc >= 0 else f"killed by signal {signal.Signals(-rc).name}"
        else:
            try:      # a zombie reparented to us (a subreaper) or our own child: reap it
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            how = "exited (status unknown: started by `up`, not by the supervisor)"
        return f"{how}; last log line: {log}" if log else how

    def tick(self) -> bool:
        """One look at every component; False when the state directory is gone (stop)."""
        st = self._state()
        if st is None:
            return False
        now = self.clock()
        pids: dict[str, int] = dict(st.get("pids") or {})
        argvs: dict[str, list[str]] = dict(st.get("argv") or {})
        changed = False
        for name, pid in pids.items():
            argv = argvs.get(name)
            if not argv or _alive(pid):
                self.down_since.pop(name, None)
                continue
            rec = self.record.setdefault(name, {"restarts": 0})
            held = (held_dir(self.state_dir) / name).exists()
            rec["held"] = held
            if name not in self.down_since:
                self.down_since[name] = now
                changed = True
                if held:
                    rec["resumed"] = True          # stopped on purpose: its start is no restart
                else:
                    ran = now - self.started_at.get(name, float(st.get("started") or 0.0))
                    self.quick_exits[name] = self.quick_exits.get(name, 0) + 1 if ran < STABLE_S else 0
                    rec["lastExit"] = self._exit_text(name, pid)
                    rec["lastExitAt"] = _iso(now)
                    changed = True
            if held:
                continue
            if now - self.down_since[name] < restart_delay(self.quick_exits.get(name, 0)):
                continue
            logf = open(self.state_dir / "logs" / f"{name}.log", "ab")
            try:
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=self.state_dir)
            except OSError as exc:
                rec["lastExit"] = f"could not be started again: {exc}"
                self.down_since[name] = now
                self.quick_exits[name] = self.quick_exits.get(name, 0) + 1
                changed = True
                continue
            finally:
                logf.close()
            self.children[name] = proc
            self.started_at[name] = now
            self.down_since.pop(name, None)
            pids[name] = proc.pid
            rec["restarts"] = rec.get("restarts", 0) + (0 if rec.get("resumed") else 1)
            rec.pop("resumed", None)
            rec["held"] = False
            rec["lastStartAt"] = _iso(now)
            rec["pid"] = proc.pid
            changed = True
            st2 = self._state()
            if st2 is None:
                proc.terminate()
                return False
            st2.setdefault("pids", {})[name] = proc.pid
            self._write(self.state_file, st2)
        if changed:
            self._write(self.state_dir / "supervisor.json", {"pid": os.getpid(), "components": self.record})
        return True

    def run(self) -> None:
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
        self._write(self.state_dir / "supervisor.json", {"pid": os.getpid(), "components": self.record})
        while not stop["now"] and self.tick():
            time.sleep(TICK_S)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m meshplan.devcluster.supervisor STATE_DIR", file=sys.stderr)
        return 2
    Supervisor(Path(args[0])).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
