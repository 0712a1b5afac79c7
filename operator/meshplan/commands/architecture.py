"""`meshplan architecture CONFIG.json`: a Hugging Face config.json as `spec.model.architecture`.

Prints the `spec.model` block (name and architecture, with the checkpoint's
weight dtype per component read from `quantization_config`, or from a ModelOpt
`hf_quant_config.json` beside the file) to paste into an LLMDeployment, and the
numbers the planner derives from it (parameters, KV bytes per token).
"""

from __future__ import annotations

import argparse
import sys

import yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("architecture", help="turn a Hugging Face config.json into spec.model.architecture",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="path of the model's config.json")
    p.add_argument("--name", default=None,
                   help="spec.model.name to print (default: the Hugging Face id from an <org>--<name>_config.json "
                        "file name, else the directory name)")
    p.set_defaults(func=run)


def _default_name(path: str) -> str:
    from pathlib import Path

    p = Path(path)
    if p.name.endswith("_config.json") and "--" in p.name:
        return p.name[: -len("_config.json")].replace("--", "/", 1)
    return p.resolve().parent.name or "model"


def run(args: argparse.Namespace) -> int:
    from meshplan.catalog.models import architecture_manifest, load_hf_config
    from meshplan.planner.memory import KV_BYTES

    name = args.name or _default_name(args.config)
    try:
        m = load_hf_config(args.config, name=name)
    except (OSError, ValueError, KeyError) as exc:
        print(f"meshplan architecture: {args.config}: {exc}", file=sys.stderr)
        return 1
    print(yaml.safe_dump({"spec": {"model": {"name": name, "architecture": architecture_manifest(m)}}},
                         sort_keys=False), end="")
    full = m.full_attention_layers
    kv = m.kv_elements_per_token() - (2 * m.sliding_window_layers * m.num_kv_heads * m.head_dim
                                      if m.sliding_window_layers and not m.is_mla else 0)
    print(f"# {m.total_params / 1e9:,.1f}B parameters ({m.active_params / 1e9:,.1f}B active per token); "
          f"{full} of {m.num_layers} layers hold KV per token: {kv * KV_BYTES['bf16']:,.0f} bytes/token in bf16")
    return 0
