"""The docs stay true to the code: condition reasons, chart values, commands, files.

docs/troubleshooting.md must explain every condition reason the controller
writes (and name none it does not); chart values and files the docs mention must
exist; the `meshplan` subcommands they show must be real.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CONTROLLER = REPO / "operator" / "meshplan" / "controller"
CONDITION_TYPES = ("Planned", "Placed", "Available", "Progressing", "Degraded", "ScalingLimited")
NOT_REASONS = {"True", "False", "Unknown", "Normal", "Warning"}  # condition statuses and event types


def controller_reasons() -> set[str]:
    """CamelCase literals in the controller's condition tuples ("Type", status, reason, message)
    (a tuple may span lines, and its reason may be a conditional expression), plus planned_reason
    values and the (reason, message) pairs reconcile.py returns."""
    reasons: set[str] = set()
    types = "|".join(CONDITION_TYPES)
    for path in (CONTROLLER / "decide.py", CONTROLLER / "reconcile.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(rf'\(\("?(?:{types})"|\("(?:{types})",', line):
                window = " ".join(lines[i:i + 3])
                window = window.split('f"', 1)[0]  # stop at the message
                reasons |= set(re.findall(r'"([A-Z][A-Za-z]+)"', window)) - set(CONDITION_TYPES) - NOT_REASONS
        text = "\n".join(lines)
        reasons |= set(re.findall(r'planned_reason="([A-Z][A-Za-z]+)"', text))
        reasons |= set(re.findall(r'return "([A-Z][A-Za-z]+)", ', text))
    return reasons


def troubleshooting_reasons() -> set[str]:
    text = (DOCS / "troubleshooting.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "/ `" in line]
    return {m for line in rows for m in re.findall(r"/ `([A-Z][A-Za-z]+)`", line)}


def test_troubleshooting_explains_every_controller_reason_and_no_other():
    code = controller_reasons()
    assert {"PlanChosen", "InvalidSpec", "InsufficientCapacity", "NoFeasiblePlan", "ReplicasReady",
            "Complete", "AsPlanned"} <= code, f"reason extraction broke: {sorted(code)}"
    docs = troubleshooting_reasons()
    assert code - docs == set(), f"reasons the controller writes but troubleshooting.md omits: {code - docs}"
    assert docs - code == set(), f"reasons troubleshooting.md names but the controller never writes: {docs - code}"


def _values() -> dict:
    return yaml.safe_load((REPO / "charts" / "meshplan" / "values.yaml").read_text())


def _has(values: dict, dotted: str) -> bool:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_chart_values_named_in_docs_exist(doc):
    text = doc.read_text()
    named = set(re.findall(r"--set ([A-Za-z][\w.]+)=", text))
    named |= {m for m in re.findall(r"`([a-z][A-Za-z]+(?:\.[A-Za-z]+)+)`", text)
              if m.split(".")[0] in _values()}
    missing = sorted(n for n in named if not _has(_values(), n))
    assert not missing, f"{doc.name} names chart values that do not exist: {missing}"


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_repository_paths_named_in_docs_exist(doc):
    text = doc.read_text()
    paths = set(re.findall(r"`((?:operator|charts|e2e|examples|tests|docs|crds)/[\w./-]+?)`", text))
    paths |= set(re.findall(r"\]\(([\w-]+\.(?:md|lua))\)", text))
    missing = []
    for p in paths:
        candidates = [REPO / p, DOCS / p, REPO / "operator" / "meshplan" / p]
        if not any(c.exists() for c in candidates):
            missing.append(p)
    assert not missing, f"{doc.name} names files that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_meshplan_commands_in_docs_exist(doc):
    from meshplan.cli import COMMANDS

    fenced = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), re.S))
    used = set(re.findall(r"^\s*meshplan ([a-z][\w-]+)", fenced, re.M))
    used |= set(re.findall(r"`meshplan ([a-z][\w-]+)", doc.read_text()))
    assert used <= set(COMMANDS), f"{doc.name}: unknown subcommands {used - set(COMMANDS)}"
