"""Issue 18, Build 1: one cluster model and no import circle between topology, the planner and placement.

`topology.py -> planner/fleet.py -> placement.py -> topology.py` was a circle held together by
function-level imports. These tests read every import statement of the package (module level and
inside functions, with the AST) and import each module alone in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "operator" / "meshplan"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every meshplan module this file imports, wherever the import statement is."""
    tree = ast.parse(path.read_text())
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("meshplan")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("meshplan"):
                continue
            out.add(base)
            for a in node.names:                      # `from meshplan import topology` imports a module
                if (PKG.parent / (base.replace(".", "/") + "/" + a.name + ".py")).exists() or \
                        (PKG.parent / (base.replace(".", "/") + "/" + a.name)).is_dir():
                    out.add(f"{base}.{a.name}")
    return out


GROUPS = ("meshplan.topology", "meshplan.placement", "meshplan.planner")


def _group(mod: str) -> str:
    for g in GROUPS:
        if mod == g or mod.startswith(g + "."):
            return g
    return mod


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        src = _group(_module_name(path))
        g.setdefault(src, set())
        for dst in _imports(path):
            dst = _group(dst)
            if dst != src and dst != "meshplan":
                g[src].add(dst)
    return g


def _reaches(g: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in g.get(node, ()):
            if nxt == goal:
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_import_graph_reads_the_real_edges():
    g = _graph()
    # the direction the layering wants: placement and the planner stand on the topology
    assert "meshplan.topology" in g["meshplan.placement"]
    assert "meshplan.topology" in g["meshplan.planner"]


def test_no_import_cycle_through_topology_planner_or_placement():
    g = _graph()
    for i, a in enumerate(GROUPS):
        for b in GROUPS[i + 1:]:
            there, back = _reaches(g, a, b), _reaches(g, b, a)
            assert not (there and back), " -> ".join(there + back[1:])
    # the topology imports nothing of the planner or placement, not even inside a function
    assert not {"meshplan.planner", "meshplan.placement"} & g["meshplan.topology"]


def test_one_topology_type_remains():
    import meshplan.planner.fleet as fleet

    assert not hasattr(fleet, "Fleet") and not hasattr(fleet, "FleetDomain")
    from meshplan.topology import Topology

    assert isinstance(fleet.load_fleet("hgx-h100"), Topology)


def test_each_module_imports_alone_in_a_fresh_interpreter():
    mods = ["meshplan.topology", "meshplan.placement", "meshplan.planner", "meshplan.planner.fleet",
            "meshplan.planner.search", "meshplan.planner.engines", "meshplan.autoscale.capacity",
            "meshplan.engines", "meshplan.engines.vllm", "meshplan.render"]
    for m in mods:
        r = subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True, text=True,
                           env={"PYTHONPATH": str(PKG.parent), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, (m, r.stderr[-2000:])
