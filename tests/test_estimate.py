"""`meshplan estimate` end to end on a small scenarios CSV written here."""

from __future__ import annotations

import csv
import json

from meshplan.cli import main

HEADER = ["id", "model_path", "system", "backend", "precision", "mode", "isl", "osl", "gemm_quant_mode",
          "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
          "moe_ep_size", "prefill_batch_size", "prefill_num_workers", "prefill_tp_size", "prefill_pp_size",
          "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_batch_size",
          "decode_num_workers", "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
          "decode_moe_tp_size", "decode_moe_ep_size"]

# A Llama-3.1-8B-shaped config.json (huggingface.co/meta-llama/Llama-3.1-8B).
LLAMA8B_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                  "vocab_size": 128256, "tie_word_embeddings": False}


def _row(**kw):
    base = {k: "" for k in HEADER}
    base.update({"model_path": "acme/tiny-llama", "backend": "vllm", "mode": "agg", "isl": "1024",
                 "osl": "256", "batch_size": "8", "tp_size": "1", "pp_size": "1", "attention_dp_size": "1",
                 "moe_tp_size": "1", "moe_ep_size": "1"})
    base.update({k: str(v) for k, v in kw.items()})
    return base


def _run(tmp_path, rows):
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    (cfg_dir / "acme--tiny-llama_config.json").write_text(json.dumps(LLAMA8B_CONFIG))
    src = tmp_path / "scenarios.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "pred.csv"
    rc = main(["estimate", "--scenarios", str(src), "--model-configs", str(cfg_dir), "--output", str(out)])
    assert rc == 0
    with out.open() as f:
        return list(csv.DictReader(f))


def test_estimate_predicts_rows_and_explains_the_rest(tmp_path):
    rows = [
        _row(id="h100-bf16-c8", system="h100_sxm"),
        _row(id="plain-name-c64", system="h100", batch_size="64"),
        _row(id="b200-fp8-tp2", system="b200_sxm", backend="trtllm", precision="fp8",
             gemm_quant_mode="fp8", moe_quant_mode="fp8", tp_size="2", moe_tp_size="2"),
        _row(id="disagg", system="gb200", backend="trtllm", mode="disagg", batch_size="",
             tp_size="", pp_size="", attention_dp_size="", moe_tp_size="", moe_ep_size="",
             prefill_batch_size="1", prefill_num_workers="1", prefill_tp_size="1", prefill_pp_size="1",
             prefill_attention_dp_size="1", prefill_moe_tp_size="1", prefill_moe_ep_size="1",
             decode_batch_size="16", decode_num_workers="2", decode_tp_size="2", decode_pp_size="1",
             decode_attention_dp_size="1", decode_moe_tp_size="2", decode_moe_ep_size="1"),
        _row(id="bad-gpu", system="tpu_v5"),
        _row(id="bad-model", model_path="acme/missing", system="h100_sxm"),
    ]
    out = _run(tmp_path, rows)
    assert [r["id"] for r in out] == [r["id"] for r in rows]
    by_id = {r["id"]: r for r in out}
    for rid in ("h100-bf16-c8", "plain-name-c64", "b200-fp8-tp2", "disagg"):
        r = by_id[rid]
        assert r["error"] == "", r
        assert float(r["pred_ttft_ms"]) > 0 and float(r["pred_tpot_ms"]) > 0
    # more concurrency on the same GPU: slower tokens
    assert float(by_id["plain-name-c64"]["pred_tpot_ms"]) > float(by_id["h100-bf16-c8"]["pred_tpot_ms"])
    assert "unknown GPU" in by_id["bad-gpu"]["error"]
    assert by_id["bad-gpu"]["pred_tpot_ms"] == ""
    assert "acme--missing_config.json" in by_id["bad-model"]["error"]


def test_estimate_reports_a_missing_scenarios_file(tmp_path, capsys):
    rc = main(["estimate", "--scenarios", str(tmp_path / "nope.csv"), "--output", str(tmp_path / "o.csv")])
    assert rc == 2
    assert "--scenarios" in capsys.readouterr().err


def test_estimate_reads_aiconfigurator_quant_mode_names(tmp_path):
    """AIConfigurator's quant names (e.g. Kimi-K2.5's int4_wo rows in its silicon sample) are
    predicted with the weight bytes they stand for; an unknown name still says why."""
    quant = {"int4-wo": ("int4", "int4_wo"), "int8-sq": ("int8", "sq"), "fp8-static": ("fp8", "fp8_static"),
             "bf16-long": ("bf16", "bfloat16"), "fp8": ("fp8", "fp8")}
    rows = [_row(id=rid, system="h100_sxm", precision=p, gemm_quant_mode=q, moe_quant_mode=q)
            for rid, (p, q) in quant.items()]
    rows.append(_row(id="bogus", system="h100_sxm", gemm_quant_mode="int3_magic"))
    by_id = {r["id"]: r for r in _run(tmp_path, rows)}
    for rid in quant:
        assert by_id[rid]["error"] == "", by_id[rid]
    tpot = {rid: float(by_id[rid]["pred_tpot_ms"]) for rid in quant}
    # fewer weight bytes per token read: 4-bit < 8-bit (int8, fp8) < 16-bit, at this small batch
    assert tpot["int4-wo"] < tpot["int8-sq"] < tpot["bf16-long"]
    assert tpot["fp8-static"] == tpot["fp8"]
    assert "int3_magic" in by_id["bogus"]["error"]


def test_a_recorded_layout_no_engine_can_run_is_read_as_attention_dp_and_expert_parallel():
    """AIConfigurator's sample records DeepSeek-R1 on GB200 as "tp36": 36 does not divide the 128
    attention heads nor the 2,048-wide expert FFN, so the run used DP attention and EP over 36 GPUs."""
    from meshplan.catalog.models import get_model
    from meshplan.planner.calibration import realizable
    from meshplan.planner.memory import ReplicaMapping

    ds = get_model("deepseek-v3")
    odd = realizable(ReplicaMapping(attn_tp=36, attn_dp=1, moe_tp=36, moe_ep=1, pp=1), ds)
    assert (odd.attn_tp, odd.attn_dp, odd.moe_tp, odd.moe_ep, odd.pp) == (1, 36, 1, 36, 1)
    assert odd.gpus == 36
    runnable = ReplicaMapping(attn_tp=8, attn_dp=1, moe_tp=1, moe_ep=8, pp=2)
    assert realizable(runnable, ds) is runnable


def test_with_attention_dp_batch_size_counts_one_ranks_requests():
    """AIConfigurator's agg rows give batch_size per attention-DP rank (its run_agg:
    global_bs = bs * attention_dp_size); the replica serves batch_size x attention_dp_size."""
    from meshplan.planner.calibration import scenario_from_row
    from meshplan.planner.perf import predict
    from meshplan.planner.types import Workload

    base = dict(model_path="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="trtllm", gemm_quant_mode="fp8",
                moe_quant_mode="fp8", tp_size="1", moe_tp_size="1", moe_ep_size="8")
    adp = scenario_from_row(_row(id="adp", batch_size="16", attention_dp_size="8", **base), None)
    tp = scenario_from_row(_row(id="tp", batch_size="16", **{**base, "tp_size": "8"}), None)
    assert adp.concurrency == 128 and tp.concurrency == 16
    assert adp.mapping.attn_dp == 8 and tp.mapping.attn_dp == 1
    # 16 requests on each of 8 ranks cost more per step than 16 requests in all
    wl = Workload(isl=1024, osl=256)
    slow = predict(adp.model, adp.gpu, adp.mapping, wl, weight_dtype="fp8", kv_dtype="fp8", engine="trtllm",
                   concurrency=adp.concurrency)
    fast = predict(adp.model, adp.gpu, adp.mapping, wl, weight_dtype="fp8", kv_dtype="fp8", engine="trtllm",
                   concurrency=16)
    assert slow.tpot_ms > fast.tpot_ms
