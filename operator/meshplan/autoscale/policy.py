"""The SLO autoscaling decision: how many DP replica groups, now (pure).

`decide(state, snapshot, config, capacity, now) -> Decision` is a pure
function: the controller passes the clock, the metrics it fetched, the
planner's per-replica capacity and how many whole replica groups still fit the
free NVLink domains, and stores `Decision.state` (JSON) in the deployment's
status for the next evaluation.

Signals
- SLO ratio = observed percentile / target, for TTFT and ITL (each only when
  the SLO sets a target). An idle deployment has no latency samples: ratio 0.
- KV pressure (only with `kv_high_watermark` set; off by default, so an
  aggregated deployment never reads it): KV-cache usage of the fullest replica
  / the high-watermark, as a third ratio named "kv" with the same thresholds
  (above 1.0 asks for a replica, below `down_threshold` allows one less). A KV
  breach is read like an ITL breach (a replica's steady load: the KV cache
  holds the running batch), so it is learned from. Used by the decode role of
  a disaggregated deployment (`autoscale.roles`).
- Demand = completed requests/s + queued requests / `queue_drain_s`. Completed
  requests alone under-read demand when replicas are saturated (they complete
  at most what they can serve); the queue term is what is piling up.
- Replicas the load needs = demand x (1 + burst headroom, below) /
  (per-replica capacity at SLO x `target_load_fraction`), from the planner's
  requests/s at SLO and/or its concurrency at SLO (running + queued /
  concurrency, with the same headroom), whichever needs more.
  Learning the real capacity: when the planner was optimistic, scaling down to
  what it says the load needs breaks the SLO again, and the fleet would
  oscillate. So a latency breach that lasts a whole up window with all
  replicas ready, and is either an ITL breach (ITL follows the batch a replica
  runs, i.e. its steady load) or comes within two down windows of a
  scale-down (the scale-down caused it), makes the peak load per replica seen
  during the breach the capacity estimate. TTFT breaches at other times are
  not learned from: TTFT also carries transient queueing (a burst that is over
  still fills a 2 m p99), and learning from those pinned the fleet high in
  the simulator. The estimate rises again when all ready replicas serve more
  per replica within the SLO. One learned from a TTFT bounce also drifts back
  to the planner's with a half-life of `capacity_half_life_s` (2 h): a burst
  misread as capacity costs hours, not the rest of the day, while a truly
  optimistic TTFT prediction is re-learned after one breach an hour or so
  later. ITL-learned estimates do not drift (ITL is not fooled by bursts).
- Burst headroom, learned. A new replica serves only minutes after it is
  asked for, so the replicas ready when a burst starts must carry it alone
  until then. The policy measures how fast this deployment's load rises:
  rise now = (demand - the lowest demand of the last `burst_horizon_s`) /
  that lowest demand (at least one replica's requests/s at SLO, so a rise
  from near idle is not read as +1000 %), and remembers the largest rise of
  the last `burst_memory_s` (a day: traffic is diurnal) as two half-day
  maxima. Demand is then sized x (1 + max(rise now, remembered rise)): the
  fleet carries the largest rise seen while new replicas start, and in a
  burst it sizes for a second one on top (bursts overlap). Rises are
  remembered only while nothing is queued (a saturated fleet completes what
  it can, not what is offered, and a draining backlog would read as a
  burst), and count at most +400 % (MAX_BURST_RISE). Before the
  deployment has shown its traffic, `initial_burst_rise` stands in, halving
  every `initial_burst_half_life_s`: an unwatched deployment is assumed
  bursty, a watched one is sized for what it showed.

Rules, in order
1. Replica bounds first: a count outside [min, max] (the spec changed) is
   corrected at once, whatever the metrics.
2. Untrusted metrics (`snapshot.assess`: Prometheus down, stale scrapes,
   NaN/Inf/negative, no latency samples while serving) hold the current count,
   reset both windows and set `ScalingActive=False` with the reason. Missing
   data never scales down, and never to zero. A signal whose query found no
   series (`snapshot.missing`) degrades alone: the others are used,
   `ScalingActive=True/MetricsPartial` names it, and there is no scale-down
   while a signal the scale-down checks read is missing (`_down_blind`).
3. Scale up when any SLO ratio is above `up_threshold`, or the load needs more
   replicas than there are, continuously for `up_window_s`. Jump straight to
   max(current + 1, replicas the load needs), at most `max_step_up` at once.
   When the request rate (plus queue) alone needs more replicas, do not wait
   for the window: the rate is already a window's average, and waiting
   another window only adds lag while a burst runs on the ready replicas.
   Latency and in-flight counts (noisier, instantaneous) still wait it.
   While an earlier scale-up is still starting (ready < desired), only the
   load may ask for more: the latency it sees predates the new replicas.
4. Scale down when every SLO ratio is below `down_threshold` and the load
   needs fewer replicas even with `load_down_margin` to spare, continuously
   for the longer `down_window_s`; go to that count, at most `max_step_down`
   at once, never below min, and to zero only when min is 0 and there is no
   traffic at all. The margin is a dead band: without it, rate noise at the
   edge of a count adds a replica (at once, rule 3) and removes it again.
5. At most one change per `cooldown_s`.
6. Only whole replica groups that fit free NVLink domains count
   (`ReplicaCapacity.additional_replicas_that_fit`): if the wanted count does
   not fit, scale to what fits and set `ScalingLimited=True` with the numbers;
   likewise at `max_replicas`.

Defaults (production values; all overridable)
- up_window 60 s: two to four evaluations at a 15-30 s timer, over a 2 m rate
  window: long enough to ignore one slow batch, short against the minutes a
  replica takes to load weights.
- down_window 300 s: the HPA's default scale-down stabilisation window
  (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#stabilization-window).
- cooldown 120 s; up_threshold 1.0 (the target itself); max_step_up 4,
  max_step_down 1 (adding is urgent, removing is not).
- down_threshold 0.8: latency has a floor (ITL at batch 1 is often 50-70 % of
  an interactive ITL target), so a lower threshold such as 0.6 can forbid any
  scale-down; the capacity check (load must need fewer replicas) is the main
  guard, the latency threshold the second.
- target_load_fraction 0.8: size to 80 % of the capacity at SLO (on top of
  the burst headroom): latency near the knee is steep (queueing) and arrivals
  are noisy over seconds.
- burst_horizon_s 300: a replica's start (weights, CUDA graphs: minutes) plus
  an evaluation or two; burst_memory_s 86400 (a day).
- initial_burst_rise 1.5, halving every 4 h (initial_burst_half_life_s): until
  it has watched the load, assume it can reach 2.5x within a replica start.
  This one is fitted to the simulator (benchmarks/autoscale_sim.py): with 1.0
  it missed one 10 s step (99.997 %), where two bursts stacked (x2.75 in four
  minutes) 34 minutes into a day, before any rise had been seen.
- load_down_margin 0.1: about two standard deviations of a 2 m request rate
  at a few requests/s.
- queue_drain_s 60; metrics older than 90 s are stale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from meshplan.autoscale.snapshot import METRICS_PARTIAL, MetricsSnapshot, assess
from meshplan.planner.types import SLO

# Decision reasons (machine-readable).
SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"
BOUNDS_CORRECTED = "ReplicaBoundsCorrected"
WITHIN_SLO = "WithinSLO"
SCALE_UP_PENDING = "ScaleUpPending"
SCALE_DOWN_PENDING = "ScaleDownPending"
COOLDOWN = "CooldownActive"
WAITING_FOR_REPLICAS = "WaitingForReplicas"
SCALING_LIMITED = "ScalingLimited"
# Condition types and their reasons (HPA-style: ScalingActive, ScalingLimited).
COND_SCALING_ACTIVE = "ScalingActive"
COND_SCALING_LIMITED = "ScalingLimited"
REASON_VALID_METRICS = "ValidMetrics"
REASON_INSUFFICIENT_CAPACITY = "InsufficientCapacity"
REASON_MAX_REPLICAS = "MaxReplicasReached"
REASON_NOT_LIMITED = "NotLimited"


# A rise measured above +400 % within the horizon is a start from near idle (with no per-replica
# rate to measure it against), not a burst to keep a fleet for: sized as at most x5.
MAX_BURST_RISE = 4.0


class AutoscaleConfigError(ValueError):
    pass


_SPEC_TO_ATTR = {
    "minReplicas": "min_replicas",
    "maxReplicas": "max_replicas",
    "upThreshold": "up_threshold",
    "downThreshold": "down_threshold",
}


@dataclass(frozen=True)
class AutoscaleConfig:
    min_replicas: int = 1
    max_replicas: int = 8
    ttft_target_s: float | None = None
    itl_target_s: float | None = None
    up_threshold: float = 1.0
    down_threshold: float = 0.8
    up_window_s: float = 60.0
    down_window_s: float = 300.0
    cooldown_s: float = 120.0
    max_step_up: int = 4
    max_step_down: int = 1
    max_metrics_age_s: float = 90.0
    target_load_fraction: float = 0.8
    queue_drain_s: float = 60.0
    capacity_half_life_s: float = 7200.0
    burst_horizon_s: float = 300.0
    burst_memory_s: float = 86400.0
    initial_burst_rise: float = 1.5
    initial_burst_half_life_s: float = 14400.0
    load_down_margin: float = 0.1
    percentile: float = 99.0  # of the latency targets (for messages; the queries carry it)
    kv_high_watermark: float | None = None  # KV usage (0..1) above which to add a replica; None: not a signal

    def __post_init__(self) -> None:
        def need(ok: bool, spec_name: str, fix: str) -> None:
            if not ok:
                attr = _SPEC_TO_ATTR.get(spec_name, spec_name)
                raise AutoscaleConfigError(f"autoscaling.{spec_name}: {fix} (got {getattr(self, attr)!r})")

        need(_is_int(self.min_replicas) and self.min_replicas >= 0, "minReplicas", "must be an integer >= 0")
        need(
            _is_int(self.max_replicas) and self.max_replicas >= max(1, self.min_replicas),
            "maxReplicas",
            "must be an integer >= minReplicas and >= 1",
        )
        for name, camel in (("ttft_target_s", "ttftTarget"), ("itl_target_s", "itlTarget")):
            v = getattr(self, name)
            if v is not None and not (_is_num(v) and v > 0):
                raise AutoscaleConfigError(f"autoscaling.{camel}: must be a positive number of seconds (got {v!r})")
        if self.ttft_target_s is None and self.itl_target_s is None:
            raise AutoscaleConfigError("slo: set ttftMs and/or itlMs; the autoscaler scales on latency targets")
        need(_is_num(self.up_threshold) and self.up_threshold > 0, "upThreshold", "must be > 0")
        need(
            _is_num(self.down_threshold) and 0 < self.down_threshold < self.up_threshold,
            "downThreshold",
            "must be > 0 and below upThreshold",
        )
        for name, camel in (
            ("up_window_s", "upWindowSeconds"),
            ("down_window_s", "downWindowSeconds"),
            ("cooldown_s", "cooldownSeconds"),
        ):
            v = getattr(self, name)
            if not (_is_num(v) and v >= 0):
                raise AutoscaleConfigError(f"autoscaling.{camel}: must be a number of seconds >= 0 (got {v!r})")
        need(self.down_window_s >= self.up_window_s, "down_window_s", "must be >= upWindowSeconds")
        need(_is_int(self.max_step_up) and self.max_step_up >= 1, "max_step_up", "must be an integer >= 1")
        need(_is_int(self.max_step_down) and self.max_step_down >= 1, "max_step_down", "must be an integer >= 1")
        need(_is_num(self.max_metrics_age_s) and self.max_metrics_age_s > 0, "max_metrics_age_s", "must be > 0")
        need(
            _is_num(self.target_load_fraction) and 0 < self.target_load_fraction <= 1,
            "target_load_fraction",
            "must be in (0, 1]",
        )
        need(_is_num(self.queue_drain_s) and self.queue_drain_s > 0, "queue_drain_s", "must be > 0")
        need(_is_num(self.capacity_half_life_s) and self.capacity_half_life_s > 0, "capacity_half_life_s", "must be > 0")
        need(_is_num(self.burst_horizon_s) and self.burst_horizon_s > 0, "burst_horizon_s", "must be > 0")
        need(_is_num(self.burst_memory_s) and self.burst_memory_s > 0, "burst_memory_s", "must be > 0")
        need(_is_num(self.initial_burst_rise) and self.initial_burst_rise >= 0, "initial_burst_rise", "must be >= 0")
        need(_is_num(self.load_down_margin) and self.load_down_margin >= 0, "load_down_margin", "must be >= 0")
        need(_is_num(self.initial_burst_half_life_s) and self.initial_burst_half_life_s > 0,
             "initial_burst_half_life_s", "must be > 0")
        need(self.kv_high_watermark is None or (_is_num(self.kv_high_watermark) and 0 < self.kv_high_watermark <= 1),
             "kv_high_watermark", "must be a fraction in (0, 1] or unset")

    @classmethod
    def from_slo(cls, slo: SLO, *, min_replicas: int, max_replicas: int, **overrides: Any) -> AutoscaleConfig:
        return cls(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            ttft_target_s=None if slo.ttft_ms is None else slo.ttft_ms / 1000.0,
            itl_target_s=None if slo.itl_ms is None else slo.itl_ms / 1000.0,
            percentile=slo.percentile,
            **overrides,
        )


@dataclass(frozen=True)
class ReplicaCapacity:
    """What one replica can take and how many more fit, as the controller knows it now.

    - requests_per_s_at_slo / concurrency_at_slo: per replica, from the planner's
      prediction for the chosen layout (either may be None).
    - additional_replicas_that_fit: whole replica groups placeable in free NVLink
      domains now (None: not limited / unknown). See `capacity.count_fitting`.
    - free_gpus_by_domain: for the ScalingLimited message.
    - ready_replicas: replicas serving now (None: unknown).
    """

    requests_per_s_at_slo: float | None = None
    concurrency_at_slo: float | None = None
    gpus_per_replica: int = 1
    additional_replicas_that_fit: int | None = None
    free_gpus_by_domain: tuple[tuple[str, int], ...] = ()
    ready_replicas: int | None = None

    @classmethod
    def with_domains(cls, free_gpus_by_domain: Mapping[str, int], **kw: Any) -> ReplicaCapacity:
        return cls(free_gpus_by_domain=tuple(sorted(free_gpus_by_domain.items())), **kw)


@dataclass(frozen=True)
class AutoscaleState:
    """What the policy remembers between evaluations (kept in status as JSON)."""

    desired_replicas: int
    above_since: float | None = None        # up signal continuously true since
    below_since: float | None = None        # down signal continuously true since
    last_change_at: float | None = None
    learned_rps_per_replica: float | None = None  # load per replica at which the SLO broke
    learned_at: float | None = None
    breach_peak_rps_per_replica: float | None = None  # highest load per replica during the current breach
    last_down_at: float | None = None
    learned_from_ttft: bool = False               # a TTFT-bounce estimate, which is forgotten slowly
    burst_rise: float | None = None               # largest rise of demand within the burst horizon, this half-memory
    burst_rise_previous: float | None = None      # ... and in the half-memory before
    burst_period_since: float | None = None       # when this half-memory began
    watching_since: float | None = None           # first evaluation with trusted metrics (the prior decays from then)
    demand_samples: tuple[tuple[float, float], ...] = ()  # (time, demand) over the last burst horizon

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, default_replicas: int) -> AutoscaleState:
        """Rebuild from status; anything malformed falls back to a fresh state at `default_replicas`."""
        if not isinstance(data, Mapping):
            return cls(desired_replicas=default_replicas)
        try:
            replicas = data["desired_replicas"]
            if not _is_int(replicas) or replicas < 0:
                raise ValueError
            kw: dict[str, Any] = {"desired_replicas": replicas}
            for name in ("above_since", "below_since", "last_change_at", "learned_rps_per_replica", "learned_at",
                         "breach_peak_rps_per_replica", "last_down_at", "burst_rise", "burst_rise_previous",
                         "burst_period_since", "watching_since"):
                v = data.get(name)
                if v is not None and not (_is_num(v) and math.isfinite(v)):
                    raise ValueError
                kw[name] = None if v is None else float(v)
            kw["learned_from_ttft"] = data.get("learned_from_ttft") is True
            samples = []
            for pair in data.get("demand_samples") or ():
                t, d = pair
                if not (_is_num(t) and _is_num(d) and d >= 0):
                    raise ValueError
                samples.append((float(t), float(d)))
            kw["demand_samples"] = tuple(samples)
            return cls(**kw)
        except (KeyError, ValueError, TypeError):
            return cls(desired_replicas=default_replicas)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    previous_replicas: int
    reason: str
    message: str
    conditions: tuple[Condition, ...]
    state: AutoscaleState
    wanted_replicas: int                     # before step, max and capacity limits
    load_replicas: int | None = None         # replicas the observed load needs
    slo_ratios: tuple[tuple[str, float], ...] = ()
    demand_rps: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def changed(self) -> bool:
        return self.desired_replicas != self.previous_replicas

    def condition_tuples(self) -> list[tuple[str, str, str, str]]:
        """(type, status, reason, message) for `meshplan.controller.status.conditions`."""
        return [(c.type, c.status, c.reason, c.message) for c in self.conditions]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["conditions"] = [asdict(c) for c in self.conditions]
        d["slo_ratios"] = dict(self.slo_ratios)
        return d


# --- the decision ------------------------------------------------------------


def decide(
    state: AutoscaleState,
    snapshot: MetricsSnapshot,
    config: AutoscaleConfig,
    capacity: ReplicaCapacity,
    now: float,
) -> Decision:
    current = state.desired_replicas
    inputs = {"metrics": snapshot.to_dict(), "now": now}

    # 1. bounds (spec-driven, applied whatever the metrics say)
    if current < config.min_replicas or current > config.max_replicas:
        wanted = min(max(current, config.min_replicas), config.max_replicas)
        target, limit = _fit(current, wanted, config, capacity)
        conds = (_active_or_not(snapshot, config, now), limit or _not_limited())
        msg = f"replicas {current} outside [{config.min_replicas}, {config.max_replicas}]: {current} -> {target}"
        if limit:
            msg += f"; {limit.message}"
        new_state = _changed_state(state, target, now) if target != current else state
        return Decision(target, current, BOUNDS_CORRECTED, msg, conds, new_state, wanted, inputs=inputs)

    # 2. trust the metrics or hold
    problem, why = assess(
        snapshot,
        now=now,
        max_age_s=config.max_metrics_age_s,
        require_ttft=config.ttft_target_s is not None,
        require_itl=config.itl_target_s is not None,
    )
    if problem:
        cond = Condition(COND_SCALING_ACTIVE, "False", problem, f"holding {current} replicas: {why}")
        held = replace(state, above_since=None, below_since=None)
        return Decision(current, current, problem, cond.message, (cond,), held, current, inputs=inputs)

    # 3. signals
    ratios = _slo_ratios(snapshot, config)
    worst = max((r for _, r in ratios), default=0.0)
    queue = snapshot.queue_depth or 0.0
    running = snapshot.running or 0.0
    demand = (snapshot.request_rate_per_s or 0.0) + queue / config.queue_drain_s
    no_traffic = demand == 0 and running == 0

    learned, learned_at = state.learned_rps_per_replica, state.learned_at
    planner_rps = capacity.requests_per_s_at_slo
    from_ttft = state.learned_from_ttft
    if from_ttft and learned is not None and learned_at is not None and planner_rps is not None and planner_rps > learned:
        # Forget slowly: the gap to the planner's estimate halves every half-life, so a
        # breach that was really a burst does not pin the fleet high for the rest of the day.
        gap = (planner_rps - learned) * 0.5 ** (max(0.0, now - learned_at) / config.capacity_half_life_s)
        learned, learned_at = planner_rps - gap, now
    ready = capacity.ready_replicas
    settled = ready is None or ready >= current
    rise, burst_memory = _burst_rise(state, demand, queue, now, config, capacity, learned)
    headroom = 1.0 + rise
    load_replicas = _replicas_for_load(demand * headroom, (queue + running) * headroom, capacity, learned, config,
                                       no_traffic)
    # Evidence the other way: all replicas serve more per replica within SLO than learned.
    if learned is not None and settled and current > 0 and worst <= config.up_threshold and demand / current > learned:
        learned, learned_at = demand / current, now
        if capacity.requests_per_s_at_slo is not None and learned >= capacity.requests_per_s_at_slo:
            learned, learned_at, from_ttft = None, None, False

    up = worst > config.up_threshold or (load_replicas is not None and load_replicas > current)
    # The request rate is already a window's average (and the queue term is what piles up):
    # when it alone needs more replicas, waiting another up window only adds lag.
    rate_replicas = _replicas_for_load(demand * headroom, 0.0, replace(capacity, concurrency_at_slo=None), learned,
                                       config, no_traffic)
    urgent = rate_replicas is not None and rate_replicas > current
    # Scale down only to a count the load fits with `load_down_margin` to spare: a dead band, so
    # noise in the rate at the edge of a count does not add a replica and take it away again.
    down_headroom = headroom * (1.0 + config.load_down_margin)
    down_replicas = _replicas_for_load(demand * down_headroom, (queue + running) * down_headroom, capacity, learned,
                                       config, no_traffic)
    # A signal with no series never lets the fleet shrink: scale-down needs every signal its
    # checks read (each targeted latency, request rate, queue, running); KV usage only with kv_high_watermark.
    blind = _down_blind(snapshot, config)
    down = (
        not blind
        and current > config.min_replicas
        and all(r < config.down_threshold for _, r in ratios)
        and (down_replicas is None or down_replicas < current)
        and not (current == 1 and not no_traffic)
    )
    # The load that caused a latency breach: the peak per-replica load while it lasts
    # (the p99 lags the load by up to the rate window, so the load *now* may be lower).
    breach_peak = None
    if worst > config.up_threshold and settled and current > 0:
        breach_peak = max(demand / current, state.breach_peak_rps_per_replica or 0.0)
    above_since = (state.above_since if state.above_since is not None else now) if up else None
    below_since = (state.below_since if state.below_since is not None else now) if down else None
    base = replace(state, above_since=above_since, below_since=below_since, learned_rps_per_replica=learned,
                   learned_at=learned_at, breach_peak_rps_per_replica=breach_peak, learned_from_ttft=from_ttft,
                   **burst_memory)
    active = _active_condition(snapshot, config)
    signal = _describe(ratios, config, demand, queue, load_replicas, capacity, learned, rise)
    extra = dict(load_replicas=load_replicas, slo_ratios=ratios, demand_rps=demand, inputs=inputs)
    in_cooldown = state.last_change_at is not None and now - state.last_change_at < config.cooldown_s

    if up:
        held_s = now - above_since
        if held_s < config.up_window_s and not urgent:
            msg = f"{signal}; above threshold for {held_s:.0f}s of {config.up_window_s:.0f}s"
            return Decision(current, current, SCALE_UP_PENDING, msg, (active,), base, current, **extra)
        if in_cooldown:
            msg = f"{signal}; cooldown until {state.last_change_at + config.cooldown_s - now:.0f}s from now"
            return Decision(current, current, COOLDOWN, msg, (active,), base, current, **extra)
        if settled:
            # ITL and KV usage follow a replica's steady load (not a burst's transient queue)
            itl_breach = max(dict(ratios).get("itl", 0.0), dict(ratios).get("kv", 0.0)) > config.up_threshold
            bounced = state.last_down_at is not None and now - state.last_down_at <= 2 * config.down_window_s
            if breach_peak and (itl_breach or bounced) and (learned is None or breach_peak < learned):
                # The SLO broke at this load per replica for a whole window: that is the
                # real capacity, whatever the planner predicted.
                learned, learned_at = breach_peak, now
                base = replace(base, learned_rps_per_replica=learned, learned_at=learned_at,
                               learned_from_ttft=not itl_breach)
                load_replicas = _replicas_for_load(demand * headroom, (queue + running) * headroom, capacity, learned,
                                                   config, no_traffic)
                extra["load_replicas"] = load_replicas
                signal = _describe(ratios, config, demand, queue, load_replicas, capacity, learned, rise)
            wanted = max(current + 1, load_replicas or 0)
        else:
            wanted = max(current, load_replicas or 0)
            if wanted == current:
                msg = f"{signal}; {ready} of {current} replicas ready, waiting for them before adding more"
                return Decision(current, current, WAITING_FOR_REPLICAS, msg, (active,), base, current, **extra)
        stepped = min(wanted, current + config.max_step_up)
        target, limit = _fit(current, stepped, config, capacity)
        conds = (active, limit or _not_limited())
        if target == current:
            msg = f"{signal}; want {wanted} replicas, holding {current}: {limit.message if limit else 'no room'}"
            return Decision(current, current, SCALING_LIMITED, msg, conds, base, wanted, **extra)
        msg = f"{signal}; scaling {current} -> {target}" + (f" (wanted {wanted})" if wanted != target else "")
        if limit:
            msg += f"; {limit.message}"
        return Decision(target, current, SCALED_UP, msg, conds, _changed_state(base, target, now), wanted, **extra)

    not_limited = _not_limited()
    if down:
        held_s = now - below_since
        if held_s < config.down_window_s:
            msg = f"{signal}; below threshold for {held_s:.0f}s of {config.down_window_s:.0f}s"
            return Decision(current, current, SCALE_DOWN_PENDING, msg, (active, not_limited), base, current, **extra)
        if in_cooldown:
            msg = f"{signal}; cooldown until {state.last_change_at + config.cooldown_s - now:.0f}s from now"
            return Decision(current, current, COOLDOWN, msg, (active, not_limited), base, current, **extra)
        floor = down_replicas if down_replicas is not None else current - 1
        wanted = max(floor, config.min_replicas)
        target = max(wanted, current - config.max_step_down)
        msg = f"{signal}; scaling {current} -> {target}"
        down_state = replace(_changed_state(base, target, now), last_down_at=now)
        return Decision(target, current, SCALED_DOWN, msg, (active, not_limited), down_state, wanted, **extra)

    return Decision(current, current, WITHIN_SLO, signal, (active, not_limited), base, current, **extra)


# --- helpers -----------------------------------------------------------------


def _slo_ratios(s: MetricsSnapshot, c: AutoscaleConfig) -> tuple[tuple[str, float], ...]:
    out = []
    for name, observed, target in (("ttft", s.ttft_s, c.ttft_target_s), ("itl", s.itl_s, c.itl_target_s)):
        if target is not None and not s.is_missing(f"{name}_s"):
            # assess() guarantees a missing latency only when nothing is being served
            # (a histogram with no series at all is a missing signal: no ratio, no scale-down)
            out.append((name, 0.0 if observed is None else observed / target))
    if c.kv_high_watermark is not None and s.kv_usage is not None and not s.is_missing("kv_usage"):
        out.append(("kv", s.kv_usage / c.kv_high_watermark))
    return tuple(out)


def _burst_rise(
    state: AutoscaleState,
    demand_rps: float,
    queue: float,
    now: float,
    c: AutoscaleConfig,
    cap: ReplicaCapacity,
    learned_rps: float | None,
) -> tuple[float, dict[str, Any]]:
    """The relative rise of demand to size for, and the burst memory to keep (AutoscaleState fields).

    See "Burst headroom" in the module docstring. The largest rise of the last `burst_memory_s`
    is kept as two maxima, of this half-memory and of the one before (a sliding maximum that
    forgets a rise between half and all of `burst_memory_s` after it was seen).
    """
    samples = tuple((t, d) for t, d in state.demand_samples if now - c.burst_horizon_s <= t < now)
    # Learned only while nothing is queued: a saturated fleet completes what it can, not what is
    # offered, and the backlog draining after a scale-up would read as a burst. (Sized for now
    # either way, so that more load never asks for fewer replicas.)
    clean = queue < 1
    rise_now = 0.0
    if samples:
        low = min(d for _, d in samples)
        denom = max(low, _per_replica_rps(cap, learned_rps) or 0.0)
        if denom > 0:
            rise_now = min(MAX_BURST_RISE, max(0.0, (demand_rps - low) / denom))
    if clean and (not samples or now - samples[-1][0] >= c.burst_horizon_s / 8):
        samples = samples + ((now, demand_rps),)
    current, previous, period_since = state.burst_rise or 0.0, state.burst_rise_previous, state.burst_period_since
    if period_since is None or now < period_since or now - period_since >= c.burst_memory_s:
        # nothing remembered yet, a clock that went back, or no evaluation for half a memory
        current, previous, period_since = 0.0, None, now
    elif now - period_since >= c.burst_memory_s / 2:
        current, previous, period_since = 0.0, current, now
    if clean:
        current = max(current, rise_now)
    since = now if state.watching_since is None else state.watching_since
    prior = c.initial_burst_rise * 0.5 ** (max(0.0, now - since) / c.initial_burst_half_life_s)
    memory = {"burst_rise": current, "burst_rise_previous": previous, "burst_period_since": period_since,
              "watching_since": since, "demand_samples": samples}
    return max(rise_now, current, previous or 0.0, prior), memory


def _per_replica_rps(cap: ReplicaCapacity, learned_rps: float | None) -> float | None:
    rps = cap.requests_per_s_at_slo
    if learned_rps is not None:
        rps = learned_rps if rps is None else min(rps, learned_rps)
    return rps


def _replicas_for_load(
    demand_rps: float,
    in_flight: float,
    cap: ReplicaCapacity,
    learned_rps: float | None,
    c: AutoscaleConfig,
    no_traffic: bool,
) -> int | None:
    needs = []
    rps = _per_replica_rps(cap, learned_rps)
    if rps is not None and rps > 0:
        needs.append(demand_rps / (rps * c.target_load_fraction))
    if cap.concurrency_at_slo is not None and cap.concurrency_at_slo > 0:
        needs.append(in_flight / (cap.concurrency_at_slo * c.target_load_fraction))
    if not needs:
        return None
    # tolerate float noise so exactly-at-capacity does not round up; any traffic needs one
    return max(0 if no_traffic else 1, math.ceil(max(needs) - 1e-9))


def _fit(current: int, wanted: int, c: AutoscaleConfig, cap: ReplicaCapacity) -> tuple[int, Condition | None]:
    """Apply max replicas and whole-group placement to an upward target."""
    if wanted <= current:
        return wanted, None
    target, limit = wanted, None
    if target > c.max_replicas:
        target = c.max_replicas
        limit = Condition(
            COND_SCALING_LIMITED,
            "True",
            REASON_MAX_REPLICAS,
            f"wanted {wanted} replicas, maxReplicas is {c.max_replicas}",
        )
    fits = cap.additional_replicas_that_fit
    if fits is not None and target - current > max(fits, 0):
        placeable = current + max(fits, 0)
        domains = ", ".join(f"{d}={g}" for d, g in cap.free_gpus_by_domain) or "none"
        limit = Condition(
            COND_SCALING_LIMITED,
            "True",
            REASON_INSUFFICIENT_CAPACITY,
            f"wanted {wanted} replicas, only {placeable} fit: {max(fits, 0)} more whole group(s) of "
            f"{cap.gpus_per_replica} GPUs fit the free NVLink domains (free GPUs per domain: {domains})",
        )
        target = placeable
    return target, limit


def _not_limited() -> Condition:
    return Condition(COND_SCALING_LIMITED, "False", REASON_NOT_LIMITED, "the wanted replica count fits")


def _active_or_not(s: MetricsSnapshot, c: AutoscaleConfig, now: float) -> Condition:
    problem, why = assess(s, now=now, max_age_s=c.max_metrics_age_s)
    if problem:
        return Condition(COND_SCALING_ACTIVE, "False", problem, why)
    return _active_condition(s, c)


# What the policy does without each signal (docs/autoscaling.md, "When a signal is missing").
_WITHOUT = {
    "ttft_s": "TTFT is not compared with its target",
    "itl_s": "ITL is not compared with its target",
    "request_rate_per_s": "demand is the queue alone (request-rate sizing under-reads)",
    "queue_depth": "the queue counts as 0",
    "running": "in-flight sizing uses the queue alone",
    "kv_usage": "not reported (not a scaling input)",
}


def _down_blind(s: MetricsSnapshot, c: AutoscaleConfig) -> list[str]:
    needed = ["request_rate_per_s", "queue_depth", "running"]
    if c.ttft_target_s is not None:
        needed.append("ttft_s")
    if c.itl_target_s is not None:
        needed.append("itl_s")
    if c.kv_high_watermark is not None:
        needed.append("kv_usage")
    return [n for n in needed if s.is_missing(n)]


def _active_condition(s: MetricsSnapshot, c: AutoscaleConfig) -> Condition:
    """ScalingActive=True: ValidMetrics, or MetricsPartial naming each missing signal and what follows."""
    if not s.missing:
        return Condition(COND_SCALING_ACTIVE, "True", REASON_VALID_METRICS, "metrics are fresh and valid")
    parts = []
    for m in s.missing:
        signal = m.split(" ", 1)[0]
        without = _WITHOUT.get(signal, 'not used')
        if signal == "kv_usage" and c.kv_high_watermark is not None:
            without = "KV usage is not compared with its high-watermark"
        parts.append(f"{m}: {without}")
    blind = _down_blind(s, c)
    tail = (f"; no scale-down while {', '.join(blind)} {'is' if len(blind) == 1 else 'are'} missing" if blind
            else "; scaling on the other signals")
    return Condition(COND_SCALING_ACTIVE, "True", METRICS_PARTIAL,
                     "scaling on the signals present; missing " + "; ".join(parts) + tail)


def _changed_state(state: AutoscaleState, target: int, now: float) -> AutoscaleState:
    return replace(state, desired_replicas=target, above_since=None, below_since=None, last_change_at=now,
                   breach_peak_rps_per_replica=None)


def _describe(
    ratios: tuple[tuple[str, float], ...],
    c: AutoscaleConfig,
    demand: float,
    queue: float,
    load_replicas: int | None,
    cap: ReplicaCapacity,
    learned: float | None,
    rise: float,
) -> str:
    targets = {"ttft": c.ttft_target_s, "itl": c.itl_target_s}
    p = f"p{c.percentile:g}"
    parts = [f"{p} {n.upper()} {r * targets[n]:.3g}s is {r:.2f}x its {targets[n]:.3g}s target" for n, r in ratios
             if n in targets]
    parts += [f"KV-cache usage {r * c.kv_high_watermark:.2f} is {r:.2f}x its {c.kv_high_watermark:.2f} high-watermark"
              for n, r in ratios if n == "kv" and c.kv_high_watermark is not None]
    load = f"demand {demand:.3g} req/s ({queue:.0f} queued)"
    if load_replicas is not None:
        per = _per_replica_rps(cap, learned)
        per_txt = f"{per:.3g} req/s per replica at SLO" if per is not None else f"{cap.concurrency_at_slo:.3g} in flight per replica"
        load += (f" needs {load_replicas} replicas ({per_txt}, sized to {c.target_load_fraction:.0%}"
                 f" with {rise:+.0%} burst headroom)")
    return "; ".join(parts + [load])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
