"""Latency of one continuous-batching replica as a function of its load.

Shared by the autoscaling simulator (benchmarks/autoscale_sim.py) and the
synthetic engine exporter used in e2e (e2e/exporter.py), so that what the
policy sees in the simulator and in the cluster behaves the same way.

Model (per replica, open-loop Poisson arrivals at `rps`):

- A request holds one of `max_num_seqs` batch slots for its service time
  S(N) = TTFT0(N) + output_tokens * TPOT(N), where N is the number of running
  sequences. TPOT(N) = tpot_base + tpot_per_seq * N (a decode step gets
  slower as the batch grows) and TTFT0(N) = prefill + prefill_per_seq * N
  (a new prompt waits behind, and interleaves with, the running batch).
- N follows from Little's law, N = rps * S(N), which is linear in N and has a
  closed form; when it reaches `max_num_seqs` the replica is saturated and
  serves at most max_num_seqs / S(max_num_seqs) requests/s.
- Queueing for a slot uses Erlang C with c = max_num_seqs servers of service
  time S(max): p99 wait = ln(C / 0.01) / (c*mu - rps) when C > 1 %.
- Percentiles: p99 TTFT = ttft_tail_factor * TTFT0(N) + p99 wait (+ the time
  to drain a backlog that built up while arrivals exceeded the maximum rate);
  p99 ITL = itl_tail_factor * TPOT(N). The tail factors are assumptions
  (prefill chunks stall some decode steps; prompt lengths vary), not fits.

Default coefficients: a least-squares fit to the measured serving runs of
Llama-3.1-70B FP8 on 4x H100 SXM (TP4) with vLLM, ISL 1024 / OSL 1024, at
concurrency 4-64 (rows 2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c{4,8,16,32,64}_tp4_*
of /work/shared/data/calibration/silicon_calibration.csv, from NVIDIA
AIConfigurator's silicon data): TPOT 11.8/12.1/13.2/16.5/19.5 ms and TTFT
81/96/121/175/256 ms. max_num_seqs 64 is the largest measured concurrency.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

CALIBRATION_SOURCE = (
    "silicon_calibration.csv rows 2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c{4..64}_tp4 "
    "(NVIDIA AIConfigurator silicon data): Llama-3.1-70B FP8, vLLM, TP4 on H100 SXM, ISL/OSL 1024"
)


@dataclass(frozen=True)
class ReplicaLatency:
    running: float          # mean running sequences
    saturated: bool
    ttft_p99_s: float
    itl_p99_s: float
    ttft_mean_s: float
    itl_mean_s: float


@dataclass(frozen=True)
class ReplicaModel:
    tpot_base_s: float = 0.0110
    tpot_per_seq_s: float = 0.000135
    prefill_s: float = 0.070
    prefill_per_seq_s: float = 0.0029
    max_num_seqs: int = 64
    output_tokens: int = 1024
    ttft_tail_factor: float = 2.0
    itl_tail_factor: float = 1.25
    gpus: int = 4
    source: str = CALIBRATION_SOURCE

    def tpot_s(self, running: float) -> float:
        return self.tpot_base_s + self.tpot_per_seq_s * running

    def ttft0_s(self, running: float) -> float:
        return self.prefill_s + self.prefill_per_seq_s * running

    def service_s(self, running: float) -> float:
        return self.ttft0_s(running) + self.output_tokens * self.tpot_s(running)

    @property
    def max_rps(self) -> float:
        """Most requests/s one replica completes (all slots busy)."""
        return self.max_num_seqs / self.service_s(self.max_num_seqs)

    def running_at(self, rps: float) -> float:
        """Mean running sequences at `rps` (Little's law fixed point, capped at the slots)."""
        if rps <= 0:
            return 0.0
        fixed = self.prefill_s + self.output_tokens * self.tpot_base_s
        growth = self.prefill_per_seq_s + self.output_tokens * self.tpot_per_seq_s
        denom = 1.0 - rps * growth
        if denom <= 0:
            return float(self.max_num_seqs)
        return min(float(self.max_num_seqs), rps * fixed / denom)

    def wait_p99_s(self, rps: float) -> float:
        """p99 wait for a batch slot (Erlang C, c = max_num_seqs); inf when saturated."""
        c = self.max_num_seqs
        mu = 1.0 / self.service_s(c)
        if rps >= c * mu:
            return math.inf
        a = rps / mu
        erlang_b = 1.0
        for k in range(1, c + 1):
            erlang_b = a * erlang_b / (k + a * erlang_b)
        rho = a / c
        erlang_c = erlang_b / (1.0 - rho * (1.0 - erlang_b))
        if erlang_c <= 0.01:
            return 0.0
        return math.log(erlang_c / 0.01) / (c * mu - rps)

    def latency(self, rps: float, backlog_drain_s: float = 0.0) -> ReplicaLatency:
        """Latency of one replica offered `rps`; `backlog_drain_s` adds a FIFO backlog's delay."""
        running = self.running_at(rps)
        saturated = rps >= self.max_rps
        wait = 0.0 if saturated else self.wait_p99_s(rps)
        if math.isinf(wait):
            wait, saturated = 0.0, True
        ttft_mean = self.ttft0_s(running) + backlog_drain_s
        return ReplicaLatency(
            running=running,
            saturated=saturated,
            ttft_p99_s=self.ttft_tail_factor * self.ttft0_s(running) + wait + backlog_drain_s,
            itl_p99_s=self.itl_tail_factor * self.tpot_s(running),
            ttft_mean_s=ttft_mean,
            itl_mean_s=self.tpot_s(running),
        )

    def capacity_at_slo(self, ttft_target_s: float | None, itl_target_s: float | None) -> float:
        """Largest requests/s one replica serves with p99 TTFT and ITL within target (bisection)."""

        def ok(rps: float) -> bool:
            lat = self.latency(rps)
            if lat.saturated:
                return False
            return (ttft_target_s is None or lat.ttft_p99_s <= ttft_target_s) and (
                itl_target_s is None or lat.itl_p99_s <= itl_target_s
            )

        lo, hi = 0.0, self.max_rps
        if not ok(1e-9):
            return 0.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def concurrency_at_slo(self, ttft_target_s: float | None, itl_target_s: float | None) -> float:
        return self.running_at(self.capacity_at_slo(ttft_target_s, itl_target_s))


@dataclass(frozen=True)
class FleetStep:
    """One time step of a deployment of `ready` identical replicas sharing arrivals evenly."""

    served: float                   # requests completed this step
    backlog: float                  # requests waiting beyond all batch slots after the step
    per_replica_rps: float          # offered to each ready replica (capped at its maximum)
    utilisation: float              # offered load / what the ready replicas can serve, capped at 1
    latency: ReplicaLatency | None  # None when no replica is ready


def step_fleet(model: ReplicaModel, arrivals: float, ready: int, backlog: float, dt_s: float) -> FleetStep:
    """Advance a fleet by `dt_s` with `arrivals` new requests (fluid FIFO backlog beyond the slots).

    Arrivals beyond what the ready replicas can complete in the step wait in a
    backlog; its drain time at full speed is added to TTFT. The simulator and
    the e2e exporter both advance their fleets with this function.
    """
    if ready <= 0:
        return FleetStep(served=0.0, backlog=backlog + arrivals, per_replica_rps=0.0, utilisation=1.0, latency=None)
    max_rps = model.max_rps
    capacity = ready * max_rps * dt_s
    served = min(backlog + arrivals, capacity)
    left = backlog + arrivals - served
    per_replica = min(arrivals / dt_s / ready, max_rps)
    latency = model.latency(per_replica, backlog_drain_s=left / (ready * max_rps))
    utilisation = min(1.0, (arrivals + backlog) / capacity)
    return FleetStep(served=served, backlog=left, per_replica_rps=per_replica, utilisation=utilisation, latency=latency)


def poisson_sample(rng: random.Random, lam: float) -> int:
    """A Poisson(`lam`) count: Knuth's product method, the normal approximation above 50
    (plenty for request counts per step). Arrivals in the simulator, completions in the exporter."""
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
