"""spec.engine.extraArgs against the engine's real option names (exact match, no abbreviations).

Pure. Why exact: vLLM's FlexibleArgumentParser and SGLang's argparse.ArgumentParser keep
argparse's `allow_abbrev=True`, so `--tensor-parallel-siz=8` or SGLang `--tp-siz 8` would be read
as the plan-owned `--tensor-parallel-size` although no guard that compares names sees it. Every
flag token of extraArgs must therefore be one of the option strings of the engine's parser at the
pinned version (meshplan.catalog.engine_options, extracted from the engines' own source by
benchmarks/engine_options/extract_options.py), spelled in full, and then:

- options of a plan-owned action (any alias of a flag in api.models.PLAN_OWNED_FLAGS, e.g.
  TensorRT-LLM `--moe_expert_parallel_size` beside `--ep_size`) need spec.engine.allowPlanOverride;
- `--served-model-name` is the operator's (spec.model.servedName, immutable);
- options that carry a secret inline (vLLM/SGLang `--api-key`, vLLM `--hf-token`) are refused:
  the value would sit in the pod spec, readable by anyone who may read pods;
- a value that looks like a credential (`sk-...`, `hf_...`) is refused wherever it stands.
Bootstrap flags (addresses, ranks, ports) stay the renderer's business: engine_args drops them
with a warning.

Spelling rules the engines apply before matching (so the guard applies them too):
- vLLM turns `_` into `-` in `--` option names and reads `--name.key value` as a JSON field of
  `--name` (vllm/utils/argparse_utils.py, 0.12.0); `-O3`/`-O=3`/`-O 3` mean
  `--optimization-level 3` and `-O.x` means `-cc.x`.
- SGLang (argparse) and TensorRT-LLM (click) take option names as written.
- `--no-X` is accepted when `--X` is an option (argparse.BooleanOptionalAction); argparse refuses
  it for a non-boolean option.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from meshplan.catalog import engine_options as option_names
from meshplan.catalog import engine_options_deepspeed as deepspeed_options

ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "deepspeed": "DeepSpeed-MII",
                 "nim": "NVIDIA NIM"}
_TABLES = {"vllm": option_names.VLLM_OPTIONS, "sglang": option_names.SGLANG_OPTIONS,
           "trtllm": option_names.TRTLLM_OPTIONS, "deepspeed": deepspeed_options.DEEPSPEED_OPTIONS}
_VERSIONS = {**option_names.VERSIONS, "deepspeed": deepspeed_options.VERSION}
# Engines without a command line: NIM for LLMs is configured by environment variables only.
_NO_ARGS = {"nim": "NVIDIA NIM for LLMs is configured by environment variables, not a command line: set them in "
                   "spec.engine.env (e.g. NIM_MODEL_PROFILE)"}
# Engines whose parser turns `_` into `-` in long option names (see module doc).
_DASHES_FOR_UNDERSCORES = {"vllm"}

# Options whose value is a secret (vLLM 0.12.0 and 0.32.0 FrontendArgs.api_key and ModelConfig hf_token;
# SGLang 0.5.5 and 0.5.23 ServerArgs.api_key; DeepSpeed-MII 0.3.3 openai_api_server --api-keys; the tables of catalog.engine_options): never inline in extraArgs.
SECRET_OPTIONS = frozenset({"api-key", "hf-token", "api-keys"})
# Names the operator sets from spec.model.servedName (immutable) on every engine that has it.
OPERATOR_OWNED = frozenset({"served-model-name"})
# Credential formats: OpenAI keys (`sk-`, `sk-proj-`), Hugging Face user access tokens (`hf_`).
CREDENTIAL_VALUE_RE = re.compile(r"(^|[=:\s])(sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,})")


def _canon(name: str) -> str:
    """Dash-and-case-insensitive name without leading dashes, for comparing with PLAN_OWNED_FLAGS."""
    return name.lstrip("-").replace("_", "-").lower()


def _plan_owned() -> frozenset[str]:
    from meshplan.api.models import PLAN_OWNED_FLAGS   # lazy: models imports this module

    return frozenset(PLAN_OWNED_FLAGS)


def option_index(engine: str) -> dict[str, tuple[str, ...]]:
    """Every option string of `engine` -> its action's option strings (as the parser matches them)."""
    out: dict[str, tuple[str, ...]] = {}
    for group in _TABLES[engine]:
        for opt in group:
            key = opt.replace("_", "-") if engine in _DASHES_FOR_UNDERSCORES and opt.startswith("--") else opt
            out[key] = group
    return out


def owned_options(engine: str) -> set[str]:
    """Option strings of `engine` whose action the plan owns (any alias of a PLAN_OWNED_FLAGS name)."""
    owned = _plan_owned()
    return {opt for group in _TABLES[engine] if any(_canon(o) in owned for o in group) for opt in group}


def _lookup_key(engine: str, token: str) -> str:
    """The option name the engine's parser looks up for `token` (before abbreviation matching)."""
    key = token.split("=", 1)[0]
    if engine == "vllm":
        if key.startswith("-O") and not key.startswith("--"):
            return "-cc" if key.startswith("-O.") else "--optimization-level"
        key = key.split(".", 1)[0]
        if key.startswith("--"):
            key = "--" + key[2:].replace("_", "-")
    return key


def _is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def _flag_positions(args: Sequence[str]) -> Iterable[tuple[int, str]]:
    for i, a in enumerate(args):
        if a.startswith("-") and len(a) > 1 and not _is_number(a):
            yield i, a


def extra_args_problems(engine: str, args: Sequence[str], allow_plan_override: bool = False,
                        field: str = "spec.engine.extraArgs") -> list[str]:
    """Problems of `args` for `engine`, each naming the entry, why, and the fix (empty when sound)."""
    if engine in _NO_ARGS:
        return [f"{field}: {_NO_ARGS[engine]}"] if args else []
    if engine not in _TABLES:
        return []
    label = f"{ENGINE_LABELS[engine]} {_VERSIONS[engine]}"
    index = option_index(engine)
    owned = owned_options(engine)
    problems: list[str] = []
    for i, a in enumerate(args):
        if CREDENTIAL_VALUE_RE.search(a):
            problems.append(f"{field}[{i}] carries what looks like a credential (an sk-/hf_ token) inline: put it "
                            "in a Secret the cluster admin allows and reference it (spec.model.weights."
                            "credentialsSecretRef for the weights token)")
    for i, token in _flag_positions(args):
        key = _lookup_key(engine, token)
        group = index.get(key)
        if group is None and key.startswith("--no-"):
            group = index.get("--" + key[5:])
        shown = token.split("=", 1)[0]
        if group is None:
            if key == "--":
                problems.append(f"{field}[{i}] `--` ends the engine's options: the arguments after it would be "
                                "read as positionals (the model); remove it")
                continue
            expanded = sorted(o for o in index if o.startswith(key) and len(key) > 1) \
                if engine != "trtllm" else []
            if expanded:
                what = ("an abbreviation of " + ", ".join(expanded[:4]) + (" ..." if len(expanded) > 4 else "")
                        + " (the engine's argparse would accept it as the full option)")
            else:
                what = "not an option of its server command"
            problems.append(f"{field}[{i}] `{shown}` is {what} in {label}: write a real option name in full "
                            f"(`{ENGINE_LABELS[engine]} --help` lists them)")
            continue
        names = {_canon(o) for o in group}
        if names & OPERATOR_OWNED:
            problems.append(f"{field}[{i}] `{shown}` sets the served model name, which the operator sets from "
                            "spec.model.servedName (immutable once set): remove it from extraArgs")
        elif names & SECRET_OPTIONS:
            problems.append(f"{field}[{i}] `{shown}` takes a secret, which extraArgs would put inline in the pod "
                            "spec: remove it (the weights token comes from spec.model.weights.credentialsSecretRef)")
        elif key in owned and not allow_plan_override:
            problems.append(f"{field}[{i}] `{shown}` is a flag the plan owns ({' / '.join(group)}): pin it in "
                            "spec.parallelism/spec.precision, or set spec.engine.allowPlanOverride: true")
    return problems


def reserved_prefix_names(plan_owned: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, exceptions) for the CRD's up-front abbreviation rule, dash-normalised (`_` -> `-`).

    names: every option string, of any engine, of a plan-owned, operator-owned or secret action,
    plus the PLAN_OWNED_FLAGS spellings; exceptions: real options of some engine, and PLAN_OWNED_FLAGS
    spellings, that are a strict prefix of one of those names (the CRD's exact plan-owned rule and the
    operator's exact check judge them: `--tp` is refused there unless allowPlanOverride, and the
    operator refuses it for SGLang as an abbreviation of `--tp-size` even then).
    """
    owned = frozenset(plan_owned)
    names: set[str] = {f"--{n}" for n in owned}
    real: set[str] = set()
    for engine, table in _TABLES.items():
        for group in table:
            norm = {o.replace("_", "-") for o in group}
            real |= norm
            if any(_canon(o) in owned | OPERATOR_OWNED | SECRET_OPTIONS for o in group):
                names |= norm
    real |= {f"--{n}" for n in owned}     # PLAN_OWNED_FLAGS spellings: the exact plan-owned rule has them
    exceptions = {r for r in real if any(n != r and n.startswith(r) for n in names)}
    return tuple(sorted(names)), tuple(sorted(exceptions))


__all__ = ["CREDENTIAL_VALUE_RE", "ENGINE_LABELS", "OPERATOR_OWNED", "SECRET_OPTIONS", "extra_args_problems",
           "option_index", "owned_options", "reserved_prefix_names"]
