"""The planner on a second evidence base: public measurements from sources other than the calibration set.

    python benchmarks/evidence.py                  # held-out figures per source / model / engine / GPU
    python benchmarks/evidence.py --rows           # also every row, predicted against measured
    python benchmarks/evidence.py --variant NAME   # a candidate model term (see VARIANTS), fitted
                                                   # leave-one-source-out and leave-one-model-out
    python benchmarks/evidence.py --variants       # every candidate, both folds, one line each
    python benchmarks/evidence.py --no-suspect     # without the sources sources.yaml marks suspect
    python benchmarks/evidence.py --decompose      # which held-out part the leave-one-model-out misses come from
    python benchmarks/evidence.py --find-overlap   # rewrite runs.csv's calibration_id from the calibration set
    python benchmarks/evidence.py --refit-lomo --iters 500 --jobs 2   # rewrite lomo_params.json (3 min)
    python benchmarks/evidence.py --fit-family-layer  # calibration.FAMILY_LAYER_US from the AMD rows
    python benchmarks/evidence.py --fit-p50          # calibration.TTFT_P50 from the calibration rows' median TTFT

Data: benchmarks/evidence/runs.csv (one measured point a row) and sources.yaml (where each source's
figures were read, engine and version, benchmark client, how its figures are defined). Issue 20, build 1.

Held out by source AND model (corrected 2026-12-02; docs/evidence.md): a row that IS a calibration measurement
(runs.csv `calibration_id`, written by `--find-overlap`: InferenceX runs that AIConfigurator's database also
holds) is in no held-out figure, and a row of a model whose architecture the calibration set has is predicted
with the calibration fit repeated without that architecture (`--refit-lomo` -> lomo_params.json, `Bases`). So
the per-source table is the leave-one-source-out figure and the per-model table the leave-one-model-out figure
of the model as committed. A `--variant` adds a term with its own constant(s), which is fitted on the OTHER
sources' (models') rows and reported on the held-out source (model). Sources marked `suspect:` in sources.yaml
stay in every headline figure; the figure without them is printed on its own line. Rows of engines the model
does not price (ATOM) and speculative rows without a stated draft and acceptance length are reported, not priced.

Figures (median over rows that have the figure): TPOT, TTFT and tokens/s/GPU median absolute relative
error, bias (median signed error), Spearman rank correlation. TTFT is the source's mean; where a source gives the
median too (InferenceX-app's fixture, dstack's CSV: runs.csv `ttft_median_ms`), `Prediction.ttft_p50_ms` (the steady
state) is compared with it in its own line ("TTFT p50"). On an AMD GPU family (calibration.FAMILY_LAYER_US) every row
takes the family's per-layer overhead fitted on the other sources' and models' rows of the current engine lines
(`Bases.held_out`). `tokens/s/GPU` for throughput-only rows
(trtllm-bench) is output tokens per second per GPU at the concurrency the row names. A source whose client sends
fixed lengths (sources.yaml `random_range_ratio: 1`: dstack's) is priced with its requests in step
(`workload_of`, `Workload.synchronized`). The ALL line is followed by the two folds apart (leave-one-source-out,
leave-one-model-out) and by the same three on the engine lines the planner renders for (`ENGINE_LINES`).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from meshplan.catalog.gpus import get_gpu
from meshplan.catalog.models import get_model
from meshplan.planner.calibration import FAMILY_LAYER_US, FITTED_PARAMS, TTFT_P50, measured_run_fit
from meshplan.planner.perf import PerfParams, committed_params, predict, with_committed_ttft_p50
from meshplan.planner.memory import ReplicaMapping
from meshplan.planner.types import Speculative, Workload, acceptance_rate_for_length

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import median, spearman  # noqa: E402

HERE = Path(__file__).resolve().parent / "evidence"
GENERATION = {"a100_sxm_40gb": "ampere", "a100_sxm_80gb": "ampere", "h100_sxm": "hopper",
              "h200_sxm": "hopper", "b200_sxm": "blackwell", "b300_sxm": "blackwell", "gb200": "blackwell",
              "gb300": "blackwell", "mi300x": "cdna3", "mi325x": "cdna3",
              "mi355x": "cdna4"}
METRICS = ("tpot_ms", "ttft_ms", "tokens_per_s_per_gpu")


@dataclass(frozen=True)
class Measured:
    """What every evidence row has: where it was measured, its conditions and its figures."""
    source: str
    model: str
    gpu: str
    engine: str
    weight_dtype: str
    kv_dtype: str
    isl: int
    osl: int
    concurrency: int
    measured: dict
    spec: bool


@dataclass(frozen=True)
class Run(Measured):
    mapping: ReplicaMapping
    spec_tokens: int = 0            # speculative rows: draft tokens per step (0: the source's run without it)
    spec_accept_length: float = 1.0  # the source's mean acceptance length (tokens per step); 0: not stated
    stat: str = ""
    calibration_id: str = ""        # the calibration row that IS this measurement (fitted on: not held out)


def _is_spec(value: str | None) -> bool:
    """A row's `spec_decoding` cell: anything but empty / no / false is a speculative-decoding run."""
    return (value or "no").strip().lower() not in ("", "no", "false")


# The median TTFT (InferenceX-app's fixture gives it next to the mean for every row it holds): the steady state
# `Prediction.ttft_p50_ms` prices, reported in its own figure (`P50`)
P50 = "ttft_p50_ms"


def _measured(r: dict, columns: dict[str, str]) -> dict:
    """{metric: value} of the row's non-empty cells (`columns`: metric -> CSV column), with its median TTFT."""
    out = {k: float(r[c]) for k, c in columns.items() if (r.get(c) or "").strip()}
    if (r.get("ttft_median_ms") or "").strip():
        out[P50] = float(r["ttft_median_ms"])
    return out


def load(path: Path = HERE / "runs.csv") -> list[Run]:
    out = []
    for r in csv.DictReader(path.open()):
        measured = _measured(r, {k: k for k in METRICS})
        spec = _is_spec(r.get("spec_decoding"))
        # a speculative row that states no draft length: -1 (not priced); no acceptance length: 1 without drafts,
        # else 0 (not stated, not priced)
        tokens = (r.get("spec_tokens") or "").strip()
        spec_tokens = int(tokens) if tokens else (-1 if spec else 0)
        accept = (r.get("spec_accept_length") or "").strip()
        mapping = ReplicaMapping(attn_tp=int(r["attn_tp"]), attn_dp=int(r["attn_dp"]), moe_tp=int(r["moe_tp"]),
                                 moe_ep=int(r["moe_ep"]), pp=int(r["pp"]))
        out.append(Run(source=r["source"], model=r["model"], gpu=r["gpu"], engine=r["engine"], mapping=mapping,
                       weight_dtype=r["weight_dtype"], kv_dtype=r["kv_dtype"],
                       isl=int(r["isl"]), osl=int(r["osl"]), concurrency=int(r["concurrency"]), measured=measured,
                       spec=spec, spec_tokens=spec_tokens,
                       spec_accept_length=float(accept) if accept else (1.0 if spec_tokens <= 0 else 0.0),
                       stat=(r.get("stat") or "").strip(),
                       calibration_id=(r.get("calibration_id") or "").strip()))
    return out


# the engines the model prices (`perf.predict`'s engine argument; NIM and DeepSpeed-MII are priced as vLLM by their
# modules). A row of another engine (AMD's ATOM in InferenceX) is in runs.csv, as measured, but in no figure.
PRICED_ENGINES = ("vllm", "sglang", "trtllm")


def held_out_runs(every: list[Run]) -> list[Run]:
    """The rows every held-out figure is computed on: not speculative (priced in their own table), not a
    calibration measurement (`calibration_id`: the fit saw it), and of an engine the model prices."""
    return [r for r in every if not r.spec and not r.calibration_id and r.engine in PRICED_ENGINES]


def priced_spec_runs(every: list[Run]) -> list[Run]:
    """The speculative rows MTP can be priced on: of a priced engine, with a stated draft length and, with drafts,
    a stated acceptance length."""
    return [r for r in every if r.spec and r.engine in PRICED_ENGINES and r.spec_tokens >= 0
            and (r.spec_tokens == 0 or r.spec_accept_length > 0)]


def suspect_sources(path: Path = HERE / "sources.yaml") -> dict[str, str]:
    """{source: why its rows are doubtful} for the sources sources.yaml marks `suspect:`."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    return {k: v["suspect"] for k, v in data.items() if isinstance(v, dict) and v.get("suspect")}


# ---- held out by model: the calibration fit repeated without the run's model ----------------------------
#
# The committed FITTED_PARAMS were fitted on every calibration model, and four of the evidence base's five models
# have their architecture in the calibration set (DeepSeek-R1 is DeepSeek-V3's architecture, the catalogue gives
# both the same dimensions; Llama-3.3-70B is Llama-3.1-70B's). A row of those models is held out by SOURCE only.
# To hold it out by MODEL too, `--refit-lomo` repeats the calibration fit (`calibration.fit`, the procedure that
# produced FITTED_PARAMS) on the calibration rows of the other architectures and stores the parameters of each
# fold in lomo_params.json; `Bases` predicts a row with its model's fold. Qwen3-235B-A22B has no calibration
# family (Qwen3-32B is a dense model of other dimensions): the committed parameters never saw it.
CALIBRATION_FAMILY = {"deepseek-r1": "deepseek-v3", "deepseek-v3": "deepseek-v3", "llama-3.1-70b": "llama-3.1-70b",
                      "llama-3.1-8b": "llama-3.1-8b", "gpt-oss-120b": "gpt-oss-120b"}
LOMO_PARAMS = HERE / "lomo_params.json"


class Bases:
    """The parameters each run is predicted with: its model's leave-one-model-out fold where the calibration set
    has the model's architecture, else the committed ones; on a GPU family of `FAMILY_LAYER_US` (one the
    calibration set never measured), plus that family's per-layer overhead fitted on the evidence rows of the
    family (`family_rows`, those of the current engine lines: `fit_family_layer`) from OTHER sources and, with
    `hold_out` ("source", "model"), other models too."""

    def __init__(self, committed: PerfParams, folds: dict[str, PerfParams], family_rows=None,
                 hold_out: tuple[str, ...] = ("source", "model")):
        self.committed, self.folds = committed, folds
        self.family_rows, self.hold_out = family_rows, hold_out
        self._family: dict[tuple, float] = {}

    def calibration_fold(self, run: "Measured") -> PerfParams:
        fam = CALIBRATION_FAMILY.get(run.model)
        return self.folds.get(fam, self.committed) if fam else self.committed

    def family_layer(self, run: "Measured") -> float:
        """The held-out per-layer overhead (us) of the run's GPU family (0 where the family has none)."""
        g = get_gpu(run.gpu).family
        if self.family_rows is None or g not in FAMILY_LAYER_US:
            return 0.0
        key = (g,) + tuple(getattr(run, k) for k in self.hold_out)
        if key not in self._family:
            train = [r for r in self.family_rows if all(getattr(r, k) != getattr(run, k) for k in self.hold_out)]
            self._family[key] = fit_family_layer(train, g, self.calibration_fold)
        return self._family[key]

    def for_run(self, run: "Measured") -> PerfParams:
        # the steady-state TTFT's constants as committed: fitted on calibration rows, which are in no figure
        q = with_committed_ttft_p50(self.calibration_fold(run))
        return with_family_layer(q, get_gpu(run.gpu).family, self.family_layer(run))

    def held_out(self, family_rows, hold_out: tuple[str, ...] = ("source", "model")) -> "Bases":
        """The same folds, with the family overheads fitted on `family_rows` holding out `hold_out`."""
        return Bases(self.committed, self.folds, list(family_rows), hold_out)

    @classmethod
    def load(cls, committed: PerfParams, path: Path = LOMO_PARAMS) -> "Bases":
        import json

        data = json.loads(path.read_text())
        return cls(committed, {fam: PerfParams(**vals) for fam, vals in data["folds"].items()})


# ---- the per-layer overhead of a GPU family the calibration set never measured (calibration.FAMILY_LAYER_US) ----
FAMILY_GRID = tuple(range(0, 501, 10))        # 0-500 us per layer


def with_family_layer(q: PerfParams, family: str, us: float) -> PerfParams:
    if us:
        return q.with_values(family_layer_us=((family, us),))
    return q.with_values(family_layer_us=()) if q.family_layer_us else q


def fit_family_layer(rows: list["Run"], family: str, base) -> float:
    """The overhead (us per layer and step, `FAMILY_GRID`) that minimises `_score` on the rows of `rows` of
    `family` measured on the engine lines the planner renders for (`on_rendered_line`: an older build's floor
    is not what the planner would be serving; those rows are still predicted and in every figure), 0 without
    rows: `base(run)` gives each row's parameters without it."""
    rows = [r for r in rows if get_gpu(r.gpu).family == family and on_rendered_line(r)]
    if not rows:
        return 0.0
    return min(FAMILY_GRID, key=lambda us: (_score([(r, predict_run(r, with_family_layer(base(r), family, us)))
                                                    for r in rows]), us))


def workload_of(run: "Measured") -> Workload:
    """The run's workload as its client sent it: in step where the source's lengths are fixed (sources.yaml
    `random_range_ratio: 1`, `Workload.synchronized`)."""
    return Workload(isl=run.isl, osl=run.osl, synchronized=fixed_lengths(run.source))


def _resolve(params, run: "Run") -> PerfParams:
    return params.for_run(run) if isinstance(params, Bases) else params


def run_memory(run: "Run"):
    """The row's memory fit as its run had it (`calibration.measured_run_fit`: the run was served, so it fit)."""
    return measured_run_fit(get_model(run.model), get_gpu(run.gpu), run.mapping, weight_dtype=run.weight_dtype,
                            kv_dtype=run.kv_dtype, context_tokens=run.isl + run.osl, engine=run.engine)


def predict_run(run: Run, params) -> dict:
    params = _resolve(params, run)
    p = predict(get_model(run.model), get_gpu(run.gpu), run.mapping,
                workload_of(run), weight_dtype=run.weight_dtype, kv_dtype=run.kv_dtype,
                engine=run.engine, concurrency=run.concurrency, params=params, memory=run_memory(run))
    return {"tpot_ms": p.tpot_ms, "ttft_ms": p.ttft_ms, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            P50: p.ttft_p50_ms}


def predict_spec_run(run: Run, params: PerfParams, with_spec: bool = True) -> dict:
    """A speculative-decoding row priced with MTP at the source's acceptance length (converted to the per-token
    rate, `types.acceptance_rate_for_length`) or, `with_spec=False`, without it. A `decode-only` row (a
    prefill/decode-disaggregated decode worker) carries no other requests' prompts (interference 0)."""
    params = _resolve(params, run)
    q = params.with_values(interference=0.0) if run.stat == "decode-only" else params
    spec = None
    if with_spec and run.spec_tokens > 0:
        a = acceptance_rate_for_length(run.spec_tokens, run.spec_accept_length)
        spec = Speculative("mtp", run.spec_tokens, a, f"{run.source} acceptance length {run.spec_accept_length}")
    p = predict(get_model(run.model), get_gpu(run.gpu), run.mapping,
                workload_of(run), weight_dtype=run.weight_dtype, kv_dtype=run.kv_dtype,
                engine=run.engine, concurrency=run.concurrency, params=q, speculative=spec)
    return {"tpot_ms": p.tpot_ms, "ttft_ms": p.ttft_ms, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu}


def speculative_report(runs: list[Run], params: PerfParams) -> list[str]:
    """Lines: every speculative row predicted with MTP priced and without, the median errors of both."""
    out = ["-- speculative decoding (MTP) rows, kept apart: predicted with MTP priced / without / measured " + "-" * 20]
    with_err, without_err = [], []
    unpriced = [r for r in runs if (r.spec_tokens < 0 or (r.spec_tokens > 0 and r.spec_accept_length <= 0))
                and "tpot_ms" in r.measured]
    runs = [r for r in runs if r not in unpriced]
    for r in runs:
        p1, p0 = predict_spec_run(r, params), predict_spec_run(r, params, with_spec=False)
        m = r.measured.get("tpot_ms")
        if m is None:
            continue
        e1, e0 = p1["tpot_ms"] / m - 1.0, p0["tpot_ms"] / m - 1.0
        if r.spec_tokens > 0:
            with_err.append(e1)
            without_err.append(e0)
        out.append(f"  {r.source:<22} {r.gpu:<9} k={r.spec_tokens} accept {r.spec_accept_length:4.2f}: TPOT pred "
                   f"{p1['tpot_ms']:6.2f} ms ({e1:+6.1%}), without MTP {p0['tpot_ms']:6.2f} ms ({e0:+6.1%}), "
                   f"measured {m:6.2f} ms")
    # the MTP speed-up against the same source's run without it (the per-step floor cancels): predicted TPOT
    # ratio over measured TPOT ratio
    base = {r.source: (predict_spec_run(r, params)["tpot_ms"], r.measured["tpot_ms"])
            for r in runs if r.spec_tokens == 0 and "tpot_ms" in r.measured}
    ratio_err = []
    for r in runs:
        if r.spec_tokens > 0 and r.source in base and "tpot_ms" in r.measured:
            pb, mb = base[r.source]
            ratio_err.append((predict_spec_run(r, params)["tpot_ms"] / pb) / (r.measured["tpot_ms"] / mb) - 1.0)
    if ratio_err:
        out.append(f"  MTP speed-up against the source's own run without MTP (TPOT ratio, n={len(ratio_err)}): median "
                   f"|err| {median([abs(e) for e in ratio_err]):.1%}, bias {median(ratio_err):+.1%}")
    if unpriced:
        # MTP is priced only at a stated draft and acceptance length; these rows state none, so what they show is the measured
        # speed-up against the model's figure without MTP
        e0 = [predict_spec_run(r, params, with_spec=False)["tpot_ms"] / r.measured["tpot_ms"] - 1.0 for r in unpriced]
        out.append(f"  {len(unpriced)} MTP rows state no acceptance length or draft length ({', '.join(sorted({r.source for r in unpriced}))}): "
                   f"not priced; priced without MTP their TPOT is {median(e0):+.1%} off (median), "
                   f"{sum(1 for e in e0 if e > 0)} of {len(e0)} over the measured")
    if with_err:
        out.append(f"  MTP rows n={len(with_err)}: TPOT median |err| {median([abs(e) for e in with_err]):.1%} "
                   f"(bias {median(with_err):+.1%}) priced; {median([abs(e) for e in without_err]):.1%} "
                   f"(bias {median(without_err):+.1%}) if priced without MTP")
    return out


def _m(m: ReplicaMapping) -> str:
    return f"attn tp{m.attn_tp}xdp{m.attn_dp} moe tp{m.moe_tp}xep{m.moe_ep} pp{m.pp}"


def figures(pairs: list[tuple[Run, dict]], metrics: tuple[str, ...] = METRICS) -> dict:
    out = {}
    for k in metrics:
        got = [(pr[k], r.measured[k]) for r, pr in pairs if k in r.measured]
        err = [p / m - 1.0 for p, m in got]
        out[k] = {"n": len(got), "mae": median([abs(e) for e in err]), "bias": median(err),
                  "within_30": sum(1 for e in err if abs(e) <= 0.30),
                  "spearman": spearman([p for p, _ in got], [m for _, m in got])}
    return out


def _fmt(label: str, f: dict) -> str:
    cells = []
    for k, name in zip(METRICS, ("TPOT", "TTFT", "tok/s/GPU")):
        x = f[k]
        if not x["n"]:
            cells.append(f"{name} {'-':>29}")
            continue
        sp = "  n/a" if x["spearman"] != x["spearman"] else f"{x['spearman']:5.2f}"
        cells.append(f"{name} n={x['n']:2d} {x['mae']:6.1%} {x['bias']:+7.1%} {sp}")
    return f"{label:<26} " + "  |  ".join(cells)


def figure_p50(pairs) -> dict:
    """The median-TTFT figure: predicted `ttft_p50_ms` against the measured median, over the rows that have one."""
    return figures(pairs, (P50,))[P50]


# issue 20's "done when": median absolute error on the sources and models not fitted
TARGETS = {"tpot_ms": 0.15, "ttft_ms": 0.30, "tokens_per_s_per_gpu": 0.15}


def target_line(label: str, f: dict, p50: dict) -> str:
    """Each target with the held-out figure and whether it is met; TTFT twice, the mean and the median."""
    def cell(name, got, limit):
        return f"{name} {got:.1%} {'met' if got <= limit else 'NOT met'} (<= {limit:.0%})"
    cells = [cell("TPOT", f["tpot_ms"]["mae"], TARGETS["tpot_ms"]),
             cell("TTFT mean", f["ttft_ms"]["mae"], TARGETS["ttft_ms"])]
    if p50["n"]:
        cells.append(cell(f"TTFT median (n={p50['n']})", p50["mae"], TARGETS["ttft_ms"]))
    cells.append(cell("tokens/s/GPU", f["tokens_per_s_per_gpu"]["mae"], TARGETS["tokens_per_s_per_gpu"]))
    return f"{label:<26} " + " | ".join(cells)


def _fmt_p50(label: str, f: dict) -> str:
    if not f["n"]:
        return f"{label:<26} TTFT p50 -"
    return (f"{label:<26} TTFT p50 (median) n={f['n']:3d} {f['mae']:6.1%} {f['bias']:+7.1%} {f['spearman']:5.2f}"
            f"  ({f['within_30']} rows within 30%)")


# ---- the steady-state (median) TTFT's constants (calibration.TTFT_P50), fitted on the calibration rows' medians ----
P50_BASE = (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 120.0, 150.0)
P50_ITERS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5)


def calibration_p50_rows() -> list:
    """The aggregated rows that ARE calibration measurements and carry a median TTFT (256: InferenceX's DeepSeek-R1
    runs on B200, B300 and H200, SGLang and TensorRT-LLM). The disaggregated calibration rows are not fitted on:
    their first token also waits for the KV transfer and the router's queue, which the steady-state figure does
    not price; fitted on them too the constants go to the grid's top (70 ms, 7.5 steps; 150 ms, 7.5 steps on
    them alone) and the aggregated held-out figure goes from 18% to 58% (docs/evidence.md)."""
    return [r for r in load() if r.calibration_id and not r.spec and r.engine in PRICED_ENGINES and P50 in r.measured]


def fit_p50(rows: list, params: PerfParams) -> dict:
    """(base_ms, iters) of the grid with the least median absolute error of `ttft_p50_ms` on `rows`."""
    parts = []          # the prediction is linear in both constants: (measured, at 0/0, per ms of base, per step)
    for r in rows:
        at = [predict_run(r, params.with_values(ttft_p50_base_ms=b, ttft_p50_iters=i))
              for b, i in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))]
        p0 = at[0][P50]
        parts.append((r.measured[P50], p0, at[1][P50] - p0, at[2][P50] - p0))

    def mae(base, iters):
        return median([abs((p0 + base * db + iters * di) / m - 1.0) for m, p0, db, di in parts])

    best = min(((mae(b, i), b, i) for b in P50_BASE for i in P50_ITERS), key=lambda x: (x[0], x[1], x[2]))
    return {"base_ms": best[1], "iters": best[2], "mae": best[0], "rows": len(parts)}


# ---- candidate terms (issue 20 build 2): each must earn its place on held-out sources AND models -----
#
# A variant is a grid of values for its constant(s) and a function that turns (base params, values, run)
# into the params that run is predicted with (plus, for per-sequence terms, a second pass that needs the
# running batch). The constants are fitted on the training rows of each fold (grid search, least sum of
# the three figures' median absolute errors) and reported on the fold's held-out rows; folds are
# leave-one-source-out and leave-one-model-out. No per-source or per-model constant exists anywhere.

ENGINES = ("sglang", "trtllm", "vllm")


def _grid(**axes):
    keys = list(axes)
    out = [{}]
    for k in keys:
        out = [{**o, k: v} for o in out for v in axes[k]]
    return out


STEP = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
TTFT_FIXED = (0.0, 25.0, 50.0, 100.0, 150.0, 200.0)
VARIANTS = {
    # a per-step serving overhead (scheduler, sampling, detokenise, launches outside the CUDA graph), one
    # constant for every engine
    "step_ms": _grid(step=STEP),
    # the same, one constant per engine (fitted on that engine's training rows only)
    "engine_step_ms": _grid(step=STEP),
    # a per-step overhead plus a per-running-sequence one (sampling and detokenising grow with the batch)
    "step_seq_ms": _grid(step=(0.0, 0.5, 1.0, 2.0, 4.0), seq=(0.0, 0.01, 0.02, 0.04, 0.08)),
    # a fixed per-request cost before the first token (HTTP, tokenise, IPC, first streamed chunk)
    "ttft_fixed_ms": _grid(ttft=TTFT_FIXED),
    # steady-state admission in place of the arrival wave: in a closed loop past its first round each
    # request arrives alone and is admitted at the next step (no wave share), plus the fixed cost
    "steady_admission": _grid(ttft=TTFT_FIXED),
    # the per-step overhead and the fixed TTFT cost together
    "step_ms+ttft_fixed_ms": _grid(step=STEP, ttft=TTFT_FIXED),
    # admission by benchmark round, no constant: a closed-loop client sending `prompts_per_concurrency`
    # x C prompts at concurrency C (sources.yaml, read in each source's harness) releases one round
    # together (the arrival wave) and the rest one at a time as others finish (steady state): mean
    # TTFT = wave TTFT / R + steady TTFT x (1 - 1/R); R = 1 (committed model) where a source states none
    "rounds_admission": [{}],
    # the GPU vendor's software stack: AMD GPUs (ROCm kernels: aiter, hipBLASLt, RCCL) reach a share f of the
    # rates the NVIDIA-fitted efficiencies give (GEMM, weight and KV streaming, collectives); one constant, no
    # per-product or per-source value. NVIDIA rows keep f = 1 (the calibration set is NVIDIA silicon)
    "amd_eff": _grid(amd=(0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0)),
    # the same on the decode side only (weight and KV streaming, collectives, the per-layer fixed cost), GEMM
    # rates as fitted: prefill on AMD is not measured slower than predicted (TTFT bias -15% on CDNA4)
    "amd_decode_eff": _grid(amd_decode=(0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0)),
    # engine steps a request waits around its prefill (`ttft_iters`, 7.5 as fitted on the calibration set) refitted on
    # the evidence: TTFT follows the step time through it, and the AMD rows show a slower step without a slower
    # first token
    "ttft_iters": _grid(ttft_iters=(0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5)),
    # the AMD share with it
    "amd_eff+ttft_iters": _grid(amd=(0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 1.0), ttft_iters=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5)),
    # the same with admission by benchmark round
    "amd_eff+rounds": _grid(amd=(0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0)),
    # admission by benchmark round with the fixed per-request cost: what rounds admission alone leaves is every
    # InferenceX row's TTFT under-predicted by 25-240 ms, a per-request offset (docs/evidence.md)
    "ttft_fixed_ms+rounds": _grid(ttft=TTFT_FIXED),
}


def _variant_params(name: str, base, v: dict, run: Run) -> PerfParams:
    base = _resolve(base, run)
    kw = {}
    if "step" in v:
        kw["iter_ms"] = base.iter_ms + v["step"]
    if "ttft" in v:
        kw["ttft_base_ms"] = base.ttft_base_ms + v["ttft"]
    if name == "steady_admission":
        kw.update(wave=0.0, wave_prefill_first=0.0, wave_budget_first=0.0)
    if "amd" in v and get_gpu(run.gpu).vendor == "amd":
        f = v["amd"]
        kw.update(gemm_eff=base.gemm_eff * f, mem_eff=base.mem_eff * f, attn_eff=base.attn_eff * f,
                  comm_eff=base.comm_eff * f)
    if "ttft_iters" in v:
        kw["ttft_iters"] = v["ttft_iters"]
    if "amd_decode" in v and get_gpu(run.gpu).vendor == "amd":
        f = v["amd_decode"]
        kw.update(mem_eff=base.mem_eff * f, attn_eff=base.attn_eff * f, comm_eff=base.comm_eff * f,
                  layer_us=base.layer_us / f)
    return base.with_values(**kw) if kw else base


def prompts_per_concurrency(source: str) -> float:
    """R of `rounds_admission`: prompts sent per unit of concurrency by the source's client (1: unknown)."""
    return float(_sources().get(source, {}).get("prompts_per_concurrency") or 1)


# The oldest release of each engine's line that the planner's engine modules render for and the model's scheduler
# terms describe: vLLM's V1 engine (the default from 0.8.0; `perf.PerfParams.wave_budget_first` prices V1's token
# budget; the module targets 0.32.0), SGLang 0.5 (the module targets 0.5.23), TensorRT-LLM 1.0 (the PyTorch
# backend as the default; the module targets 1.2.1). Rows measured on older builds are reported apart, not dropped.
ENGINE_LINES = {"vllm": (0, 8), "sglang": (0, 5), "trtllm": (1, 0)}


def engine_release(source: str) -> tuple[int, int] | None:
    """(major, minor) of the engine release sources.yaml names for `source` (None: unstated or unparsed)."""
    import re

    m = re.match(r"\s*v?(\d+)\.(\d+)", str(_sources().get(source, {}).get("engine_version") or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def on_rendered_line(run: "Measured") -> bool:
    """Whether the row's engine build is on a line the planner renders for (`ENGINE_LINES`; unstated: yes)."""
    got = engine_release(run.source)
    return got is None or run.engine not in ENGINE_LINES or got >= ENGINE_LINES[run.engine]


def fixed_lengths(source: str) -> bool:
    """Whether the source's client sends fixed-length prompts and answers (`random_range_ratio: 1`)."""
    return float(_sources().get(source, {}).get("random_range_ratio") or 0) == 1.0


def _sources() -> dict:
    global _SOURCES
    if _SOURCES is None:
        import yaml

        _SOURCES = yaml.safe_load((HERE / "sources.yaml").read_text()) or {}
    return _SOURCES


_SOURCES = None


def predict_variant(name: str, run: Run, base, v: dict) -> dict:
    base = _resolve(base, run)
    if name == "rounds_admission" or name.endswith("+rounds"):
        base = _variant_params(name, base, v, run)
        p = predict_run(run, base)
        rounds = prompts_per_concurrency(run.source)
        if rounds > 1 and run.concurrency > 1:
            steady = predict_run(run, base.with_values(wave=0.0, wave_prefill_first=0.0, wave_budget_first=0.0))
            p = {**p, "ttft_ms": p["ttft_ms"] / rounds + steady["ttft_ms"] * (1.0 - 1.0 / rounds)}
        return p
    q = _variant_params(name, base, v, run)
    p = predict_run(run, q)
    if v.get("seq"):
        # the running batch of the first pass (tokens/s/GPU = B_run x 1000 / TPOT / GPUs), per scheduler
        b_run = p["tokens_per_s_per_gpu"] * run.mapping.gpus * p["tpot_ms"] / 1000.0
        p = predict_run(run, q.with_values(iter_ms=q.iter_ms + v["seq"] * b_run / run.mapping.attn_dp))
    return p


def _score(pairs) -> float:
    f = figures(pairs)
    return sum(f[k]["mae"] for k in METRICS if f[k]["n"])


def _fit(name: str, train: list[Run], base: PerfParams) -> dict:
    """The variant's constant(s) that minimise `_score` on `train`; per engine for engine_* variants."""
    grid = VARIANTS[name]
    if name.startswith("engine_"):
        out = {}
        for e in ENGINES:
            rows = [r for r in train if r.engine == e]
            best = min(grid, key=lambda v: _score([(r, predict_variant(name, r, base, v)) for r in rows])
                       if rows else 0.0) if rows else grid[0]
            out[e] = best
        return out
    return min(grid, key=lambda v: _score([(r, predict_variant(name, r, base, v)) for r in train]))


def _apply(name: str, fitted: dict, r: Run, base: PerfParams) -> dict:
    v = fitted[r.engine] if name.startswith("engine_") else fitted
    return predict_variant(name, r, base, v)


def held_out(name: str, runs: list[Run], base: PerfParams, key, *, log=None) -> list[tuple[Run, dict]]:
    """Leave-one-group-out (`key`: source or model): fit on the other groups, predict the held-out one."""
    out = []
    for g in sorted({key(r) for r in runs}):
        train = [r for r in runs if key(r) != g]
        test = [r for r in runs if key(r) == g]
        fitted = _fit(name, train, base)
        if log is not None:
            log(f"  {name}: held out {g:<24} fitted {fitted}")
        out += [(r, _apply(name, fitted, r, base)) for r in test]
    return out


# ---- disaggregated rows (InferenceX's multi-node prefill/decode runs) --------------------------------------
#
# disagg_runs.csv: one measured point of a prefill/decode-disaggregated deployment a row: the prefill and decode
# workers' layouts and counts as the fixture names them, the total concurrency, mean TTFT and TPOT, and output
# tokens/s per DECODE GPU (the fixture divides output throughput by the decode pool, input by the prefill pool:
# both identities hold on every row). Predicted with `perf.predict_disagg`; its tokens/s per GPU (all GPUs) is
# converted to per decode GPU. Rows whose layout fields do not add up to the GPU counts (`layout_consistent` no:
# worker counts 0, or TP 1 with attention DP that hides the DP size) and speculative rows are in no figure.


@dataclass(frozen=True)
class DisaggRun(Measured):
    prefill: ReplicaMapping
    decode: ReplicaMapping
    prefill_workers: int
    decode_workers: int
    consistent: bool
    calibration_id: str = ""


DISAGG = HERE / "disagg_runs.csv"


def load_disagg(path: Path = DISAGG) -> list[DisaggRun]:
    out = []
    for r in csv.DictReader(path.open()):
        def m(side):
            return ReplicaMapping(attn_tp=int(r[f"{side}_attn_tp"]), attn_dp=int(r[f"{side}_attn_dp"]),
                                  moe_tp=int(r[f"{side}_moe_tp"]), moe_ep=int(r[f"{side}_moe_ep"]))
        measured = _measured(r, {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms",
                                 "tokens_per_s_per_gpu": "tokens_per_s_per_decode_gpu"})
        out.append(DisaggRun(source=r["source"], model=r["model"], gpu=r["gpu"], engine=r["engine"],
                             prefill=m("prefill"), decode=m("decode"), prefill_workers=int(r["prefill_workers"]),
                             decode_workers=int(r["decode_workers"]), weight_dtype=r["weight_dtype"],
                             kv_dtype=r["kv_dtype"], isl=int(r["isl"]), osl=int(r["osl"]),
                             concurrency=int(r["concurrency"]), measured=measured,
                             spec=_is_spec(r["spec_decoding"]),
                             consistent=r["layout_consistent"] == "yes", calibration_id=r["calibration_id"].strip()))
    return out


def _priceable(r: DisaggRun) -> bool:
    """Layout fields consistent, not speculative, KV dtype known."""
    return r.consistent and not r.spec and r.kv_dtype in ("fp8", "bf16", "fp16")


def held_out_disagg(every: list[DisaggRun]) -> list[DisaggRun]:
    """The disaggregated rows the figures are computed on: priceable and not a calibration measurement."""
    return [r for r in every if _priceable(r) and not r.calibration_id]


def predict_disagg_run(run: DisaggRun, params) -> dict | None:
    """TTFT, TPOT and output tokens/s per decode GPU; None where the model cannot place the layout (memory)."""
    from meshplan.planner.perf import predict_disagg

    params = _resolve(params, run)
    try:
        p = predict_disagg(get_model(run.model), get_gpu(run.gpu), run.prefill, run.decode,
                           workload_of(run), weight_dtype=run.weight_dtype, kv_dtype=run.kv_dtype,
                           concurrency=run.concurrency, prefill_workers=run.prefill_workers,
                           decode_workers=run.decode_workers, engine=run.engine, params=params)
    except ValueError:
        return None
    gpus = run.prefill_workers * run.prefill.gpus + run.decode_workers * run.decode.gpus
    return {"ttft_ms": p.ttft_ms, "tpot_ms": p.tpot_ms, P50: p.ttft_p50_ms,
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu * gpus / (run.decode_workers * run.decode.gpus)}


def disagg_report(params) -> list[str]:
    """Lines: the disaggregated rows per source and ALL (held out), and how many rows are out of the figures."""
    if not DISAGG.exists():
        return []
    every = load_disagg()
    held = held_out_disagg(every)
    pairs, unplaced = [], 0
    for r in held:
        p = predict_disagg_run(r, params)
        if p is None:
            unplaced += 1
        else:
            pairs.append((r, p))
    out = ["-- disaggregated rows (prefill/decode workers; tokens/s per DECODE GPU), held out by source and model "
           + "-" * 10]
    by = defaultdict(list)
    for r, p in pairs:
        by[r.source].append((r, p))
    for k in sorted(by):
        out.append(_fmt(k[len("ixapp-disagg-"):] if k.startswith("ixapp-disagg-") else k, figures(by[k])))
    out.append(_fmt("ALL disaggregated", figures(pairs)))
    out.append(_fmt_p50("ALL disaggregated", figure_p50(pairs)))
    suspect = suspect_sources()
    out.append(_fmt("  without suspect sources", figures([(r, p) for r, p in pairs if r.source not in suspect])))
    cal = [r for r in every if _priceable(r) and r.calibration_id]
    cal_pairs = [(r, p) for r in cal if (p := predict_disagg_run(r, FITTED_PARAMS)) is not None]
    if cal_pairs:
        out.append(_fmt("  calibration rows (in-sample)", figures(cal_pairs)))
    out.append(f"    {len(every)} rows: {len(held)} held out ({unplaced} the model cannot place: memory), "
               f"{sum(1 for r in every if r.calibration_id)} calibration rows, "
               f"{sum(1 for r in every if r.spec)} speculative, {sum(1 for r in every if not r.consistent)} with "
               f"layout fields that do not add up, {sum(1 for r in every if r.kv_dtype == 'unknown')} of unknown KV dtype")
    return out


def _same_agg(r: dict, c: dict) -> bool:
    """An aggregated row and a calibration row are one run: same concurrency (the calibration's batch_size, per
    attention-DP rank or not), and TPOT within 0.01 ms or TTFT within 0.1 ms (the figures carry many digits)."""
    b, dp = int(c["batch_size"] or 0), int(c["attention_dp_size"] or 1)
    if int(r["concurrency"]) not in (b, b * dp):
        return False
    same_tpot = r["tpot_ms"] and abs(float(c["silicon_tpot_ms"]) - float(r["tpot_ms"])) <= 0.01
    same_ttft = r["ttft_ms"] and abs(float(c["silicon_ttft_ms"]) - float(r["ttft_ms"])) <= 0.1
    return bool(same_tpot or same_ttft)


def _same_disagg(r: dict, c: dict) -> bool:
    """A disaggregated calibration row names no batch size to match on, so both TPOT and TTFT must agree."""
    return (abs(float(c["silicon_tpot_ms"]) - float(r["tpot_ms"])) <= 0.01
            and abs(float(c["silicon_ttft_ms"]) - float(r["ttft_ms"])) <= 0.1)


def _overlap(runs_csv: Path, calibration_dir: Path, mode: str, same) -> list[dict]:
    cal_rows = [c for c in csv.DictReader((calibration_dir / "silicon_calibration.csv").open())
                if (c.get("mode") or "agg") == mode]
    by_key = defaultdict(list)
    for c in cal_rows:
        by_key[(c["system"], c["backend"], c["isl"], c["osl"])].append(c)
    out = []
    for r in csv.DictReader(runs_csv.open()):
        r["calibration_id"] = next((c["id"] for c in by_key.get((r["gpu"], r["engine"], r["isl"], r["osl"]), [])
                                    if same(r, c)), "")
        out.append(r)
    return out


def calibration_overlap(runs_csv: Path, calibration_dir: Path) -> list[dict]:
    """runs.csv's rows with `calibration_id` set to the aggregated calibration row that is the same measurement:
    same GPU, engine and ISL/OSL, and `_same_agg`. InferenceX-app's fixture and AIConfigurator's silicon database
    share runs: the calibration rows whose `silicon_data_source` says `db-dump/...` are InferenceX workflow runs."""
    return _overlap(runs_csv, calibration_dir, "agg", _same_agg)


def calibration_overlap_disagg(runs_csv: Path, calibration_dir: Path) -> list[dict]:
    """disagg_runs.csv's rows with `calibration_id` set to the disaggregated calibration row with the same GPU,
    engine and ISL/OSL and `_same_disagg` (both the same TPOT and TTFT)."""
    return _overlap(runs_csv, calibration_dir, "disagg", _same_disagg)


def _rewrite(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def refit_lomo(calibration_dir: Path, iters: int, jobs: int, path: Path = LOMO_PARAMS) -> dict:
    """Fit the calibration set once per CALIBRATION_FAMILY without that family (the procedure of FITTED_PARAMS,
    `calibration.fit`) and store each fold's parameters in lomo_params.json."""
    import datetime
    import json
    import multiprocessing

    from accuracy import family
    from meshplan.planner import calibration as cal

    items = cal.load_scenarios(calibration_dir / "silicon_calibration.csv", calibration_dir / "model_configs",
                               modes=("agg", "disagg"))
    fams = sorted(set(CALIBRATION_FAMILY.values()))
    trains = [[s for r, s, _ in items if s is not None and family(r.get("model_path", "")) != fam] for fam in fams]
    if jobs > 1:
        with multiprocessing.Pool(jobs) as pool:
            fitted = pool.starmap(cal.fit, [(t, None, iters) for t in trains], chunksize=1)
    else:
        fitted = [cal.fit(t, iters=iters) for t in trains]
    data = {"command": f"python benchmarks/evidence.py --refit-lomo --iters {iters} --jobs {jobs}",
            "date": datetime.date.today().isoformat(),
            "calibration": f"silicon_calibration.csv ({len(items)} rows)",
            "folds": {fam: {n: round(getattr(p, n), 6) for n in cal.FIT_NAMES} for fam, p in zip(fams, fitted)},
            "train_rows": {fam: len(t) for fam, t in zip(fams, trains)}}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def decompose(runs: list[Run], folds: "Bases") -> list[tuple[str, dict]]:
    """Which held-out part the leave-one-model-out misses come from, on the engine lines the planner renders for:
    the figures with each of the two parts held out by model or by source only. The parts: the calibration
    parameters (the model's leave-one-model-out fold, `lomo_params.json`, or the committed fit, which saw the
    model's architecture but not the row's source) and the AMD families' per-layer overhead (fitted without the
    row's source and model, or without its source only). The first line is the "current lines, both" figure,
    the last the "current lines, source" one."""
    current = [r for r in runs if on_rendered_line(r)]
    committed = Bases(folds.committed, {})
    out = []
    for label, params, hold in (("fold / family w/o source+model", folds, ("source", "model")),
                                ("committed / family w/o source+model", committed, ("source", "model")),
                                ("fold / family w/o source", folds, ("source",)),
                                ("committed / family w/o source", committed, ("source",))):
        b = params.held_out(runs, hold)
        out.append((label, figures([(r, predict_run(r, b)) for r in current])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "runs.csv")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default=None)
    ap.add_argument("--variants", action="store_true",
                    help="every variant: leave-one-source-out and leave-one-model-out figures, one line each")
    ap.add_argument("--no-suspect", action="store_true",
                    help="drop the sources sources.yaml marks suspect (from fitting and from the figures)")
    ap.add_argument("--refit-lomo", action="store_true",
                    help="refit the calibration set without each evidence model's family; write lomo_params.json")
    ap.add_argument("--iters", type=int, default=500, help="--refit-lomo: Nelder-Mead iterations per fit")
    ap.add_argument("--jobs", type=int, default=2, help="--refit-lomo: folds fitted in parallel")
    ap.add_argument("--fit-p50", action="store_true",
                    help="fit calibration.TTFT_P50 on the calibration rows' median TTFT; print it")
    ap.add_argument("--fit-family-layer", action="store_true",
                    help="fit calibration.FAMILY_LAYER_US on every held-out current-line row of each family; print it")
    ap.add_argument("--decompose", action="store_true",
                    help="the current engine lines' figures with the calibration fold and the AMD family overhead each "
                         "held out by model or by source only (which part the leave-one-model-out misses come from)")
    ap.add_argument("--find-overlap", action="store_true",
                    help="rewrite runs.csv's calibration_id column from the calibration set (--calibration)")
    ap.add_argument("--calibration", type=Path, default=None, help="calibration dir (default ../shared/data/calibration)")
    args = ap.parse_args(argv)
    if args.refit_lomo or args.find_overlap:
        from meshplan.planner.calibration import default_data_dir

        cdir = args.calibration or default_data_dir()
        if args.find_overlap:
            rows = calibration_overlap(args.data, cdir)
            _rewrite(args.data, rows)
            print(f"{sum(1 for r in rows if r['calibration_id'])} of {len(rows)} rows are calibration rows")
            if DISAGG.exists():
                rows = calibration_overlap_disagg(DISAGG, cdir)
                _rewrite(DISAGG, rows)
                print(f"{sum(1 for r in rows if r['calibration_id'])} of {len(rows)} disaggregated rows are "
                      "calibration rows")
        if args.refit_lomo:
            data = refit_lomo(cdir, args.iters, args.jobs)
            print(f"wrote {LOMO_PARAMS}: folds {sorted(data['folds'])}")
        return 0
    every = load(args.data)
    # a row that is a calibration measurement was fitted on: out of every held-out figure, reported on its own
    fitted_on = [r for r in every if r.calibration_id and not r.spec]
    unpriced_engine = [r for r in every if r.engine not in PRICED_ENGINES]
    # speculative decoding runs kept apart (priced in their own table)
    runs = held_out_runs(every)
    if args.no_suspect:
        drop = suspect_sources(args.data.parent / "sources.yaml")
        runs = [r for r in runs if r.source not in drop]
        print(f"without the suspect sources {sorted(drop)}")
    base = Bases.load(FITTED_PARAMS).held_out(runs)
    if args.fit_p50:
        got = fit_p50(calibration_p50_rows(), FITTED_PARAMS)
        print(f"TTFT_P50 = {{\"base_ms\": {got['base_ms']}, \"iters\": {got['iters']}}}: median |err| {got['mae']:.1%} on "
              f"{got['rows']} calibration rows' median TTFT (committed: {TTFT_P50})")
        return 0
    if args.fit_family_layer:
        # the committed values: fitted on every held-out current-line row of the family, on top of the parameters
        # the planner predicts with (FITTED_PARAMS)
        for g in sorted(FAMILY_LAYER_US):
            us = fit_family_layer(runs, g, lambda r: FITTED_PARAMS)
            n = sum(1 for r in runs if get_gpu(r.gpu).family == g and on_rendered_line(r))
            print(f"{g}: {us:.0f} us per layer on {n} rows (committed FAMILY_LAYER_US: {FAMILY_LAYER_US[g]})")
        return 0
    if args.decompose:
        print(f"{sum(1 for r in runs if on_rendered_line(r))} rows on the current engine lines. Calibration parameters: the "
              "model's leave-one-model-out fold or the committed fit; AMD family per-layer overhead: fitted without the row's source "
              "and model, or without its source only")
        for label, f in decompose(runs, Bases.load(FITTED_PARAMS)):
            print(_fmt(f"  {label:<34}", f))
        return 0
    if args.variants:
        print(f"{len(runs)} runs, {len({r.source for r in runs})} sources, {len({r.model for r in runs})} models; "
              "per metric: rows, median |err|, bias, Spearman")
        print(_fmt("committed (no new term)", figures([(r, predict_run(r, base)) for r in runs])))
        for name in VARIANTS:
            for title, key in (("LOSO", lambda r: r.source), ("LOMO", lambda r: r.model)):
                print(_fmt(f"{name} {title}"[:26], figures(held_out(name, runs, base, key))))
        return 0

    pairs = [(r, predict_run(r, base)) for r in runs]
    if args.variant:
        for title, key in (("leave-one-source-out", lambda r: r.source), ("leave-one-model-out", lambda r: r.model)):
            held = held_out(args.variant, runs, base, key, log=print)
            print(_fmt(f"{title[:26]}", figures(held)))
        pairs = held_out(args.variant, runs, base, lambda r: r.source)
    print(f"{len(runs)} runs from {len({r.source for r in runs})} sources "
          f"({'variant ' + args.variant + ', leave-one-source-out' if args.variant else 'held out by source and model'}); "
          "per metric: rows, median |err|, bias, Spearman")
    groups = (("source", lambda r: r.source), ("model", lambda r: r.model), ("engine", lambda r: r.engine),
              ("GPU generation", lambda r: GENERATION.get(r.gpu, r.gpu)))
    for title, key in groups:
        print(f"-- by {title} " + "-" * 80)
        by = defaultdict(list)
        for r, p in pairs:
            by[key(r)].append((r, p))
        for k in sorted(by):
            print(_fmt(k, figures(by[k])))
    print("=" * 120)
    print(_fmt("ALL (held out)", figures(pairs)))
    print(_fmt_p50("ALL (held out)", figure_p50(pairs)))
    print(_fmt_p50("  InferenceX-app rows only", figure_p50([(r, p) for r, p in pairs if r.source.startswith("ixapp-")])))
    if not args.variant:
        # the issue's two folds apart: leave-one-source-out fits nothing on the row's source (the calibration
        # fit is AIConfigurator's source, its own rows are out), leave-one-model-out nothing on the row's model
        loso, lomo = Bases(FITTED_PARAMS, {}).held_out(runs, ("source",)), base.held_out(runs, ("model",))
        for label, bases in (("leave-one-source-out", loso), ("leave-one-model-out", lomo)):
            print(_fmt(f"  {label}", figures([(r, predict_run(r, bases)) for r in runs])))
        older = sorted({r.source for r in runs if not on_rendered_line(r)})
        current = [r for r in runs if on_rendered_line(r)]
        print(f"  on the engine lines the planner renders for (vLLM >= 0.8, SGLang >= 0.5, TensorRT-LLM >= 1.0): "
              f"{len(current)} rows; {len(runs) - len(current)} rows of older builds apart ({', '.join(older)})")
        for label, bases in (("both", base), ("source", loso), ("model", lomo)):
            print(_fmt(f"  current lines, {label}", figures([(r, predict_run(r, bases)) for r in current])))
        print(target_line("issue 20 targets, both folds", figures(pairs), figure_p50(pairs)))
        cur = [(r, p) for r, p in pairs if on_rendered_line(r)]
        print(target_line("  on the current lines", figures(cur), figure_p50(cur)))
        by_source = base.held_out(runs, ("source",))
        print(_fmt("  family term by source only", figures([(r, predict_run(r, by_source)) for r in runs])))
        print(_fmt("  source only (committed)", figures([(r, predict_run(r, committed_params())) for r in runs])))
    if fitted_on and not args.variant:
        print(_fmt("  calibration rows (in-sample)", figures([(r, predict_run(r, FITTED_PARAMS)) for r in fitted_on])))
        print(f"    {len(fitted_on)} rows are calibration measurements (runs.csv calibration_id; sources "
              f"{', '.join(sorted({r.source for r in fitted_on}))}): fitted on, so in no held-out figure")
    if unpriced_engine and not args.variant:
        print(f"    {len(unpriced_engine)} rows of engines the model does not price "
              f"({', '.join(sorted({r.engine for r in unpriced_engine}))}; sources "
              f"{', '.join(sorted({r.source for r in unpriced_engine}))}): in no figure")
    if not args.variant and args.data == HERE / "runs.csv":
        print("\n".join(disagg_report(base)))
    spec_runs = [r for r in every if r.spec and r.engine in PRICED_ENGINES]
    if spec_runs and not args.variant:
        print("\n".join(speculative_report(spec_runs, base)))
    yml = args.data.parent / "sources.yaml"
    suspect = suspect_sources(yml) if yml.exists() and not args.no_suspect else {}
    if suspect:
        print(_fmt("  without suspect sources", figures([(r, p) for r, p in pairs if r.source not in suspect])))
        for k, why in sorted(suspect.items()):
            print(f"    suspect {k}: {why}")
    if args.rows:
        for r, p in pairs:
            cells = " ".join(f"{k.split('_')[0]} {p[k]:8.1f}/{r.measured[k]:8.1f}" for k in METRICS if k in r.measured)
            print(f"  {r.source:<24} {r.model:<16} {r.gpu:<14} {r.engine:<6} {_m(r.mapping)} "
                  f"{r.isl}/{r.osl} c{r.concurrency}: pred/meas {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
