"""Calibration: the measured-run scenarios, their prediction, and the fitted global efficiencies.

The performance model (`meshplan.planner.perf`) has a handful of GLOBAL
physical parameters (`PerfParams`, 15 fitted here):

- compute/memory: `gemm_eff` (share of dense tensor peak), `mem_eff` (share
  of HBM bandwidth streaming weights), `attn_eff` (share of HBM bandwidth
  reading the KV cache), `moe_eff` (share of the weight-streaming rate
  reached reading routed experts), `moe_gemm_eff` (share of the dense GEMM
  rate reached by routed experts' grouped GEMMs: an op kind of its own, many
  small GEMMs of tokens/expert rows each);
- fixed costs: `layer_us` per layer per iteration, `iter_ms` per iteration;
- communication: `comm_eff` (share of link bandwidth), `comm_us` / `nic_us`
  (latency per collective inside the NVLink domain / across the NIC);
- serving: `ttft_iters` (engine iterations a request waits around its
  prefill; a fixed `ttft_base_ms` instead generalised worse: 44% vs 42%
  held-out TTFT error), `wave` / `wave_prefill_first` /
  `wave_budget_first` (share of the arrival wave's prefill a request waits for
  under TensorRT-LLM's whole-request admission, SGLang's prefill-first and vLLM
  V1's token-budget scheduler), `interference` (share of others' prefill
  landing in decode steps).

planner.md reports that ~9 global parameters generalised best under
leave-one-model-out and that per-GPU-family x engine factors overfit. Nothing
here depends on the model or the GPU; the op kinds (dense GEMM, grouped expert
GEMM, weight streaming, KV reads, collectives) have their own efficiencies,
fitted on every architecture in the training set. The one engine distinction is the
scheduler's admission policy (`perf.PREFILL_FIRST_ENGINES`,
`perf.BUDGET_FIRST_ENGINES`), which sets how much of the arrival wave a request
waits for; leave-one-model-out keeps it honest (each held-out model's rows are
predicted from the other models' rows of the same engines), and it lowered the
held-out TTFT error from 46% to 43-44%.

Fitting (`fit`), in two stages over all rows of `silicon_calibration.csv`
(agg and disagg): first the step-time parameters minimise the mean absolute
log error of TPOT, then, with those frozen, the TTFT-stage parameters
(`TTFT_ONLY`: the serving parameters and `moe_gemm_eff`) minimise TTFT's
relative error capped at a clip (a robust loss in the target's own terms),
once per clip of the fixed grid `TTFT_CLIPS`, and the fits are averaged in
log space (no clip is chosen; see `TTFT_CLIPS`); each fit by Nelder-Mead in the
log of each parameter (pure Python; no scipy), starting from `PerfParams()`'s
physical guesses and clamping efficiencies and shares to (0, 1]; a second
Nelder-Mead restarts from the best point with a fresh, smaller simplex.

`FITTED_PARAMS` below was produced by

    python benchmarks/accuracy.py --fit --iters 500

on ../shared/data/calibration/silicon_calibration.csv (all models); the
leave-one-model-out figures of the same procedure are printed by
`python benchmarks/accuracy.py`.

Scenario rows (the CSV format `meshplan estimate` reads): `model_path`
(`org/name`, read from `DIR/org--name_config.json`), `system` (GPU), `backend`
(engine), `gemm_quant_mode`/`moe_quant_mode`/`precision`, `isl`, `osl`,
`batch_size` (concurrency; per attention-DP rank when
`attention_dp_size` > 1), `tp_size`, `pp_size`, `attention_dp_size`,
`moe_tp_size`, `moe_ep_size`; `mode=disagg` rows use the `prefill_*`/`decode_*`
columns instead.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from meshplan.catalog.gpus import GpuSpec, get_gpu
from meshplan.catalog.models import ModelArch, get_model, load_hf_config
from meshplan.planner import perf
from meshplan.planner.memory import ReplicaMapping, memory_fit
from meshplan.planner.perf import PerfParams
from meshplan.planner.types import Workload

# Fitted by `python benchmarks/accuracy.py --fit` (see module docstring).
FITTED_PARAMS = PerfParams(gemm_eff=0.6805, mem_eff=1, attn_eff=0.7036, moe_eff=0.6052, layer_us=70.24, iter_ms=0.03273, comm_eff=0.3837, comm_us=1.155, nic_us=24.3, ttft_iters=7.514, wave=0.05711, wave_prefill_first=0.3933, wave_budget_first=0.03658, interference=1, moe_gemm_eff=0.2443, a2a_peer_us=1.565)

# Per-layer serving overhead (us per transformer layer and step, added to `layer_us`) of the GPU families the
# calibration set has no measurement of: AMD's CDNA3 (MI300X, MI325X) and CDNA4 (MI355X). The calibration set is
# NVIDIA silicon only, and on AMD GPUs the evidence base's measured TPOT has a floor the NVIDIA-fitted step does
# not: MI300X SGLang 0.5.9 DeepSeek-R1 TP8 at concurrency 4 decodes at 24.6 ms a token where the step is priced at
# 7.8 ms, while from concurrency 4 to 64 both grow by about the same 21-27 ms (the slope holds, the floor does
# not). Priced per layer, not per step (a per-step constant until 2026-12-03): the floor grows with the model's
# depth (kernel launches and latency-bound kernels of each layer), so one value carries across models of 36
# (gpt-oss-120b), 61 (DeepSeek-R1) and 62 (MiniMax-M2) layers, which one per-step value did not (docs/evidence.md,
# "The AMD families' overhead, per layer"). Fitted by `python benchmarks/evidence.py --fit-family-layer` on the
# evidence rows of each family measured on the engine lines the planner renders for (benchmarks/evidence/runs.csv:
# InferenceX SGLang 0.5.x DeepSeek-R1, vLLM 0.17 gpt-oss-120b and SGLang 0.5.13 MiniMax-M2.7 on MI300X / MI325X;
# InferenceX SGLang 0.5.x DeepSeek-R1, vLLM 0.19 gpt-oss-120b and vLLM 0.19 MiniMax-M2.5 on MI355X); grid 0-500 us
# in 10 us, least sum of the TPOT, TTFT and tokens/s/GPU median errors. docs/evidence.md reports it held out by
# source and by model.
FAMILY_LAYER_US = {"cdna3": 290, "cdna4": 60}

# Steady-state (median) TTFT = base_ms + iters x step + the request's own prefill + its wait for the prefills
# ahead of it on its rank (`perf._core`; the wait is `perf.prefill_queue_ms`, no constant, since 2026-12-03,
# when this fit went from 80 ms / 0.5 steps to 90 ms / 0 steps and 41.2% -> 40.2% in-sample). Fitted by
# `python benchmarks/evidence.py --fit-p50` on the median TTFT of the calibration set's aggregated InferenceX
# runs (the 256 runs.csv rows with a calibration_id: InferenceX-app's fixture gives each run's median next to
# the mean the calibration set holds; DeepSeek-R1 on B200, B300 and H200 with SGLang and TensorRT-LLM), with
# FITTED_PARAMS; least median absolute error over a grid (base 0-150 ms, 0-7.5 steps). 40% in-sample, 17% on
# InferenceX's held-out rows (docs/evidence.md): the calibration runs' medians scatter more.
TTFT_P50 = {"base_ms": 90.0, "iters": 0.0}


MAX_MEMORY_FRACTION = 0.96             # highest memory fraction we assume an operator set

REPO_ROOT = Path(__file__).resolve().parents[3]


def default_data_dir() -> Path:
    """`$MESHPLAN_CALIBRATION_DIR`, else ../shared/data/calibration next to the repository."""
    env = os.environ.get("MESHPLAN_CALIBRATION_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "calibration"


# ---- scenarios ------------------------------------------------------------------------

# quant-mode names -> the weight dtype whose bytes the model reads; the AIConfigurator
# names are its `--gemm-quant-mode` / `--moe-quant-mode` choices (aiconfigurator 0.12.0
# CLI): *_wo and w4a16* are weight-only (4- or 8-bit weights, 16-bit activations),
# w4afp8 / w4a8_* are 4-bit weights with 8-bit activations, sq is SmoothQuant INT8.
_QUANT = {"nvfp4": "fp4", "mxfp4": "fp4", "fp4": "fp4", "nvfp4_wo": "fp4", "w4a16_nvfp4": "fp4",
          "w4a16_mxfp4": "fp4", "w4a16_mxfp4_cutlass": "fp4", "w4a8_mxfp4_mxfp8": "fp4",
          "w4a8_mxfp4_mxfp8_trtllm": "fp4",
          "fp8": "fp8", "fp8_block": "fp8", "fp8_static": "fp8", "fp8_ootb": "fp8",
          "w4a16": "int4", "int4": "int4", "int4_awq": "int4", "int4_wo": "int4", "w4a8": "int4",
          "w4afp8": "int4", "int8": "int8", "int8_wo": "int8", "sq": "int8",
          "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "": "bf16"}
_ENGINES = {"trtllm": "trtllm", "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "vllm": "vllm",
            "sglang": "sglang"}


@dataclass(frozen=True)
class Scenario:
    id: str
    model: ModelArch
    model_key: str                       # the CSV's model_path
    gpu: GpuSpec
    engine: str
    weight_dtype: str
    kv_dtype: str
    isl: int
    osl: int
    concurrency: int
    mapping: ReplicaMapping | None = None          # agg
    prefill: ReplicaMapping | None = None          # disagg
    decode: ReplicaMapping | None = None
    prefill_workers: int = 0
    decode_workers: int = 0
    prefill_batch: int = 1
    measured_ttft_ms: float | None = None
    measured_tpot_ms: float | None = None


def _int(v, default: int = 1) -> int:
    try:
        x = int(float(v))
    except (TypeError, ValueError):
        return default
    return x if x > 0 else default


def _float(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x > 0 and math.isfinite(x) else None


def _source_concurrency(row: dict) -> int:
    m = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source") or "")
    return int(m.group(1)) if m else 0


def _mapping(row: dict, prefix: str = "") -> ReplicaMapping:
    tp = _int(row.get(prefix + "tp_size"))
    adp = _int(row.get(prefix + "attention_dp_size"))
    mtp = _int(row.get(prefix + "moe_tp_size"))
    mep = _int(row.get(prefix + "moe_ep_size"))
    pp = _int(row.get(prefix + "pp_size"))
    attn = tp * adp
    moe = mtp * mep
    if moe != attn:
        # dense models or unset MoE fields: experts follow attention's GPUs
        if moe == 1:
            mtp, mep = tp, adp
        elif attn == 1:
            tp = moe
    return ReplicaMapping(attn_tp=tp, attn_dp=adp, moe_tp=mtp, moe_ep=mep, pp=pp)


def realizable(m: ReplicaMapping, model: ModelArch) -> ReplicaMapping:
    """The layout an engine can actually have run for a recorded one it could not.

    Some rows record only a GPU count as `tp_size` (e.g. DeepSeek-R1 "tp72" on GB200 in
    AIConfigurator's silicon sample). Tensor parallelism must divide the attention heads
    (and the expert FFN width), so such a row ran data-parallel attention (TensorRT-LLM
    `enable_attention_dp`, SGLang `--enable-dp-attention`) and expert parallelism over
    those GPUs, which is what is predicted. Layouts an engine accepts are returned as they are.
    """
    tp, adp, mtp, mep = m.attn_tp, m.attn_dp, m.moe_tp, m.moe_ep
    if tp > 1 and model.num_attention_heads % tp:
        tp, adp = 1, adp * tp
    if model.is_moe and mtp > 1 and model.moe_intermediate_size % mtp:
        mtp, mep = 1, mep * mtp
    if (tp, adp, mtp, mep) == (m.attn_tp, m.attn_dp, m.moe_tp, m.moe_ep):
        return m
    return ReplicaMapping(attn_tp=tp, attn_dp=adp, moe_tp=mtp, moe_ep=mep, pp=m.pp)


def config_name(model_path: str) -> str:
    """The config.json file name of `org/name` in a model-configs directory: `org--name_config.json`."""
    return model_path.replace("/", "--") + "_config.json"


_MODEL_CACHE: dict[tuple[str, str], ModelArch] = {}


def load_model(model_path: str, configs_dir: str | Path | None) -> ModelArch:
    """`org/name` -> ModelArch from `configs_dir/org--name_config.json`, else the catalogue."""
    key = (model_path, str(configs_dir))
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    arch = None
    if configs_dir:
        f = Path(configs_dir) / config_name(model_path)
        if f.exists():
            arch = load_hf_config(f, name=model_path)
    if arch is None:
        try:
            arch = get_model(model_path)
        except KeyError:
            raise KeyError(f"no config for model_path {model_path!r}: expected "
                           f"{Path(configs_dir or '.') / config_name(model_path)}")
    _MODEL_CACHE[key] = arch
    return arch


def scenario_from_row(row: dict, configs_dir: str | Path | None) -> Scenario:
    """Parse one CSV row; raises ValueError/KeyError with the reason it cannot be predicted."""
    model_path = (row.get("model_path") or "").strip()
    if not model_path:
        raise ValueError("model_path is empty")
    model = load_model(model_path, configs_dir)
    gpu = get_gpu(row.get("system") or "")
    engine = _ENGINES.get((row.get("backend") or "").strip().lower())
    if engine is None:
        raise ValueError(f"backend {row.get('backend')!r} unknown; expected trtllm, vllm or sglang")
    gq = (row.get("gemm_quant_mode") or row.get("precision") or "").strip().lower()
    mq = (row.get("moe_quant_mode") or gq).strip().lower()
    q = mq if model.is_moe else gq
    if q not in _QUANT:
        raise ValueError(f"quant mode {q!r} unknown; expected one of {sorted(k for k in _QUANT if k)}")
    wd = _QUANT[q]
    if wd == "bf16" and model.native_dtype in ("fp8", "fp4"):
        wd = model.native_dtype
    kv = "fp8" if wd in ("fp8", "fp4") and gpu.supports("fp8") else "bf16"
    isl, osl = _int(row.get("isl"), 0), _int(row.get("osl"), 0)
    if isl <= 0 or osl <= 0:
        raise ValueError("isl and osl must be positive integers")
    mode = (row.get("mode") or "agg").strip().lower()
    common = dict(id=row.get("id", ""), model=model, model_key=model_path, gpu=gpu, engine=engine,
                  weight_dtype=wd, kv_dtype=kv, isl=isl, osl=osl,
                  measured_ttft_ms=_float(row.get("silicon_ttft_ms")),
                  measured_tpot_ms=_float(row.get("silicon_tpot_ms")))
    if mode == "disagg":
        dec = realizable(_mapping(row, "decode_"), model)
        pre = realizable(_mapping(row, "prefill_"), model)
        dw = _int(row.get("decode_num_workers"))
        pw = _int(row.get("prefill_num_workers"))
        dbs = _int(row.get("decode_batch_size"), 0)
        conc = _int(row.get("batch_size"), 0) or dbs * dw * dec.attn_dp or _source_concurrency(row)
        if conc <= 0:
            raise ValueError("disagg row gives no concurrency (batch_size, decode_batch_size or "
                             "silicon_concurrency= in silicon_data_source)")
        return Scenario(**common, concurrency=conc, prefill=pre, decode=dec, prefill_workers=pw,
                        decode_workers=dw, prefill_batch=_int(row.get("prefill_batch_size")))
    bs = _int(row.get("batch_size"), 0)
    if bs <= 0:
        raise ValueError("batch_size (concurrency) is empty")
    mapping = _mapping(row)
    # with attention DP, batch_size counts the requests of ONE attention-DP rank: the
    # replica serves batch_size x attention_dp_size (AIConfigurator's convention,
    # `global_bs = bs * attention_dp_size` in its backends' run_agg; in the calibration
    # set silicon_concurrency = batch_size x attention_dp_size on all 23 such rows)
    return Scenario(**common, concurrency=bs * mapping.attn_dp, mapping=realizable(mapping, model))


def measured_run_fit(model, gpu, mapping, *, weight_dtype: str, kv_dtype: str, context_tokens: int, engine: str):
    """The memory fit of a layout a measured run served: it did fit, so where the default memory fraction (0.9)
    is too small the operator must have raised it; the fit at the largest fraction engines accept in practice
    (`MAX_MEMORY_FRACTION`) then. Used for the calibration scenarios and the evidence rows alike (issue 20: one
    InferenceX source ran DeepSeek-R1 FP8 on 4 B200 with `--mem-fraction-static 0.95`; at 0.9 the weights alone
    do not fit, and the row was priced as one sequence at a time)."""
    chunk = perf.engine_defaults(engine, gpu)[0]
    for fraction in (0.9, MAX_MEMORY_FRACTION):
        mf = memory_fit(model, gpu, mapping, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                        context_tokens=context_tokens, chunk_size=chunk, engine=engine, memory_fraction=fraction)
        if mf.fits:
            break
    return mf


def predict_scenario(sc: Scenario, params: PerfParams | None = None) -> tuple[float, float]:
    """(ttft_ms, tpot_ms) predicted for one scenario."""
    q = params or FITTED_PARAMS
    wl = Workload(isl=sc.isl, osl=sc.osl, concurrency=sc.concurrency)
    if sc.mapping is not None:
        mf = measured_run_fit(sc.model, sc.gpu, sc.mapping, weight_dtype=sc.weight_dtype, kv_dtype=sc.kv_dtype,
                              context_tokens=sc.isl + sc.osl, engine=sc.engine)
        if not mf.fits:
            raise ValueError(f"layout does not fit memory even at memory fraction {MAX_MEMORY_FRACTION}: {mf.reason}")
        pr = perf.predict(sc.model, sc.gpu, sc.mapping, wl, weight_dtype=sc.weight_dtype,
                          kv_dtype=sc.kv_dtype, engine=sc.engine, concurrency=sc.concurrency,
                          memory=mf, params=q)
        return pr.ttft_ms, pr.tpot_ms
    pr = perf.predict_disagg(sc.model, sc.gpu, sc.prefill, sc.decode, wl, weight_dtype=sc.weight_dtype,
                             kv_dtype=sc.kv_dtype, engine=sc.engine, concurrency=sc.concurrency,
                             prefill_workers=sc.prefill_workers, decode_workers=sc.decode_workers,
                             prefill_batch=sc.prefill_batch, params=q, memory_fraction=MAX_MEMORY_FRACTION)
    return pr.ttft_ms, pr.tpot_ms


def load_scenarios(csv_path: str | Path, configs_dir: str | Path | None, *, modes=("agg", "disagg")):
    """[(row, Scenario or None, error)] for every row of a scenarios CSV."""
    out = []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if (row.get("mode") or "agg").strip().lower() not in modes:
                continue
            try:
                out.append((row, scenario_from_row(row, configs_dir), ""))
            except (KeyError, ValueError) as exc:
                out.append((row, None, str(exc).strip("'\"")))
    return out


# ---- fitting --------------------------------------------------------------------------

FIT_NAMES = ("gemm_eff", "mem_eff", "attn_eff", "moe_eff", "layer_us", "iter_ms", "comm_eff", "comm_us",
             "nic_us", "ttft_iters", "wave", "wave_prefill_first", "wave_budget_first",
             "interference", "moe_gemm_eff", "a2a_peer_us")
_CAPPED = {"gemm_eff", "mem_eff", "attn_eff", "moe_eff", "moe_gemm_eff", "comm_eff", "wave",
           "wave_prefill_first", "wave_budget_first", "interference"}
TTFT_WEIGHT = 1.0
# The TTFT stage minimises the RELATIVE error |pred/measured - 1| capped at a clip,
# the quantity the accuracy target is stated in (median relative error), made robust:
# some measured runs sit 10-100x off their neighbours (a 38 s TTFT at concurrency 4
# beside 0.2 s at 12) and would otherwise steer the TTFT parameters. Which clip
# generalises best is not knowable in advance: held-out TTFT error moved by several
# points with it (0.4 / 0.5 / 0.7 / 1.0 gave 41.2% / 41.0% / 36.4% / 39.1% in an
# earlier version), and choosing one by inner leave-one-architecture-out inside
# each fold picked near-ties (inner scores within 0.3 points) whose held-out
# errors differed by 14 points. So no clip is chosen: the TTFT stage is fitted once
# per clip of this fixed grid (None = plain mean |log| error) and the fits'
# parameters are averaged in log space (`fit`). The grid holds the caps tried
# before, 0.7 among them (picked earlier partly on held-out results).
# Held-out (leave-one-model-out, --iters 500): one cap 0.7 and moe_eff also on the
# expert GEMMs 35.4% (bias -15.3%); this average with `moe_gemm_eff` in the TTFT
# stage 33.9% (bias -13.8%), every held-out model lower (DeepSeek-V3 52.4 -> 51.5,
# gpt-oss 22.6 -> 21.7, Llama-70B 38.4 -> 34.8, Llama-8B 52.9 -> 52.5, Qwen3-32B
# 27.3 -> 24.8). That structure was kept from about ten variants compared on these
# held-out figures, so 33.9% carries some selection optimism; the fitted values
# themselves come from the training models of each fold only.
# Since then: prompts priced whole in a share of the steps, then batch_size x attention_dp_size
# read, then the per-peer all-to-all latency: held-out TTFT 33.6%, 33.4%, 33.2% (bias -4.9%).
TTFT_CLIPS = (0.5, 0.7, 1.0, None)
# Wide expert parallelism was under-predicted (median TPOT bias of the aggregated DeepSeek-V3
# rows with EP > 16: -32% in-sample at first, -20% once prompts were priced whole and
# batch_size x attention_dp_size read; DeepSeek-R1 "tp36"/"tp72" rows of AIConfigurator's
# sample -47%). A fitted all-to-all latency per peer EP rank (`a2a_peer_us`) was first tried
# before those two changes and not kept (held-out TPOT 16.4%, Spearman 0.906, TTFT 35.6% against
# 16.3% / 0.901 / 33.9%). Tried again after them it is kept: held-out 13.5% / 0.923 / 33.2%
# (bias -4.9%) against 14.4% / 0.913 / 33.4%; on AIConfigurator's 1,866 unseen aggregated rows
# 17.2% / 0.885 / 33.1% against 17.0% / 0.882 / 33.4%; the R1 tp36/tp72 bias -47% -> -1%, the
# V3 EP > 16 bias -20% -> -18%. Fitted 1.6 µs per peer, the order of DeepEP's published growth.
# Tried and not kept (after the per-peer latency): an extra fitted cost per layer in steps that
# carry prompt tokens (engines replay CUDA graphs for decode-only steps and launch mixed steps
# kernel by kernel). Held-out 14.2% / 0.917 / 35.7% against 13.5% / 0.923 / 33.2% without it.
# Tried and not kept (after batch_size x attention_dp_size): attention-DP ranks stalling
# together when a prompt lands on ANY of them (they meet at every MoE all-to-all). Held-out
# 13.7% / 0.920 / 31.4% against 14.4% / 0.913 / 33.4% without it, but on AIConfigurator's
# unseen aggregated rows 17.4% / 0.878 / 33.7% against 17.0% / 0.882 / 33.4%: the calibration
# set has only 23 aggregated attention-DP rows, so its held-out gain came through the other
# parameters' refit, not from those rows. Engines also balance prompts over DP ranks
# (TensorRT-LLM attention_dp_config.enable_balance), which the full stall ignores.


def _make(x: list[float], base: PerfParams, names=None) -> PerfParams:
    vals = {}
    for name, lv in zip(names or FIT_NAMES, x):
        v = math.exp(lv)
        if name in _CAPPED:
            v = min(v, 1.0)
        vals[name] = v
    return base.with_values(**vals)


def loss(scenarios: list[Scenario], params: PerfParams, tpot_weight: float = 1.0,
         ttft_weight: float | None = None, clip: float | None = None) -> float:
    """Mean error over the scenarios: |log(pred/measured)| of TPOT x tpot_weight plus,
    for TTFT x ttft_weight (default TTFT_WEIGHT), the same or, when `clip` is given,
    the relative error |pred/measured - 1| capped at `clip` (`fit`'s TTFT stage; see
    TTFT_CLIPS for why)."""
    ttft_weight = TTFT_WEIGHT if ttft_weight is None else ttft_weight
    total = 0.0
    n = 0
    for sc in scenarios:
        try:
            ttft, tpot = predict_scenario(sc, params)
        except (ValueError, ZeroDivisionError, OverflowError):
            total += 3.0
            n += 1
            continue
        if sc.measured_tpot_ms and tpot_weight:
            total += tpot_weight * abs(math.log(tpot / sc.measured_tpot_ms))
        if sc.measured_ttft_ms and ttft_weight:
            if clip is None:
                total += ttft_weight * abs(math.log(ttft / sc.measured_ttft_ms))
            else:
                total += ttft_weight * min(clip, abs(ttft / sc.measured_ttft_ms - 1.0))
        n += 1
    return total / max(n, 1)


def nelder_mead(f, x0: list[float], step: float = 0.3, iters: int = 300, tol: float = 1e-5) -> tuple[list[float], float]:
    """Minimise f over R^n from x0 (standard Nelder-Mead: reflect, expand, contract, shrink)."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        xr = [centroid[j] + (centroid[j] - worst[j]) for j in range(n)]
        fr = f(xr)
        if fr < values[0]:
            xe = [centroid[j] + 2.0 * (centroid[j] - worst[j]) for j in range(n)]
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = [centroid[j] + 0.5 * (worst[j] - centroid[j]) for j in range(n)]
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [[best[j] + 0.5 * (p[j] - best[j]) for j in range(n)] for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return simplex[i], values[i]


# parameters fitted in the second (TTFT) stage of `fit`: the TTFT-only serving
# parameters and the grouped-GEMM efficiency of routed experts, whose work is
# prefill-sized (decode reads experts, it hardly computes them)
TTFT_ONLY = ("ttft_iters", "wave", "wave_prefill_first", "wave_budget_first", "moe_gemm_eff")


def _nm_fit(scenarios, p: PerfParams, names, tpot_weight: float, ttft_weight: float, clip,
            iters: int) -> PerfParams:
    """Nelder-Mead over log(names) from p's values, then a restart with a smaller simplex."""
    # moe_gemm_eff 0 means "as moe_eff": start it there
    x0 = [math.log(getattr(p, n) or p.moe_eff) for n in names]
    f = lambda x: loss(scenarios, _make(x, p, names), tpot_weight, ttft_weight, clip)  # noqa: E731
    best, _ = nelder_mead(f, x0, iters=iters)
    best, _ = nelder_mead(f, best, step=0.1, iters=iters // 2)
    return _make(best, p, names)


def fit(scenarios: list[Scenario], base: PerfParams | None = None, iters: int = 300) -> PerfParams:
    """Two-stage fit: the step-time parameters on TPOT alone, then the TTFT-stage
    parameters (`TTFT_ONLY`) on TTFT with the step-time parameters frozen.

    Fitting both on a joint loss let TTFT's larger, source-dependent errors pull
    the step-time efficiencies away from what TPOT says; staging keeps each
    parameter fitted on the measurement it explains. `moe_gemm_eff` sits in the
    TTFT stage because routed experts' GEMMs matter in prefill: decode steps read
    the touched experts (memory-bound, `moe_eff`) and TPOT barely constrains
    their compute rate (it only enters through other requests' prefill landing
    in decode steps).

    The TTFT stage is fitted once per clip in `TTFT_CLIPS` and the fitted values
    averaged in log space (geometric mean), so no clip is picked (see TTFT_CLIPS).
    """
    base = base or PerfParams()
    step_names = tuple(n for n in FIT_NAMES if n not in TTFT_ONLY)
    ttft_names = tuple(n for n in FIT_NAMES if n in TTFT_ONLY)
    p = _nm_fit(scenarios, base, step_names, 1.0, 0.0, None, iters)
    fits = [_nm_fit(scenarios, p, ttft_names, 0.0, 1.0, clip, iters) for clip in TTFT_CLIPS]
    return p.with_values(**{n: math.exp(sum(math.log(getattr(f, n)) for f in fits) / len(fits))
                            for n in ttft_names})
