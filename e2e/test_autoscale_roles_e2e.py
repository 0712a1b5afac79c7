"""Per-role autoscaling of a disaggregated deployment end to end (issue 19): real control plane, real
Prometheus, `meshplan run` as a process with the Helm chart's RBAC (e2e/chart_credentials.py).

A DeepSeek-R1 deployment with `spec.serving.disaggregation: enabled`, pinned to TP8, on a private kwok fleet of
8 HGX H200 nodes with `rdma/ib` (as e2e/test_disagg.py's 6, plus room: the decode role may ask for a third group,
below; with 6 nodes, 4 prefill + 2 decode groups filled the fleet exactly and the second decode group, created and
released, was not Ready within 2 minutes in one run: not explained yet), with spec.autoscaling.enabled and short up windows.
kwok pods run nothing: each role's engines are one synthetic vLLM exporter (e2e/exporter.py's SyntheticEngine
through e2e/autoscale_fleet.FollowingFleet with `role`), whose series carry the role label the chart's PodMonitor
gives them (`meshplan_dev_serving_role`) and whose replica count follows the READY groups of that role the
operator made; Prometheus scrapes both every second. Latency, queue and KV usage come from the calibrated replica
model (`autoscale.queueing.ReplicaModel`), not from the planner the operator sizes with.

1. A heavier prompt load on the prefill exporter (prompts ten times longer to prefill and twelve times as many:
   TTFT p99 above the 2 s target) scales the prefill groups and not the decode groups, within two up windows;
   then the prompt load goes back and the prefill role settles within its SLO.
2. Longer outputs on the decode exporter (OSL 256 -> 1024 at 8 req/s: more requests running, each holding more
   KV cache; its vllm:kv_cache_usage_perc goes from 0.2 to 1.0, ITL stays inside the SLO) scale the decode
   groups and not the prefill groups, within two up windows (0.53 used with two decode groups).

Prefill first: a role the P:D bounds hold back resumes when the other role grows (autoscale.roles, rule 2), so
the role that scaled is let settle before the other one's phase; in an earlier order (decode first) the decode
role's load sizing (its capacity learned at the KV breach, times the burst headroom it learned from the rate's
noise) asked for a third decode group that the bounds allowed only once prefill grew.

The down window is long (the test watches scale-ups; a scale-down during it would move the other role's count
for a reason the test is not about). The InferencePool CRDs are not installed: Routed=False says so and the
groups deploy all the same (e2e/test_disagg.py covers the pool).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest

from e2e.reliability import kit
from e2e.test_autoscale import fleets  # noqa: F401 - the fixture that stops the synthetic fleets a test started
from meshplan.autoscale.queueing import ReplicaModel
from meshplan.render.inference_pool import LABEL_SERVING_ROLE

pytestmark = [pytest.mark.e2e]
GLOB = "mppdas-*"
H200 = "NVIDIA-H200"
EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.6.0"
UP_WINDOW_S = 10
INTERVAL_S = 2.5          # controller.autoscaling.evaluation_interval_s(10 s)
TWO_WINDOWS_S = 2 * UP_WINDOW_S + 2 * INTERVAL_S + 5     # as e2e/test_autoscale.py allows
KV_TOKENS = 131072        # the decode exporter's KV pool per replica: 0.20 used at OSL 256, full at 1024 with one
                          # decode group, 0.53 with two
RATE_WINDOW_S = 30        # controller.autoscaling.rate_window_s(10 s)

fleet_mod = None


def _fleet_mod():
    global fleet_mod
    if fleet_mod is None:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("e2e_autoscale_fleet_roles",
                                                      Path(__file__).with_name("autoscale_fleet.py"))
        fleet_mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fleet_mod)
    return fleet_mod


@pytest.fixture(scope="module")
def gpus(cluster):
    kit.ensure_crd(cluster)
    # 8 nodes (64 GPUs): room for a decode group beyond the ones the test asks for (see the module doc)
    f = kit.Fleet(cluster, "rel-pdscale", [kit.h200_ib_group("rel-pdscale-a", 8)])
    f.add()
    yield f
    f.delete()


@pytest.fixture(scope="module")
def op(cluster, gpus, request):
    yield from kit.serve_module(cluster, request, GLOB, "--prometheus-url", cluster.prometheus_url, log_lines=200)


@pytest.fixture
def ns(cluster, op, request):
    import uuid

    name = kit.namespace(cluster, "mppdas", f"{request.node.name[5:25]}-{uuid.uuid4().hex[:6]}")
    yield name
    kit.drop_namespace(cluster, name)




def manifest(name: str) -> dict[str, Any]:
    m = kit.pinned(name, "rel-pdscale", H200, tensor=8, replicas=1, max_gpus=64)
    m["spec"]["model"] = {"name": "deepseek-r1", "weights": {"uri": "hf://deepseek-ai/DeepSeek-R1"}}
    m["spec"]["precision"] = {"weights": "fp8", "kvCache": "fp8"}
    m["spec"]["engine"] = {"kind": "vllm"}
    m["spec"]["parallelism"] = {"tensor": 8, "expert": 1, "pipeline": 1}
    m["spec"]["serving"] = {"disaggregation": "enabled", "router": {"image": EPP_IMAGE}}
    m["spec"]["workload"] = {"inputTokens": 1024, "outputTokens": 256}
    m["spec"]["slo"] = {"ttftMs": 2000, "itlMs": 50, "percentile": 99}
    m["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3,
                                "upWindowSeconds": UP_WINDOW_S, "downWindowSeconds": 600, "cooldownSeconds": 10,
                                "upThreshold": 1.0, "downThreshold": 0.8,
                                # no burst headroom before a rise was seen: with the default +150 % the
                                # learned capacity of the first breach asks for 4 groups at once, and a role
                                # held at the P:D bound would follow the other role's growth later
                                "initialBurstHeadroom": 0}
    return m


def _roles(o: dict[str, Any]) -> dict[str, Any]:
    return (((o or {}).get("status") or {}).get("autoscaling") or {}).get("roles") or {}


def _to(o: dict[str, Any], role: str) -> int | None:
    return (_roles(o).get(role) or {}).get("toReplicas")


def _role_pods(cluster, ns: str, name: str) -> dict[str, int]:
    out = {"prefill": 0, "decode": 0}
    for p in kit.pods(cluster, ns):
        labels = p["metadata"].get("labels") or {}
        if labels.get("meshplan.dev/deployment") == name and not p["metadata"].get("deletionTimestamp") \
                and labels.get(LABEL_SERVING_ROLE) in out:
            out[labels[LABEL_SERVING_ROLE]] += 1
    return out


def _show(cluster, ns: str, name: str, fl: dict) -> dict:
    o = kit.get(cluster, ns, "llmd", name) or {}
    st = o.get("status") or {}
    pods = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"),
             [g.get("name") for g in p["spec"].get("schedulingGates") or []],
             [(c["type"], c["status"], c.get("reason")) for c in p["status"].get("conditions") or []])
            for p in kit.pods(cluster, ns)]
    return {"ready": {r: f.ready_replicas for r, f in fl.items()}, "pods": _role_pods(cluster, ns, name),
            "pod_states": pods,
            "autoscaling": st.get("autoscaling"), "disaggregation": st.get("disaggregation"),
            "conditions": [(c["type"], c["status"], c["reason"], c["message"][:200]) for c in st.get("conditions") or []],
            "exporters": {r: f.engine.state() for r, f in fl.items()}}


def _wait(pred, timeout_s: float, what: str, show=lambda: None):
    from e2e.operator_runner import wait_until

    v = wait_until(pred, timeout_s)
    if not v:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {json.dumps(show())[:4000]}")
    return v


def _steady(cluster, ns: str, name: str, fl: dict, prefill: int, decode: int, timeout_s: float = 150) -> dict:
    def check():
        o = kit.get(cluster, ns, "llmd", name) or {}
        a = ((o.get("status") or {}).get("autoscaling") or {})
        ok = (fl["prefill"].ready_replicas == prefill and fl["decode"].ready_replicas == decode
              and _to(o, "prefill") == prefill and _to(o, "decode") == decode and a.get("metricsHealthy")
              and (_roles(o).get("prefill") or {}).get("metricsHealthy")
              and kit.cond(o, "ScalingActive").get("status") == "True")
        return o if ok else None
    return _wait(check, timeout_s, f"{ns}/{name} steady at {prefill} prefill + {decode} decode group(s) with "
                 "healthy metrics", lambda: _show(cluster, ns, name, fl))


def _events(cluster, ns: str, name: str, reason: str) -> list[str]:
    return [e.get("message", "") for e in kit.events(cluster, ns, name) if e.get("reason") == reason]


def _scales_alone(cluster, ns: str, name: str, fl: dict, role: str, before: int, other: str, other_count: int,
                  why: str) -> dict:
    """Wait (two up windows at most) for `role` to scale above `before` while `other` stays at `other_count` at every
    poll, then for the role's ScaledUp event; the LLMDeployment of the scale-up."""
    t0 = time.monotonic()
    seen: list = []

    def up():
        o = kit.get(cluster, ns, "llmd", name) or {}
        seen.append((round(time.monotonic() - t0, 1), _to(o, other),
                     ((_roles(o).get(other) or {}).get("reason") or "")[:200]))
        return o if (_to(o, role) or 0) > before else None
    o = _wait(up, TWO_WINDOWS_S, f"the {role} groups to scale up", lambda: _show(cluster, ns, name, fl))
    after = time.monotonic() - t0
    print(f"{role} {before} -> {_to(o, role)} {after:.1f}s after {why}: {_roles(o)[role].get('reason', '')[:300]}")
    assert after <= TWO_WINDOWS_S
    assert {x for _, x, _ in seen} == {other_count}, seen
    _wait(lambda: any(m.startswith(f"{role} groups scaled from {before} to") for m in _events(cluster, ns, name,
                                                                                              "ScaledUp")),
          10, f"the {role} ScaledUp event", lambda: [(e.get("reason"), e.get("message", "")[:200])
                                                    for e in kit.events(cluster, ns, name)][-10:])
    return o


def test_each_role_scales_on_its_own_signals_and_not_the_other(cluster, ns, fleets):
    name = "r1-as"
    kit.apply(cluster, ns, manifest(name))
    o = _wait(lambda: (lambda o: o if o and ((o.get("status") or {}).get("disaggregation") or {}).get("prefill", {})
                       .get("desiredReplicas") else None)(kit.get(cluster, ns, "llmd", name)), 90,
              "the disaggregated plan", lambda: (kit.get(cluster, ns, "llmd", name) or {}).get("status"))
    d = o["status"]["disaggregation"]
    p0, d0 = d["prefill"]["desiredReplicas"], d["decode"]["desiredReplicas"]
    assert d0 == 1 and d["disaggregated"] is True, d
    print(f"plan {d['label']} (P:D {d['ratio']}): {p0} prefill + {d0} decode group(s) to start")

    # decode: 8 req/s on slots that never run out (ITL flat at 13.7 ms), so the KV pool is the pressure; a load
    # this size keeps the rate's noise (Poisson, over the 30 s window) small beside the capacity the first KV
    # breach teaches (the load per group at the breach): at 1 req/s the policy's burst memory learned +90 %
    # "rises" from noise and the decode role then asked for a third group at the plain load
    decode_model = ReplicaModel(output_tokens=256, tpot_per_seq_s=0.0, prefill_per_seq_s=0.0, max_num_seqs=1024)
    prefill_model = ReplicaModel(output_tokens=1, max_num_seqs=6)    # a prefill worker emits one token
    mod = _fleet_mod()
    fl = {
        "prefill": mod.FollowingFleet(cluster, ns, name, role="prefill", rps=1.0, ttft_target_s=2.0,
                                      itl_target_s=0.05, model=prefill_model).start(),
        "decode": mod.FollowingFleet(cluster, ns, name, role="decode", rps=8.0, ttft_target_s=2.0,
                                     itl_target_s=0.05, model=decode_model, kv_tokens_per_replica=KV_TOKENS).start(),
    }
    fleets.extend(fl.values())
    started = time.monotonic()
    o = _steady(cluster, ns, name, fl, p0, d0)
    # the request rate is a rate over RATE_WINDOW_S: a breach before the window holds the exporters' series would
    # teach a role a capacity below the real one (the policy learns the load per group at the breach), and that
    # role would then ask for more groups at the plain load
    time.sleep(max(0.0, RATE_WINDOW_S + 5 - (time.monotonic() - started)))
    o = kit.get(cluster, ns, "llmd", name)
    assert o["status"]["replicas"] == 1 and o["status"]["readyReplicas"] == 1       # decode groups (scale subresource)
    roles = _roles(o)
    assert "kvCacheUsage" in roles["decode"] and "kvCacheUsage" not in roles["prefill"], roles

    # 1. a heavier prompt load on the prefill exporter (prompts ten times longer to prefill, twelve times as
    # many): TTFT p99 above the 2 s target
    fl["prefill"].engine.set_model(replace(prefill_model, prefill_s=0.7))
    fl["prefill"].set_load(12.0)
    o = _scales_alone(cluster, ns, name, fl, "prefill", p0, "decode", d0, "the prompt load rose")
    p1 = _to(o, "prefill")
    # the reconciler acts on it: more prefill groups, the decode group untouched
    _wait(lambda: (lambda c: c["decode"] == d0 and c["prefill"] >= p1)(_role_pods(cluster, ns, name)), 120,
          f"at least {p1} prefill groups beside {d0} decode", lambda: _show(cluster, ns, name, fl))
    o = kit.get(cluster, ns, "llmd", name)
    assert _to(o, "decode") == d0 and o["status"]["replicas"] == d0

    # the prompt load goes back to what it was: the prefill role settles (the long down window keeps its groups)
    fl["prefill"].engine.set_model(prefill_model)
    fl["prefill"].set_load(1.0)

    def settled(role: str):
        def check():
            o = kit.get(cluster, ns, "llmd", name) or {}
            r = _roles(o).get(role) or {}
            n = _to(o, role)
            return o if (r.get("reason", "").startswith(("WithinSLO", "ScaleDownPending"))
                         and fl[role].ready_replicas == n and _role_pods(cluster, ns, name)[role] == n) else None
        return check
    o = _wait(settled("prefill"), 90, "the prefill role within its SLO", lambda: _show(cluster, ns, name, fl))
    p2 = _to(o, "prefill")

    # 2. longer outputs on the decode exporter: its KV usage rises past the 0.9 high-watermark
    fl["decode"].engine.set_model(replace(decode_model, output_tokens=1024))
    o = _scales_alone(cluster, ns, name, fl, "decode", d0, "prefill", p2, "the outputs grew")
    d1 = _to(o, "decode")
    _wait(lambda: fl["decode"].ready_replicas >= d1 and (lambda c: c["prefill"] == p2 and c["decode"] >= d1)(
          _role_pods(cluster, ns, name)), 120, f"{d1} ready decode groups beside {p2} prefill",
          lambda: _show(cluster, ns, name, fl))
    o = kit.get(cluster, ns, "llmd", name)
    # the scale subresource's status counts decode groups; the prefill groups did not move
    assert o["status"]["replicas"] == _to(o, "decode") >= d1 and _to(o, "prefill") == p2
