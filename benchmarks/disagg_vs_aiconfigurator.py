"""meshplan's prefill/decode disaggregated choice next to NVIDIA AIConfigurator's, on the same inputs (issue 19).

    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0     # throwaway, NOT a dependency
    PYTHONPATH=operator python benchmarks/disagg_vs_aiconfigurator.py --aiconfigurator /tmp/aic/bin/aiconfigurator

For three models (DeepSeek-R1, Qwen3-235B-A22B, Llama-3.1-70B) on 64 H200 SXM GPUs with TensorRT-LLM, ISL 8192 /
OSL 1024, SLO TTFT <= 5 s and ITL (TPOT) <= 20 ms, objective maxThroughput (AIConfigurator ranks by tokens/s/GPU):

- AIConfigurator: `aiconfigurator cli default --model-path <HF id> --total-gpus 64 --system h200_sxm --backend
  trtllm --isl 8192 --osl 1024 --ttft 5000 --tpot 20`; its "Best Experiment Chosen" line (agg or disagg, and how
  much better) and the rank-1 rows of its "agg Top Configurations" and "disagg Top Configurations" tables
  (tokens/s/gpu, tokens/s/user, TTFT, the prefill/decode workers and parallel mappings) are parsed.
- meshplan: `planner.disagg.plan_disagg(mode="auto")` with the same model (catalogue config.json), GPU, budget,
  workload, SLO and engine; the aggregated choice, the best disaggregated one and the predicted gain.

Without `--aiconfigurator` (or when it fails) meshplan's side is printed and AIConfigurator's columns say why.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

# (meshplan catalogue name, Hugging Face id AIConfigurator 0.12.0 ships a config for: aiconfigurator_core/model_configs)
MODELS = (("deepseek-r1", "deepseek-ai/DeepSeek-R1"),
          ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B"),
          ("llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B"))
GPUS, SYSTEM, GPU = 64, "h200_sxm", "h200"
ISL, OSL, TTFT_MS, TPOT_MS = 8192, 1024, 5000, 20


def run_aiconfigurator(exe: str, hf_id: str, timeout: int = 900) -> tuple[dict | None, str]:
    cmd = [exe, "cli", "default", "--model-path", hf_id, "--total-gpus", str(GPUS), "--system", SYSTEM,
           "--backend", "trtllm", "--isl", str(ISL), "--osl", str(OSL), "--ttft", str(TTFT_MS),
           "--tpot", str(TPOT_MS), "--no-color"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(cmd)}: {exc}"
    out = r.stdout + r.stderr
    parsed = parse(out)
    if r.returncode != 0 or parsed is None:
        tail = " | ".join(line.strip() for line in out.strip().splitlines()[-3:])
        return None, f"{' '.join(cmd)} exited {r.returncode}: {tail}"
    return parsed, ""


def _table_row1(text: str, title: str) -> dict | None:
    """The rank-1 row of one of AIConfigurator's "<mode> Top Configurations" tables, keyed by its header."""
    i = text.find(title)
    if i < 0:
        return None
    rows = [ln for ln in text[i:].splitlines()[1:12] if ln.startswith("|")]
    if len(rows) < 2:
        return None
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    vals = [c.strip() for c in rows[1].strip("|").split("|")]
    return dict(zip(head, vals))


def parse(text: str) -> dict | None:
    m = re.search(r"Best Experiment Chosen: (\w+) at ([\d,.]+) tokens/s/gpu \((\w+) ([\d.]+)x better than (\w+)\)",
                  text)
    if not m:
        return None
    return {"best": m.group(1), "best_tps_gpu": float(m.group(2).replace(",", "")),
            "factor": float(m.group(4)), "agg": _table_row1(text, "agg Top Configurations"),
            "disagg": _table_row1(text, "disagg Top Configurations")}


def aic_disagg_label(row: dict | None) -> str:
    if not row:
        return "-"
    return (f"P{row.get('(p)workers')}×{row.get('(p)parallel')} + D{row.get('(d)workers')}×{row.get('(d)parallel')}"
            f" x{row.get('replicas')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiconfigurator", help="the `aiconfigurator` executable of a throwaway venv")
    args = ap.parse_args()

    from meshplan.catalog.models import get_model
    from meshplan.planner.disagg import plan_disagg
    from meshplan.planner.types import SLO, Workload

    print(f"{GPUS} x {GPU}, TensorRT-LLM, ISL {ISL} / OSL {OSL}, SLO TTFT <= {TTFT_MS} ms, ITL <= {TPOT_MS} ms, "
          f"objective maxThroughput (tokens/s/GPU)")
    head = (f"{'model':<16} {'tool':<15} {'chosen':<7} {'aggregated best':<34} {'disaggregated best':<48} "
            f"{'disagg/agg tokens/s/GPU':>23}")
    print(head)
    for name, hf_id in MODELS:
        t = time.perf_counter()
        d = plan_disagg(get_model(name), GPU, mode="auto", max_gpus=GPUS, workload=Workload(isl=ISL, osl=OSL),
                        slo=SLO(ttft_ms=TTFT_MS, itl_ms=TPOT_MS), objective="maxThroughput", engine="trtllm")
        dt = time.perf_counter() - t
        a, c = d.aggregated.choice, d.choice
        a_txt = (f"{a.layout.label()}" + (f" x DP{a.layout.dp}" if a.layout.dp > 1 else "")
                 + f" {a.prediction.tokens_per_s_per_gpu:,.1f} t/s/GPU") if a else "none meets the SLO"
        c_txt = (f"{c.label()} {c.prediction.tokens_per_s_per_gpu:,.1f} t/s/GPU" if c else "none meets the SLO")
        gain = (f"{c.prediction.tokens_per_s_per_gpu / a.prediction.tokens_per_s_per_gpu:.2f}x" if a and c else "-")
        print(f"{name:<16} {'meshplan':<15} {'disagg' if d.disaggregated else 'agg':<7} {a_txt:<34} {c_txt:<48} "
              f"{gain:>23}   ({dt:.1f} s; KV over {c.kv_path.tier if c else '-'})")
        if not args.aiconfigurator:
            print(f"{'':<16} {'AIConfigurator':<15} not run: pass --aiconfigurator PATH")
            continue
        t = time.perf_counter()
        r, why = run_aiconfigurator(args.aiconfigurator, hf_id)
        dt = time.perf_counter() - t
        if r is None:
            print(f"{'':<16} {'AIConfigurator':<15} failed: {why}")
            continue
        ag, dg = r["agg"] or {}, r["disagg"] or {}
        a_txt = f"{ag.get('parallel', '-')} x{ag.get('replicas', '-')} {ag.get('tokens/s/gpu', '-')} t/s/GPU"
        c_txt = f"{aic_disagg_label(dg)} {dg.get('tokens/s/gpu', '-')} t/s/GPU"
        try:
            gain = f"{float(dg['tokens/s/gpu']) / float(ag['tokens/s/gpu']):.2f}x"
        except (KeyError, ValueError, ZeroDivisionError):
            gain = "-"
        print(f"{'':<16} {'AIConfigurator':<15} {r['best']:<7} {a_txt:<34} {c_txt:<48} {gain:>23}   ({dt:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
