"""Unit checks for defects the reliability suite (e2e/reliability, docs/reliability.md) found.

- nodeSelector entries that are not label syntax are named (they were reported as missing capacity);
- a plan is kept when only capacity shrinks under an unchanged spec (the deployment was left
  unmanaged with Planned=False); a changed spec is re-planned as before;
- names that cannot be label values are caught before children are listed by them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from meshplan.api.models import LLMDeployment
from meshplan.controller.reconcile import Reconciler, World, labels_can_carry, node_selector_problems
from meshplan.devcluster.fleets import fleet_nodes
from meshplan.topology import build_topology_from_infos, node_info

REPO = Path(__file__).resolve().parent.parent


def test_node_selector_problems_name_bad_keys_and_values_only():
    good = {"meshplan.dev/fleet": "hgx-h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "empty": ""}
    assert node_selector_problems(good) == []
    bad = node_selector_problems({"meshplan.dev/fleet": "x,kubernetes.io/os!=y", "a b=c,d": "x",
                                  "ok": "v" * 64})
    assert len(bad) == 3
    assert all(p.startswith("spec.gpus.nodeSelector") for p in bad)
    assert any("'a b=c,d' is not a valid label key" in p for p in bad)


def test_labels_can_carry_only_dns_labels_up_to_63():
    assert labels_can_carry("llm-1") and labels_can_carry("a" * 63)
    assert not labels_can_carry("a" * 64)
    assert not labels_can_carry("llm.v1")


def _topology(trays: int):
    fleet = {"name": "t", "nodeGroups": [{"namePrefix": f"t-d{d}", "count": 2, "gpusPerNode": 4,
                                          "product": "NVIDIA-GB200", "memoryMiB": 189471, "clique": f"t-d{d}.0"}
                                         for d in range(2)]}
    infos = []
    for n in fleet_nodes(fleet)[:trays]:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        infos.append(node_info(n))
    return build_topology_from_infos(infos, [])


def _spec(replicas: int, model: str = "llama-3.1-70b"):
    m = yaml.safe_load((REPO / "examples" / "llama-3.1-70b-hgx-h100.yaml").read_text())
    m["spec"].pop("slo", None)
    m["spec"].update({"objective": "maxThroughput", "model": {"name": model}, "replicas": replicas,
                      "autoscaling": {"enabled": False}, "parallelism": {"tensor": 8, "pipeline": 1},
                      "gpus": {"products": ["NVIDIA-GB200"], "maxGpus": 16, "nodeSelector": {}}})
    return LLMDeployment.from_manifest(copy.deepcopy(m)).spec


def test_plan_kept_when_only_capacity_shrinks_and_redone_when_the_spec_changes():
    r = Reconciler(kube=None, world=World(), compute_domains=False)
    full, shrunk = _topology(4), _topology(3)
    first = r._plan("uid", _spec(2), full)
    assert first.choice is not None
    # 12 GPUs left for 2 x TP8: a fresh plan has no choice, the running one is kept
    assert r._plan("uid", _spec(2), shrunk) is first
    # a changed spec on the shrunk fleet is planned afresh (and reported infeasible)
    other = r._plan("uid", _spec(2, "llama-3.1-8b"), shrunk)
    assert other is not first
    assert Reconciler(kube=None, world=World(), compute_domains=False)._plan("new", _spec(2), shrunk).choice is None
