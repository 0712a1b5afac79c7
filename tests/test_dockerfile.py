"""The operator image's Dockerfile, checked without Docker (none on these machines).

What can be checked statically: base images pinned to an exact version, a
build stage and a final stage, a numeric non-root USER equal to the chart's
runAsUser, ENTRYPOINT = pyproject's console script, every COPY source present
and not excluded by .dockerignore, the Python version allowed by
requires-python, and EXPOSEd ports equal to the chart's defaults.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def build_args() -> dict[str, str]:
    args = {}
    for ins, rest in instructions():
        if ins == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
    return args


def stages() -> list[dict]:
    args = build_args()
    out = []
    for ins, rest in instructions():
        if ins == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            out.append({"image": image, "name": name, "body": []})
        elif out:
            out[-1]["body"].append((ins, rest))
    return out


def final(ins_name: str) -> list[str]:
    return [rest for ins, rest in stages()[-1]["body"] if ins == ins_name]


def test_base_images_are_pinned_to_an_exact_python_release():
    for stage in stages():
        if stage["image"] in {s["name"] for s in stages() if s["name"]}:
            continue
        repo, _, tag = stage["image"].partition(":")
        assert repo == "python", stage["image"]
        assert "@sha256:" in stage["image"] or re.match(r"^\d+\.\d+\.\d+-slim", tag), \
            f"{stage['image']}: pin an exact version (x.y.z) or a digest, never a moving tag"
        assert "latest" not in tag


def test_python_version_satisfies_requires_python():
    tag = stages()[-1]["image"].split(":", 1)[1]
    version = re.match(r"^(\d+\.\d+\.\d+)", tag).group(1)
    assert version in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert stages()[0]["image"] == stages()[-1]["image"], "build and run on the same Python"


def test_multi_stage_wheel_built_then_installed_into_a_venv():
    st = stages()
    assert len(st) >= 2 and st[0]["name"], "a named build stage, then the final stage"
    build_runs = " ".join(r for i, r in st[0]["body"] if i == "RUN")
    assert "pip wheel" in build_runs
    copies_from_build = [r for r in final("COPY") if r.startswith(f"--from={st[0]['name']}")]
    assert copies_from_build, "the final stage takes only the build stage's wheels"
    final_runs = " ".join(final("RUN"))
    assert "python -m venv" in final_runs and ".whl" in final_runs
    assert not [r for r in final("COPY") if not r.startswith("--from=")], \
        "the final stage must not copy the source tree"


def test_runs_as_numeric_non_root_user_matching_the_chart():
    users = final("USER")
    assert users, "no USER in the final stage: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "USER must be numeric (runAsNonRoot can only verify a numeric uid)"
    helpers = (REPO / "charts/meshplan/templates/_helpers.tpl").read_text()
    assert f"runAsUser: {uid}" in helpers
    if gid:
        assert f"runAsGroup: {gid}" in helpers


def test_entrypoint_is_the_console_script_and_cmd_runs_the_operator():
    scripts = PYPROJECT["project"]["scripts"]
    entry = json.loads(final("ENTRYPOINT")[-1])
    assert len(entry) == 1 and entry[0] in scripts
    assert scripts[entry[0]] == "meshplan.cli:main"
    assert json.loads(final("CMD")[-1]) == ["run"]


def test_the_chart_relies_only_on_what_the_image_provides():
    """The Deployment uses args (keeps ENTRYPOINT); the hook runs `python -m` on the venv's python."""
    env_line = " ".join(final("ENV"))
    venv = re.search(r"VIRTUAL_ENV=(\S+)", env_line).group(1)
    assert f"PATH={venv}/bin:" in env_line
    hook = (REPO / "charts/meshplan/templates/cleanup-hook.yaml").read_text()
    assert re.search(r"command:\s*\n\s*- python\s*\n\s*- -m\s*\n\s*- meshplan\.commands\.cleanup", hook)
    assert (REPO / "operator/meshplan/commands/cleanup.py").exists()


def _dockerignore_allows(path: str) -> bool:
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pat = raw.strip()
        if not pat or pat.startswith("#"):
            continue
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            allowed = negate
    return allowed


def test_copied_paths_exist_and_are_in_the_build_context():
    sources = []
    for stage in stages():
        for ins, rest in stage["body"]:
            if ins == "COPY" and not rest.startswith("--from="):
                words = shlex.split(rest)
                sources += [w for w in words[:-1] if not w.startswith("--")]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
        assert _dockerignore_allows(src.rstrip("/")), f"COPY {src}: excluded by .dockerignore"
    readme = PYPROJECT["project"].get("readme")
    if readme:
        assert readme in sources, "pyproject's readme is needed to build the wheel"
    where = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    assert all(w in [s.rstrip("/").lstrip("./") for s in sources] for w in where)


def test_exposed_ports_are_the_charts_defaults():
    values = yaml.safe_load((REPO / "charts/meshplan/values.yaml").read_text())
    exposed = {int(p) for line in final("EXPOSE") for p in line.split()}
    assert exposed == {values["metrics"]["port"], values["health"]["port"]}
