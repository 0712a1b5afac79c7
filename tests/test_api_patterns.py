"""The API server and the Python models accept and refuse the same strings (issue 17, finding 10).

Three regex engines read meshplan's patterns: pydantic-core's Rust `regex` (the models' `pattern`),
Go's RE2 (the API server: the CRD's `pattern` and CEL `matches()`), and Python's `re` (the rules'
lambdas, through `models.rx`). A vertical tab passed `kubectl apply` (RE2's `\\s` is ASCII) and failed
the operator (Rust's `\\s` is Unicode White_Space); Python's `$` matched before a trailing newline.

This test runs the real RE2: Go's `regexp` package (the one the API server links), through a small Go
program compiled here (`go` is part of the e2e toolchain, e2e/build-control-plane.sh). Every pattern
of the generated CRD is compared with the pattern pydantic checks, on strings that are valid but for
one tricky character (\\v \\f \\r \\n \\t, a trailing newline, NBSP, U+2003, U+0085, U+2028, U+3000...).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Annotated

import pytest
from pydantic import Field, TypeAdapter, ValidationError

from meshplan.api import models
from meshplan.api.crd import SchemaError, build_crd, go_pattern
from meshplan.api.models import (
    DNS_LABEL_RE,
    LLMDeployment,
    PLAN_OWNED_FLAG_RE,
    SECRET_ENV_RE,
    URI_TOKEN_QUERY_RE,
    URI_USERINFO_RE,
    rx,
)

GO_PROGRAM = r"""
package main

import (
	"encoding/json"
	"os"
	"regexp"
)

type job struct {
	P string   `json:"p"`
	S []string `json:"s"`
}

func main() {
	var jobs []job
	if err := json.NewDecoder(os.Stdin).Decode(&jobs); err != nil {
		panic(err)
	}
	out := make([][]bool, len(jobs))
	for i, j := range jobs {
		re := regexp.MustCompile(j.P)
		for _, s := range j.S {
			out[i] = append(out[i], re.MatchString(s))
		}
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
"""

TRICKY = ["\v", "\f", "\r", "\n", "\t", " ", "\x85", "\xa0", "\u1680", "\u2003", "\u200a", "\u2028", "\u202f",
          "\u3000", "\x00", "\x1f", "\u200b", "\ufeff"]
BASES = ["abc", "a-b.c", "hf://org/model", "s3://bucket/path", "http://prometheus:9090", "MY_VAR", "HF_TOKEN",
         "vllm:num_requests_waiting", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.product", "Ready", "PlanChosen",
         "--tensor-parallel-size=8", "--max-model-len=16384", "registry.example/vllm:v0.9.1", "^mlx5_0,mlx5_1",
         "eth0", "token"]


def _variants(base: str) -> list[str]:
    mid = len(base) // 2
    out = [base]
    for t in TRICKY:
        out += [base + t, t + base, base[:mid] + t + base[mid:]]
    return out


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert os.path.exists(go), "Go is needed to run RE2 (install it as e2e/build-control-plane.sh does)"
    return go


def _run_go(jobs: list[dict], tmp_path) -> list[list[bool]]:
    src = tmp_path / "re2.go"
    src.write_text(GO_PROGRAM)
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": ""}
    r = subprocess.run([_go(), "run", str(src)], input=json.dumps(jobs), capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _model_patterns() -> set[str]:
    """Every `pattern` pydantic checks (all models of the CRD's schema)."""
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.add(node["pattern"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(LLMDeployment.model_json_schema(by_alias=True, mode="validation"))
    return found


def _crd_patterns() -> set[str]:
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.add(node["pattern"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(build_crd())
    return found


def _rust_accepts(pattern: str, value: str) -> bool:
    try:
        TypeAdapter(Annotated[str, Field(pattern=pattern)]).validate_python(value)
        return True
    except ValidationError:
        return False


def test_the_crd_patterns_are_the_models_patterns_in_re2_syntax():
    patterns = _model_patterns()
    assert len(patterns) >= 10
    assert _crd_patterns() == {go_pattern(p) for p in patterns}
    assert not any("\\s" in p or "\\d" in p or "\\w" in p for p in _crd_patterns())


def test_re2_and_pydantic_agree_on_tricky_strings(tmp_path):
    jobs, expected = [], []
    for p in sorted(_model_patterns()):
        strings = [v for b in BASES for v in _variants(b)]
        jobs.append({"p": go_pattern(p), "s": strings})
        expected.append([_rust_accepts(p, s) for s in strings])
    got = _run_go(jobs, tmp_path)
    disagree = [(jobs[i]["p"][:60], s) for i in range(len(jobs)) for s, g, e in zip(jobs[i]["s"], got[i],
                                                                                      expected[i]) if g != e]
    assert not disagree, f"{len(disagree)} disagreement(s), e.g. {disagree[:5]}"
    # the test bites: the very case of the issue, \v, is accepted by RE2's \s-class and refused by pydantic
    raw = _run_go([{"p": r"^[^\s]+$", "s": ["a\vb"]}], tmp_path)
    assert raw == [[True]] and not _rust_accepts(r"^[^\s]+$", "a\vb")


def test_re2_and_pythons_re_agree_for_the_rules_patterns(tmp_path):
    """The rules' patterns run in CEL (RE2) at the API server and in Python's `re` in the models."""
    pats = [SECRET_ENV_RE, URI_USERINFO_RE, URI_TOKEN_QUERY_RE, PLAN_OWNED_FLAG_RE, DNS_LABEL_RE]
    strings = [v for b in BASES for v in _variants(b)] + ["HF_TOKEN\n", "--tensor-parallel-size\n", "abc\n"]
    got = _run_go([{"p": p, "s": strings} for p in pats], tmp_path)
    for p, verdicts in zip(pats, got):
        mine = [bool(rx(p).search(s)) for s in strings]
        diff = [s for s, g, m in zip(strings, verdicts, mine) if g != m]
        assert not diff, f"{p[:50]}: RE2 and Python re disagree on {diff[:5]}"
    import re

    assert re.match(DNS_LABEL_RE, "abc\n") and not rx(DNS_LABEL_RE).match("abc\n")   # what rx is for


def test_engine_dependent_escapes_are_refused_not_guessed():
    for p in (r"^\d+$", r"^\w+$", r"\bx", r"^[\S]+$"):
        with pytest.raises(SchemaError):
            go_pattern(p)
    assert go_pattern(r"^a\.b\\s$") == r"^a\.b\\s$"          # escapes that mean the same stay


def test_a_manifest_with_a_vertical_tab_is_refused_by_the_models_as_by_the_api_server():
    m = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "x"},
         "spec": {"model": {"name": "llama-3.1-8b", "weights": {"uri": "hf://meta-llama/Llama\v-3.1-8B"}}}}
    with pytest.raises(ValidationError, match="weights.uri|uri"):
        LLMDeployment.from_manifest(m)
    assert models.WHITE_SPACE and "\v" in models.WHITE_SPACE
