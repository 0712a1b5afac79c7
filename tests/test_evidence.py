"""The second evidence base (benchmarks/evidence.py, issue 20): its held-out figures, its folds, its variants.

The figures are the planner's median absolute errors on public runs outside AIConfigurator's data
(204 non-speculative runs from 21 sources on 2026-12-01; the first build's 43 runs from 6 sources),
none of which the committed parameters were fitted on. They are not at issue 20's targets (TPOT
<= 15%, TTFT <= 30%; docs/evidence.md says where the misses are): these tests hold them where they
are measured now, so a change to the model that makes them worse fails here. The first build's
sources keep their own figures (FIRST_BUILD): adding sources changes the whole base's medians, not
what the model does on the rows it was already checked on.
"""

from __future__ import annotations

import pytest

from benchmarks import evidence as ev
from meshplan.planner.calibration import FITTED_PARAMS

# measured with the committed parameters on 2026-12-01 (`python benchmarks/evidence.py`); a regression
# of more than MARGIN (absolute, in error units) fails
MARGIN = 0.02
# the first build's six sources (43 runs): the figures the targets below were set on
FIRST_BUILD = {"trtllm-perf-overview", "inferencex-870-h200", "inferencex-870-b200", "inferencex-1061-mi300x",
               "tenstorrent-356-h100", "musgrave-a100"}
MEASURED_FIRST = {"tpot_ms": 0.334, "ttft_ms": 0.377, "tokens_per_s_per_gpu": 0.128}
MEASURED_FIRST_NO_SUSPECT = {"tpot_ms": 0.093, "ttft_ms": 0.377, "tokens_per_s_per_gpu": 0.128}
SPEARMAN_FIRST = {"tpot_ms": 0.70, "ttft_ms": 0.83, "tokens_per_s_per_gpu": 0.97}
# every source (second build: + InferenceX #870 concurrency 4 and #828, the NIM benchmarking page, dstack's
# DeepSeek-R1 raw results, InferenceX-app's API fixture): 204 runs, 21 sources
MEASURED = {"tpot_ms": 0.305, "ttft_ms": 0.575, "tokens_per_s_per_gpu": 0.364}
MEASURED_NO_SUSPECT = {"tpot_ms": 0.299, "ttft_ms": 0.575, "tokens_per_s_per_gpu": 0.365}
SPEARMAN = {"tpot_ms": 0.83, "ttft_ms": 0.79, "tokens_per_s_per_gpu": 0.92}


@pytest.fixture(scope="module")
def runs():
    return [r for r in ev.load() if not r.spec]


@pytest.fixture(scope="module")
def pairs(runs):
    return [(r, ev.predict_run(r, FITTED_PARAMS)) for r in runs]


def test_evidence_base_is_what_the_docs_describe(runs):
    assert len(runs) >= 204
    assert len({r.source for r in runs}) >= 21
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
    # tokens/s/GPU is at its target (<= 15%) on the first build's sources and must stay there
    assert f["tokens_per_s_per_gpu"]["mae"] <= 0.15


def test_held_out_figures_without_the_suspect_sources_do_not_regress(pairs):
    suspect = ev.suspect_sources()
    assert "tenstorrent-356-h100" in suspect and "TP16 assumed" in suspect["tenstorrent-356-h100"]
    f = ev.figures([(r, p) for r, p in pairs if r.source not in suspect])
    for k, was in MEASURED_NO_SUSPECT.items():
        assert f[k]["mae"] <= was + MARGIN, (k, f[k])
    first = ev.figures([(r, p) for r, p in pairs if r.source in FIRST_BUILD and r.source not in suspect])
    for k, was in MEASURED_FIRST_NO_SUSPECT.items():
        assert first[k]["mae"] <= was + MARGIN, (k, first[k])
    assert first["tpot_ms"]["mae"] <= 0.15      # at the TPOT target on the first build without its suspect source


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
            assert steady["ttft_ms"] < got["ttft_ms"] < wave["ttft_ms"]
            assert got["ttft_ms"] == pytest.approx(wave["ttft_ms"] / 10 + steady["ttft_ms"] * 0.9)
            assert got["tpot_ms"] == wave["tpot_ms"]


def test_amd_efficiency_slows_amd_rows_only(runs):
    """`amd_eff` at 1 is the committed model; below 1 it slows every AMD row and leaves NVIDIA rows as they are."""
    from meshplan.catalog.gpus import get_gpu

    amd = [r for r in runs if get_gpu(r.gpu).vendor == "amd"]
    nvidia = [r for r in runs if get_gpu(r.gpu).vendor == "nvidia"]
    assert amd and nvidia
    for r in amd[::4] + nvidia[::8]:
        base = ev.predict_run(r, FITTED_PARAMS)
        assert ev.predict_variant("amd_eff", r, FITTED_PARAMS, {"amd": 1.0}) == base
        slow = ev.predict_variant("amd_eff", r, FITTED_PARAMS, {"amd": 0.5})
        if r in amd:
            assert slow["tpot_ms"] > base["tpot_ms"] and slow["tokens_per_s_per_gpu"] < base["tokens_per_s_per_gpu"]
        else:
            assert slow == base
