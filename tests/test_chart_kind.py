"""e2e/kind: the path for users with Docker, checked without Docker (none here).

The script cannot run on these machines; what can be checked is that it
parses (`bash -n`), that its embedded fleet -> node-label step produces the
labels and GPU counts meshplan's fleets define, that the chart values it sets
exist, and that the kind config has workers for the default fleet.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from meshplan.devcluster.fleets import fleet_names, fleet_nodes, load_fleet

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "e2e" / "kind" / "create-cluster.sh"
CONFIG = REPO / "e2e" / "kind" / "kind-config.yaml"


def test_script_parses_and_says_it_is_not_run_here():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    head = SCRIPT.read_text()[:2000]
    assert "NOT RUN IN THIS REPOSITORY'S CI" in head and "set -euo pipefail" in SCRIPT.read_text()


def _default(var: str) -> str:
    return re.search(rf'{var}="\$\{{{var}:-([^}}]+)\}}"', SCRIPT.read_text()).group(1)


def test_kind_config_has_a_worker_per_default_fleet_node():
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4" and cfg["kind"] == "Cluster"
    workers = [n for n in cfg["nodes"] if n["role"] == "worker"]
    fleet = _default("FLEET")
    assert fleet in fleet_names()
    assert len(workers) == len(fleet_nodes(load_fleet(fleet)))


def _label_step() -> str:
    text = SCRIPT.read_text()
    return text[text.index("<<'PY'") + len("<<'PY'"):text.index("\nPY\n")].split("\n", 1)[1]


def test_label_step_copies_fleet_labels_and_gpus_to_workers():
    fleet = "gb200-nvl72"
    want = fleet_nodes(load_fleet(fleet))[:2]
    proc = subprocess.run([sys.executable, "-", fleet, "kind-worker", "kind-worker2"], input=_label_step(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" ", 2) for line in proc.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["kind-worker", "kind-worker2"]
    for (worker, gpus, labels), node in zip(rows, want):
        assert gpus == node["status"]["allocatable"]["nvidia.com/gpu"]
        got = dict(kv.split("=", 1) for kv in labels.split())
        expected = {k: v for k, v in node["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
        assert got == expected
        assert "nvidia.com/gpu.clique" in got and "nvidia.com/gpu.product" in got


def test_label_step_refuses_more_workers_than_fleet_nodes():
    n = len(fleet_nodes(load_fleet("hgx-h100")))
    proc = subprocess.run([sys.executable, "-", "hgx-h100", *[f"w{i}" for i in range(n + 1)]],
                          input=_label_step(), capture_output=True, text=True)
    assert proc.returncode != 0 and "use a bigger fleet" in proc.stderr


def test_chart_values_set_by_the_script_exist():
    values = yaml.safe_load((REPO / "charts" / "meshplan" / "values.yaml").read_text())
    for key in re.findall(r"--set ([\w.]+)=", SCRIPT.read_text()):
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: no such chart value"
            node = node[part]
