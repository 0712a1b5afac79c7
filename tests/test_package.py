"""The package layout must never shadow the standard library."""

import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_stdlib_operator_module_still_imports():
    import operator

    # the real stdlib module has itemgetter and lives outside the repo
    assert operator.itemgetter(1)([0, 42]) == 42
    assert REPO not in Path(operator.__file__).resolve().parents


def test_no_operator_init_file():
    assert not (REPO / "operator" / "__init__.py").exists()


def test_meshplan_imports_and_cli_help(capsys):
    meshplan = importlib.import_module("meshplan")
    assert meshplan.__version__
    from meshplan.cli import main

    assert main([]) == 2  # no command: prints help, exit code 2
    assert "dev-cluster" in capsys.readouterr().out


def test_no_two_test_modules_share_a_basename():
    """pytest imports test modules by basename (no __init__.py in tests/ or e2e/): two files of one name stop the
    whole run at collection ("import file mismatch"), as e2e/test_inference_pool.py beside
    tests/test_inference_pool.py once did."""
    from collections import Counter

    names = Counter(p.name for d in ("tests", "e2e") for p in (REPO / d).rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]
