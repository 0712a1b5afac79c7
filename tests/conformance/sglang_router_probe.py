"""Runs INSIDE the sglang-router venv (stdlib + sglang-router only). JSON in on stdin, JSON out (last line).

Input: {"cases": [{"id", "argv"}]}: the args of `python -m sglang_router.launch_router` meshplan renders.
For each case: the router's own parser, `sglang_router.launch_router.parse_router_args` (argparse with
RouterArgs.add_cli_args, then RouterArgs.from_cli_args, which parses `--prefill URL [BOOTSTRAP_PORT]`), and
RouterArgs._validate_router_args (what launch_router runs before it starts the Rust router). Nothing is started.
"""

import contextlib
import importlib.metadata
import io
import json
import sys
import traceback

payload = json.loads(sys.stdin.read())

from sglang_router.launch_router import parse_router_args  # noqa: E402

results = []
for case in payload["cases"]:
    out = {"id": case["id"], "ok": False, "error": ""}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parse_router_args(list(case["argv"]))
        args._validate_router_args()
        out.update(ok=True, pd_disaggregation=args.pd_disaggregation, prefill_urls=[list(u) for u in args.prefill_urls],
                   decode_urls=list(args.decode_urls), host=args.host, port=args.port, policy=args.policy)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from argparse
        out["error"] = f"{type(exc).__name__}: {exc} {err.getvalue().strip()[-600:]}"
        out["trace"] = traceback.format_exc()[-1500:]
    results.append(out)

print(json.dumps({"version": importlib.metadata.version("sglang-router"), "results": results}))
