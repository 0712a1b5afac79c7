"""Runs INSIDE the sglang-router venv (stdlib + sglang-router only). JSON in on stdin, JSON out (last line).

Input: {"cases": [{"id", "argv"}]}: the args of `python -m sglang_router.launch_router` meshplan renders.
For each case: the router's own parser, `sglang_router.launch_router.parse_router_args` (argparse with
RouterArgs.add_cli_args, then RouterArgs.from_cli_args, which parses `--prefill URL [BOOTSTRAP_PORT]`), and
RouterArgs._validate_router_args (what launch_router runs before it starts the Rust router). Nothing is started.
"""

import importlib.metadata
import json
import sys

from router_probe_loop import run_cases

payload = json.loads(sys.stdin.read())

from sglang_router.launch_router import parse_router_args  # noqa: E402

results = run_cases(payload["cases"], parse_router_args, lambda args: dict(
    pd_disaggregation=args.pd_disaggregation, prefill_urls=[list(u) for u in args.prefill_urls],
    decode_urls=list(args.decode_urls), host=args.host, port=args.port, policy=args.policy))
print(json.dumps({"version": importlib.metadata.version("sglang-router"), "results": results}))
