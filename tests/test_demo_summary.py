"""`meshplan demo`'s report explains what is deployed, and separately what the SLO search saw.

Defect (issue 16): the demo's "Why" read "balanced: TP4 x DP6 (24 GPUs) ..." while 2 replicas (8 GPUs)
ran: status.plan.reason was the planner's sentence about its own DP (sized for spec.workload), not
about the replicas the operator applies. This feeds the default demo example through the functions
the demo runs (plan -> controller.decide -> status) and through `commands.demo.summary`, without a
cluster (`make demo` itself starts a control plane).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from meshplan.api.models import LLMDeployment
from meshplan.commands.demo import summary
from meshplan.controller.decide import Inputs, decide, target_for
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.planner import plan_for_spec
from meshplan.render.pipeline import replicas_and_why
from meshplan.topology import build_topology

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama-3.1-70b-hgx-h100.yaml"


def _status():
    m = yaml.safe_load(EXAMPLE.read_text())
    m["metadata"].update(namespace="meshplan-demo", uid="u-1", generation=1)
    d = LLMDeployment.from_manifest(m)
    topo = build_topology(fleet_nodes(load_fleet("hgx-h100")), ready_if_unknown=True)
    plan = plan_for_spec(d.spec, topo)
    desired, why = replicas_and_why(d.spec, None)
    out = decide(Inputs(name=d.name, namespace="meshplan-demo", uid="u-1", generation=1, desired_replicas=desired,
                        topology=topo, pods=[], services=[], target=target_for(d.spec, plan, topo),
                        replicas_why=why))
    return m, plan, out.status


def test_status_plan_reason_describes_the_deployed_replicas_and_search_reason_the_search():
    m, plan, status = _status()
    c = plan.choice
    assert status["desiredReplicas"] == 2 and c.layout.dp != 2           # the search sized another DP
    gpr = c.layout.gpus_per_replica
    reason = status["plan"]["reason"]
    assert reason.startswith(f"running {c.layout.label()} x 2 replica(s) = {2 * gpr} GPUs")
    assert "spec.replicas 2, where autoscaling starts," in reason
    assert f"the SLO search sized DP{c.layout.dp} ({c.layout.total_gpus} GPUs) for spec.workload" in reason
    assert status["plan"]["searchReason"] == plan.reason
    assert f"x DP{c.layout.dp} ({c.layout.total_gpus} GPUs)" in plan.reason      # the search's own view
    planned = next(x for x in status["conditions"] if x["type"] == "Planned")
    assert planned["message"].startswith(reason) and plan.reason in planned["message"]


def test_demo_report_why_is_what_runs_and_search_is_what_the_search_saw():
    m, plan, status = _status()
    obj = {"metadata": {"namespace": "meshplan-demo", "name": m["metadata"]["name"]}, "spec": m["spec"],
           "status": {**status, "readyReplicas": 2}}
    text = summary(obj, [])
    lines = {line.split(None, 1)[0]: line for line in text.splitlines() if line[:1].isalpha()}
    c = plan.choice
    assert f"x 2 replica(s) = {2 * c.layout.gpus_per_replica} GPUs" in lines["Plan"]
    why = lines["Why"]
    assert f"x 2 replica(s) = {2 * c.layout.gpus_per_replica} GPUs" in why
    assert not why.startswith("Why         balanced:")                       # not the search's sentence
    assert lines["Search"].startswith("Search      balanced: ") and f"x DP{c.layout.dp}" in lines["Search"]
