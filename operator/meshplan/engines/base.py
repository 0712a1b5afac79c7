"""What every engine module shares: the engine interface, the records it returns, and the flag helpers.

One module per engine (`meshplan.engines.vllm`, `.sglang`, `.trtllm`, ...) implements
`EngineModule`; `meshplan.engines.get(kind)` finds it. The planner's search asks a module
which layouts and knobs it can run (`check_layout`, `check_pods`, `check_knobs`) and how it
spells a layout (`layout`); the renderer asks it for the pod's command line (`command`).
Adding an engine is one module here, its entry in `meshplan.engines.MODULES`, and its golden files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from meshplan.api.extra_args import _is_number  # one reading of "is this token a number, not a flag"
from meshplan.explain import Explanation
from meshplan.planner.types import Candidate, Engine, Layout

HTTP_PORT = 8000
HEALTH_PATH = "/health"       # vLLM, SGLang and trtllm-serve all serve GET /health

# Engine default memory fraction meshplan renders when the plan gives none: 0.9
# (vLLM --gpu-memory-utilization default; the planner's memory_fit default, which
# prices SGLang and TRT-LLM with the same figure).
DEFAULT_MEMORY_FRACTION = 0.9

_PLAN_OWNED = {
    "tensor-parallel-size", "tp-size", "tp", "pipeline-parallel-size", "pp-size", "pp",
    "data-parallel-size", "dp-size", "dp", "expert-parallel-size", "ep-size", "ep", "moe-ep-size",
    "enable-expert-parallel", "enable-dp-attention", "max-num-seqs", "max-num-batched-tokens",
    "max-running-requests", "chunked-prefill-size", "max-batch-size", "max-num-tokens", "kv-cache-dtype",
}
try:  # single source when the API package is present
    from meshplan.api.models import PLAN_OWNED_FLAGS as _API_FLAGS

    _PLAN_OWNED = set(_API_FLAGS) | {"ep"}
except ImportError:  # pragma: no cover - the API package is part of the distribution
    pass

_BOOTSTRAP = {
    "nnodes", "node-rank", "master-addr", "master-port", "headless", "data-parallel-size-local",
    "data-parallel-start-rank", "data-parallel-address", "data-parallel-rpc-port", "dist-init-addr",
    "host", "port", "distributed-executor-backend", "extra-llm-api-options", "backend",
    "served-model-name",   # spec.model.servedName owns it (immutable); the API refuses it in extraArgs
}
_SHORT_ALIASES = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
                  "ep": "enable-expert-parallel"}



@dataclass(frozen=True)
class EngineLayout:
    """A layout as one engine runs it.

    `flags` are command-line flags of the engine's server (flag -> value; `True`
    for a bare switch); `config` are entries of the engine's config file where the
    engine has no flag (TensorRT-LLM's LLM-API YAML). The effective degrees say what
    the engine really does, which may differ from the blog layout (see `exact`).
    """

    engine: Engine
    flags: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    attention_tp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    pp: int = 1
    exact: bool = True                   # the engine runs exactly the blog layout
    notes: tuple[str, ...] = ()

    @property
    def gpus_per_replica(self) -> int:
        return self.attention_tp * self.attention_dp * self.pp

    def argv(self) -> list[str]:
        """Flags as a command-line argument list (bare switches without a value)."""
        out: list[str] = []
        for flag, value in self.flags.items():
            if value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            else:
                out.extend([flag, str(value)])
        return out



def norm_flag(flag: str) -> str:
    """`--Max_Num_Seqs` -> `max-num-seqs`; `--no-enable-x` -> `enable-x`; vLLM `-tp` -> long name."""
    single = flag.startswith("-") and not flag.startswith("--")
    name = flag.lstrip("-").split("=", 1)[0].replace("_", "-").lower()
    if single and name in _SHORT_ALIASES:
        return _SHORT_ALIASES[name]
    if name.startswith("no-"):
        name = name[3:]
    return name


def parse_args(tokens: Sequence[str]) -> list[tuple[str, list[str]]]:
    """['--a', '1', '--b', '--c=2'] -> [('--a', ['1']), ('--b', []), ('--c', ['2'])]."""
    out: list[tuple[str, list[str]]] = []
    for t in tokens:
        if t.startswith("-") and not _is_number(t):
            if "=" in t and t.startswith("--"):
                k, v = t.split("=", 1)
                out.append((k, [v]))
            else:
                out.append((t, []))
        elif out:
            out[-1][1].append(t)
        else:
            out.append(("", [t]))
    return out


@dataclass(frozen=True)
class ServingOptions:
    """Engine settings that do not come from the plan (spec.engine, spec.model)."""

    engine: Engine = "vllm"
    model: str = ""                         # what the engine loads: HF repo id or a path
    served_name: str | None = None
    revision: str | None = None
    load_format: str | None = None          # vLLM --load-format (runai_streamer for s3:// / gs://)
    weights_refusal: str = ""               # why this engine cannot open the weights (render.weights)
    checkpoint_dtype: str = "bf16"          # dtype of the checkpoint's weights
    prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    expert_load_balancing: str = "auto"     # auto | enabled | disabled (api.models spelling)
    cuda_graphs: str = "auto"               # auto | enabled | disabled (api.models spelling)
    memory_fraction: float | None = None
    max_model_len: int | None = None
    max_model_len_why: str = ""              # where max_model_len comes from (render.options.planned_context)
    extra_args: tuple[str, ...] = ()
    allow_plan_override: bool = False
    port: int = HTTP_PORT
    num_experts: int = 0                    # routed experts of the model (0: dense or unknown); TRT-LLM EPLB slots
    model_name: str = ""                    # the planner's model (catalogue / architecture name): the EPLB rule's family
    speculative: Any = None                 # planner.types.Speculative (spec.engine.speculative), None: off
    # Prefill/decode disaggregation (issue 19): the role this pod's engine plays, None: aggregated (both phases)
    disagg: "Disaggregation | None" = None

    @property
    def role(self) -> str | None:
        """"prefill" | "decode" | None (aggregated)."""
        return self.disagg.role if self.disagg is not None else None


@dataclass(frozen=True)
class PodRole:
    """Where one pod sits in its replica group."""

    rank: int = 0
    pods: int = 1
    gpus_per_pod: int = 1
    leader_host: str = "localhost"
    peer_hosts: tuple[str, ...] = ()        # every pod's DNS name by rank (TRT-LLM's MPI host list)
    env_names: tuple[str, ...] = ()         # variables mpirun must forward (TRT-LLM)
    deployment: str = ""                    # the LLMDeployment's name (TRT-LLM: its ssh Secret)

    @property
    def leader(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class EngineCommand:
    command: tuple[str, ...]
    args: tuple[str, ...]
    serves_http: bool
    ports: tuple[tuple[str, int], ...]
    explain: tuple[Explanation, ...] = field(default=())
    volumes: tuple[dict[str, Any], ...] = ()         # pod volumes the command needs (TRT-LLM: the ssh Secret)
    volume_mounts: tuple[dict[str, Any], ...] = ()
    # Engines configured by environment (NVIDIA NIM): (name, value) pairs the pod's container gets;
    # the renderer puts them under the user's spec.engine.env (which wins by name).
    env: tuple[tuple[str, str], ...] = ()
    # What the pod's startup/readiness probes GET (NIM: /v1/health/ready) and its liveness probe ("": the same).
    health_path: str = HEALTH_PATH
    live_path: str = ""
    # Pod annotations the command needs (NIM multi-node: the leader's MPI hostfile, mounted by the downward API).
    annotations: tuple[tuple[str, str], ...] = ()
    # Variables read from the pod by the downward API: (name, fieldPath), e.g. vLLM's NIXL side-channel host
    # from status.podIP (disaggregated roles); the renderer gives them as valueFrom.fieldRef.
    env_fields: tuple[tuple[str, str], ...] = ()


# ---- prefill/decode disaggregation (issue 19) ---------------------------------------------------

DISAGG_ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Disaggregation:
    """What the renderer tells an engine module about the disaggregated role of a pod (issue 19).

    `transfer_backend`: the KV-transfer backend in meshplan's lower-case spelling ("" = the engine module's
    default for the path: `DISAGG_TRANSFER_BACKENDS` of each module lists its names and what they render to).
    `bootstrap_port`: the port the prefill side listens on for the decode side's handshake (SGLang's bootstrap
    server, vLLM's NIXL side channel), None: the engine's default. `ib_devices`: the RDMA devices (HCA names,
    e.g. mlx5_0) the pod is given; empty: no RDMA (the KV goes over TCP or NVLink as the backend decides).
    Each engine module's `disagg_flags` is the one rule that turns this into flags (every caller uses it).
    """

    role: str
    transfer_backend: str = ""
    bootstrap_port: int | None = None
    ib_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in DISAGG_ROLES:
            raise ValueError(f"disaggregation role {self.role!r}: use one of {', '.join(DISAGG_ROLES)} "
                             "(None for an aggregated pod)")


def disagg_backend(title: str, disagg: Disaggregation, backends: dict[str, str], default: str) -> str:
    """The engine's spelling of `disagg.transfer_backend` ("" -> `default`), or a RenderError naming the choices."""
    name = (disagg.transfer_backend or default).lower()
    if name not in backends:
        raise RenderError(f"disaggregation transfer backend {disagg.transfer_backend!r}: {title} has "
                          f"{', '.join(sorted(backends))}; choose one of them")
    return backends[name]


class RenderError(ValueError):
    """A plan that the chosen engine cannot be started with; the message names the fix."""


def flag_items(flags: dict[str, Any]) -> list[tuple[str, list[str]]]:
    out = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        out.append((k, [] if v is True else [str(v)]))
    return out


def merge_extra(base: list[tuple[str, list[str]]], extra: Sequence[str], allow_override: bool,
                 explain: list[Explanation]) -> list[tuple[str, list[str]]]:
    index = {norm_flag(k): i for i, (k, _) in enumerate(base) if k}
    out = list(base)
    for flag, values in parse_args(extra):
        shown = " ".join([flag, *values]).strip()
        if not flag:
            out.append((flag, values))
            continue
        n = norm_flag(flag)
        if n in _BOOTSTRAP:
            explain.append(Explanation(flag, " ".join(values), "extraArgs cannot set bootstrap/port flags; ignored",
                                       "meshplan.render.engine_args", "warning"))
            continue
        if n in _PLAN_OWNED and not allow_override:
            explain.append(Explanation(flag, " ".join(values),
                                       "extraArgs sets a flag the plan owns; ignored (pin it in spec.parallelism/"
                                       "spec.precision or set spec.engine.allowPlanOverride)",
                                       "meshplan.api PLAN_OWNED_FLAGS", "warning"))
            continue
        if n in index:
            old = out[index[n]]
            out[index[n]] = (flag, values)
            same = norm_flag(old[0]) == n and old[1] == values and old[0].startswith("--no-") == flag.startswith("--no-")
            explain.append(Explanation(flag, " ".join(values),
                                       f"extraArgs replaces meshplan's `{' '.join([old[0], *old[1]])}`"
                                       + (" (plan override allowed: predictions may not describe what runs)"
                                          if n in _PLAN_OWNED else ""),
                                       "spec.engine.extraArgs", "info" if same else "warning"))
        else:
            out.append((flag, values))
            index[n] = len(out) - 1
            explain.append(Explanation(flag, " ".join(values), f"from spec.engine.extraArgs: {shown}"))
    return out


def flatten(items: list[tuple[str, list[str]]]) -> list[str]:
    out: list[str] = []
    for k, vs in items:
        if k:
            out.append(k)
        out.extend(vs)
    return out



@dataclass(frozen=True)
class EngineKnobs:
    """The plan's chunk size and batch limit as one engine's flags mean them.

    The plan counts `max_num_seqs` per replica and the chunk per attention rank (`planner.perf`: each DP
    rank's step carries `chunk` tokens). An engine whose schedulers run per data-parallel rank (vLLM: every
    DP rank is its own engine core) is told a per-rank batch limit; `replica_max_num_seqs` is what one
    replica then runs at once, the figure the planner prices. `same_knobs` is the identity mapping.
    """

    chunk_size: int | None            # the engine's chunk flag value
    max_num_seqs: int | None          # the engine's batch-limit flag value
    replica_max_num_seqs: int | None  # sequences one replica runs at once with that flag
    ranks: int = 1                    # schedulers per replica the batch limit applies to


def same_knobs(layout: Layout, chunk_size: int | None, max_num_seqs: int | None) -> EngineKnobs:
    """Engines whose flags mean what the plan means (one scheduler per replica)."""
    return EngineKnobs(chunk_size, max_num_seqs, max_num_seqs, 1)


SIXTEEN_BIT = ("bf16", "fp16")


def sixteen_bit_only(title: str, model: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    """The precision rule of an engine that cannot be told a dtype (NIM's profile and DeepSpeed-MII decide it):
    16-bit weights or the checkpoint's own dtype, a 16-bit KV cache; None when these dtypes run."""
    if kv_dtype not in SIXTEEN_BIT:
        return (f"spec.precision.kvCache {kv_dtype}: {title} cannot be told a {kv_dtype} KV cache (it runs "
                f"{'/'.join(SIXTEEN_BIT)}): pin spec.precision.kvCache bf16 or use another engine")
    native = getattr(model, "native_dtype", "bf16") or "bf16"
    if weight_dtype not in SIXTEEN_BIT and weight_dtype != native:
        return (f"spec.precision.weights {weight_dtype}: {title} cannot be told to run {weight_dtype} weights (it "
                f"loads the checkpoint's {native}): pin spec.precision.weights {native} or use another engine")
    return None


# ---- EPLB: redundant experts -----------------------------------------------------------------

def one_per_rank(num_experts: int, ep_size: int) -> int:
    """Redundant experts for an EP group of `ep_size` ranks: one per rank, as DeepSeek's and the peers' EP
    deployments run (DeepSeek-R1 EP32: 256 + 32 = 288 physical experts, 9 per GPU: DeepSeek-V3/R1 inference
    system overview, LMSYS blog 2025-05-05 large-scale EP, vLLM eplb_state.py glossary), topped up to the next
    count that makes (experts + redundant) divide by the EP size, which vLLM 0.32.0 (FusedMoE: "EPLB currently
    only supports even distribution of experts across ranks") and SGLang 0.5.23 (eplb/expert_location.py
    `assert num_physical_experts % ep_size == 0`) both require. 0 when there is no EP group or the expert count
    is not known (then the engine is not told to balance: EPLB without redundant experts is not rendered)."""
    if ep_size <= 1 or num_experts <= 0:
        return 0
    return ep_size + (-(num_experts + ep_size)) % ep_size


def no_redundant_experts(layout: Layout, model: Any = None, balancing: str = "auto") -> int:
    """The rule of an engine meshplan renders no EPLB for (NIM, DeepSpeed-MII): no redundant experts."""
    return 0


def eplb_model(serving: ServingOptions) -> Any:
    """What the redundant-experts rule reads of the model at render time (name, expert count, checkpoint dtype), from
    the serving options: the same facts the planner's `ModelArch` gives it at search time."""
    from types import SimpleNamespace

    return SimpleNamespace(name=serving.model_name or serving.model, num_experts=serving.num_experts,
                           native_dtype=serving.checkpoint_dtype)


def family_of(model: Any) -> str:
    """A model's lower-case name without its organisation (`openai/gpt-oss-120b` -> `gpt-oss-120b`)."""
    name = model if isinstance(model, str) else getattr(model, "name", "") or ""
    return name.lower().rsplit("/", 1)[-1]


def mtp_refusal(title: str, model: Any, speculative: Any) -> str | None:
    """The rule every engine that runs MTP shares: the checkpoint must ship MTP modules (config.json
    `num_nextn_predict_layers` > 0, `catalog.models.ModelArch.mtp_layers`); None when it does."""
    if getattr(speculative, "method", "off") != "mtp":
        return None
    if not (getattr(model, "mtp_layers", 0) or 0):
        return (f"spec.engine.speculative.method mtp: {getattr(model, 'name', 'the model')} has no multi-token-prediction "
                f"modules (config.json num_nextn_predict_layers is absent or 0), so {title} has no MTP drafter to run; "
                "set spec.engine.speculative.method off, or serve a checkpoint that ships MTP layers (DeepSeek-V3/R1)")
    return None


class EngineModule(Protocol):
    """The interface every engine module implements (module-level names)."""

    NAME: str                 # spec.engine.kind
    TITLE: str                # the engine's own name, for messages
    DEFAULT_IMAGE: str        # the operator's pinned image (override: spec.engine.image)

    def check_layout(self, layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None: ...

    def check_pods(self, layout: Layout, pods: int, gpus_per_pod: int) -> str | None: ...

    def check_knobs(self, chunk_size: int | None, max_num_seqs: int | None) -> str | None: ...

    def check_precision(self, model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None: ...

    def layout(self, layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
               memory_fraction: float | None = None, kv_dtype: str | None = None,
               a2a_backend: str | None = None) -> EngineLayout: ...

    def command(self, candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
                explain: list[Explanation]) -> EngineCommand: ...

    # Optional (default `no_redundant_experts`): redundant experts the engine runs for `layout` with
    # spec.engine.expertLoadBalancing `balancing`; the planner's memory fit and performance model and the
    # renderer's EPLB flags all read this one count (planner.engines.redundant_experts).
    def redundant_experts(self, layout: Layout, model: Any = None, balancing: str = "auto") -> int: ...

    # Optional (prefill/decode disaggregation, issue 19; an engine without them refuses `ServingOptions.disagg`):
    # `disagg_flags(disagg, layout, explain)` -> the role's flags (or LLM-API config) that `command` renders, and
    # `router_command(prefill, decode, port, disagg)` -> (command, args) of the engine's own PD router in front of
    # them (`disagg`: the roles' transfer backend and bootstrap port, which the router must match).
    def disagg_flags(self, disagg: Disaggregation, layout: Layout, explain: list[Explanation]) -> dict[str, Any]: ...

    def router_command(self, prefill: Sequence[str], decode: Sequence[str], port: int = HTTP_PORT,
                       disagg: Disaggregation | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]: ...
