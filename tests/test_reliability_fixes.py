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


def _ready_topology(fleet: dict, limit: int | None = None):
    """The topology of a fleet file's nodes (the first `limit` of them), all Ready, nothing used."""
    infos = []
    for n in fleet_nodes(fleet)[:limit]:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        infos.append(node_info(n))
    return build_topology_from_infos(infos, [])


def _topology(trays: int):
    fleet = {"name": "t", "nodeGroups": [{"namePrefix": f"t-d{d}", "count": 2, "gpusPerNode": 4,
                                          "product": "NVIDIA-GB200", "memoryMiB": 189471, "clique": f"t-d{d}.0"}
                                         for d in range(2)]}
    return _ready_topology(fleet, trays)


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


# --- a full planned product, another allowed one with room (found by the soak: a deployment scaled
# 1 -> 2 waited forever with Placed=False while the other product it allows stood idle) -------------

H100, GB200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200"


def _two_products():
    """Two HGX H100 nodes (8 GPUs each) and one GB200 NVLink domain of 4 x 4 GPUs."""
    fleet = {"name": "mix", "nodeGroups": [
        {"namePrefix": "mix-h100", "count": 2, "gpusPerNode": 8, "product": H100, "memoryMiB": 81559,
         "family": "hopper"},
        {"namePrefix": "mix-nvl0", "count": 4, "gpusPerNode": 4, "product": GB200, "memoryMiB": 189471,
         "clique": "mix-nvl0.0"},
    ]}
    return _ready_topology(fleet)


def _mixed_manifest(replicas: int, products: list[str]) -> dict:
    m = yaml.safe_load((REPO / "examples" / "llama-3.1-70b-hgx-h100.yaml").read_text())
    m["metadata"] = {"name": "mixed", "namespace": "ns", "uid": "u-mix", "generation": 1}
    m["spec"].pop("slo", None)
    m["spec"].update({"objective": "maxThroughput", "replicas": replicas, "autoscaling": {"enabled": False},
                      "parallelism": {"tensor": 8, "pipeline": 1},
                      "gpus": {"products": products, "maxGpus": 16, "nodeSelector": {}}})
    return m


def _fill(topology, product: str, leave_gpus: int):
    """The topology with every GPU of `product` used except `leave_gpus` on its first node."""
    usage, left = [], leave_gpus
    for name, state in sorted(topology.nodes.items()):
        if state.info.product != product:
            continue
        keep = min(left, state.free_gpus)
        left -= keep
        usage.append((name, state.free_gpus - keep))
    return topology.with_usage(usage)


def _planned(manifest: dict, topology):
    from meshplan.controller.decide import target_for
    from meshplan.planner import plan_for_spec

    spec = LLMDeployment.from_manifest(copy.deepcopy(manifest)).spec
    plan = plan_for_spec(spec, topology)
    assert plan.choice is not None
    return spec, target_for(spec, plan, topology)


def test_fallback_target_moves_to_the_other_allowed_product_only_when_it_holds_every_replica():
    from meshplan.controller.decide import fallback_target, replicas_that_fit
    from meshplan.planner import plan_for_spec

    topo = _two_products()
    spec, target = _planned(_mixed_manifest(2, [H100, GB200]), topo)
    other = GB200 if target.product == H100 else H100
    # room for both replicas on the planned product: nothing to do
    assert replicas_that_fit(target, topo, 2) == 2
    assert fallback_target(spec, target, topo, 2, plan_for_spec) is None
    # the planned product keeps room for one TP8 group only
    squeezed = _fill(topo, target.product, 8)
    assert replicas_that_fit(target, squeezed, 2) == 1
    alt = fallback_target(spec, target, squeezed, 2, plan_for_spec)
    assert alt is not None and alt.product == other
    assert replicas_that_fit(alt, squeezed, 2) == 2
    # the other product full too: no fallback (Placed=False reports it)
    assert fallback_target(spec, target, _fill(squeezed, other, 0), 2, plan_for_spec) is None
    # a spec that allows the planned product only never moves
    spec_one, target_one = _planned(_mixed_manifest(2, [target.product]), topo)
    assert fallback_target(spec_one, target_one, squeezed, 2, plan_for_spec) is None


def test_reconciler_adopts_the_fallback_plan_and_places_every_replica():
    topo = _two_products()
    manifest = _mixed_manifest(2, [H100, GB200])
    spec, target = _planned(manifest, topo)
    r = Reconciler(kube=None, world=World(), compute_domains=False)
    first = r._decide(_mixed_manifest(1, [H100, GB200]), topo, [], [], [])
    assert first.placement is not None and len(first.placement.placed) == 1
    assert r.plans["u-mix"][1].choice.gpu == target.plan.choice.gpu and "u-mix" not in r.plans_moved
    # others take the planned product's GPUs but room for one group; the deployment is scaled to 2
    squeezed = _fill(topo, target.product, 8)
    out = r._decide(manifest, squeezed, [], [], [])
    assert out.placement is not None and not out.placement.unplaced
    assert len(out.placement.placed) == 2
    placed_products = {squeezed.nodes[n].info.product for rp in out.placement.placed for n in rp.nodes}
    assert placed_products == {GB200 if target.product == H100 else H100}
    assert [e for e in out.events if e[1] == "PlanMovedProduct"]
    conds = {c["type"]: c for c in out.status["conditions"]}
    assert conds["Placed"]["status"] == "True"
    # the adopted plan is the cached one (later reconciles and the autoscaler use it) and is marked
    # for the annotation rewrite; a second decide on the same world does not move again
    assert r.plans["u-mix"][1].choice.gpu != target.plan.choice.gpu
    assert "u-mix" in r.plans_moved
    again = r._decide(manifest, squeezed, [], [], [])
    assert not [e for e in again.events if e[1] == "PlanMovedProduct"]
    assert len(again.placement.placed) == 2
