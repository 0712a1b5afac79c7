"""Check the TensorRT-LLM multi-node ssh bootstrap with OpenSSH itself (sshd and ssh of this machine).

    python benchmarks/trtllm_ssh_check.py      # needs root, /usr/sbin/sshd (Debian: openssh-server) and ssh

It writes the Secret's files as the operator makes them (meshplan.engines.trtllm_ssh) with the mode
the pods mount them with (0400), starts sshd with the worker script meshplan renders
(engines.trtllm.SSHD_SCRIPT: only the directory and the port are changed, to a temporary directory
and a free port), and logs in with the leader's ssh options (engines.trtllm.SSH_CLIENT_ARGS, the
same two changes), host key checked against the rendered known_hosts, running a command the way
Open MPI's rsh launcher does. It prints each step and exits non-zero when one fails.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

import meshplan.render  # noqa: E402,F401  (import order of the package)
from meshplan.engines import trtllm  # noqa: E402
from meshplan.engines.trtllm_ssh import ssh_files  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "ssh"
        d.mkdir()
        for name, text in ssh_files("check").items():
            (d / name).write_text(text)
            os.chmod(d / name, trtllm.SSH_FILE_MODE)
        script = trtllm.SSHD_SCRIPT.replace(trtllm.SSH_DIR, str(d)).replace(f"-p {trtllm.TRTLLM_SSH_PORT}",
                                                                            f"-p {port}")
        print("worker script:\n" + script)
        sshd = subprocess.Popen(["/bin/sh", "-c", script, trtllm.TRTLLM_SSHD_SCRIPT_NAME],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(50):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            client = trtllm.SSH_CLIENT_ARGS.replace(trtllm.SSH_DIR, str(d)).replace(
                f"-p {trtllm.TRTLLM_SSH_PORT}", f"-p {port}")
            cmd = ["ssh", *shlex.split(client), "127.0.0.1", "echo login-ok; echo PATH=$PATH"]
            print("leader ssh:", " ".join(cmd))
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            print(out.stdout.strip() or "(no output)")
            if out.returncode != 0:
                print("ssh failed:", out.stderr.strip())
                return 1
            session = next((ln[5:] for ln in out.stdout.splitlines() if ln.startswith("PATH=")), "").split(":")
            # the login shell's rc files may add entries; every entry of the container's PATH must be there
            ok = "login-ok" in out.stdout and all(p in session for p in os.environ.get("PATH", "").split(":") if p)
            print("host key verified, key login, container PATH passed to the session:", ok)
            return 0 if ok else 1
        finally:
            sshd.terminate()
            try:
                sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sshd.kill()
            print("sshd log:", (sshd.stdout.read() if sshd.stdout else "").strip()[-800:])


if __name__ == "__main__":
    sys.exit(main())
