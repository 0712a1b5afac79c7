"""Value types shared by the planner, placement, rendering and autoscaling.

A `Layout` uses the notation of NVIDIA's trillion-parameter inference blog
("Demystifying AI Inference Deployments for Trillion Parameter LLMs", 2024):
TP x EP x PP GPUs make one model replica, DP replicas serve independently.

- `tp`: tensor-parallel degree of attention and of each expert / dense FFN.
- `ep`: expert-parallel degree. Experts are spread over `ep` groups of `tp`
  GPUs; attention runs data-parallel across those `ep` groups (this is what
  TensorRT-LLM calls attention-DP and vLLM/SGLang reach with DP attention).
  For a dense model `ep` is 1.
- `pp`: pipeline stages; layers are split evenly across stages.
- `dp`: independent replicas, each `tp * ep * pp` GPUs.

No engine spells a layout this way: `meshplan.planner.engines` holds the one
tested mapping per engine (vLLM, SGLang, TensorRT-LLM).

Everything here is frozen and hashable so plans can be cached and compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Dtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
Engine = Literal["vllm", "sglang", "trtllm", "nim", "deepspeed"]
Objective = Literal["maxThroughput", "bestInteractivity", "balanced", "minCostWithinSLO"]


@dataclass(frozen=True, order=True)
class Layout:
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "pp", "dp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"layout.{name} must be a positive integer, got {v!r}")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.ep * self.pp

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.dp

    @property
    def gpus_per_stage(self) -> int:
        """GPUs that must share one NVLink domain (one pipeline stage's TP x EP group)."""
        return self.tp * self.ep

    def label(self, with_dp: bool = False) -> str:
        """Blog-style name, e.g. `TP4·EP4·PP4` (parts equal to 1 omitted, TP1 if all are 1)."""
        parts = [f"{k.upper()}{v}" for k, v in (("tp", self.tp), ("ep", self.ep), ("pp", self.pp)) if v > 1]
        if with_dp and self.dp > 1:
            parts.append(f"DP{self.dp}")
        return "·".join(parts) or "TP1"


@dataclass(frozen=True)
class Workload:
    """What one replica set is asked to serve (per deployment, not per replica)."""

    isl: int = 1024                      # input tokens per request
    osl: int = 256                       # output tokens per request
    concurrency: int | None = None       # requests in flight (closed loop), or
    request_rate: float | None = None    # requests/s arriving (open loop)
    max_context: int | None = None       # longest context to support; default isl + osl
    # A closed loop whose requests stay in step: fixed prompt and answer lengths (a benchmark client's
    # `--random-range-ratio 1` with EOS ignored) make the C requests of a round finish together, so EVERY
    # round arrives at one instant and each request waits for the whole round's prompts on its attention
    # rank (`perf.predict`: wave share 1 for every scheduler). False: the engine's fitted share of the
    # first round's wave (`PerfParams.wave*`). Set by the evidence harness for such sources (issue 20);
    # served traffic is not in step.
    synchronized: bool = False

    @property
    def context(self) -> int:
        return self.max_context or (self.isl + self.osl)


def expected_tokens_per_step(tokens: int, acceptance_rate: float) -> float:
    """Tokens a sequence gains per target-model step with `tokens` chain-drafted tokens each accepted with
    probability `acceptance_rate` (independently, until the first rejection; the target's own token always
    counts): (1 - a^(k+1)) / (1 - a) (Leviathan, Kalman, Matias, "Fast Inference from Transformers via
    Speculative Decoding", ICML 2023, arXiv:2211.17192, eq. 1). a = 1 gives k + 1; k = 0 gives 1."""
    k, a = max(0, int(tokens)), float(acceptance_rate)
    if a >= 1.0:
        return float(k + 1)
    if a <= 0.0 or k == 0:
        return 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_rate_for_length(tokens: int, accept_length: float) -> float:
    """The per-token acceptance rate a with `expected_tokens_per_step(tokens, a) == accept_length` (bisection):
    how a published mean acceptance length (tokens per step, the draft's plus the target's) becomes the rate
    the model takes."""
    k = max(1, int(tokens))
    target = min(max(float(accept_length), 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if expected_tokens_per_step(k, mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as the plan prices and the engines run it (spec.engine.speculative).

    `method` "mtp": the checkpoint's own multi-token-prediction modules draft `tokens` tokens per step
    (DeepSeek-V3/R1); `acceptance_rate` is the per-draft-token acceptance probability a, `source` where it
    came from (the user's spec, or the default's publication)."""

    method: str = "mtp"
    tokens: int = 1
    acceptance_rate: float = 0.85
    source: str = ""

    @property
    def expected_tokens(self) -> float:
        return expected_tokens_per_step(self.tokens, self.acceptance_rate)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    itl_ms: float | None = None           # inter-token latency (TPOT)
    percentile: int = 99
    min_tokens_per_s_per_user: float | None = None


@dataclass(frozen=True)
class MemoryFit:
    """Per-GPU memory budget of one layout (bytes)."""

    fits: bool
    weights_bytes: float
    kv_bytes_per_token: float            # per GPU, per token of context
    activation_bytes: float
    runtime_bytes: float
    usable_bytes: float                  # memory the engine may use after headroom
    kv_capacity_tokens: int              # tokens of KV cache one replica can hold
    max_concurrency: int                 # sequences of `context` tokens that fit
    reason: str = ""                     # why it does not fit (empty when it fits)
    redundant_expert_bytes: float = 0.0  # per GPU, EPLB's redundant experts (part of weights_bytes)


@dataclass(frozen=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float                        # = inter-token latency
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    concurrency: int                      # per replica, as modelled
    prefill_ms: float = 0.0               # no-queue prefill time (lower bound of TTFT)
    notes: tuple[str, ...] = ()
    ttft_p50_ms: float = 0.0              # steady-state (median) TTFT; `ttft_ms` is a closed-loop run's mean
                                          # (perf._core says how each is priced); 0: not priced

    @property
    def median_ttft_ms(self) -> float:
        """The median TTFT: `ttft_p50_ms`, or `ttft_ms` for a prediction made before the median was priced."""
        return self.ttft_p50_ms if self.ttft_p50_ms > 0 else self.ttft_ms


@dataclass(frozen=True)
class Candidate:
    """One evaluated point of the search: a layout with its knobs and predictions."""

    layout: Layout
    weight_dtype: Dtype
    kv_dtype: Dtype
    chunk_size: int                       # max tokens per engine step (chunked prefill)
    max_num_seqs: int                     # batch limit per replica
    memory: MemoryFit
    prediction: Prediction
    engine: Engine = "vllm"
    gpu: str = ""                         # catalogue GPU name (set by the search; plans may span products)
    a2a_backend: str = ""                 # EP all-to-all: "" the engine's default, "deepep-normal", "deepep-low-latency"
    batch_overlap: bool = False           # dual-batch (vLLM --enable-dbo) / two-batch (SGLang) overlap


@dataclass(frozen=True)
class Rejected:
    layout: Layout
    reason: str


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the choice, why, the frontier and the alternatives."""

    choice: Candidate | None
    objective: Objective
    reason: str
    frontier: tuple[Candidate, ...] = ()
    alternatives: tuple[Candidate, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    evaluated: int = 0
    gpu: str = ""
    model: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class KvPath:
    """The path a request's KV cache takes from its prefill worker to its decode worker (`planner.disagg`)."""

    tier: str                             # "nvlink" | "pcie" | "ib" | "roce" | "efa" | "tcp"
    gb_s: float                           # link bandwidth, one direction, GB/s
    latency_us: float
    bytes_per_request: float              # the ISL tokens' KV cache of the whole model
    transfer_ms: float                    # priced per request (part of TTFT)
    source: str                           # where bandwidth and latency come from
    why: str = ""                         # why this tier (domain sizes, network block, no RDMA)


@dataclass(frozen=True)
class DisaggCandidate:
    """Prefill/decode disaggregated serving: `prefill.layout.dp` prefill workers feed `decode.layout.dp`
    decode workers. Per role: `prefill.prediction` carries the TTFT (queue + prefill + KV transfer) and the
    input tokens/s per prefill GPU; `decode.prediction` the ITL, the output tokens/s per decode GPU and per
    user. `prediction` is the whole deployment's (tokens/s per GPU over all its GPUs)."""

    prefill: Candidate
    decode: Candidate
    prediction: Prediction
    kv_path: KvPath

    @property
    def prefill_workers(self) -> int:
        return self.prefill.layout.dp

    @property
    def decode_workers(self) -> int:
        return self.decode.layout.dp

    @property
    def total_gpus(self) -> int:
        return self.prefill.layout.total_gpus + self.decode.layout.total_gpus

    @property
    def ratio(self) -> str:
        """Prefill to decode workers, e.g. `2:1`."""
        return f"{self.prefill_workers}:{self.decode_workers}"

    def label(self) -> str:
        """Compact, e.g. `P2×TP4 + D1×EP16`."""
        return (f"P{self.prefill_workers}×{self.prefill.layout.label()} + "
                f"D{self.decode_workers}×{self.decode.layout.label()}")


@dataclass(frozen=True)
class DisaggPlan:
    """The planner's answer on disaggregation (`planner.disagg.plan_disagg`).

    `mode` "auto" | "enabled" | "disabled"; `disaggregated` says what was chosen; `choice` is the best
    disaggregated candidate (also when aggregated won under `auto`, for the comparison; None when disabled
    or none meets the SLO); `aggregated` is the aggregated plan it was compared with."""

    mode: str
    disaggregated: bool
    choice: DisaggCandidate | None
    aggregated: Plan
    objective: Objective
    reason: str
    alternatives: tuple[DisaggCandidate, ...] = ()
    evaluated: int = 0
    eligible: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def label(self) -> str:
        """What runs, compactly: `P2×TP4 + D1×EP16`, or the aggregated layout `TP8 x DP4`."""
        if self.disaggregated and self.choice is not None:
            return self.choice.label()
        c = self.aggregated.choice
        if c is None:
            return "none"
        return c.layout.label() + (f" x DP{c.layout.dp}" if c.layout.dp > 1 else "")
