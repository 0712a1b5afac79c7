"""Accuracy of the performance model by leave-one-model-out cross-validation.

For each model architecture in the calibration CSV (quantised re-releases such
as nvidia/Llama-3.1-8B-Instruct-FP8 count as their base model), fit the global
parameters on the OTHER models' rows and predict the held-out model's rows.
Prints per model and overall (pooled over all held-out predictions):

- TPOT median absolute relative error and Spearman rank correlation,
- TTFT median absolute relative error and bias (median signed relative error),
- share of rows predicted (an unpredictable row says why).

Usage (from the repository root):

    python benchmarks/accuracy.py                 # leave-one-model-out
    python benchmarks/accuracy.py --jobs 2        # the same, two folds at a time
    python benchmarks/accuracy.py --fit           # fit on all rows, print FITTED_PARAMS
    python benchmarks/accuracy.py --no-refit      # evaluate the committed FITTED_PARAMS
    python benchmarks/accuracy.py --aic-sample DIR   # unseen rows, see below

The data defaults to ../shared/data/calibration (override with --data DIR or
$MESHPLAN_CALIBRATION_DIR).

`--aic-sample DIR` evaluates the committed FITTED_PARAMS (fitted on the
calibration set only) on the rows of NVIDIA AIConfigurator's silicon sample
that the calibration set does not have: DIR is the `aiconfigurator_core`
package directory of `pip install aiconfigurator==0.12.0` (its
`systems/silicon_sample.csv`, 5,221 rows, is a superset of our 2,046, and its
`model_configs/` holds the models' config.json). Those rows are 3,175 runs of
seven models the fit never saw. Nothing of it is stored in this repository.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import math
import multiprocessing
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from meshplan.planner import calibration as cal


def family(model_path: str) -> str:
    """Architecture key: org dropped, quantisation / instruct suffixes dropped."""
    name = model_path.split("/")[-1].lower()
    return re.sub(r"(-instruct|-fp8|-nvfp4|-fp4|-awq|-gptq)+$", "", name)


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else float("nan")


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summarise(label: str, results: list[tuple], total_rows: int) -> dict:
    """results: (scenario, pred_ttft, pred_tpot)."""
    tp_err = [abs(p / s.measured_tpot_ms - 1) for s, _, p in results if s.measured_tpot_ms]
    tp_pred = [p for s, _, p in results if s.measured_tpot_ms]
    tp_meas = [s.measured_tpot_ms for s, _, p in results if s.measured_tpot_ms]
    tt = [(t / s.measured_ttft_ms - 1) for s, t, _ in results if s.measured_ttft_ms]
    out = {
        "rows": total_rows,
        "predicted": len(results) / total_rows if total_rows else float("nan"),
        "tpot_mape_median": median(tp_err),
        "tpot_spearman": spearman(tp_pred, tp_meas),
        "ttft_err_median": median([abs(x) for x in tt]),
        "ttft_bias_median": median(tt),
    }
    print(f"{label:<24} rows {total_rows:5d}  predicted {out['predicted']:6.1%}  "
          f"TPOT med|err| {out['tpot_mape_median']:6.1%}  Spearman {out['tpot_spearman']:5.3f}  "
          f"TTFT med|err| {out['ttft_err_median']:6.1%}  bias {out['ttft_bias_median']:+6.1%}")
    return out


def predict_all(items, params) -> tuple[list, list]:
    ok, failed = [], []
    for row, sc, err in items:
        if sc is None:
            failed.append((row, err))
            continue
        try:
            ttft, tpot = cal.predict_scenario(sc, params)
        except (ValueError, ZeroDivisionError, OverflowError) as exc:
            failed.append((row, str(exc)))
            continue
        ok.append((sc, ttft, tpot))
    return ok, failed


# Models of the sample without their own config.json there: the same architecture
# under another checkpoint's config (quantisation comes from the CSV row, not the config).
AIC_CONFIG_ALIASES = {"zhipuai/GLM-5": "nvidia/GLM-5-NVFP4", "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1"}


def unseen_aic_rows(aic_root: Path, calib: Path, out: Path) -> int:
    """Write the sample's rows missing from `calib` and their configs to `out`; returns the row count."""
    seen = {r["id"] for r in csv.DictReader((calib / "silicon_calibration.csv").open())}
    with (aic_root / "systems" / "silicon_sample.csv").open() as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["id"] not in seen]
        fields = reader.fieldnames
    with (out / "silicon_calibration.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    (out / "model_configs").mkdir()
    for mp in sorted({r["model_path"] for r in rows}):
        found = [d / cal.config_name(name) for name in (mp, AIC_CONFIG_ALIASES.get(mp, mp))
                 for d in (aic_root / "model_configs", calib / "model_configs") if (d / cal.config_name(name)).exists()]
        if found:
            shutil.copy(found[0], out / "model_configs" / cal.config_name(mp))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="calibration dir (default ../shared/data/calibration)")
    ap.add_argument("--fit", action="store_true", help="fit on all rows and print the parameters")
    ap.add_argument("--no-refit", action="store_true", help="evaluate the committed FITTED_PARAMS as they are")
    ap.add_argument("--iters", type=int, default=300, help="Nelder-Mead iterations per fit")
    ap.add_argument("--mode", choices=("agg", "disagg", "all"), default="all")
    ap.add_argument("--jobs", type=int, default=1, help="folds fitted in parallel processes (default 1)")
    ap.add_argument("--show-failures", action="store_true")
    ap.add_argument("--aic-sample", type=Path, default=None, metavar="DIR",
                    help="aiconfigurator_core package dir: evaluate the committed parameters on its unseen rows")
    args = ap.parse_args(argv)
    data = args.data or cal.default_data_dir()
    if args.aic_sample is not None:
        if not (args.aic_sample / "systems" / "silicon_sample.csv").exists():
            print(f"no systems/silicon_sample.csv under {args.aic_sample}: pass the aiconfigurator_core "
                  "package directory of `pip install aiconfigurator==0.12.0`", file=sys.stderr)
            return 2
        tmp = Path(tempfile.mkdtemp(prefix="meshplan-aic-"))
        atexit.register(shutil.rmtree, tmp, True)
        n = unseen_aic_rows(args.aic_sample, data, tmp)
        print(f"{n} rows of {args.aic_sample / 'systems/silicon_sample.csv'} not in {data}; "
              f"committed parameters (fitted on the calibration set only)")
        data, args.no_refit, args.fit = tmp, True, False
    csv_path = data / "silicon_calibration.csv"
    if not csv_path.exists():
        print(f"calibration data not found at {csv_path}; pass --data DIR", file=sys.stderr)
        return 2
    modes = ("agg", "disagg") if args.mode == "all" else (args.mode,)
    items = cal.load_scenarios(csv_path, data / "model_configs", modes=modes)
    fit_items = [(r, s, e) for r, s, e in items if s is not None]
    t0 = time.time()

    if args.fit:
        params = cal.fit([s for _, s, _ in fit_items], iters=args.iters)
        print("FITTED_PARAMS = PerfParams(" + ", ".join(
            f"{n}={getattr(params, n):.4g}" for n in cal.FIT_NAMES) + ")")
        ok, failed = predict_all(items, params)
        summarise("in-sample (all)", ok, len(items))
        print(f"fit took {time.time() - t0:.1f} s")
        return 0

    groups: dict[str, list] = defaultdict(list)
    for it in items:
        groups[family(it[0].get("model_path", ""))].append(it)
    pooled: list = []
    pooled_failed: list = []
    per_model = {}
    fams = sorted(groups)
    if args.no_refit:
        fold_params = {fam: cal.FITTED_PARAMS for fam in fams}
    else:
        trains = [[s for f2, its in groups.items() if f2 != fam for _, s, _ in its if s is not None]
                  for fam in fams]
        if args.jobs > 1:
            with multiprocessing.Pool(args.jobs) as pool:
                fitted = pool.starmap(cal.fit, [(train, None, args.iters) for train in trains], chunksize=1)
        else:
            fitted = [cal.fit(train, iters=args.iters) for train in trains]
        fold_params = dict(zip(fams, fitted))
    for fam in fams:
        held = groups[fam]
        params = fold_params[fam]
        ok, failed = predict_all(held, params)
        per_model[fam] = summarise(fam, ok, len(held))
        pooled += ok
        pooled_failed += failed
    print("-" * 140)
    label = "ALL (held-out pooled)"
    if args.no_refit:
        label = "ALL (unseen rows)" if args.aic_sample is not None else "ALL (in-sample, committed)"
    summarise(label, pooled, len(items))
    agg = [x for x in pooled if x[0].mapping is not None]
    n_agg = sum(1 for r, _, _ in items if (r.get("mode") or "agg") == "agg")
    if agg and n_agg != len(items):
        summarise("agg rows only", agg, n_agg)
        dis = [x for x in pooled if x[0].mapping is None]
        summarise("disagg rows only", dis, len(items) - n_agg)
        # rows that record no decode worker count are predicted as one worker of each kind
        counted = {r.get("id") for r, _, _ in items if (r.get("decode_num_workers") or "").strip()}
        n_counted = sum(1 for r, _, _ in items if r.get("id") in counted)
        if 0 < n_counted < len(items) - n_agg:
            summarise("  with worker counts", [x for x in dis if x[0].id in counted], n_counted)
            summarise("  without (1 assumed)", [x for x in dis if x[0].id not in counted],
                      len(items) - n_agg - n_counted)
    reasons = defaultdict(int)
    for _, err in pooled_failed:
        reasons[err.split(":")[0][:90]] += 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  not predicted: {n:4d} x {why}")
    print(f"took {time.time() - t0:.1f} s{' (no refit)' if args.no_refit else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
