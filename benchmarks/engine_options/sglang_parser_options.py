"""Print SGLang's server option table (`SGLANG_OPTIONS` of operator/meshplan/catalog/engine_options.py)
from SGLang's OWN parser, run inside the SGLang engine venv (engines-venv/sglang-0.5.23.txt):

    $(.venv/bin/python engines-venv/install.py --path sglang-0.5.23) benchmarks/engine_options/sglang_parser_options.py

From 0.5.23 on most options are generated from the ServerArgs field namespaces
(arg_groups/fields/*, add_cli_args_from_dataclass), so the static `ast` reading of
extract_options.py no longer sees them; this asks `ServerArgs.add_cli_args` for its actions.
"""

import argparse

import sglang
from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
rows = [tuple(a.option_strings) for a in parser._actions if a.option_strings]
print(f"# sglang {sglang.__version__}: {len(rows)} options")
print("SGLANG_OPTIONS: tuple[tuple[str, ...], ...] = (")
for r in rows:
    print(f"    {r!r},")
print(")")
