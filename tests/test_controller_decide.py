"""The reconcile decisions (meshplan.controller.decide) against a small simulated cluster.

`Sim` plays the API server, scheduler and kubelet in the simplest honest way:
applied objects are stored, a pod without scheduling gates is bound to its
assigned node and becomes Ready one round later, deleted pods go away one
round later. Each test drives `decide` round by round and checks the rules of
the module docstring: all-or-nothing groups, one NVLink domain per replica,
zero writes when converged, rolling updates that keep ready replicas, whole
group restarts, nothing touched without a plan.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from meshplan.api.models import LLMDeployment
from meshplan.controller.apply import needs_apply
from meshplan.controller.decide import Inputs, decide, live_groups, target_for
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.planner import plan_for_spec
from meshplan.render.workloads import GANG_GATE, LABEL_PLAN_HASH
from meshplan.topology import build_topology

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
_uids = itertools.count(1)


def llmd(fleet_product: str, tensor: int, replicas: int, **spec_extra) -> LLMDeployment:
    m = yaml.safe_load(open("examples/llama-3.1-70b-hgx-h100.yaml"))
    m["metadata"] = {"name": "llama", "namespace": "ns", "uid": "u-1", "generation": 1}
    m["spec"]["autoscaling"] = {"enabled": False}
    m["spec"]["gpus"] = {"products": [fleet_product], "maxGpus": 64}
    m["spec"]["parallelism"]["tensor"] = tensor
    m["spec"]["replicas"] = replicas
    m["spec"].pop("slo")
    for k, v in spec_extra.items():
        m["spec"][k] = v
    return LLMDeployment.from_manifest(m)


class Sim:
    def __init__(self, fleet: str):
        self.nodes = fleet_nodes(load_fleet(fleet))
        self.objects: dict[tuple[str, str], dict] = {}
        self.to_delete: set[tuple[str, str]] = set()
        self.previous_status: dict = {}
        self.writes = 0

    def topology(self):
        return build_topology(self.nodes, ready_if_unknown=True)

    def pods(self):
        return [o for (k, _), o in self.objects.items() if k == "Pod"]

    def services(self):
        return [o for (k, _), o in self.objects.items() if k == "Service"]

    def kubelet(self) -> None:
        """One round of the scheduler/kubelet/garbage collector."""
        for key in list(self.to_delete):
            self.objects.pop(key, None)
        self.to_delete.clear()
        for (kind, _), o in self.objects.items():
            if kind == "Pod" and not o["spec"].get("schedulingGates"):
                o["spec"]["nodeName"] = o["metadata"]["annotations"]["meshplan.dev/assigned-node"]
                o["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    def step(self, model: LLMDeployment, replicas: int | None = None):
        self.kubelet()
        topo = self.topology()
        plan = plan_for_spec(model.spec, topo)
        inp = Inputs(name=model.name, namespace=model.namespace, uid="u-1", generation=1,
                     desired_replicas=model.spec.replicas if replicas is None else replicas, topology=topo,
                     pods=copy.deepcopy(self.pods()), services=copy.deepcopy(self.services()),
                     target=target_for(model.spec, plan, topo), previous_status=self.previous_status, now=NOW)
        out = decide(inp)
        # As the reconciler does: every object of `apply`, then (all of them written) the releases.
        releases = [(pod, None) for group in out.release for pod in group]
        for desired, live in list(out.apply) + releases:
            if needs_apply(desired, live):
                self.writes += 1
                key = (desired["kind"], desired["metadata"]["name"])
                obj = copy.deepcopy(desired)
                old = self.objects.get(key)
                obj["metadata"]["uid"] = old["metadata"]["uid"] if old else f"uid-{next(_uids)}"
                if old and desired["kind"] == "Pod":
                    assert obj["spec"]["containers"] == old["spec"]["containers"], "pod containers are immutable"
                    assert obj["spec"]["affinity"] == old["spec"]["affinity"], "pod affinity is immutable"
                    assert not (obj["spec"].get("schedulingGates") and not old["spec"].get("schedulingGates")), \
                        "a scheduling gate can only be removed"
                    obj["status"] = old.get("status", {})
                    obj["spec"]["nodeName"] = old["spec"].get("nodeName")
                self.objects[key] = obj
        for _, kind, name, _uid in out.delete:
            self.writes += 1
            o = self.objects.get((kind, name))
            if o is not None:
                o["metadata"]["deletionTimestamp"] = "now"
                self.to_delete.add((kind, name))
        self.previous_status = out.status
        return out

    def ready_groups(self) -> int:
        return sum(1 for g in live_groups(self.pods()).values() if g.ready())

    def condition(self, type_: str) -> dict:
        return next(c for c in self.previous_status["conditions"] if c["type"] == type_)


def converge(sim: Sim, model: LLMDeployment, rounds: int = 8, **kw):
    for _ in range(rounds):
        out = sim.step(model, **kw)
    return out


def test_new_deployment_becomes_available_with_whole_groups_in_one_domain():
    sim, model = Sim("gb200-nvl72"), llmd("NVIDIA-GB200", tensor=8, replicas=3)
    first = sim.step(model)
    created = [d for d, _ in first.apply if d["kind"] == "Pod"]
    assert len(created) == 3 * 2        # TP8 on 4-GPU trays: two pods per replica
    assert all(p["spec"]["schedulingGates"] == [{"name": GANG_GATE}] for p in created)
    converge(sim, model)
    assert sim.ready_groups() == 3
    assert sim.condition("Available")["status"] == "True"
    assert sim.previous_status["readyReplicas"] == 3
    for r in sim.previous_status["placement"]:
        assert "," not in r["nvlinkDomain"]          # one NVLink domain per replica
    for g in live_groups(sim.pods()).values():
        assert len({p.obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0] for p in g.pods.values()}) == 1


def test_converged_world_needs_zero_writes():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2)
    converge(sim, model)
    before = sim.writes
    out = sim.step(model)
    assert sim.writes == before
    assert not out.delete
    assert sim.condition("Progressing")["status"] == "False"


def test_last_transition_time_only_moves_on_status_change():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    sim.step(model)
    t0 = sim.condition("Planned")["lastTransitionTime"]
    sim.step(dataclasses.replace(model) if False else model)
    assert sim.condition("Planned")["lastTransitionTime"] == t0


def test_rolling_update_with_surge_never_drops_ready_replicas():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2)
    converge(sim, model)
    old_hash = {p["metadata"]["labels"][LABEL_PLAN_HASH] for p in sim.pods()}
    changed = llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2,
                   engine={"kind": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]})
    ready_seen = []
    for _ in range(14):
        sim.step(changed)
        ready_seen.append(sim.ready_groups())
        # never more than one surge group: 2 desired + 1
        assert len(live_groups(sim.pods())) <= 3
    hashes = {p["metadata"]["labels"][LABEL_PLAN_HASH] for p in sim.pods()}
    assert hashes and hashes.isdisjoint(old_hash)
    assert min(ready_seen) >= 2, ready_seen
    assert sim.ready_groups() == 2


def test_rolling_update_without_room_replaces_one_group_at_a_time():
    # 4 x TP8 fill the 4 HGX nodes: no room for a surge group.
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=4)
    converge(sim, model)
    assert sim.ready_groups() == 4
    changed = llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=4,
                   engine={"kind": "vllm", "env": [{"name": "X_DEBUG", "value": "1"}]})
    seen = []
    for _ in range(30):
        sim.step(changed)
        seen.append(sim.ready_groups())
    assert min(seen) >= 3, seen           # at most one replica down at a time
    assert sim.ready_groups() == 4
    assert len({p["metadata"]["labels"][LABEL_PLAN_HASH] for p in sim.pods()}) == 1


def test_lost_worker_restarts_the_whole_group():
    sim, model = Sim("gb200-nvl72"), llmd("NVIDIA-GB200", tensor=8, replicas=1)
    converge(sim, model)
    leader_uid = sim.objects[("Pod", "llama-r0-0")]["metadata"]["uid"]
    del sim.objects[("Pod", "llama-r0-1")]           # a worker pod is deleted
    out = sim.step(model)
    assert ("v1", "Pod", "llama-r0-0", leader_uid) in out.delete
    converge(sim, model)
    assert sim.ready_groups() == 1
    assert sim.objects[("Pod", "llama-r0-0")]["metadata"]["uid"] != leader_uid


def test_deleted_service_comes_back_and_edited_child_is_reapplied():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    converge(sim, model)
    del sim.objects[("Service", "llama")]
    sim.objects[("Pod", "llama-r0-0")]["metadata"]["labels"]["meshplan.dev/role"] = "edited"
    sim.step(model)
    assert ("Service", "llama") in sim.objects
    assert sim.objects[("Pod", "llama-r0-0")]["metadata"]["labels"]["meshplan.dev/role"] == "leader"


def test_no_plan_touches_nothing_and_says_why():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2)
    converge(sim, model)
    topo = sim.topology()
    inp = Inputs(name="llama", namespace="ns", uid="u-1", generation=2, desired_replicas=9, topology=topo,
                 pods=sim.pods(), services=sim.services(), target=None, planned_reason="InsufficientCapacity",
                 planned_message="needs 72 GPUs, 32 free", previous_status=sim.previous_status, now=NOW)
    out = decide(inp)
    assert not out.apply and not out.delete
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "InsufficientCapacity")
    assert "72" in planned["message"]
    assert out.status["readyReplicas"] == 2


def test_node_lost_moves_its_group_whole():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    converge(sim, model)
    node = sim.pods()[0]["spec"]["nodeName"]
    for n in sim.nodes:
        if n["metadata"]["name"] == node:
            n.setdefault("spec", {})["unschedulable"] = True
    converge(sim, model)
    assert sim.ready_groups() == 1
    assert sim.pods()[0]["spec"]["nodeName"] != node


def test_scale_down_removes_highest_groups_and_keeps_the_others_in_place():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=3)
    converge(sim, model)
    nodes_before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in sim.pods()}
    converge(sim, model, replicas=1)
    pods = sim.pods()
    assert [p["metadata"]["name"] for p in pods] == ["llama-r0-0"]
    assert pods[0]["spec"]["nodeName"] == nodes_before["llama-r0-0"]
    assert not [s for s in sim.services() if s["metadata"]["name"] in ("llama-r1", "llama-r2")]


@pytest.mark.parametrize("replicas", [0])
def test_zero_replicas_is_not_available(replicas):
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    converge(sim, model, replicas=replicas)
    assert not sim.pods()
    assert sim.condition("Available")["status"] == "False"


def test_group_the_scheduler_cannot_bind_is_placed_again_after_the_grace_period():
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=1)
    sim.step(model)
    sim.step(model)                      # released
    pod = sim.objects[("Pod", "llama-r0-0")]
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": "2025-12-31T23:59:30Z"}]}
    pod["spec"]["schedulingGates"] = []
    topo = sim.topology()
    plan = plan_for_spec(model.spec, topo)
    common = dict(name="llama", namespace="ns", uid="u-1", generation=1, desired_replicas=1, topology=topo,
                  pods=[pod], services=sim.services(), target=target_for(model.spec, plan, topo),
                  previous_status=sim.previous_status)
    young = decide(Inputs(now=NOW, **common))            # 30 s unschedulable: wait
    assert not young.delete
    old = decide(Inputs(now=NOW + timedelta(seconds=60), **common))
    assert [d[2] for d in old.delete] == ["llama-r0-0"]
    assert any(e[1] == "ReplicaRestarted" and "unschedulable" in e[2] for e in old.events)


def test_new_group_is_released_in_the_reconcile_that_creates_it():
    sim, model = Sim("gb200-nvl72"), llmd("NVIDIA-GB200", tensor=8, replicas=2)
    first = sim.step(model)
    created = [d for d, _ in first.apply if d["kind"] == "Pod"]
    assert all(p["spec"]["schedulingGates"] == [{"name": GANG_GATE}] for p in created)
    # One release per group, naming exactly that group's pods, without the gate.
    assert len(first.release) == 2
    released = [p["metadata"]["name"] for g in first.release for p in g]
    assert sorted(released) == sorted(p["metadata"]["name"] for p in created)
    for group in first.release:
        assert len({p["metadata"]["labels"]["meshplan.dev/replica"] for p in group}) == 1
        assert all(p["spec"]["schedulingGates"] == [] for p in group)
        # released pods keep the node they reserve
        assert all(p["metadata"]["annotations"]["meshplan.dev/assigned-node"] for p in group)
    sim.step(model)                      # the kubelet round binds them: no second trip to drop gates
    assert sim.ready_groups() == 2
    assert sim.condition("Available")["status"] == "True"


def test_interrupted_creation_never_releases_part_of_a_group():
    sim, model = Sim("gb200-nvl72"), llmd("NVIDIA-GB200", tensor=8, replicas=1)
    sim.step(model)
    # An operator killed after creating rank 0 only: rank 1 never written, nothing released.
    del sim.objects[("Pod", "llama-r0-1")]
    leader = sim.objects[("Pod", "llama-r0-0")]
    leader["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    leader["spec"].pop("nodeName", None)
    leader.pop("status", None)
    out = sim.step(model)
    assert ("v1", "Pod", "llama-r0-0", leader["metadata"]["uid"]) in out.delete     # the part goes whole
    assert not out.release
    assert all(d["spec"].get("schedulingGates") for d, _ in out.apply if d["kind"] == "Pod")
    converge(sim, model)
    assert sim.ready_groups() == 1


def test_conditions_state_what_holds_now_when_replicas_lack_a_place():
    """Issue 17 finding 10: with replicas short of GPUs the status said `Progressing=False/Complete:
    10000 replica(s) running` (18 ready) and `Degraded=False/AsPlanned`. 4 HGX nodes hold 4 TP8
    replicas of the 6 desired: each condition says so, with the numbers."""
    sim, model = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=4)
    first = sim.step(model, replicas=6)      # planned for 4, 6 desired (the autoscaler, kubectl scale)
    deg = sim.condition("Degraded")
    assert (deg["status"], deg["reason"]) == ("False", "ReplicasStarting"), deg
    assert deg["message"].startswith("0 of 6 replica(s) ready") and "2 without a place" in deg["message"]
    assert first.placement.unplaced
    converge(sim, model, replicas=6)
    assert sim.ready_groups() == 4
    prog, deg = sim.condition("Progressing"), sim.condition("Degraded")
    assert (prog["status"], prog["reason"]) == ("False", "InsufficientCapacity"), prog
    assert prog["message"] == "4 of 6 replica(s) of TP8 placed, 4 ready; 2 wait for free GPUs"
    assert (deg["status"], deg["reason"]) == ("True", "MissingReplicas"), deg
    assert deg["message"] == "4 of 6 replica(s) ready; 2 without a place (not enough free GPUs)"
    # all placed and ready: complete, with the count that is ready
    sim2, model2 = Sim("hgx-h100"), llmd("NVIDIA-H100-80GB-HBM3", tensor=8, replicas=2)
    converge(sim2, model2)
    prog = sim2.condition("Progressing")
    assert (prog["reason"], prog["message"]) == ("Complete", "2 of 2 replica(s) of TP8 ready")
    assert (sim2.condition("Degraded")["reason"], sim2.condition("Degraded")["status"]) == ("AsPlanned", "False")
