"""meshplan reads manifests as kubectl does (issue 17, finding 10): compared with sigs.k8s.io/yaml itself.

The reference is kubectl's own YAML-to-JSON conversion, `sigs.k8s.io/yaml.YAMLToJSON` (v1.6.0 over
go.yaml.in/yaml/v2 v2.4.3, the versions Kubernetes v1.36 pins in its go.mod), run by a small Go
program built from the Go module cache that e2e/build-control-plane.sh fills (offline: GOPROXY=off).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from meshplan import kubeyaml
from meshplan.commands.plan import _read_manifest

GO_MAIN = r"""
package main

import (
	"encoding/json"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	var docs []string
	if err := json.NewDecoder(os.Stdin).Decode(&docs); err != nil {
		panic(err)
	}
	out := []map[string]any{}
	for _, d := range docs {
		j, err := yaml.YAMLToJSON([]byte(d))
		if err != nil {
			out = append(out, map[string]any{"error": err.Error()})
		} else {
			out = append(out, map[string]any{"json": string(j)})
		}
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
"""
GO_MOD = """module kubeyamlref

go 1.22

require sigs.k8s.io/yaml v1.6.0

replace go.yaml.in/yaml/v2 => go.yaml.in/yaml/v2 v2.4.3
"""

SCALARS = ["1e1", "1E3", "12e03", "-1e-2", "1.", ".5", ".5e3", "1.0", "10", "+1", "-0", "0755", "08", "0x1A",
           "0o17", "0b11", "-0b11", "1_000", "0x_1f", "99999999999999999999", "18446744073709551615",
           "9223372036854775808", "1:30", "190:20:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00",
           "y", "Y", "n", "N", "yes", "No", "on", "OFF", "true", "False", "~", "null", "NULL", "", "abc",
           "1e", "e1", "1.2.3", "0.1e+1", "+.5", "-.5", "_1", "1__0", "0b", "0x", "-", ".", "..5"]


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert os.path.exists(go), "Go is needed for the reference (install it as e2e/build-control-plane.sh does)"
    return go


@pytest.fixture(scope="module")
def kubectl_yaml(tmp_path_factory):
    d = tmp_path_factory.mktemp("kubeyamlref")
    (d / "go.mod").write_text(GO_MOD)
    (d / "main.go").write_text(GO_MAIN)
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOSUMDB": "off"}
    build = subprocess.run([_go(), "build", "-o", str(d / "ref"), "."], cwd=d, capture_output=True, text=True,
                           timeout=300, env=env)
    assert build.returncode == 0, f"cannot build the sigs.k8s.io/yaml reference offline: {build.stderr[-2000:]}"

    def convert(docs: list[str]) -> list[dict]:
        r = subprocess.run([str(d / "ref")], input=json.dumps(docs), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    return convert


def _ours(doc: str) -> dict:
    try:
        return {"value": kubeyaml.load(doc)}
    except kubeyaml.KubeYamlError as exc:
        return {"error": str(exc)}


def test_scalars_as_values_and_keys_read_as_kubectl_reads_them(kubectl_yaml):
    docs = [f"v: {s}\n" for s in SCALARS] + [f"{s}: 1\n" for s in SCALARS if s not in ("", "-", "~")]
    docs += ["v: [1e1, y, 0755]\n", "a: &x {b: 1e1}\nc: *x\n", "a: {<<: {b: 1}, c: 2}\n", "v: .inf\n",
             "v: .nan\n", 'v: "1e1"\n', "v: '0755'\n", "v: !!str 1e1\n"]
    ref = kubectl_yaml(docs)
    bad = []
    for doc, r in zip(docs, ref):
        ours = _ours(doc)
        if "error" in r:
            if "error" not in ours:
                bad.append((doc, r, ours))
        elif "error" in ours or ours["value"] != json.loads(r["json"]):
            bad.append((doc, r, ours))
    assert not bad, f"{len(bad)} difference(s) from kubectl, e.g. {bad[:4]}"
    # the case, and that PyYAML alone differs (the test bites)
    import yaml

    assert kubeyaml.load("replicas: 1e1\n") == {"replicas": 10} and yaml.safe_load("replicas: 1e1\n") == {
        "replicas": "1e1"}


def test_the_examples_read_the_same_as_kubectl(kubectl_yaml):
    paths = sorted(Path("examples").glob("*.yaml"))
    ref = kubectl_yaml([p.read_text() for p in paths])
    for p, r in zip(paths, ref):
        docs = [d for d in kubeyaml.load_all(p.read_text()) if d is not None]
        assert len(docs) == 1 and docs[0] == json.loads(r["json"]), p


def _bomb(levels: int = 9, width: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        prev = names[i - 1]
        lines.append(f"{names[i]}: &{names[i]} [" + ",".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_fails_fast_with_kubectls_verdict(kubectl_yaml, tmp_path, capsys):
    bomb = _bomb()
    assert len(bomb.encode()) < 600          # the bomb was 568 bytes (68 s, 643 MB before)
    assert "excessive aliasing" in kubectl_yaml([bomb])[0]["error"]
    t0 = time.monotonic()
    with pytest.raises(kubeyaml.KubeYamlError, match="excessive aliasing"):
        kubeyaml.load(bomb)
    assert time.monotonic() - t0 < 1.0
    # through `meshplan plan`'s reader: a clear error, fast
    f = tmp_path / "bomb.yaml"
    f.write_text("apiVersion: meshplan.dev/v1alpha1\nkind: LLMDeployment\n" + bomb)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="excessive aliasing"):
        _read_manifest(str(f))
    assert time.monotonic() - t0 < 1.0
    # a few honest aliases are fine (kubectl reads them too)
    assert kubeyaml.load("a: &x [1, 2]\nb: *x\nc: *x\n") == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}


def test_nan_and_infinity_are_refused_as_kubectl_refuses_them():
    for doc in ("v: .nan\n", "v: -.inf\n"):
        with pytest.raises(kubeyaml.KubeYamlError, match="not a JSON number"):
            kubeyaml.load(doc)
