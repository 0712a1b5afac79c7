"""The `meshplan` command line.

Each subcommand lives in its own module under `meshplan.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Modules are imported lazily by name so that a missing optional dependency of
one command (matplotlib for `plan --plot`, say) never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under meshplan.commands
COMMANDS: dict[str, str] = {
    "dev-cluster": "dev_cluster",
    "demo": "demo",
    "plan": "plan",
    "estimate": "estimate",
    "architecture": "architecture",
    "render": "render",
    "crd": "crd",
    "run": "run",
    "cleanup": "cleanup",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshplan",
        description="Plan, place, configure and autoscale LLM inference on real GPU topology.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = None
    if argv:
        first = next((a for a in argv if not a.startswith("-")), None)
        if first in COMMANDS:
            wanted = first
    for name, module in COMMANDS.items():
        if wanted is not None and name != wanted:
            continue
        try:
            mod = importlib.import_module(f"meshplan.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("meshplan.commands"):
                continue  # command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
