"""Regenerate `operator/meshplan/catalog/engine_options.py`: the real option names of each engine's
server command line at the version meshplan pins (render.engine_args.DEFAULT_IMAGES).

Static extraction (no engine import: vLLM and SGLang import torch/CUDA at module level), by
reading the parser code of the released packages with Python's `ast`:

- vLLM 0.12.0 (`vllm serve`): the wheel from PyPI
  (`pip download --no-deps --only-binary :all: vllm==0.12.0`). Options are
  * every literal option string of an `add_argument(...)` call in
    vllm/engine/arg_utils.py (EngineArgs.add_cli_args, AsyncEngineArgs.add_cli_args) and
    vllm/entrypoints/openai/cli_args.py (make_arg_parser);
  * `--<field with _ as ->` for each field of `FrontendArgs` (cli_args.py registers them in a loop:
    `frontend_group.add_argument(f"--{key.replace('_', '-')}", **value)`).
  Boolean fields get argparse.BooleanOptionalAction, i.e. also `--no-<name>`; the guard accepts
  `--no-X` exactly when `--X` is an option, so the `--no-` forms are not listed.
  FlexibleArgumentParser (vllm/utils/argparse_utils.py) turns `_` into `-` in `--` option names and
  reads `--name.key value` as a JSON field of `--name`; it keeps argparse's allow_abbrev=True.
- SGLang 0.5.5 (`python -m sglang.launch_server`): the wheel from PyPI
  (`pip download --no-deps sglang==0.5.5`); every literal option string of an `add_argument(...)`
  call in sglang/srt/server_args.py (ServerArgs.add_cli_args; a plain argparse.ArgumentParser(),
  allow_abbrev=True, no `_`/`-` conversion).
- TensorRT-LLM (`trtllm-serve serve`): tensorrt_llm/commands/serve.py, click options of the `serve`
  command (`@click.option("--a", "--b", ...)` decorators of `def serve`). The TensorRT-LLM wheels are
  not on PyPI; pass a checkout's serve.py with --trtllm-serve-py. click matches option names
  exactly (no abbreviations, no `_`/`-` conversion).

From the engine's own parser (preferred; needed from SGLang 0.5.23 on, whose options are generated from
the ServerArgs dataclass): `parser_options.py` run with a Python where the engine imports prints the
option strings of every action as JSON; pass that file with --vllm-json / --sglang-json (and the version
and where it came from). `--no-X` strings of a BooleanOptionalAction are dropped when `--X` is in the same
action (the guard accepts `--no-X` exactly when `--X` is an option), as for the wheels.

    V=$(.venv/bin/python engines-venv/install.py --path vllm-0.32.0)
    $V benchmarks/engine_options/parser_options.py vllm | tail -1 > /tmp/vllm.json
    <python with sglang 0.5.23> benchmarks/engine_options/parser_options.py sglang | tail -1 > /tmp/sglang.json
    python benchmarks/engine_options/extract_options.py --vllm-json /tmp/vllm.json --vllm-version 0.32.0 \
        --vllm-source "..." --sglang-json /tmp/sglang.json --sglang-version 0.5.23 --sglang-source "..." \
        > operator/meshplan/catalog/engine_options.py

From the wheels (static, the versions before):
    python benchmarks/engine_options/extract_options.py \
        --vllm-wheel ~/.cache/meshplan-engine-src/vllm-0.12.0-cp38-abi3-manylinux_2_31_x86_64.whl \
        --sglang-wheel ~/.cache/meshplan-engine-src/sglang-0.5.5-py3-none-any.whl \
        --trtllm-serve-py path/to/tensorrt_llm/commands/serve.py --trtllm-source "NVIDIA/TensorRT-LLM@<commit>" \
        > operator/meshplan/catalog/engine_options.py
Without --trtllm-serve-py the TensorRT-LLM table of the current module is kept as it is.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import pathlib
import sys
import zipfile


def _literal_options(call: ast.Call) -> tuple[str, ...]:
    return tuple(a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("-"))


def argparse_options(source: str, functions: set[str] | None = None) -> list[tuple[str, ...]]:
    """Option strings of each literal add_argument(...) call (inside `functions`, if given)."""
    tree = ast.parse(source)
    out: list[tuple[str, ...]] = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and (functions is None or n.name in functions)] if functions else [tree]
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                opts = _literal_options(node)
                if opts and opts not in out:
                    out.append(opts)
    return out


def dataclass_field_options(source: str, cls: str) -> list[tuple[str, ...]]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [(f"--{s.target.id.replace('_', '-')}",) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise SystemExit(f"class {cls} not found")


def click_options(source: str, function: str) -> list[tuple[str, ...]]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            out = []
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "option":
                    out.append(_literal_options(d))
            return out
    raise SystemExit(f"function {function} not found")


def _read(wheel: str, member: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(member).decode()


def vllm(wheel: str) -> list[tuple[str, ...]]:
    arg_utils = _read(wheel, "vllm/engine/arg_utils.py")
    cli_args = _read(wheel, "vllm/entrypoints/openai/cli_args.py")
    opts = argparse_options(arg_utils, {"add_cli_args"})
    opts += dataclass_field_options(cli_args, "FrontendArgs")
    opts += argparse_options(cli_args, {"make_arg_parser"})
    opts.append(("--help", "-h"))    # argparse's own
    return list(dict.fromkeys(opts))


def sglang(wheel: str) -> list[tuple[str, ...]]:
    opts = argparse_options(_read(wheel, "sglang/srt/server_args.py"), {"add_cli_args"})
    opts.append(("--help", "-h"))
    return list(dict.fromkeys(opts))


def trtllm(serve_py: str) -> list[tuple[str, ...]]:
    opts = click_options(pathlib.Path(serve_py).read_text(), "serve")
    opts.append(("--help",))          # click's own
    return list(dict.fromkeys(opts))


def from_parser_json(path: str) -> list[tuple[str, ...]]:
    """Groups printed by parser_options.py, without the `--no-X` twin of `--X` (see the docstring)."""
    import json

    lines = [ln for ln in pathlib.Path(path).read_text().splitlines() if ln.strip()]
    groups = json.loads(lines[-1])["groups"]
    out: list[tuple[str, ...]] = []
    for g in groups:
        keep = tuple(o for o in g if not (o.startswith("--no-") and "--" + o[5:] in g))
        if keep and keep not in out:
            out.append(keep)
    # argparse's own -h/--help last, as in the wheel tables
    help_ = [g for g in out if "--help" in g]
    return [g for g in out if "--help" not in g] + [("--help", "-h")] * bool(help_)


def _table(name: str, groups: list[tuple[str, ...]]) -> str:
    lines = [f"{name}: tuple[tuple[str, ...], ...] = ("]
    lines += [f"    {g!r}," for g in groups]
    lines.append(")")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-wheel")
    p.add_argument("--sglang-wheel")
    p.add_argument("--vllm-json", help="parser_options.py output for vLLM")
    p.add_argument("--vllm-version", default="0.12.0")
    p.add_argument("--vllm-source", default="")
    p.add_argument("--sglang-json", help="parser_options.py output for SGLang")
    p.add_argument("--sglang-version", default="0.5.5")
    p.add_argument("--sglang-source", default="")
    p.add_argument("--trtllm-serve-py")
    p.add_argument("--trtllm-source", default="")
    a = p.parse_args(argv)
    here = pathlib.Path(__file__).resolve().parents[2] / "operator/meshplan/catalog/engine_options.py"
    trt_groups: list[tuple[str, ...]]
    trt_source: str
    if a.trtllm_serve_py:
        trt_groups, trt_source = trtllm(a.trtllm_serve_py), a.trtllm_source or a.trtllm_serve_py
    else:
        spec = importlib.util.spec_from_file_location("engine_options", here)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)          # type: ignore[union-attr]
        trt_groups, trt_source = list(mod.TRTLLM_OPTIONS), mod.SOURCES["trtllm"]
    if not (a.vllm_json or a.vllm_wheel) or not (a.sglang_json or a.sglang_wheel):
        p.error("give --vllm-json or --vllm-wheel, and --sglang-json or --sglang-wheel")
    sources = {
        "vllm": a.vllm_source or (f"vllm {a.vllm_version} wheel ({pathlib.Path(a.vllm_wheel).name}): "
                                  "vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py"),
        "sglang": a.sglang_source or (f"sglang {a.sglang_version} wheel ({pathlib.Path(a.sglang_wheel).name}): "
                                      "sglang/srt/server_args.py"),
        "trtllm": trt_source,
    }
    trt_version = "1.1.0"
    if not a.trtllm_serve_py:
        trt_version = mod.VERSIONS["trtllm"]
    vllm_groups = from_parser_json(a.vllm_json) if a.vllm_json else vllm(a.vllm_wheel)
    sglang_groups = from_parser_json(a.sglang_json) if a.sglang_json else sglang(a.sglang_wheel)
    print('"""GENERATED by benchmarks/engine_options/extract_options.py; do not edit by hand.\n\n'
          "The option strings of each engine's server parser at the version meshplan pins, one tuple per\n"
          "parser action (aliases together), as the engine's own source spells them. See the tool's\n"
          'docstring for how each table was extracted."""\n')
    versions = {"vllm": a.vllm_version, "sglang": a.sglang_version, "trtllm": trt_version}
    print(f"VERSIONS: dict[str, str] = {versions!r}")
    print(f"SOURCES: dict[str, str] = {sources!r}\n")
    print(_table("VLLM_OPTIONS", vllm_groups) + "\n")
    print(_table("SGLANG_OPTIONS", sglang_groups) + "\n")
    print(_table("TRTLLM_OPTIONS", trt_groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
