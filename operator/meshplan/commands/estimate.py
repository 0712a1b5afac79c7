"""`meshplan estimate`: predict TTFT and TPOT for every row of a scenarios CSV.

The CSV uses the calibration data's columns (`id`, `model_path`, `system`,
`backend`, `precision`, `mode`, `isl`, `osl`, `batch_size`, `tp_size`,
`pp_size`, `attention_dp_size`, `moe_tp_size`, `moe_ep_size`,
`gemm_quant_mode`, `moe_quant_mode`; `prefill_*` / `decode_*` for
`mode=disagg`). A model `org/name` is read from `DIR/org--name_config.json`
(`--model-configs DIR`), falling back to the built-in catalogue. Output:
`id,pred_ttft_ms,pred_tpot_ms,error` — `error` is empty, or says why that row
cannot be predicted (the other rows are still predicted).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from meshplan.planner import calibration as cal


def estimate_rows(scenarios_csv: str | Path, model_configs: str | Path | None) -> list[dict]:
    """[{id, pred_ttft_ms, pred_tpot_ms, error}] for every row, in order."""
    out = []
    for row, sc, err in cal.load_scenarios(scenarios_csv, model_configs):
        rid = row.get("id", "")
        if sc is None:
            out.append({"id": rid, "pred_ttft_ms": "", "pred_tpot_ms": "", "error": err})
            continue
        try:
            ttft, tpot = cal.predict_scenario(sc)
        except (ValueError, ZeroDivisionError, OverflowError) as exc:
            out.append({"id": rid, "pred_ttft_ms": "", "pred_tpot_ms": "", "error": str(exc)})
            continue
        out.append({"id": rid, "pred_ttft_ms": f"{ttft:.3f}", "pred_tpot_ms": f"{tpot:.4f}", "error": ""})
    return out


def run(args: argparse.Namespace) -> int:
    src = Path(args.scenarios)
    if not src.exists():
        print(f"--scenarios: no such file {src}", file=sys.stderr)
        return 2
    if args.model_configs and not Path(args.model_configs).is_dir():
        print(f"--model-configs: {args.model_configs} is not a directory", file=sys.stderr)
        return 2
    rows = estimate_rows(src, args.model_configs)
    fields = ["id", "pred_ttft_ms", "pred_tpot_ms", "error"]
    if args.output in (None, "-"):
        w = csv.DictWriter(sys.stdout, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    else:
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        failed = sum(1 for r in rows if r["error"])
        print(f"predicted {len(rows) - failed} of {len(rows)} rows -> {args.output}"
              + (f" ({failed} with an error column)" if failed else ""), file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="predict TTFT/TPOT for every row of a scenarios CSV (calibration-data format)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenarios", required=True, metavar="FILE.csv", help="scenarios in the calibration CSV format")
    p.add_argument("--model-configs", metavar="DIR", default=None,
                   help="directory of Hugging Face configs named org--name_config.json")
    p.add_argument("--output", metavar="FILE.csv", default=None, help="output CSV (default: stdout)")
    p.set_defaults(func=run)
