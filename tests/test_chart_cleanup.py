"""The chart's pre-delete hook command (meshplan.commands.cleanup): which finalizers it may drop.

The deletion loop itself runs against the real API server in e2e/test_chart.py.
"""

from __future__ import annotations

import subprocess
import sys

from meshplan.commands import cleanup


def test_only_meshplans_own_finalizers_are_dropped():
    fins = ["foregroundDeletion", "meshplan.dev/finalizer", "kopf.zalando.org/KopfFinalizerMarker",
            "example.com/other-controller"]
    assert cleanup.finalizers_without_own(fins) == ["foregroundDeletion", "example.com/other-controller"]
    assert cleanup.finalizers_without_own([]) == []
    assert not cleanup.is_own_finalizer("meshplan.devil/x")


def test_describe_names_namespace_name_and_finalizers():
    text = cleanup.describe([{"metadata": {"namespace": "ns", "name": "a", "finalizers": ["meshplan.dev/f"]}},
                             {"metadata": {"namespace": "ns", "name": "b"}}])
    assert text == "ns/a [finalizers: meshplan.dev/f]; ns/b [finalizers: none]"


def test_scope_is_required_and_exclusive():
    run = [sys.executable, "-m", "meshplan.commands.cleanup"]
    none = subprocess.run(run, capture_output=True, text=True)
    assert none.returncode == 2 and "--all-namespaces" in none.stderr
    both = subprocess.run([*run, "-A", "-n", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "not allowed with" in both.stderr
