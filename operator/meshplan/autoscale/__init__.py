"""SLO autoscaling of DP replica groups.

- `promql`: safe PromQL for one deployment's engine metrics (per engine, overridable).
- `snapshot`: the `MetricsSnapshot` value and the pure check of its sanity.
- `source`: `PrometheusSource`, the only part that talks to the network.
- `policy`: `decide(...)`, the pure scaling decision (windows, cooldown, capacity).
- `roles`: `decide_roles(...)`, per-role decisions of a prefill/decode disaggregated deployment (through
  `policy.decide`) within the plan's P:D ratio bounds (not wired into the operator yet).
- `capacity`: how many whole replica groups still fit free NVLink domains.
- `queueing`: the replica latency model shared by the simulator and the e2e exporter.
"""
