"""Runs INSIDE the deepspeed-mii-0.3.3 venv (stdlib + DeepSpeed-MII only): argv -> MII's own parser -> MIIConfig.

stdin: {"cases": [{"id", "argv", "gpus_per_pod", "config_json"}]}; argv is the container's args after
`python -m mii.entrypoints.openai_api_server`, config_json the model's real config.json text.
For each case, the way the server starts (mii/entrypoints/openai_api_server.py `__main__`, then
mii.serve -> mii.api._parse_kwargs_to_mii_config -> MIIServer): the module runs as `__main__` with
sys.argv set, its argparse parses the argv (an unknown option exits with argparse's message), the
`mii.serve(...)` call it makes is captured (nothing starts), the keyword arguments become MII's
pydantic MIIConfig/ModelConfig, and the replicas are placed on a host of the pod's GPUs exactly as
MIIServer does without a hostfile (`localhost slots=N`, MIIConfig.generate_replica_configs). The
model's config.json is read by transformers' AutoConfig (what MII's checkpoint engine reads) and its
model_type is checked against the model types DeepSpeed's FastGen engine factory implements
(deepspeed/inference/v2/engine_factory.py, read from the installed source).
stdout (last line): {"options": [...], "fastgen_model_types": [...], "results": [...]}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import sys
import tempfile

import mii
import mii.api
from transformers import AutoConfig

SERVER = "mii.entrypoints.openai_api_server"


class _Captured(Exception):
    pass


def _fake_serve(model_name_or_path="", **kwargs):
    raise _Captured((model_name_or_path, kwargs))


def _fastgen_model_types() -> list[str]:
    import deepspeed.inference.v2 as v2

    src = open(os.path.join(os.path.dirname(v2.__file__), "engine_factory.py")).read()
    return sorted(set(re.findall(r'model_config\.model_type == "([^"]+)"', src)))


def _parser_options() -> list[list[str]]:
    seen: list[list[str]] = []
    original = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        for a in self._actions:
            seen.append(list(a.option_strings))
        raise _Captured(None)

    argparse.ArgumentParser.parse_args = grab
    try:
        sys.argv = ["openai_api_server"]
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(SERVER, run_name="__main__")
    except _Captured:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    return seen


def run_case(case: dict, model_types: list[str]) -> dict:
    out: dict = {"id": case["id"], "ok": False}
    sys.argv = ["openai_api_server", *case["argv"]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(SERVER, run_name="__main__")
        out["error"] = "the server module returned without calling mii.serve"
        return out
    except SystemExit as exc:
        out["error"] = f"argparse exit {exc.code}: {err.getvalue().strip()[-800:]}"
        return out
    except _Captured as cap:
        model, kwargs = cap.args[0]
    out["serve_kwargs"] = kwargs
    try:
        cfg = mii.api._parse_kwargs_to_mii_config(model_name_or_path=model, **kwargs)
        with tempfile.NamedTemporaryFile("w", suffix=".hostfile", delete=False) as hf:
            hf.write(f"localhost slots={case['gpus_per_pod']}")   # what MIIServer writes without a hostfile
        cfg.hostfile = hf.name
        cfg.generate_replica_configs()
    except Exception as exc:   # pydantic ValidationError, AssertionError, ValueError: MII's own message
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    mc = cfg.model_conf
    iec = mc.inference_engine_config
    out.update(
        model=mc.model_name_or_path,
        tp_size=iec.tensor_parallel.tp_size,
        replica_num=mc.replica_num,
        max_length=mc.max_length,
        replica_gpus=[list(r.gpu_indices) for r in mc.replica_configs],
        max_context=iec.state_manager.max_context,
        max_ragged_batch_size=iec.state_manager.max_ragged_batch_size,
        max_ragged_sequence_count=iec.state_manager.max_ragged_sequence_count,
    )
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(case["config_json"])
        hf_cfg = AutoConfig.from_pretrained(d)
    out["model_type"] = hf_cfg.model_type
    problems = []
    if hf_cfg.model_type not in model_types:
        problems.append(f"FastGen implements no {hf_cfg.model_type!r} model (engine_factory: {model_types})")
    heads = hf_cfg.num_attention_heads
    if heads % out["tp_size"]:
        problems.append(f"{heads} attention heads do not split over tensor_parallel {out['tp_size']}")
    if out["max_length"] and out["max_length"] > out["max_context"]:
        problems.append(f"max_length {out['max_length']} exceeds the engine's max_context {out['max_context']}")
    if out["max_length"] and out["max_length"] > hf_cfg.max_position_embeddings:
        problems.append(f"max_length {out['max_length']} exceeds max_position_embeddings "
                        f"{hf_cfg.max_position_embeddings}")
    if problems:
        out["error"] = "; ".join(problems)
        return out
    out["ok"] = True
    return out


def main() -> None:
    payload = json.load(sys.stdin)
    options = _parser_options()
    model_types = _fastgen_model_types()
    mii.serve = _fake_serve
    results = [run_case(c, model_types) for c in payload["cases"]]
    print(json.dumps({"options": options, "fastgen_model_types": model_types, "results": results,
                      "mii_version": getattr(mii, "__version__", "")}))


if __name__ == "__main__":
    main()
