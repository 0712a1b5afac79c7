"""`meshplan crd generate|check|print`: the CRD generated from the API models.

`generate` writes crds/meshplan.dev_llmdeployments.yaml and the Helm chart's
copy; `check` exits 1 (listing the files) when either differs from what the
models generate, for CI; `print` writes the CRD to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _repo_root(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    here = Path.cwd()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").exists() and (candidate / "operator" / "meshplan").is_dir():
            return candidate
    return here


def run(args: argparse.Namespace) -> int:
    from meshplan.api import crd

    root = _repo_root(args.root)
    if args.action == "print":
        sys.stdout.write(crd.render_crd())
        return 0
    if args.action == "generate":
        for path in crd.write_crd(root):
            print(f"wrote {path}")
        return 0
    stale = crd.drifted(root)
    if stale:
        for path in stale:
            print(f"{path}: differs from the models; run `meshplan crd generate`", file=sys.stderr)
        return 1
    print("CRD files match the models")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("crd", help="generate or check the LLMDeployment CRD from the API models")
    p.add_argument("action", choices=("generate", "check", "print"), help="generate files, check for drift, or print")
    p.add_argument("--root", help="repository root (default: found from the current directory)")
    p.set_defaults(func=run)
