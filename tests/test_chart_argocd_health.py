"""docs/argocd-health.lua, run in Lua 5.1 (Argo CD's gopher-lua speaks 5.1) via lupa.

The fixtures are LLMDeployment statuses as meshplan's controller writes them
(conditions and reasons from operator/meshplan/controller/decide.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lupa import lua51  # the `test` extra; Lua 5.1 like Argo CD's gopher-lua

SCRIPT = (Path(__file__).resolve().parent.parent / "docs" / "argocd-health.lua").read_text()


def health(obj: dict) -> tuple[str, str]:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(SCRIPT)
    return hs["status"], hs["message"]


def cond(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def llmd(generation: int = 2, observed: int | None = 2, desired: int = 2, conditions=None) -> dict:
    obj = {"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
           "metadata": {"name": "m", "generation": generation}}
    if conditions is not None:
        obj["status"] = {"conditions": conditions, "desiredReplicas": desired}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


RUNNING = [cond("Planned", "True", "PlanChosen", "TP4"), cond("Placed", "True", "AllReplicasPlaced"),
           cond("Available", "True", "ReplicasReady", "2 of 2 replica(s) ready"),
           cond("Progressing", "False", "Complete"), cond("Degraded", "False", "AsPlanned"),
           cond("ScalingLimited", "False", "WithinCapacity")]


def replace(conds, new):
    return [new if c["type"] == new["type"] else c for c in conds]


@pytest.mark.parametrize("obj, want_status, want_in_message", [
    (llmd(conditions=None), "Progressing", "Waiting"),
    (llmd(generation=3, observed=2, conditions=RUNNING), "Progressing", "generation 3"),
    (llmd(observed=None, conditions=RUNNING), "Progressing", "generation 2"),
    (llmd(conditions=RUNNING), "Healthy", "2 of 2"),
    (llmd(conditions=replace(RUNNING, cond("Planned", "False", "InsufficientCapacity", "needs 8 GPUs, 4 free"))),
     "Degraded", "InsufficientCapacity: needs 8 GPUs, 4 free"),
    (llmd(conditions=[cond("Planned", "False", "InvalidSpec", "spec.gpus.maxGpus: too small")]),
     "Degraded", "InvalidSpec"),
    (llmd(conditions=replace(RUNNING, cond("Degraded", "True", "MissingReplicas", "1 of 2 replica(s) ready"))),
     "Degraded", "MissingReplicas"),
    (llmd(conditions=replace(RUNNING, cond("Placed", "False", "InsufficientCapacity", "1 of 2 replica(s) have no place"))),
     "Degraded", "no place"),
    (llmd(conditions=replace(replace(RUNNING, cond("Available", "False", "ReplicasNotReady", "0 of 2")),
                             cond("Progressing", "True", "CreatingReplicas", "starting 2"))),
     "Progressing", "CreatingReplicas"),
    (llmd(conditions=replace(RUNNING, cond("Progressing", "True", "RollingUpdate", "replacing 1"))),
     "Progressing", "RollingUpdate"),
    (llmd(desired=0, conditions=replace(RUNNING, cond("Available", "False", "NoReplicas", "0 of 0"))),
     "Suspended", "zero"),
], ids=["no-status", "older-generation", "no-observed-generation", "healthy", "no-capacity", "invalid-spec",
        "missing-replica", "unplaced-replica", "starting", "rolling", "scaled-to-zero"])
def test_health(obj, want_status, want_in_message):
    status, message = health(obj)
    assert status == want_status
    assert want_in_message in message
