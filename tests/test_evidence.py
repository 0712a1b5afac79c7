"""The second evidence base (benchmarks/evidence.py, issue 20): its held-out figures, its folds, its variants.

The figures are the planner's median absolute errors on public runs outside the calibration fit: 218 rows
from 26 sources (2026-12-02), each predicted with the parameters of its model's leave-one-model-out fold
(lomo_params.json: the calibration fit repeated without the model's architecture), and without the rows
that ARE calibration measurements (runs.csv `calibration_id`: InferenceX-app's fixture and AIConfigurator's
database share 256 runs). They are not at issue 20's targets (TPOT <= 15%, TTFT <= 30%, tokens/s/GPU <= 15%;
docs/evidence.md says where the misses are): these tests hold them where they are measured now, so a change
to the model that makes them worse fails here. The first build's sources keep their own figures
(FIRST_BUILD): adding sources changes the whole base's medians, not what the model does on the rows it was
already checked on.
"""

from __future__ import annotations

import pytest

from benchmarks import evidence as ev
from meshplan.planner.calibration import FITTED_PARAMS

# measured on 2026-12-02 (`python benchmarks/evidence.py`, its ALL line: every row with its model's
# leave-one-model-out fold); a regression of more than MARGIN (absolute, in error units) fails
MARGIN = 0.02
# the first build's six sources (43 runs): the figures the targets below were set on
FIRST_BUILD = {"trtllm-perf-overview", "inferencex-870-h200", "inferencex-870-b200", "inferencex-1061-mi300x",
               "tenstorrent-356-h100", "musgrave-a100"}
# (with the committed parameters, which saw these models, the first build measured 33.4% / 37.7% / 12.8%)
# (2026-12-02, with the AMD families' per-step overhead: 27.8% / 39.2% / 15.4% before it; MI300X's gpt-oss-120b
# rows take CDNA3's overhead fitted on its DeepSeek-R1 rows and are over-predicted, the rest gains)
# (2026-12-03, the AMD overhead per layer instead of per step: 25.0% / 39.2% / 13.9% -> 12.8% / 39.2% / 12.9%;
# MI300X's gpt-oss-120b rows, 36 layers, are no longer priced with DeepSeek-R1's 61-layer floor)
MEASURED_FIRST = {"tpot_ms": 0.128, "ttft_ms": 0.392, "tokens_per_s_per_gpu": 0.129}
MEASURED_FIRST_NO_SUSPECT = {"tpot_ms": 0.085, "ttft_ms": 0.355, "tokens_per_s_per_gpu": 0.129}
SPEARMAN_FIRST = {"tpot_ms": 0.70, "ttft_ms": 0.81, "tokens_per_s_per_gpu": 0.97}
# every source: the second build (+ InferenceX #870 concurrency 4 and #828, the NIM benchmarking page, dstack's
# DeepSeek-R1 raw results, the first 128,000 characters of InferenceX-app's API fixture) and the third (the rest
# of that fixture): 218 held-out rows, 26 sources. With the AMD families' per-step overhead (calibration.FAMILY_STEP_MS,
# each AMD row's fitted without its source and model); 37.4% / 56.7% / 43.5% before it. With dstack's fixed-length
# rows priced in step (`Workload.synchronized`, sources.yaml random_range_ratio 1): TTFT 54.0% -> 43.5%, its Spearman
# 0.80 -> 0.90 (the family step, fitted on all three errors, moves TPOT 27.5% -> 27.4%, the first build's 29.1% -> 26.4%)
# Fourth build (2026-12-02, session 4): MiniMax-M2.x, a model outside the calibration set, on MI300X (SGLang 0.5.13),
# GB300 (SGLang 0.5.10) and H100 (vLLM 0.16): 228 rows, 29 sources; CDNA3's overhead for DeepSeek-R1's rows is now
# fitted on two other models' rows (10 ms, was gpt-oss-120b's alone): 27.4% / 43.5% / 37.8% -> 25.1% / 43.2% / 35.8%
# Session 5 (2026-12-02 evening): every row is priced with the memory its run had (`evidence.run_memory`,
# `calibration.measured_run_fit`): 25.1% / 43.2% / 35.8% -> 24.9% / 43.2% / 35.4% (two B200 TP4 rows that fit
# only above the default memory fraction had been priced one sequence at a time)
# Session of 2026-12-03 afternoon: eight throughput rows of two more models on MI355X (gpt-oss-120b TP1, MiniMax-M2.5
# TP2/EP2; 236 rows, 31 sources; 24.9% / 43.2% / 35.6% with the per-step overhead), and the AMD families' overhead
# priced per layer (calibration.FAMILY_LAYER_US, fitted on the current engine lines' rows): 20.6% / 43.2% / 29.7%
MEASURED = {"tpot_ms": 0.206, "ttft_ms": 0.432, "tokens_per_s_per_gpu": 0.297}
MEASURED_NO_SUSPECT = {"tpot_ms": 0.197, "ttft_ms": 0.435, "tokens_per_s_per_gpu": 0.285}
SPEARMAN = {"tpot_ms": 0.87, "ttft_ms": 0.90, "tokens_per_s_per_gpu": 0.94}


@pytest.fixture(scope="module")
def runs():
    return ev.held_out_runs(ev.load())


@pytest.fixture(scope="module")
def bases(runs):
    """Each row's leave-one-model-out calibration fold and, on an AMD family, that family's per-step overhead
    fitted on the other sources' and models' rows."""
    return ev.Bases.load(FITTED_PARAMS).held_out(runs)


@pytest.fixture(scope="module")
def pairs(runs, bases):
    """Every held-out row predicted with the parameters of its model's leave-one-model-out fold."""
    return [(r, ev.predict_run(r, bases)) for r in runs]


def test_evidence_base_is_what_the_docs_describe(runs):
    assert len(runs) >= 228
    assert len({r.source for r in runs}) >= 29
    assert {r.engine for r in runs} >= {"vllm", "sglang", "trtllm"}
    assert len({ev.GENERATION[r.gpu] for r in runs}) >= 5
    assert {r.source for r in runs} >= FIRST_BUILD
    assert len([r for r in runs if r.source in FIRST_BUILD]) == 43


def test_held_out_figures_do_not_regress(pairs):
    f = ev.figures(pairs)
    for k, was in MEASURED.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])
        assert f[k]["spearman"] >= SPEARMAN[k] - 0.05, (k, f[k])


def test_first_build_figures_do_not_regress(pairs):
    f = ev.figures([(r, p) for r, p in pairs if r.source in FIRST_BUILD])
    for k, was in MEASURED_FIRST.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])
        assert f[k]["spearman"] >= SPEARMAN_FIRST[k] - 0.05, (k, f[k])


def test_held_out_figures_without_the_suspect_sources_do_not_regress(pairs):
    suspect = ev.suspect_sources()
    assert "tenstorrent-356-h100" in suspect and "TP16 assumed" in suspect["tenstorrent-356-h100"]
    f = ev.figures([(r, p) for r, p in pairs if r.source not in suspect])
    for k, was in MEASURED_NO_SUSPECT.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])
    first = ev.figures([(r, p) for r, p in pairs if r.source in FIRST_BUILD and r.source not in suspect])
    for k, was in MEASURED_FIRST_NO_SUSPECT.items():
        assert first[k]["mae"] <= was + MARGIN, (k, first[k])


@pytest.mark.parametrize("key", [lambda r: r.source, lambda r: r.model], ids=["source", "model"])
def test_leave_one_group_out_never_fits_on_the_held_out_group(runs, key, monkeypatch):
    seen = []
    real_fit = ev._fit

    def spy(name, train, base):
        seen.append({key(r) for r in train})
        return real_fit(name, train, base)

    monkeypatch.setattr(ev, "_fit", spy)
    held = ev.held_out("step_ms", runs, FITTED_PARAMS, key)
    groups = sorted({key(r) for r in runs})
    assert len(seen) == len(groups)
    for g, train_groups in zip(groups, seen):
        assert g not in train_groups and train_groups == set(groups) - {g}
    assert sorted(id(r) for r, _ in held) == sorted(id(r) for r in runs)   # every run predicted once


def test_each_variant_vanishes_at_zero(runs):
    """With its constants at 0 every term (but steady admission, which drops the wave) is the committed
    model exactly."""
    for name in ("step_ms", "engine_step_ms", "step_seq_ms", "ttft_fixed_ms", "step_ms+ttft_fixed_ms"):
        zero = {k: 0.0 for k in ev.VARIANTS[name][0]}
        assert all(v == 0.0 for v in zero.values()) and zero in ev.VARIANTS[name]
        for r in runs[::5]:
            assert ev.predict_variant(name, r, FITTED_PARAMS, zero) == ev.predict_run(r, FITTED_PARAMS)


def test_step_overhead_is_monotone_in_tpot(runs):
    r = next(r for r in runs if r.source == "inferencex-870-h200")
    tpots = [ev.predict_variant("step_ms", r, FITTED_PARAMS, {"step": s})["tpot_ms"] for s in (0.0, 1.0, 2.0, 4.0)]
    assert tpots == sorted(tpots) and tpots[0] < tpots[-1]
    # a per-sequence term grows with the running batch: more at concurrency 64 than at 8
    rows = sorted((r for r in runs if r.source == "inferencex-870-h200"), key=lambda r: r.concurrency)
    extra = [ev.predict_variant("step_seq_ms", r, FITTED_PARAMS, {"step": 0.0, "seq": 0.05})["tpot_ms"]
             - ev.predict_run(r, FITTED_PARAMS)["tpot_ms"] for r in (rows[0], rows[-1])]
    assert 0 < extra[0] < extra[1]


def test_fixed_ttft_cost_shifts_ttft_only(runs):
    r = next(r for r in runs if "ttft_ms" in r.measured)
    a = ev.predict_run(r, FITTED_PARAMS)
    b = ev.predict_variant("ttft_fixed_ms", r, FITTED_PARAMS, {"ttft": 100.0})
    assert b["ttft_ms"] == pytest.approx(a["ttft_ms"] + 100.0)
    assert b["tpot_ms"] == a["tpot_ms"] and b["tokens_per_s_per_gpu"] == a["tokens_per_s_per_gpu"]


def test_steady_admission_drops_the_wave_only_where_others_arrive(runs):
    rows = [r for r in runs if r.source == "inferencex-870-h200"]
    for r in rows:      # concurrency 8..64: the wave share is gone, TTFT drops
        assert (ev.predict_variant("steady_admission", r, FITTED_PARAMS, {"ttft": 0.0})["ttft_ms"]
                < ev.predict_run(r, FITTED_PARAMS)["ttft_ms"])
    lone = [r for r in runs if r.concurrency == 1 and "ttft_ms" in r.measured]
    assert lone
    for r in lone:      # a lone request has no wave: nothing changes
        assert (ev.predict_variant("steady_admission", r, FITTED_PARAMS, {"ttft": 0.0})["ttft_ms"]
                == pytest.approx(ev.predict_run(r, FITTED_PARAMS)["ttft_ms"]))


def test_variants_command_prints_both_folds(capsys):
    assert ev.main(["--variants"]) == 0
    out = capsys.readouterr().out
    for name in ev.VARIANTS:
        assert f"{name} LOSO"[:26] in out and f"{name} LOMO"[:26] in out


def test_rounds_admission_weights_the_wave_by_the_clients_rounds(runs):
    """InferenceX sends 10 x C prompts at concurrency C (its benchmark scripts: --num-prompts $((CONC * 10))):
    one round in ten meets the arrival wave. With R = 1 (trtllm-bench queues everything at once) or at
    concurrency 1 nothing changes; otherwise TTFT lies between the steady-state and the wave figure."""
    assert ev.prompts_per_concurrency("inferencex-870-h200") == 10
    assert ev.prompts_per_concurrency("trtllm-perf-overview") == 1
    assert ev.prompts_per_concurrency("tenstorrent-356-h100") == 1     # states none
    for r in runs:
        got = ev.predict_variant("rounds_admission", r, FITTED_PARAMS, {})
        wave = ev.predict_run(r, FITTED_PARAMS)
        if ev.prompts_per_concurrency(r.source) == 1 or r.concurrency == 1:
            assert got == wave
        else:
            steady = ev.predict_variant("steady_admission", r, FITTED_PARAMS, {"ttft": 0.0})
            assert steady["ttft_ms"] <= got["ttft_ms"] <= wave["ttft_ms"]
            rounds = ev.prompts_per_concurrency(r.source)
            assert got["ttft_ms"] == pytest.approx(wave["ttft_ms"] / rounds + steady["ttft_ms"] * (1 - 1 / rounds))
            assert got["tpot_ms"] == wave["tpot_ms"]


def test_rounds_admission_with_a_fixed_cost_is_rounds_admission_shifted_by_it(runs):
    """`ttft_fixed_ms+rounds` at 0 ms is `rounds_admission`; at x ms every TTFT is x later (the wave's and the
    steady state's alike, so their rounds-weighted mean too) and nothing else moves."""
    for r in runs[::3]:
        rounds = ev.predict_variant("rounds_admission", r, FITTED_PARAMS, {})
        assert ev.predict_variant("ttft_fixed_ms+rounds", r, FITTED_PARAMS, {"ttft": 0.0}) == rounds
        got = ev.predict_variant("ttft_fixed_ms+rounds", r, FITTED_PARAMS, {"ttft": 100.0})
        assert got["ttft_ms"] == pytest.approx(rounds["ttft_ms"] + 100.0)
        assert got["tpot_ms"] == rounds["tpot_ms"] and got["tokens_per_s_per_gpu"] == rounds["tokens_per_s_per_gpu"]


def test_amd_efficiency_slows_amd_rows_only(runs):
    """`amd_eff` at 1 is the committed model; below 1 it slows every AMD row and leaves NVIDIA rows as they are."""
    from meshplan.catalog.gpus import get_gpu

    amd = [r for r in runs if get_gpu(r.gpu).vendor == "amd"]
    nvidia = [r for r in runs if get_gpu(r.gpu).vendor == "nvidia"]
    assert amd and nvidia
    for name, key in (("amd_eff", "amd"), ("amd_decode_eff", "amd_decode")):
        for r in amd[::4] + nvidia[::8]:
            base = ev.predict_run(r, FITTED_PARAMS)
            assert ev.predict_variant(name, r, FITTED_PARAMS, {key: 1.0}) == base
            slow = ev.predict_variant(name, r, FITTED_PARAMS, {key: 0.5})
            if r in amd:
                assert slow["tpot_ms"] > base["tpot_ms"]
                assert slow["tokens_per_s_per_gpu"] < base["tokens_per_s_per_gpu"]
            else:
                assert slow == base


def test_calibration_measurements_are_in_no_held_out_figure(runs):
    """InferenceX-app's fixture and the calibration set share runs (AIConfigurator's `db-dump` rows are InferenceX
    workflow runs): the 34 rows of three sources are calibration rows, named by runs.csv's calibration_id, and
    are out of every held-out figure."""
    every = ev.load()
    fitted_on = [r for r in every if r.calibration_id]
    assert len(fitted_on) >= 34
    assert {r.source for r in fitted_on} >= {"ixapp-b200-trt-fp8-2601", "ixapp-b200-trt-fp8-2511", "ixapp-h200-sgl-fp8"}
    assert all(r.source.startswith("ixapp-") for r in fitted_on)
    assert not any(r.calibration_id for r in runs)
    assert all(r in runs for r in every if not r.spec and not r.calibration_id and r.engine in ev.PRICED_ENGINES)


def test_the_overlap_finder_matches_one_measurement_only(tmp_path):
    """`calibration_overlap` names a calibration row as the same run only at the same GPU, engine, ISL/OSL and
    concurrency with the same TPOT (or TTFT); a row one concurrency step away, or 1% off, is another run."""
    import csv

    head = "source,model,hf_model,gpu,engine,attn_tp,attn_dp,moe_tp,moe_ep,pp,weight_dtype,kv_dtype,isl,osl,concurrency,ttft_ms,tpot_ms,tokens_per_s_per_gpu"
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text(head + "\n"
                        "a,deepseek-r1,x,h200_sxm,sglang,8,1,8,1,1,fp8,bf16,1024,1024,4,259.9,10.293,45.9\n"
                        "b,deepseek-r1,x,h200_sxm,sglang,8,1,8,1,1,fp8,bf16,1024,1024,8,250.0,12.0,77.0\n"
                        "c,deepseek-r1,x,h200_sxm,sglang,8,1,8,1,1,fp8,bf16,1024,1024,16,300.0,16.8,116\n")
    cal = tmp_path / "silicon_calibration.csv"
    with cal.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "mode", "system", "backend", "isl", "osl", "batch_size", "attention_dp_size",
                    "silicon_ttft_ms", "silicon_tpot_ms"])
        w.writerow(["same", "agg", "h200_sxm", "sglang", 1024, 1024, 4, 1, 259.93, 10.2931])
        w.writerow(["next-step", "agg", "h200_sxm", "sglang", 1024, 1024, 16, 1, 250.0, 12.0])   # conc 16, not 8
        w.writerow(["one-pct", "agg", "h200_sxm", "sglang", 1024, 1024, 16, 1, 303.0, 16.97])
    got = {r["source"]: r["calibration_id"] for r in ev.calibration_overlap(runs_csv, tmp_path)}
    assert got == {"a": "same", "b": "", "c": ""}


def test_a_row_of_a_calibrated_architecture_is_predicted_by_the_fold_without_it(bases):
    """DeepSeek-R1 (DeepSeek-V3's architecture), gpt-oss-120b and the Llamas are in the calibration set: their rows
    are predicted with lomo_params.json's fold fitted without their family; Qwen3-235B-A22B, which the calibration
    set lacks, with the committed parameters."""
    import json

    data = json.loads(ev.LOMO_PARAMS.read_text())
    assert set(data["folds"]) == set(ev.CALIBRATION_FAMILY.values())
    assert "--refit-lomo" in data["command"]
    from meshplan.planner.calibration import TTFT_P50

    every = ev.load()
    by_model = {r.model: r for r in every if ev.get_gpu(r.gpu).vendor == "nvidia"}    # no family step
    p50 = dict(ttft_p50_base_ms=TTFT_P50["base_ms"], ttft_p50_iters=TTFT_P50["iters"])
    for model, fam in ev.CALIBRATION_FAMILY.items():
        if model in by_model:
            got = bases.calibration_fold(by_model[model])
            assert got == ev.PerfParams(**data["folds"][fam]) and got != FITTED_PARAMS
            # what a row is predicted with: its fold and the committed steady-state TTFT constants
            assert bases.for_run(by_model[model]) == got.with_values(**p50)
            assert ev.predict_run(by_model[model], bases) == ev.predict_run(by_model[model], got.with_values(**p50))
    assert bases.calibration_fold(by_model["qwen3-235b-a22b"]) is FITTED_PARAMS
    # each fold trained on fewer rows than the whole calibration set
    assert all(0 < n < 2046 for n in data["train_rows"].values())


# ---- disaggregated rows (InferenceX-app's multi-node prefill/decode runs) ---------------------------------------

def test_disaggregated_rows_add_up_to_their_gpu_counts():
    """A consistent row's workers x layout GPUs are the fixture's prefill and decode GPU counts; the figures take only
    consistent, non-speculative rows of a known KV dtype that are not calibration measurements."""
    import csv

    rows = list(csv.DictReader(ev.DISAGG.open()))
    every = ev.load_disagg()
    assert len(every) == len(rows) >= 1000
    for r, row in zip(every, rows):
        assert r.measured["tpot_ms"] == float(row["tpot_ms"])
        if r.consistent:
            assert r.prefill_workers * r.prefill.gpus == int(row["num_prefill_gpu"])
            assert r.decode_workers * r.decode.gpus == int(row["num_decode_gpu"])
    held = ev.held_out_disagg(every)
    assert len(held) >= 200
    for r in held:
        assert r.consistent and not r.spec and not r.calibration_id and r.kv_dtype in ("fp8", "bf16")


def test_disaggregated_throughput_is_compared_per_decode_gpu(bases):
    """The fixture divides output tokens/s by the decode pool: the prediction (per GPU of both pools) is converted
    by all GPUs / decode GPUs, and TTFT and TPOT are predict_disagg's own."""
    from meshplan.catalog.gpus import get_gpu
    from meshplan.catalog.models import get_model
    from meshplan.planner.perf import predict_disagg
    from meshplan.planner.types import Workload

    r = ev.held_out_disagg(ev.load_disagg())[0]
    got = ev.predict_disagg_run(r, bases)
    p = predict_disagg(get_model(r.model), get_gpu(r.gpu), r.prefill, r.decode, Workload(isl=r.isl, osl=r.osl),
                       weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype, concurrency=r.concurrency,
                       prefill_workers=r.prefill_workers, decode_workers=r.decode_workers, engine=r.engine,
                       params=bases.for_run(r))
    gpus = r.prefill_workers * r.prefill.gpus + r.decode_workers * r.decode.gpus
    assert got["tpot_ms"] == p.tpot_ms and got["ttft_ms"] == p.ttft_ms
    assert got["tokens_per_s_per_gpu"] == pytest.approx(p.tokens_per_s_per_gpu * gpus / (r.decode_workers * r.decode.gpus))
    assert gpus > r.decode_workers * r.decode.gpus


def test_disaggregated_overlap_needs_both_figures(tmp_path):
    """A disaggregated calibration row names no batch size, so a row is the same run only when TPOT AND TTFT agree."""
    import csv

    runs_csv = tmp_path / "disagg.csv"
    runs_csv.write_text("source,gpu,engine,isl,osl,ttft_ms,tpot_ms\n"
                        "a,gb200,trtllm,1024,1024,1196.836,11.473\n"
                        "b,gb200,trtllm,1024,1024,1500.0,11.473\n")
    with (tmp_path / "silicon_calibration.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "mode", "system", "backend", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms"])
        w.writerow(["same", "disagg", "gb200", "trtllm", 1024, 1024, 1196.8362, 11.4731])
    got = {r["source"]: r["calibration_id"] for r in ev.calibration_overlap_disagg(runs_csv, tmp_path)}
    assert got == {"a": "same", "b": ""}


# measured on 2026-12-02 (`python benchmarks/evidence.py`, its "ALL disaggregated" line: 260 held-out rows).
# 2026-12-03, the AMD overhead per layer: 23.9% / 58.0% / 30.2% -> 16.1% / 61.8% / 20.5%. The mean TTFT is worse
# (a trade taken knowingly, docs/evidence.md): MI355X's DeepSeek-R1 rows, held out by model, took no CDNA4 step
# (no other model's rows) and now take 30 us per layer fitted on gpt-oss-120b's and MiniMax's rows, which lengthens
# every prefill step of TTFTs that were already over-predicted
MEASURED_DISAGG = {"tpot_ms": 0.161, "ttft_ms": 0.618, "tokens_per_s_per_gpu": 0.205}
SPEARMAN_DISAGG = {"tpot_ms": 0.90, "ttft_ms": 0.75, "tokens_per_s_per_gpu": 0.99}


def test_disaggregated_held_out_figures_do_not_regress(bases):
    held = ev.held_out_disagg(ev.load_disagg())
    pairs = [(r, p) for r in held if (p := ev.predict_disagg_run(r, bases)) is not None]
    assert len(pairs) == len(held)          # every held-out layout fits the model's memory accounting
    f = ev.figures(pairs)
    for k, was in MEASURED_DISAGG.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])
        assert f[k]["spearman"] >= SPEARMAN_DISAGG[k] - 0.05, (k, f[k])


# ---- the per-layer overhead of the GPU families the calibration set never measured (calibration.FAMILY_LAYER_US) ----

def test_the_committed_family_overhead_is_the_fit_on_every_current_line_row_of_the_family(runs):
    from meshplan.planner.calibration import FAMILY_LAYER_US

    assert set(FAMILY_LAYER_US) == {"cdna3", "cdna4"}
    for g, us in FAMILY_LAYER_US.items():
        assert ev.fit_family_layer(runs, g, lambda r: FITTED_PARAMS) == us, g
    # the older builds' rows (dstack's SGLang 0.4 / vLLM 0.7 on MI300X) are not fitted on: adding them changes nothing
    older = [r for r in runs if not ev.on_rendered_line(r) and ev.get_gpu(r.gpu).family == "cdna3"]
    assert len(older) == 18
    current = [r for r in runs if ev.on_rendered_line(r)]
    assert ev.fit_family_layer(current, "cdna3", lambda r: FITTED_PARAMS) == FAMILY_LAYER_US["cdna3"]


def test_a_family_overhead_is_fitted_without_the_rows_source_and_model(runs, monkeypatch):
    seen = []

    def spy(train, family, base):
        seen.append((family, train))
        return 10.0

    monkeypatch.setattr(ev, "fit_family_layer", spy)
    amd = [r for r in runs if ev.get_gpu(r.gpu).vendor == "amd"]
    b = ev.Bases.load(FITTED_PARAMS).held_out(runs)
    for r in amd:
        seen.clear()
        q = b.for_run(r)
        assert dict(q.family_layer_us) == {ev.get_gpu(r.gpu).family: 10.0}
        for _, train in seen:
            assert all(t.source != r.source and t.model != r.model for t in train), r.source
    # an NVIDIA row takes none
    nv = next(r for r in runs if ev.get_gpu(r.gpu).vendor == "nvidia")
    assert b.for_run(nv).family_layer_us == ()


def test_the_family_overhead_improves_every_figure_on_the_amd_rows_held_out_by_source_and_model(runs, bases):
    """The term's place, on rows it was not fitted on: with it (source and model held out) every figure of the
    AMD rows is better than without it."""
    amd = [r for r in runs if ev.get_gpu(r.gpu).vendor == "amd"]
    assert len(amd) >= 113
    with_it = ev.figures([(r, ev.predict_run(r, bases)) for r in amd])
    without = ev.figures([(r, ev.predict_run(r, ev.Bases.load(FITTED_PARAMS))) for r in amd])
    for k in ev.METRICS:
        assert with_it[k]["mae"] < without[k]["mae"], (k, with_it[k], without[k])


def test_per_layer_beats_the_per_step_overhead_on_both_folds(runs, monkeypatch):
    """Why the AMD overhead is priced per layer (docs/evidence.md, "The AMD families' overhead, per layer"): the
    per-step constant it replaced (0-30 ms in 0.5 ms, fitted the same way on the same rows) is worse on TPOT
    held out by source and model and held out by source only, worse on tokens/s/GPU held out by both (measured
    2026-12-03: 20.6% / 43.2% / 29.7% against 24.9% / 43.2% / 35.6%; by source 12.3% / 42.5% / 14.8% against
    13.7% / 42.7% / 14.8%), and no better anywhere on the mean TTFT."""
    # the same held-out fit (`Bases.family_layer`, `fit_family_layer`), with the per-step form and its grid swapped in
    def with_step(q, family, ms):
        return q.with_values(iter_ms=q.iter_ms + ms) if ms else q

    layers = {hold: ev.Bases.load(FITTED_PARAMS).held_out(runs, hold) for hold in (("source", "model"), ("source",))}
    figures_layer = {hold: ev.figures([(r, ev.predict_run(r, b)) for r in runs]) for hold, b in layers.items()}
    monkeypatch.setattr(ev, "with_family_layer", with_step)
    monkeypatch.setattr(ev, "FAMILY_GRID", tuple(x * 0.5 for x in range(61)))
    for hold, fl in figures_layer.items():
        per_step = ev.Bases.load(FITTED_PARAMS).held_out(runs, hold)
        fs = ev.figures([(r, ev.predict_run(r, per_step)) for r in runs])
        assert fl["tpot_ms"]["mae"] < fs["tpot_ms"]["mae"] - 0.01, (hold, fl["tpot_ms"], fs["tpot_ms"])
        if hold == ("source", "model"):
            assert fl["tokens_per_s_per_gpu"]["mae"] < fs["tokens_per_s_per_gpu"]["mae"] - 0.05
        else:
            assert fl["tokens_per_s_per_gpu"]["mae"] <= fs["tokens_per_s_per_gpu"]["mae"] + 0.001
        assert fl["ttft_ms"]["mae"] <= fs["ttft_ms"]["mae"] + 0.001, (hold, fl["ttft_ms"], fs["ttft_ms"])


# ---- the steady-state (median) TTFT (Prediction.ttft_p50_ms; calibration.TTFT_P50) -------------------------------

# measured on 2026-12-02 (`python benchmarks/evidence.py`, the "TTFT p50 (median)" lines): every held-out row
# with a median (InferenceX-app's fixture and dstack's raw CSV), the fixture's alone, the disaggregated rows
# (2026-12-02 session 4: the median in step, `perf._core` in_step, 33.2% -> 31.7%; the fixture's 18.0% -> 18.5% with
# the fourth build's CDNA3 step); 2026-12-03: the wait for the prefills ahead (`perf.prefill_queue_ms`) 31.7% -> 30.2%,
# 18.5% -> 18.9%, 59.8% -> 56.5%; the AMD overhead per layer 30.2% -> 30.3%, 18.9% -> 19.6%, 56.5% -> 57.6%
MEASURED_P50 = {"agg": (153, 0.303), "fixture": (108, 0.196), "disagg": (260, 0.576)}


def test_every_row_of_the_fixture_and_of_dstacks_csv_carries_its_median_ttft():
    every = ev.load()
    with_median = [r for r in every if r.source.startswith(("ixapp-", "dstack-"))]
    assert len(with_median) == 645 and all(ev.P50 in r.measured for r in with_median)
    assert not any(ev.P50 in r.measured for r in every if r not in with_median)
    disagg = ev.load_disagg()
    assert len(disagg) == 1128 and all(ev.P50 in r.measured for r in disagg)


def test_the_committed_p50_constants_are_the_fit_on_the_calibration_rows_medians():
    from meshplan.planner.calibration import TTFT_P50

    rows = ev.calibration_p50_rows()
    assert len(rows) == 256 and all(r.calibration_id for r in rows)
    got = ev.fit_p50(rows, FITTED_PARAMS)
    assert (got["base_ms"], got["iters"]) == (TTFT_P50["base_ms"], TTFT_P50["iters"])


def test_median_ttft_held_out_figures_do_not_regress(pairs, bases):
    f = ev.figure_p50(pairs)
    n, was = MEASURED_P50["agg"]
    assert f["n"] == n and f["mae"] <= was + MARGIN, f
    fx = ev.figure_p50([(r, p) for r, p in pairs if r.source.startswith("ixapp-")])
    n, was = MEASURED_P50["fixture"]
    assert fx["n"] == n and fx["mae"] <= was + MARGIN, fx
    assert fx["within_30"] > fx["n"] / 2              # there the median row is inside the issue's 30%
    held = ev.held_out_disagg(ev.load_disagg())
    d = ev.figure_p50([(r, p) for r in held if (p := ev.predict_disagg_run(r, bases)) is not None])
    n, was = MEASURED_P50["disagg"]
    assert d["n"] == n and d["mae"] <= was + MARGIN, d


def test_fixed_length_sources_are_priced_in_step_and_their_ttft_gains(runs, bases):
    """dstack's client sends fixed lengths (`--random-range-ratio 1`, sources.yaml random_range_ratio): its rows get a
    synchronised workload (`Workload.synchronized`), no other source does, and on those rows the held-out TTFT
    error falls from 87% to 56% (the rest of the miss is the early-2025 engines' slower prefill: their TPOT is
    under-predicted by half as well); TPOT and tokens/s/GPU do not move."""
    fixed = [r for r in runs if ev.workload_of(r).synchronized]
    assert {r.source for r in fixed} == {s for s in ev._sources() if s.startswith("dstack-")}
    assert len(fixed) == 45
    free = ev.figures([(r, ev.predict_run(r, bases)) for r in fixed])

    def unsynced(r):
        p = ev.predict(ev.get_model(r.model), ev.get_gpu(r.gpu), r.mapping, ev.Workload(isl=r.isl, osl=r.osl),
                       weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype, engine=r.engine, concurrency=r.concurrency,
                       params=bases.for_run(r))
        return {"tpot_ms": p.tpot_ms, "ttft_ms": p.ttft_ms, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                ev.P50: p.ttft_p50_ms}

    before = ev.figures([(r, unsynced(r)) for r in fixed])
    assert free["ttft_ms"]["mae"] <= 0.56 + MARGIN and before["ttft_ms"]["mae"] >= 0.85, (free, before)
    for k in ("tpot_ms", "tokens_per_s_per_gpu"):
        assert free[k]["mae"] == pytest.approx(before[k]["mae"])
    # the median too waits for every round's prompts: dstack's median TTFT error 97% -> 60%
    # (`Prediction.ttft_p50_ms` in step; the measured median is as high as the mean there)
    p50_free = ev.figure_p50([(r, ev.predict_run(r, bases)) for r in fixed])
    p50_before = ev.figure_p50([(r, unsynced(r)) for r in fixed])
    assert p50_free["n"] == 45 and p50_free["mae"] <= 0.60 + MARGIN and p50_before["mae"] >= 0.95, (p50_free, p50_before)


def test_rows_of_builds_older_than_the_rendered_engine_lines_are_dstacks_and_reported_apart(runs):
    """`evidence.ENGINE_LINES`: vLLM >= 0.8 (V1), SGLang >= 0.5, TensorRT-LLM >= 1.0, the lines the engine modules
    render for. Only dstack's early-2025 builds (SGLang 0.4.2/0.4.3, vLLM 0.7.3/0.7.4, TensorRT-LLM 0.17) are
    older; an unstated version counts as current. On the current lines, held out by source (the committed
    calibration fit and the family step fitted on other sources), TPOT 11.3% and tokens/s/GPU 10.5% are within
    issue 20's 15%, the mean TTFT (34.6%) is not: held where measured (2026-12-02)."""
    older = {r.source for r in runs if not ev.on_rendered_line(r)}
    assert older == {s for s in ev._sources() if s.startswith("dstack-")}
    assert ev.engine_release("dstack-r1-h200-trtllm") == (0, 17) and ev.engine_release("inferencex-1061-mi300x") == (0, 17)
    assert ev.on_rendered_line(next(r for r in runs if r.source == "inferencex-1061-mi300x"))
    current = [r for r in runs if ev.on_rendered_line(r)]
    by_source = ev.Bases(FITTED_PARAMS, {}).held_out(runs, ("source",))
    f = ev.figures([(r, ev.predict_run(r, by_source)) for r in current])
    # (2026-12-03, the AMD overhead per layer: 11.3% / 34.6% / 10.5% -> 8.3% / 36.4% / 10.1%)
    for k, was in {"tpot_ms": 0.083, "ttft_ms": 0.364, "tokens_per_s_per_gpu": 0.101}.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])


def test_the_decomposition_shows_the_amd_family_overhead_is_what_misses_held_out_by_model(runs, bases, capsys):
    """`evidence.py --decompose`: its first line is the current lines' figure held out by source and model, its last
    the figure held out by source only. Between them, holding the AMD family overhead out by source only takes TPOT
    and tokens/s/GPU within issue 20's 15% whatever the calibration parameters (the model's fold or the committed
    fit), and holding the calibration parameters out by source only does not: the leave-one-model-out misses come
    from the family overhead, which on CDNA4 has only two other models' throughput rows to be fitted on. Held where
    measured (2026-12-03, per-layer overhead: 9.0% / 10.3% and 8.3% / 10.1% by source; 16.0% / 22.3% and
    17.4% / 21.4% by source and model)."""
    current = [r for r in runs if ev.on_rendered_line(r)]
    got = dict(ev.decompose(runs, ev.Bases.load(FITTED_PARAMS)))
    both = ev.figures([(r, ev.predict_run(r, bases)) for r in current])
    by_source = ev.Bases(FITTED_PARAMS, {}).held_out(runs, ("source",))
    source = ev.figures([(r, ev.predict_run(r, by_source)) for r in current])
    for k in ev.METRICS:
        assert got["fold / family w/o source+model"][k]["mae"] == both[k]["mae"]
        assert got["committed / family w/o source"][k]["mae"] == source[k]["mae"]
    for label in ("fold / family w/o source", "committed / family w/o source"):
        for k, was in {"tpot_ms": 0.090, "tokens_per_s_per_gpu": 0.103}.items():
            assert got[label][k]["mae"] <= min(was + MARGIN, ev.TARGETS[k]), (label, k, got[label][k])
    for label in ("fold / family w/o source+model", "committed / family w/o source+model"):
        assert got[label]["tpot_ms"]["mae"] > ev.TARGETS["tpot_ms"], (label, got[label]["tpot_ms"])
        assert got[label]["tokens_per_s_per_gpu"]["mae"] > ev.TARGETS["tokens_per_s_per_gpu"]
    assert ev.main(["--decompose"]) == 0
    out = capsys.readouterr().out
    assert all(label in out for label in got)


def test_the_target_line_says_met_only_within_issue_20s_limits():
    f = {"tpot_ms": {"mae": 0.15}, "ttft_ms": {"mae": 0.301}, "tokens_per_s_per_gpu": {"mae": 0.2}}
    line = ev.target_line("x", f, {"n": 3, "mae": 0.29})
    assert "TPOT 15.0% met" in line and "TTFT mean 30.1% NOT met" in line
    assert "TTFT median (n=3) 29.0% met" in line and "tokens/s/GPU 20.0% NOT met" in line
    assert "median" not in ev.target_line("x", f, {"n": 0, "mae": float("nan")})


def test_a_row_that_fits_only_above_the_default_memory_fraction_is_priced_as_its_run_fit(runs, bases):
    """InferenceX ran DeepSeek-R1 FP8 on 4 B200 (TP4) with `--mem-fraction-static 0.95` (sources.yaml
    ixapp-b200-sgl-fp8-2603-tp4): at the default fraction 0.9 the weights alone do not fit, and the rows were
    priced as one sequence at a time (TPOT 6.0 ms at every concurrency, TTFT 95-197 s against 1.0-1.5 s
    measured). A measured run was served, so it fit: the evidence rows take the calibration's rule
    (`calibration.measured_run_fit`), and their TPOT is then within 10% of the measured 22.3 / 34.1 ms."""
    from meshplan.planner.memory import memory_fit
    from meshplan.planner.perf import engine_defaults

    rows = [r for r in runs if r.source == "ixapp-b200-sgl-fp8-2603-tp4"]
    assert len(rows) == 2
    for r in rows:
        at_default = memory_fit(ev.get_model(r.model), ev.get_gpu(r.gpu), r.mapping, weight_dtype=r.weight_dtype,
                                kv_dtype=r.kv_dtype, context_tokens=r.isl + r.osl, engine=r.engine)
        assert not at_default.fits and "exceed" in at_default.reason
        assert ev.run_memory(r).fits
        p = ev.predict_run(r, bases)
        assert abs(p["tpot_ms"] / r.measured["tpot_ms"] - 1.0) < 0.10, (r.concurrency, p, r.measured)
        assert p["ttft_ms"] < 10 * r.measured["ttft_ms"], (r.concurrency, p, r.measured)
    # where the default fraction fits, the rule changes nothing
    fits = next(r for r in runs if r.source == "inferencex-828-h100")
    gpu = ev.get_gpu(fits.gpu)
    assert ev.run_memory(fits) == memory_fit(ev.get_model(fits.model), gpu, fits.mapping,
                                             weight_dtype=fits.weight_dtype, kv_dtype=fits.kv_dtype,
                                             context_tokens=fits.isl + fits.osl, engine=fits.engine,
                                             chunk_size=engine_defaults(fits.engine, gpu)[0])
