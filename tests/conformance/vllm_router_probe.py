"""Runs INSIDE the vllm-router venv (stdlib + vllm-router only). JSON in on stdin, JSON out (last line).

Input: {"cases": [{"id", "argv"}]}: the args of `vllm-router` meshplan renders (without the program name).
For each case: the router's own parser, `vllm_router.launch_router.parse_router_args` (argparse with
RouterArgs.add_cli_args, then RouterArgs.from_cli_args, which parses `--prefill URL [BOOTSTRAP_PORT]`), and
RouterArgs._validate_router_args (what launch_router runs before it starts the Rust router). Nothing is started.
The console script `vllm-router` is checked to be vllm_router.launch_router:main (the wheel's entry point).
"""

import importlib.metadata
import json
import sys

from router_probe_loop import run_cases

payload = json.loads(sys.stdin.read())

from vllm_router.launch_router import parse_router_args  # noqa: E402

entry = [e.value for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "vllm-router"]
results = run_cases(payload["cases"], parse_router_args, lambda args: dict(
    vllm_pd_disaggregation=args.vllm_pd_disaggregation, prefill_urls=[list(u) for u in args.prefill_urls],
    decode_urls=list(args.decode_urls), host=args.host, port=args.port, kv_connector=args.kv_connector,
    policy=args.policy))
print(json.dumps({"version": importlib.metadata.version("vllm-router"), "entry_point": entry, "results": results}))
