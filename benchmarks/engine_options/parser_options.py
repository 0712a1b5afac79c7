"""Print the option strings of an engine's own server parser (run with a Python where the engine imports).

    <engine venv>/bin/python benchmarks/engine_options/parser_options.py vllm|sglang

stdlib + the engine only. Builds the parser exactly as the server command does and prints, as JSON on
the last line of stdout, one list of option strings per argparse action (aliases together):

- vLLM (`vllm serve`): `make_arg_parser(FlexibleArgumentParser())` (vllm/entrypoints/launchers/cli_args.py
  in 0.32; vllm/entrypoints/openai/cli_args.py before), what vllm/entrypoints/cli/serve.py registers.
- SGLang (`python -m sglang.launch_server`, `sglang serve`): `ServerArgs.add_cli_args(argparse.ArgumentParser())`
  (sglang/srt/server_args.py: in 0.5.23 the options are generated from the ServerArgs dataclass fields by
  sglang/srt/arg_groups/arg_utils.py add_cli_args_from_dataclass, so a static reading of add_argument calls
  no longer finds them).
"""

from __future__ import annotations

import argparse
import json
import sys


def vllm_parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def main(engine: str) -> int:
    parser = {"vllm": vllm_parser, "sglang": sglang_parser}[engine]()
    groups = [list(a.option_strings) for a in parser._actions if a.option_strings]
    print(json.dumps({"engine": engine, "allow_abbrev": parser.allow_abbrev, "groups": groups}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
