"""Pipeline stages against data-parallel replicas at the same per-GPU load (the EP16PP4 seed claim).

    python benchmarks/pp_vs_dp.py                   # our model only (no extra dependency)
    python benchmarks/pp_vs_dp.py --aiconfigurator  # also NVIDIA's AIConfigurator, if installed

The seeds (NVIDIA's "Demystifying AI Inference Deployments for Trillion
Parameter LLMs", 2024) claim that GPT-MoE-1.8T as EP16PP4 on 64 GPUs gives
about 2x the tokens/s/user of EP16DP4 at about 10% less tokens/s/GPU. Issue 4
asks for >= 1.5x at <= 20% less; `tests/test_seed_claims.py` restates it as what
holds (PP buys no interactivity at equal per-GPU load). This command prints the evidence:

1. Our model, GPT-MoE-1.8T with FP4 weights and FP8 KV, `trtllm` semantics:
   EP16 x PP1 replicas (4 of them on 64 GPUs) against one EP16 x PP4 replica,
   on the blog's 192 GB GPU, with the PP replica holding pp times the
   sequences (pp microbatches of the DP replica's batch). Same per-GPU batch,
   so the same per-GPU load.
2. With `--aiconfigurator`: NVIDIA's own calibrated model, AIConfigurator
   (`pip install aiconfigurator==0.12.0`, about 850 MB; not a meshplan
   dependency), run through its CLI `aiconfigurator cli estimate
   --estimate-mode static_gen --database-mode HYBRID` on a config.json written
   from our catalogue entry (Mixtral-format fields). Its shipped databases have
   no cross-node EP16 all-to-all data for gb200 in 0.12.0, so the AIC rows use
   b200_sxm with EP8 (attention DP 8) and PP1 against PP4: the same question
   one size down. `--batch-size` there is per attention-DP rank; AIC scales a
   PP replica's throughput by pp (its `run_static`), i.e. pp microbatches.

Prints one row per batch and the largest relative difference between PP and DP
in tokens/s/user and tokens/s/GPU. Asserts nothing; exit 1 only when
`--aiconfigurator` was asked for and could not run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def ours(batches: list[int]) -> list[tuple]:
    from meshplan.catalog.gpus import BLOG_GPU
    from meshplan.catalog.models import get_model
    from meshplan.planner.perf import predict
    from meshplan.planner.types import Layout, Workload

    model = get_model("gpt-moe-1.8t")
    wl = Workload(isl=1024, osl=256)
    rows = []
    for per_gpu in batches:
        out = []
        for pp in (1, 4):
            # a replica of 16 x pp GPUs holding per_gpu sequences per GPU
            p = predict(model, BLOG_GPU, Layout(tp=1, ep=16, pp=pp), wl, weight_dtype="fp4", kv_dtype="fp8",
                        engine="trtllm", concurrency=per_gpu * 16 * pp)
            out.append((p.tokens_per_s_per_user, p.tokens_per_s_per_gpu, " ".join(p.notes)))
        rows.append((per_gpu, *out))
    return rows


def aic_config() -> dict:
    """GPT-MoE-1.8T from our catalogue as a Mixtral-style Hugging Face config.json."""
    from meshplan.catalog.models import get_model

    m = get_model("gpt-moe-1.8t")
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.head_dim, "intermediate_size": m.moe_intermediate_size,
        "num_local_experts": m.num_experts, "num_experts_per_tok": m.experts_per_token,
        "vocab_size": m.vocab_size, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
        "rope_theta": 1e6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


_FIELDS = {"gpu": r"tokens/s/gpu:\s+([\d.,]+)",
           "user": r"tokens/s/user:\s+([\d.,]+)", "mem": r"Memory \(GPU\):\s+([\d.,]+)"}


def aic(exe: str, cfg_dir: Path, batch: int, pp: int) -> dict:
    cmd = [exe, "cli", "estimate", "--model-path", str(cfg_dir), "--system", "b200_sxm", "--backend", "trtllm",
           "--estimate-mode", "static_gen", "--database-mode", "HYBRID", "--isl", "1024", "--osl", "256",
           "--batch-size", str(batch), "--tp-size", "1", "--pp-size", str(pp), "--attention-dp-size", "8",
           "--moe-tp-size", "1", "--moe-ep-size", "8", "--gemm-quant-mode", "nvfp4",
           "--moe-quant-mode", "nvfp4", "--kvcache-quant-mode", "fp8"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = res.stdout + res.stderr
    got = {}
    for key, pat in _FIELDS.items():
        mt = re.search(pat, text)
        if mt:
            got[key] = float(mt.group(1).replace(",", ""))
    if "user" not in got or "gpu" not in got:
        tail = "\n".join(line for line in text.splitlines() if "Error" in line)[-400:]
        raise RuntimeError(f"aiconfigurator gave no estimate for pp={pp} batch={batch}: {tail or text[-400:]}")
    return got


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiconfigurator", action="store_true", help="also run NVIDIA AIConfigurator's CLI")
    ap.add_argument("--aic-batches", default="1,4,16,32,64", help="AIC batch sizes per attention-DP rank")
    args = ap.parse_args()

    print("Our model: GPT-MoE-1.8T, FP4/FP8, trtllm, blog 192 GB GPU, ISL 1024 / OSL 256")
    print(f"{'seqs/GPU':>8} | {'EP16DP4 tok/s/user':>18} {'tok/s/GPU':>10} | {'EP16PP4 tok/s/user':>18} "
          f"{'tok/s/GPU':>10} | {'PP/DP user':>10} {'PP/DP GPU':>9}")
    worst_user = worst_gpu = 0.0
    for per_gpu, (du, dg, dn), (pu, pg, pn) in ours([1, 2, 4, 8, 16, 24, 32, 48]):
        note = f"  (DP: {dn})" if dn else ""
        note += f"  (PP: {pn})" if pn else ""
        print(f"{per_gpu:>8} | {du:>18.2f} {dg:>10.1f} | {pu:>18.2f} {pg:>10.1f} | {pu / du:>10.3f} {pg / dg:>9.3f}{note}")
        if not dn and not pn:   # rows where neither replica is capped by KV cache or batch slots
            worst_user = max(worst_user, rel(pu, du))
            worst_gpu = max(worst_gpu, rel(pg, dg))
    print(f"largest PP-vs-DP difference where neither is capped: tokens/s/user {worst_user:.1%}, "
          f"tokens/s/GPU {worst_gpu:.1%}")

    if not args.aiconfigurator:
        return 0
    exe = shutil.which("aiconfigurator")
    if exe is None:
        print("aiconfigurator is not installed: pip install aiconfigurator==0.12.0", file=sys.stderr)
        return 1
    print()
    print("NVIDIA AIConfigurator (HYBRID database, b200_sxm, trtllm): EP8 x attention-DP 8, PP1 against PP4")
    print(f"{'batch/rank':>10} | {'PP1 tok/s/user':>14} {'tok/s/GPU':>10} {'mem GB':>7} | "
          f"{'PP4 tok/s/user':>14} {'tok/s/GPU':>10} {'mem GB':>7}")
    worst_user = worst_gpu = 0.0
    with tempfile.TemporaryDirectory(prefix="meshplan-aic-") as tmp:
        cfg_dir = Path(tmp)
        (cfg_dir / "config.json").write_text(json.dumps(aic_config(), indent=1))
        for batch in [int(b) for b in args.aic_batches.split(",")]:
            try:
                d, p = aic(exe, cfg_dir, batch, 1), aic(exe, cfg_dir, batch, 4)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"{batch:>10} | {exc}")
                return 1
            print(f"{batch:>10} | {d['user']:>14.2f} {d['gpu']:>10.2f} {d.get('mem', 0):>7.1f} | "
                  f"{p['user']:>14.2f} {p['gpu']:>10.2f} {p.get('mem', 0):>7.1f}")
            worst_user = max(worst_user, rel(p["user"], d["user"]))
            worst_gpu = max(worst_gpu, rel(p["gpu"], d["gpu"]))
    print(f"largest PP-vs-DP difference in AIConfigurator: tokens/s/user {worst_user:.1%}, "
          f"tokens/s/GPU {worst_gpu:.1%} (only the memory per GPU differs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
