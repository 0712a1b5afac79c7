"""Whole replica groups that still fit free NVLink domains, via the real placement."""

from __future__ import annotations

from _gpu_nodes import gpu_node, gpu_pod, hgx_h100

from meshplan.autoscale.capacity import count_fitting, replica_capacity
from meshplan.autoscale.policy import AutoscaleConfig, AutoscaleState, decide
from meshplan.autoscale.snapshot import MetricsSnapshot
from meshplan.placement import request_for_layout
from meshplan.planner.types import Layout
from meshplan.topology import build_topology


def test_counts_whole_tp4_groups_on_partly_used_nodes() -> None:
    # two 8-GPU domains; other workloads use 5 GPUs on one and 1 on the other
    topo = build_topology(hgx_h100(2), pods=[gpu_pod("other-a", "hgx-0", 5), gpu_pod("other-b", "hgx-1", 1)])
    req = request_for_layout(Layout(tp=4), gpus_per_node=8)
    fits, trial = count_fitting(req, topo, current=0, upper=10)
    # hgx-0 has 3 free (no TP4 group), hgx-1 has 7 free (one group): never a split group
    assert fits == 1
    assert all(len({p.node for p in r.pods}) == 1 for r in trial.placed)


def test_running_replicas_keep_their_place_and_upper_bounds() -> None:
    topo = build_topology(hgx_h100(4))
    req = request_for_layout(Layout(tp=8), gpus_per_node=8)
    fits, _ = count_fitting(req, topo, current=1, upper=10, existing={0: ["hgx-0"]})
    assert fits == 3
    fits, _ = count_fitting(req, topo, current=1, upper=2, existing={0: ["hgx-0"]})
    assert fits == 2


def test_capacity_feeds_the_policy_scaling_limited_message() -> None:
    nodes = hgx_h100(2) + [gpu_node("small", gpus=4)]
    topo = build_topology(nodes, pods=[gpu_pod("other", "hgx-1", 2)])
    req = request_for_layout(Layout(tp=8), gpus_per_node=8)
    cap = replica_capacity(req, topo, current=0, max_replicas=6, requests_per_s_at_slo=1.0)
    assert cap.additional_replicas_that_fit == 1 and cap.gpus_per_replica == 8
    hot = MetricsSnapshot(ok=True, ttft_s=3.0, itl_s=0.02, request_rate_per_s=4.0, queue_depth=0, running=10,
                          sample_age_s=1.0)
    cfg = AutoscaleConfig(min_replicas=0, max_replicas=6, ttft_target_s=1.0)
    # the request rate alone needs more: the first evaluation scales (no up window)
    d = decide(AutoscaleState(desired_replicas=0), hot, cfg, cap, 0.0)
    assert d.desired_replicas == 1
    limited = [c for c in d.conditions if c.type == "ScalingLimited"][0]
    assert limited.status == "True" and "hgx-1=6" in limited.message and "small=4" in limited.message
