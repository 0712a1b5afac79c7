"""The loop both PD-router probes run (sglang_router_probe.py, vllm_router_probe.py), inside the router's own venv
(stdlib only here): each case's argv through the router's `parse_router_args`, then `_validate_router_args` (what
its launcher runs before it starts the Rust router); nothing is started. `fields(args)` picks what the test reads."""

import contextlib
import io
import traceback


def run_cases(cases, parse_router_args, fields):
    results = []
    for case in cases:
        out = {"id": case["id"], "ok": False, "error": ""}
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parse_router_args(list(case["argv"]))
            args._validate_router_args()
            out.update(ok=True, **fields(args))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from argparse
            out["error"] = f"{type(exc).__name__}: {exc} {err.getvalue().strip()[-600:]}"
            out["trace"] = traceback.format_exc()[-1500:]
        results.append(out)
    return results
