"""The LLMDeployment API (`meshplan.dev/v1alpha1`) as pydantic v2 models.

These models are the single source of truth of the API:

- the CRD's OpenAPI v3 schema is generated from them (`meshplan.api.crd`), so
  every field's description here is what `kubectl explain llmd.spec...` prints;
- the operator and the CLI parse manifests with them (`LLMDeployment.from_manifest`);
- cross-field rules are declared once per model as `Rule`s: each carries the CEL
  expression the API server evaluates (`x-kubernetes-validations`) and the same
  check written in Python, so `meshplan plan manifest.yaml` refuses what
  `kubectl apply` would refuse, with the same message (the models are strict
  about types, as the API server is). Transition rules (`oldSelf`,
  immutable fields) only exist on the server side.

What CEL cannot check (a catalogue model name exists, pinned sizes divide the
catalogue model's heads/experts, GPU product names are known) lives in
`validate_semantics`, which the operator runs before planning and reports as a
`Planned=False` condition.

Decisions worth knowing:

- Immutable (CEL `self == oldSelf`): `engine.kind` (engines differ in metrics,
  multi-node bootstrap and API details, so a mixed fleet mid-roll would serve
  and autoscale inconsistently: deploy a second LLMDeployment and shift
  traffic) and `model.servedName` once set (clients address the model by it).
  The model and its weights stay mutable: changing them re-plans and rolls
  replicas group by group.
- `replicas` is not forced into [minReplicas, maxReplicas] when autoscaling is
  on: the CRD cannot tell a defaulted `replicas: 1` from a written one, so such
  a rule would refuse `minReplicas: 2` manifests that never mention replicas.
  The autoscaler clamps instead and reports `status.desiredReplicas`.
- `requestRate` and `concurrency` are mutually exclusive but both optional:
  with neither, the planner explores the whole throughput/interactivity
  frontier (the NVIDIA blog's picture) and picks by `objective`.
- Pinned parallel sizes are int-or-string (`auto` or an integer) in the CRD;
  CEL checks the string is exactly `auto` and multiplies the pinned ones (auto
  counts as 1, a lower bound) against `gpus.maxGpus`.
- Serving toggles are `auto|enabled|disabled`, not `on|off`: YAML 1.1 reads
  unquoted on/off as booleans.

Conventions: YAML keys are camelCase (`alias_generator`), Python attributes are
snake_case (`populate_by_name`). Optional fields default to `None` and are left
out of manifests and of the CRD's `required`; every string, list and map has a
size bound so the API server's CEL cost estimator accepts the rules.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "meshplan.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
SINGULAR = "llmdeployment"
SHORT_NAMES = ("llmd",)

Dtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
DtypeOrAuto = Literal["auto", "bf16", "fp16", "fp8", "int8", "int4", "fp4"]
EngineKind = Literal["vllm", "sglang", "trtllm", "nim", "deepspeed"]
Objective = Literal["maxThroughput", "bestInteractivity", "balanced", "minCostWithinSLO"]
# Not on/off: YAML 1.1 (PyYAML, and kubectl's sigs.k8s.io/yaml) reads unquoted
# on/off as booleans, so `cudaGraphs: off` would arrive as false and be refused.
AutoOnOff = Literal["auto", "enabled", "disabled"]
Percentile = Literal[50, 90, 95, 99]
Transport = Literal["auto", "nvlink", "infiniband", "roce", "efa", "tcp"]
ConditionType = Literal["Planned", "Placed", "Available", "Progressing", "Degraded", "ScalingLimited", "ScalingActive",
                        "Routed"]

# Bits per weight/KV element of each dtype: the order `precision.accuracyFloor` uses.
DTYPE_BITS: dict[str, int] = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}

# Engine flags whose value the plan decides. extraArgs may not set them unless
# engine.allowPlanOverride is true. Sources: vLLM engine arguments
# (docs.vllm.ai/en/latest/configuration/engine_args: --tensor-parallel-size/-tp,
# --pipeline-parallel-size/-pp, --data-parallel-size/-dp, --enable-expert-parallel/-ep,
# --max-num-seqs, --max-num-batched-tokens, --kv-cache-dtype); SGLang server
# arguments (docs.sglang.io/advanced_features/server_arguments: --tp-size/--tp,
# --dp-size/--dp, --ep-size/--ep, --pp-size, --enable-dp-attention,
# --chunked-prefill-size, --max-running-requests); trtllm-serve
# (nvidia.github.io/TensorRT-LLM/commands/trtllm-serve: --tp_size, --pp_size,
# --ep_size, --max_batch_size, --max_num_tokens). Both engines accept `_` for `-`.
PLAN_OWNED_FLAGS: tuple[str, ...] = (
    "tensor-parallel-size", "tp-size", "tp",
    "pipeline-parallel-size", "pp-size", "pp",
    "data-parallel-size", "dp-size", "dp",
    "expert-parallel-size", "ep-size", "ep", "moe-ep-size", "enable-expert-parallel",
    "moe-expert-parallel-size",   # trtllm-serve's long name of --ep_size
    "enable-dp-attention",
    # SGLang 0.5.23: the attention-DP and MoE-DP sizes (--attn-dp-size / --attention-data-parallel-size,
    # --moe-dp-size / --moe-data-parallel-size; sglang/srt/server_args.py ServerArgs) reshape the layout
    "attn-dp-size", "moe-dp-size",
    "max-num-seqs", "max-num-batched-tokens", "max-running-requests", "chunked-prefill-size",
    "max-batch-size", "max-num-tokens",
    "kv-cache-dtype",
    "tensor-parallel", "replica-num",   # DeepSpeed-MII 0.3.3 mii/entrypoints/openai_api_server.py
)
PLAN_OWNED_SHORT_FLAGS: tuple[str, ...] = ("tp", "pp", "dp", "ep")  # vLLM single-dash aliases


def _flag_regex() -> str:
    longs = "|".join(f.replace("-", "[-_]") for f in PLAN_OWNED_FLAGS)
    shorts = "|".join(PLAN_OWNED_SHORT_FLAGS)
    return f"^(--({longs})|-({shorts}))(=.*)?$"


PLAN_OWNED_FLAG_RE = _flag_regex()

# Abbreviations: vLLM's and SGLang's argparse parsers accept any unambiguous prefix of an option
# (allow_abbrev=True), so `--tensor-parallel-siz` IS `--tensor-parallel-size`. RESERVED_FLAG_NAMES:
# every real spelling (meshplan.catalog.engine_options, from the engines' own parsers) of a
# plan-owned option, `--served-model-name` (spec.model.servedName owns it) and the options that take
# a secret inline; a flag that is a strict prefix of one of them is refused, unless it is itself a
# real option of some engine (RESERVED_FLAG_PREFIX_EXCEPTIONS, checked exactly by the operator:
# meshplan.api.extra_args). ALWAYS_REFUSED_FLAGS: refused even with allowPlanOverride.
from meshplan.api.extra_args import OPERATOR_OWNED as _OPERATOR_OWNED  # noqa: E402
from meshplan.api.extra_args import SECRET_OPTIONS as _SECRET_OPTIONS  # noqa: E402
from meshplan.api.extra_args import reserved_prefix_names as _reserved_prefix_names  # noqa: E402

RESERVED_FLAG_NAMES, RESERVED_FLAG_PREFIX_EXCEPTIONS = _reserved_prefix_names(PLAN_OWNED_FLAGS)
ALWAYS_REFUSED_FLAGS: tuple[str, ...] = tuple(sorted(f"--{n}" for n in (*_OPERATOR_OWNED, *_SECRET_OPTIONS)))


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{x}'" for x in items) + "]"


def flag_key(arg: str) -> str:
    """The option name of an extraArgs entry as the CRD rule compares it: before `=`, `_` as `-`."""
    return arg.split("=", 1)[0].replace("_", "-")


def reserved_flag_misuse(arg: str) -> bool:
    """Python twin of the CRD rule: an abbreviation of a reserved option, or an always-refused one."""
    if not arg.startswith("-") or len(arg) < 2:
        return False
    k = flag_key(arg)
    if k in ALWAYS_REFUSED_FLAGS:
        return True
    if k in RESERVED_FLAG_PREFIX_EXCEPTIONS:
        return False
    return any(n != k and n.startswith(k) for n in RESERVED_FLAG_NAMES)


# The flag's key is read from the argument's first KEY_SCAN characters only: every reserved or refused name
# is shorter, so a longer key can neither equal one nor be a proper prefix of one. Scanning the whole
# argument (split/replace) inside the `exists` cost len(arg) per reserved name, and 64 arguments of 1 KiB
# crossed the API server's runtime cost limit once the engines' new plan-owned names were added
# (e2e/reliability/test_hostile.py). CRD validation has no cel.bind to compute the key once.
KEY_SCAN = 48
assert max(len(n) for n in (*RESERVED_FLAG_NAMES, *ALWAYS_REFUSED_FLAGS, *RESERVED_FLAG_PREFIX_EXCEPTIONS)) < KEY_SCAN
_FLAG_KEY_CEL = f"(size(a) > {KEY_SCAN} ? a.substring(0, {KEY_SCAN}) : a).split('=')[0].replace('_', '-')"
RESERVED_FLAG_CEL = (
    f"!a.startsWith('-') || size(a) < 2 || (!({_FLAG_KEY_CEL} in {_cel_list(ALWAYS_REFUSED_FLAGS)}) && "
    f"({_FLAG_KEY_CEL} in {_cel_list(RESERVED_FLAG_PREFIX_EXCEPTIONS)} || "
    f"!{_cel_list(RESERVED_FLAG_NAMES)}.exists(n, n != {_FLAG_KEY_CEL} && n.startsWith({_FLAG_KEY_CEL}))))"
)

# Environment variable names that carry secrets: they must come from a Secret
# (valueFrom.secretKeyRef), never an inline value.
# (Not CREDENTIALS: GOOGLE_APPLICATION_CREDENTIALS and friends hold file paths.)
# Matched on the upper-cased name: TOKEN with nothing or a separator after it (HF_TOKEN, HFTOKEN,
# HF-TOKEN; not TOKENIZERS_PARALLELISM or MAX_TOKENS), SECRET/PASSWORD anywhere, a final KEY after a
# separator (OPENAI_KEY; not SSL_KEY_FILE), API/ACCESS/PRIVATE KEY with or without a separator.
SECRET_ENV_RE = r"TOKEN([-_.]|$)|SECRET|PASSWORD|PASSWD|(^|[-_.])KEY$|(API|ACCESS|PRIVATE)[-_.]?KEY([-_.]|$)"
# Values that are credentials whatever the name: OpenAI keys (sk-...), Hugging Face tokens (hf_...).
SECRET_VALUE_RE = r"(^|[=: ])(sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,})"
# Variables the operator sets on every engine pod (multi-node bootstrap): user env may not set them.
RESERVED_ENV_PREFIX = "MESHPLAN_"
# Inline credentials in a weights URI: user[:password]@host, or a token-ish query
# parameter. hf:// is exempt from the first: hf://name@revision names a revision.
URI_USERINFO_RE = r"^(https?|s3|gs|az|oci|pvc|file)://[^/?#]*@"
# hf://name@revision names a revision; hf://user:token@host (a colon before the @) is a credential.
URI_HF_USERINFO_RE = r"^hf://[^/?#@]*:[^/?#]*@"
URI_TOKEN_QUERY_RE = (
    r"(?i)[?&;]([^=&;#]*[-_.])?(token|access_token|auth|authorization|api_key|apikey|key|password|secret|"
    r"sig|signature|x-amz-signature|x-amz-credential|x-goog-signature|x-goog-credential|sv|se)="
)
URI_SCHEMES = ("hf", "s3", "gs", "az", "oci", "pvc", "https", "http", "file")
URI_SCHEME_RE = r"^(" + "|".join(URI_SCHEMES) + r")://[^\s]+$"
# Per-scheme forms (RE2 and Python agree on these: no lookarounds).
# hf://[org/]name[@revision]: Hugging Face repository ids are `[namespace/]repo`, letters, digits, `-_.`
# (huggingface_hub validate_repo_id); a revision is a branch, tag or commit.
URI_HF_RE = r"^hf://([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._/-]*)?$"
# pvc://claim[/path]: claim is a PersistentVolumeClaim name (DNS subdomain), path inside the volume.
URI_PVC_RE = r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[A-Za-z0-9._/-]*)?$"
# s3://bucket[/key], gs://bucket[/object]: bucket names are 3-63 lower-case letters, digits, `.-`
# (AWS S3 and Google Cloud Storage bucket naming rules).
URI_BUCKET_RE = r"^(s3|gs)://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^?#]*)?$"
# file:// only under these directories: where images bake weights (/models) or a volume is mounted
# (/mnt/models, KServe's storage-initializer convention). Anything else could read the container's
# or node's own files.
FILE_URI_PREFIXES = ("/models/", "/mnt/models/")
URI_FILE_RE = r"^file://(" + "|".join(p.rstrip("/") for p in FILE_URI_PREFIXES) + r")/[A-Za-z0-9._/-]+$"

# One pattern, three regex engines (issue 17, finding 10: a vertical tab passed `kubectl apply` and
# failed the operator). pydantic-core checks `pattern` with Rust's regex crate, where `\s` is Unicode
# White_Space; the API server checks the CRD's `pattern` and CEL `matches()` with Go's RE2, where `\s`
# is only [\t\n\f\r ] (no \v, no NBSP, ...); and Python's `re` (the rules' lambdas below) lets `$` match
# before a trailing newline, unlike both. So: the CRD generator writes `\s` as the explicit Unicode
# White_Space class (`crd.go_pattern`), and Python code compiles patterns through `rx`, which reads `$`
# as the end of the text. tests/test_api_patterns.py checks the three agree on tricky strings.
# Unicode White_Space (unicode.org/Public/UCD/latest/ucd/PropList.txt), what Rust's `\s` matches.
WHITE_SPACE = ("\t", "\n", "\v", "\f", "\r", " ", "\x85", "\xa0", "\u1680", *map(chr, range(0x2000, 0x200B)),
               "\u2028", "\u2029", "\u202f", "\u205f", "\u3000")


@functools.lru_cache(maxsize=256)
def rx(pattern: str) -> re.Pattern:
    """`pattern` compiled for Python's `re` with RE2/Rust semantics for `$` (end of text only)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(r"\Z" if c == "$" and not in_class else c)
        i += 1
    return re.compile("".join(out))


DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Label syntax of k8s.io/apimachinery/pkg/util/validation (IsQualifiedName for keys: an optional DNS-subdomain
# prefix of <= 253 characters, '/', a name of <= 63; IsValidLabelValue for values: <= 63, may be empty).
# Written so that Python `re`, pydantic and the API server's RE2 read them alike, and without backslashes
# ('[.]' for a dot) so they sit inside CEL string literals unchanged.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_RE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _LABEL_NAME + "$"
LABEL_KEY_LENGTHS_RE = r"^([^/]{1,253}/)?[^/]{1,63}$"
LABEL_VALUE_RE = r"^(" + _LABEL_NAME + ")?$"
DNS_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
PROM_METRIC_RE = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"


@dataclass(frozen=True)
class Rule:
    """One cross-field rule: the CEL the API server runs and its Python twin.

    `field_path` is relative to the object the rule sits on (e.g. `.maxReplicas`)
    and becomes the path in the API server's error. `check` is None for
    transition rules (they use `oldSelf`, which only the server has).
    """

    cel: str
    message: str
    field_path: str | None = None
    check: Callable[[Any], bool] | None = None
    reason: str | None = None  # FieldValueInvalid (default) | FieldValueForbidden | FieldValueRequired
    # Optional message with the numbers in it: CEL for the server (it falls back
    # to `message` if this fails), and the same text computed in Python.
    message_expression: str | None = None
    python_message: Callable[[Any], str] | None = None

    def to_crd(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


def _add_rules(schema: dict[str, Any], cls: type) -> None:
    rules = cls.__dict__.get("RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_crd() for r in rules]


class ApiModel(BaseModel):
    """Base of every API object: camelCase aliases, unknown keys rejected, rules enforced."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,  # like the API server: "3" is not an integer, "true" not a boolean
        validate_default=True,
        json_schema_extra=_add_rules,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self):
        for rule in type(self).__dict__.get("RULES", ()):
            if rule.check is not None and not rule.check(self):
                raise ValueError(rule.python_message(self) if rule.python_message else rule.message)
        return self

    def to_manifest(self) -> dict[str, Any]:
        """camelCase dict for YAML/JSON, leaving out fields that are unset (None)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # keeps the decimal point: CEL does not mix int and double
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _or_default(model: type, field: str, obj: str = "self") -> str:
    """CEL for a field that has a default: the API server validates a section's
    `default: {}` against its rules before filling nested defaults, so rules
    must not assume defaulted fields are present."""
    info = model.model_fields[field]
    alias = to_camel(field)
    return f"(has({obj}.{alias}) ? {obj}.{alias} : {_cel_literal(info.default)})"


def _auto_or_int(what: str, maximum: int, minimum: int = 1):
    """`auto` or a pinned integer: an int-or-string in the CRD, checked by CEL."""
    return Annotated[
        Union[Literal["auto"], Annotated[StrictInt, Field(ge=minimum, le=maximum)]],
        WithJsonSchema(
            {
                "x-kubernetes-int-or-string": True,
                "x-kubernetes-validations": [
                    {
                        "rule": f"type(self) == string ? self == 'auto' : (self >= {minimum} && self <= {maximum})",
                        "message": f"{what} must be 'auto' or an integer from {minimum} to {maximum}",
                    }
                ],
            }
        ),
    ]


def _str(description: str, max_length: int, pattern: str | None = None, **kw) -> Any:
    return Field(description=description, max_length=max_length, pattern=pattern, **kw)


def _section(cls: type, description: str) -> Any:
    """A sub-object that is always present: `{}` by default, so the API server
    (which applies nested defaults inside a defaulted object) and pydantic agree."""
    return Field(default_factory=cls, description=description, json_schema_extra={"default": {}})


def pinned(value: int | str | None) -> int | None:
    """The pinned integer of an `auto`-or-int field, or None when it is `auto`."""
    return value if isinstance(value, int) else None


# --------------------------------------------------------------------------- model


class SecretKeyRef(ApiModel):
    """A key in a Secret in the LLMDeployment's namespace."""

    name: str = _str("Name of the Secret (same namespace as the LLMDeployment).", 253, DNS_SUBDOMAIN_RE)
    key: str = _str("Key inside the Secret whose value is the credential.", 253, r"^[-._a-zA-Z0-9]+$")


class Architecture(ApiModel):
    """Explicit model dimensions, for a model that is not in meshplan's catalogue.

    Names follow the Hugging Face `config.json` fields (noted per field) so a
    user can copy them from the model card.
    """

    layers: int = Field(ge=1, le=1024, description="Number of transformer layers (config.json `num_hidden_layers`).")
    hidden_size: int = Field(ge=1, le=262144, description="Model (residual stream) width (config.json `hidden_size`).")
    attention_heads: int = Field(ge=1, le=1024, description="Query heads per layer (config.json `num_attention_heads`).")
    kv_heads: int | None = Field(
        default=None, ge=1, le=1024,
        description="Key/value heads per layer for grouped-query attention (config.json `num_key_value_heads`); "
        "omit for multi-head attention (= attentionHeads). Ignored for MLA models.",
    )
    head_dim: int | None = Field(
        default=None, ge=1, le=4096,
        description="Dimension of one attention head (config.json `head_dim`); default hiddenSize / attentionHeads.",
    )
    kv_lora_rank: int | None = Field(
        default=None, ge=1, le=65536,
        description="Multi-head latent attention (MLA, DeepSeek-V2/V3): rank of the compressed KV latent that is cached "
        "(config.json `kv_lora_rank`). Setting it makes the model MLA.",
    )
    q_lora_rank: int | None = Field(
        default=None, ge=1, le=65536, description="MLA: rank of the compressed query (config.json `q_lora_rank`)."
    )
    qk_rope_head_dim: int | None = Field(
        default=None, ge=1, le=4096,
        description="MLA: per-head dimension of the rotary part of query/key, cached beside the latent "
        "(config.json `qk_rope_head_dim`).",
    )
    qk_nope_head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="MLA: per-head dimension of the non-rotary part of query/key (config.json `qk_nope_head_dim`)."
    )
    v_head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="MLA: per-head dimension of values (config.json `v_head_dim`)."
    )
    intermediate_size: int | None = Field(
        default=None, ge=1, le=1048576,
        description="FFN inner width of dense layers (config.json `intermediate_size`). Required for dense models.",
    )
    experts: int | None = Field(
        default=None, ge=1, le=4096,
        description="Routed experts per MoE layer (config.json `num_local_experts` / `n_routed_experts`); omit for a dense model.",
    )
    experts_per_token: int | None = Field(
        default=None, ge=1, le=256,
        description="Routed experts each token activates (config.json `num_experts_per_tok`). Required with experts.",
    )
    shared_experts: int | None = Field(
        default=None, ge=0, le=64, description="Always-active shared experts per MoE layer (config.json `n_shared_experts`)."
    )
    moe_intermediate_size: int | None = Field(
        default=None, ge=1, le=1048576,
        description="FFN inner width of one expert (config.json `moe_intermediate_size`); default intermediateSize.",
    )
    dense_layers: int | None = Field(
        default=None, ge=0, le=1024,
        description="Leading layers that are dense in an otherwise MoE model (config.json `first_k_dense_replace`).",
    )
    vocab_size: int = Field(ge=1, le=4194304, description="Vocabulary size (config.json `vocab_size`).")
    max_context_tokens: int | None = Field(
        default=None, ge=1, le=16777216,
        description="Longest context the model supports (config.json `max_position_embeddings`).",
    )
    mtp_layers: int | None = Field(
        default=None, ge=0, le=16,
        description="Multi-token-prediction modules the checkpoint ships (config.json `num_nextn_predict_layers`; "
        "DeepSeek-V3/R1: 1): what spec.engine.speculative.method mtp drafts with. Default 0 (no MTP).",
    )
    total_params: int | None = Field(
        default=None, ge=1, le=100_000_000_000_000,
        description="Total parameter count, all experts included. When given, the planner sizes the weights at "
        "this count (its per-component split from the dimensions) and the plan warns when it differs from the "
        "count computed from the dimensions by more than 10% (meshplan.catalog.models.PARAMS_TOLERANCE).",
    )
    weight_dtype: Dtype | None = Field(
        default=None,
        description="Dtype the checkpoint ships its bulk weights in: the routed experts of a MoE, else the dense "
        "layers (config.json `quantization_config`: quant_method fp8 -> fp8, mxfp4 -> fp4, compressed-tensors / "
        "ModelOpt / AWQ / GPTQ by bits and type; without one, `torch_dtype` / `dtype`). When set, "
        "precision.weights auto plans this dtype, or one the engine converts to online (vLLM/SGLang: fp8 from "
        "bf16/fp16), never another. Omitted: the checkpoint's dtype is unknown and the precision rule picks freely.",
    )
    attention_dtype: Dtype | None = Field(
        default=None,
        description="Checkpoint dtype of the attention projections when it differs from weightDtype (e.g. bf16 "
        "in Kimi-K2.5's INT4 and gpt-oss' MXFP4 checkpoints: config.json quantization_config ignore / "
        "modules_to_not_convert lists self_attn). Default weightDtype.",
    )
    dense_dtype: Dtype | None = Field(
        default=None,
        description="Checkpoint dtype of the dense-layer FFNs (denseLayers of a MoE, or all layers of a dense "
        "model) when it differs from weightDtype. Default weightDtype.",
    )
    shared_expert_dtype: Dtype | None = Field(
        default=None,
        description="Checkpoint dtype of the shared experts when it differs from weightDtype (bf16 in Kimi-K2.5's "
        "INT4 checkpoint). Default weightDtype.",
    )
    sliding_window: int | None = Field(
        default=None, ge=1, le=16777216,
        description="Tokens a sliding-window layer attends to (config.json `sliding_window`; gpt-oss 128, "
        "Gemma 3 1024). Such layers hold at most this many tokens of KV per sequence.",
    )
    sliding_window_layers: int | None = Field(
        default=None, ge=0, le=1024,
        description="How many layers use the sliding window (config.json `layer_types` entries "
        "`sliding_attention`; gpt-oss-120b 18 of 36). Requires slidingWindow.",
    )
    linear_attention_layers: int | None = Field(
        default=None, ge=0, le=1024,
        description="Linear-attention (Gated DeltaNet) layers of a hybrid model (config.json `layer_types` entries "
        "`linear_attention`, or layers - layers / `full_attention_interval`; Qwen3-Next-80B 36 of 48, "
        "Qwen3.5-397B 45 of 60). They keep a fixed state per sequence and no KV cache that grows with the "
        "context. Requires linearKeyHeads, linearValueHeads, linearKeyHeadDim and linearValueHeadDim.",
    )
    linear_key_heads: int | None = Field(
        default=None, ge=1, le=1024, description="Linear attention: key heads (config.json `linear_num_key_heads`)."
    )
    linear_value_heads: int | None = Field(
        default=None, ge=1, le=1024,
        description="Linear attention: value heads (config.json `linear_num_value_heads`).",
    )
    linear_key_head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="Linear attention: key head dimension (config.json `linear_key_head_dim`)."
    )
    linear_value_head_dim: int | None = Field(
        default=None, ge=1, le=4096,
        description="Linear attention: value head dimension (config.json `linear_value_head_dim`).",
    )
    linear_conv_kernel: int | None = Field(
        default=None, ge=1, le=64,
        description="Linear attention: short convolution width (config.json `linear_conv_kernel_dim`, 4 in "
        "Qwen3-Next); its window is part of the per-sequence state. Default 4.",
    )

    RULES = (
        Rule(
            "!has(self.experts) || has(self.expertsPerToken)",
            "spec.model.architecture.expertsPerToken is required when experts is set",
            ".expertsPerToken",
            lambda a: a.experts is None or a.experts_per_token is not None,
            "FieldValueRequired",
        ),
        Rule(
            "!has(self.expertsPerToken) || (has(self.experts) && self.expertsPerToken <= self.experts)",
            "spec.model.architecture.expertsPerToken must not exceed experts (and needs experts)",
            ".expertsPerToken",
            lambda a: a.experts_per_token is None or (a.experts is not None and a.experts_per_token <= a.experts),
        ),
        Rule(
            "!has(self.kvHeads) || (self.kvHeads <= self.attentionHeads && self.attentionHeads % self.kvHeads == 0)",
            "spec.model.architecture.kvHeads must divide attentionHeads",
            ".kvHeads",
            lambda a: a.kv_heads is None or (a.kv_heads <= a.attention_heads and a.attention_heads % a.kv_heads == 0),
        ),
        Rule(
            "!has(self.kvLoraRank) || has(self.qkRopeHeadDim)",
            "spec.model.architecture.qkRopeHeadDim is required for MLA models (kvLoraRank set)",
            ".qkRopeHeadDim",
            lambda a: a.kv_lora_rank is None or a.qk_rope_head_dim is not None,
            "FieldValueRequired",
        ),
        Rule(
            "has(self.experts) || has(self.intermediateSize)",
            "spec.model.architecture.intermediateSize is required for a dense model (no experts)",
            ".intermediateSize",
            lambda a: a.experts is not None or a.intermediate_size is not None,
            "FieldValueRequired",
        ),
        Rule(
            "!has(self.denseLayers) || self.denseLayers < self.layers",
            "spec.model.architecture.denseLayers must be smaller than layers",
            ".denseLayers",
            lambda a: a.dense_layers is None or a.dense_layers < a.layers,
        ),
        Rule(
            "!has(self.slidingWindowLayers) || self.slidingWindowLayers == 0 || has(self.slidingWindow)",
            "spec.model.architecture.slidingWindow is required when slidingWindowLayers is set",
            ".slidingWindow",
            lambda a: not a.sliding_window_layers or a.sliding_window is not None,
            "FieldValueRequired",
        ),
        Rule(
            "(has(self.slidingWindowLayers) ? self.slidingWindowLayers : 0) + "
            "(has(self.linearAttentionLayers) ? self.linearAttentionLayers : 0) <= self.layers",
            "spec.model.architecture.slidingWindowLayers + linearAttentionLayers must not exceed layers",
            ".linearAttentionLayers",
            lambda a: (a.sliding_window_layers or 0) + (a.linear_attention_layers or 0) <= a.layers,
        ),
        Rule(
            "!has(self.linearAttentionLayers) || self.linearAttentionLayers == 0 || (has(self.linearKeyHeads) && "
            "has(self.linearValueHeads) && has(self.linearKeyHeadDim) && has(self.linearValueHeadDim))",
            "spec.model.architecture.linearKeyHeads, linearValueHeads, linearKeyHeadDim and linearValueHeadDim are "
            "required when linearAttentionLayers is set (config.json linear_num_key_heads, linear_num_value_heads, "
            "linear_key_head_dim, linear_value_head_dim)",
            ".linearAttentionLayers",
            lambda a: not a.linear_attention_layers or None not in (
                a.linear_key_heads, a.linear_value_heads, a.linear_key_head_dim, a.linear_value_head_dim),
            "FieldValueRequired",
        ),
    )

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


class Weights(ApiModel):
    """Where the weights come from. Credentials only ever come from a Secret."""

    uri: str | None = _str(
        "Weights location: hf://org/name[@revision] (Hugging Face repository), pvc://claim[/path] (a "
        "PersistentVolumeClaim, mounted read-only at /mnt/models), s3://bucket/path or gs://bucket/path (streamed by "
        "vLLM's Run:ai model streamer; other engines refuse), or file:///models/... or file:///mnt/models/... (a "
        "path in the image). az://, oci:// and http(s):// are accepted by the schema but no engine meshplan "
        "renders loads them (the plan says so). Default: the catalogue entry's Hugging Face repository, or "
        "spec.model.name when that is an HF id. Must not contain credentials (no user:password@, no token or "
        "signature query parameters): use credentialsSecretRef.",
        2048, URI_SCHEME_RE, default=None,
    )
    credentials_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the credential for the weights store: for hf:// a Hugging Face token "
        "(env HF_TOKEN), for s3:// the secret access key (env AWS_SECRET_ACCESS_KEY, with accessKeyIdSecretRef), "
        "for gs:// a service-account key JSON (mounted as a file, env GOOGLE_APPLICATION_CREDENTIALS). "
        "Without it the pod's own identity is used (public repositories, IRSA, Workload Identity).",
    )
    access_key_id_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="s3:// only: Secret key holding the access key id (env AWS_ACCESS_KEY_ID). Required with "
        "credentialsSecretRef for s3://.",
    )
    endpoint: str | None = _str(
        "s3:// only: endpoint of an S3-compatible store (MinIO, Ceph, GCS interop), env AWS_ENDPOINT_URL "
        "(read by the Run:ai streamer as its S3 endpoint). Default: AWS.",
        512, r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\s?#@]*)?$", default=None,
    )
    session_token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="s3:// only: Secret key holding a session token of temporary credentials (env "
        "AWS_SESSION_TOKEN, read by the AWS SDK the Run:ai streamer uses), beside accessKeyIdSecretRef and "
        "credentialsSecretRef.",
    )
    region: str | None = _str(
        "s3:// only: the bucket's region, env AWS_REGION (AWS SDK). Default: the SDK's (us-east-1, or the "
        "node's instance metadata).", 64, r"^[a-z0-9-]+$", default=None,
    )

    RULES = (
        Rule(
            f"!has(self.uri) || !self.uri.matches('{URI_USERINFO_RE}')",
            "spec.model.weights.uri must not contain user:password@ credentials; put them in a Secret and set "
            "spec.model.weights.credentialsSecretRef",
            ".uri",
            lambda w: w.uri is None or not rx(URI_USERINFO_RE).search(w.uri),
            "FieldValueForbidden",
        ),
        Rule(
            f"!has(self.uri) || !self.uri.matches('{URI_TOKEN_QUERY_RE}')",
            "spec.model.weights.uri must not carry a token or signature query parameter; put the credential in a "
            "Secret and set spec.model.weights.credentialsSecretRef",
            ".uri",
            lambda w: w.uri is None or not rx(URI_TOKEN_QUERY_RE).search(w.uri),
            "FieldValueForbidden",
        ),
        Rule(
            f"!has(self.uri) || !self.uri.matches('{URI_HF_USERINFO_RE}')",
            "spec.model.weights.uri must not contain user:token@ credentials (hf://name@revision names a "
            "revision); put the token in a Secret and set spec.model.weights.credentialsSecretRef",
            ".uri",
            lambda w: w.uri is None or not re.search(URI_HF_USERINFO_RE, w.uri),
            "FieldValueForbidden",
        ),
        Rule(
            f"!has(self.uri) || !self.uri.startsWith('hf://') || self.uri.matches('{URI_HF_RE}')",
            "spec.model.weights.uri: an hf:// URI must be hf://[org/]name[@revision] (a Hugging Face repository id, "
            "letters, digits and -_. only)",
            ".uri",
            lambda w: w.uri is None or not w.uri.startswith("hf://") or re.search(URI_HF_RE, w.uri) is not None,
        ),
        Rule(
            f"!has(self.uri) || !self.uri.startsWith('pvc://') || self.uri.matches('{URI_PVC_RE}')",
            "spec.model.weights.uri: a pvc:// URI must be pvc://claim[/path] with claim a PersistentVolumeClaim name "
            "in this namespace",
            ".uri",
            lambda w: w.uri is None or not w.uri.startswith("pvc://") or re.search(URI_PVC_RE, w.uri) is not None,
        ),
        Rule(
            f"!has(self.uri) || !(self.uri.startsWith('s3://') || self.uri.startsWith('gs://')) || "
            f"self.uri.matches('{URI_BUCKET_RE}')",
            "spec.model.weights.uri: an s3:// or gs:// URI must be s3://bucket/path or gs://bucket/path (bucket: 3-63 "
            "lower-case letters, digits, . and -)",
            ".uri",
            lambda w: w.uri is None or not w.uri.startswith(("s3://", "gs://"))
            or re.search(URI_BUCKET_RE, w.uri) is not None,
        ),
        Rule(
            f"!has(self.uri) || !self.uri.startsWith('file://') || self.uri.matches('{URI_FILE_RE}')",
            "spec.model.weights.uri: file:// is only allowed under " + " or ".join(FILE_URI_PREFIXES)
            + " (weights baked into the image); use pvc:// for a volume",
            ".uri",
            lambda w: w.uri is None or not w.uri.startswith("file://") or re.search(URI_FILE_RE, w.uri) is not None,
            "FieldValueForbidden",
        ),
        Rule(
            "!has(self.uri) || !(self.uri.contains('/../') || self.uri.endsWith('/..') || self.uri.contains('/./'))",
            "spec.model.weights.uri must not contain . or .. path segments",
            ".uri",
            lambda w: w.uri is None or not ("/../" in w.uri or w.uri.endswith("/..") or "/./" in w.uri),
        ),
        Rule(
            "!has(self.accessKeyIdSecretRef) || (has(self.uri) && self.uri.startsWith('s3://') && "
            "has(self.credentialsSecretRef))",
            "spec.model.weights.accessKeyIdSecretRef is for s3:// URIs and needs credentialsSecretRef (the secret "
            "access key)",
            ".accessKeyIdSecretRef",
            lambda w: w.access_key_id_secret_ref is None or (
                w.uri is not None and w.uri.startswith("s3://") and w.credentials_secret_ref is not None),
        ),
        Rule(
            "!(has(self.uri) && self.uri.startsWith('s3://') && has(self.credentialsSecretRef)) || "
            "has(self.accessKeyIdSecretRef)",
            "spec.model.weights.accessKeyIdSecretRef is required with credentialsSecretRef for s3:// (the access key "
            "id and the secret access key are two Secret keys)",
            ".accessKeyIdSecretRef",
            lambda w: not (w.uri is not None and w.uri.startswith("s3://") and w.credentials_secret_ref is not None)
            or w.access_key_id_secret_ref is not None,
            "FieldValueRequired",
        ),
        Rule(
            "!has(self.sessionTokenSecretRef) || has(self.accessKeyIdSecretRef)",
            "spec.model.weights.sessionTokenSecretRef belongs to temporary S3 credentials: set "
            "accessKeyIdSecretRef and credentialsSecretRef with it",
            ".sessionTokenSecretRef",
            lambda w: w.session_token_secret_ref is None or w.access_key_id_secret_ref is not None,
        ),
        Rule(
            "!has(self.region) || (has(self.uri) && self.uri.startsWith('s3://'))",
            "spec.model.weights.region is only for s3:// URIs",
            ".region",
            lambda w: w.region is None or (w.uri is not None and w.uri.startswith("s3://")),
        ),
        Rule(
            "!has(self.endpoint) || (has(self.uri) && self.uri.startsWith('s3://'))",
            "spec.model.weights.endpoint is only for s3:// URIs",
            ".endpoint",
            lambda w: w.endpoint is None or (w.uri is not None and w.uri.startswith("s3://")),
        ),
        Rule(
            "!has(self.credentialsSecretRef) || !has(self.uri) || !(self.uri.startsWith('pvc://') || "
            "self.uri.startsWith('file://'))",
            "spec.model.weights.credentialsSecretRef has no use with pvc:// or file:// weights; remove it",
            ".credentialsSecretRef",
            lambda w: w.credentials_secret_ref is None or w.uri is None
            or not w.uri.startswith(("pvc://", "file://")),
        ),
    )


class ModelCache(ApiModel):
    """A volume for the engine's Hugging Face download cache (HF_HOME), so restarts do not download again."""

    claim_name: str | None = _str(
        "PersistentVolumeClaim (read-write, this namespace) mounted as the cache: survives pod restarts and is "
        "shared by the pods that mount it (ReadWriteMany for more than one node).",
        253, DNS_SUBDOMAIN_RE, default=None,
    )
    size_limit: str | None = _str(
        "emptyDir cache of at most this size (a Kubernetes quantity, e.g. 200Gi), used when claimName is unset: "
        "survives container restarts, not pod deletion.",
        32, r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$", default=None,
    )

    RULES = (
        Rule(
            "!(has(self.claimName) && has(self.sizeLimit))",
            "spec.model.cache: set claimName (a PVC) or sizeLimit (an emptyDir), not both",
            ".sizeLimit",
            lambda c: not (c.claim_name is not None and c.size_limit is not None),
        ),
    )


class ModelSpec(ApiModel):
    """Which model to serve: a catalogue name, or a name plus explicit architecture."""

    name: str = _str(
        "Model name: a meshplan catalogue name (llama-3.1-8b, deepseek-r1, ...: see meshplan.catalog.models) or "
        "a Hugging Face id `org/name` (meta-llama/Llama-3.1-8B-Instruct), matched to the catalogue entry of that "
        "checkpoint case-insensitively. A name or id the catalogue does not know needs `architecture` (copy it "
        "from the model's config.json: `meshplan architecture config.json`); it then is a free label, and an "
        "HF id is also what the engine loads when weights.uri is unset.",
        128, r"^[a-zA-Z0-9][a-zA-Z0-9._-]*(/[a-zA-Z0-9][a-zA-Z0-9._-]*)?$",
    )
    architecture: Architecture | None = Field(
        default=None, description="Explicit dimensions for a model the catalogue does not know (e.g. GPT-MoE-1.8T)."
    )
    weights: Weights | None = Field(default=None, description="Weights source and its credentials Secret.")
    cache: ModelCache | None = Field(
        default=None,
        description="Optional model cache volume mounted at /cache/huggingface (HF_HOME) for hf:// downloads.",
    )
    served_name: str | None = _str(
        "Model name clients send in OpenAI API requests (`model` field). Default: the weights repository name. "
        "Immutable once set: clients depend on it; deploy a new LLMDeployment to rename.",
        256, r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$", default=None,
    )

    RULES = (
        Rule(
            "!has(oldSelf.servedName) || (has(self.servedName) && self.servedName == oldSelf.servedName)",
            "spec.model.servedName is immutable once set: clients address the model by it; create a new "
            "LLMDeployment to serve under another name",
            ".servedName",
            None,
            "FieldValueForbidden",
        ),
    )


# ----------------------------------------------------------------------- precision


class Precision(ApiModel):
    """Numeric formats of weights and KV cache."""

    weights: DtypeOrAuto = Field(
        default="auto",
        description="Weight dtype: auto (the checkpoint's own dtype, or FP8 that vLLM/SGLang make online from a "
        "BF16/FP16 checkpoint when the weights would not leave room for KV cache in one NVLink domain and "
        "accuracyFloor allows; never a dtype the checkpoint does not ship in. For a model without a known "
        "checkpoint dtype (architecture without weightDtype, gpt-moe-1.8t): the most precise dtype the GPU runs "
        "natively that leaves that room, never below accuracyFloor) or pinned bf16|fp16|fp8|int8|int4|fp4.",
    )
    kv_cache: DtypeOrAuto = Field(
        default="auto",
        description="KV-cache dtype: auto (the planner picks, not below accuracyFloor) or pinned bf16|fp16|fp8|int8|int4|fp4.",
    )
    accuracy_floor: Dtype = Field(
        default="fp8",
        description="Lowest precision `auto` may choose, by bits per value (bf16/fp16 16, fp8/int8 8, int4/fp4 4). "
        "Pinned dtypes are used as given.",
    )

    def allowed_auto_dtypes(self) -> tuple[str, ...]:
        floor = DTYPE_BITS[self.accuracy_floor]
        return tuple(d for d, bits in DTYPE_BITS.items() if bits >= floor)


# -------------------------------------------------------------------------- engine


class SecretEnvSource(ApiModel):
    """Value taken from a Secret."""

    secret_key_ref: SecretKeyRef = Field(description="Secret and key holding the value.")


class EnvVar(ApiModel):
    """An environment variable: an inline value, or a value from a Secret."""

    name: str = _str("Variable name.", 128, ENV_NAME_RE)
    value: str | None = _str("Inline value (not for secrets: names like *_TOKEN, *_SECRET, *_PASSWORD must use valueFrom).", 4096, default=None)
    value_from: SecretEnvSource | None = Field(default=None, description="Take the value from a Secret key.")

    RULES = (
        Rule(
            "has(self.value) != has(self.valueFrom)",
            "env: set exactly one of value and valueFrom",
            None,
            lambda e: (e.value is None) != (e.value_from is None),
        ),
        Rule(
            f"!has(self.value) || !self.name.upperAscii().matches('{SECRET_ENV_RE}')",
            "env: a variable whose name marks a secret (TOKEN, SECRET, PASSWORD, API_KEY, ...) must use "
            "valueFrom.secretKeyRef, not an inline value",
            ".value",
            lambda e: e.value is None or not rx(SECRET_ENV_RE).search(e.name.upper()),
            "FieldValueForbidden",
        ),
        Rule(
            f"!has(self.value) || !self.value.matches('{SECRET_VALUE_RE}')",
            "env: the value looks like a credential (an sk-... or hf_... token): put it in a Secret and use "
            "valueFrom.secretKeyRef",
            ".value",
            lambda e: e.value is None or not re.search(SECRET_VALUE_RE, e.value),
            "FieldValueForbidden",
        ),
        Rule(
            f"!self.name.upperAscii().startsWith('{RESERVED_ENV_PREFIX}')",
            f"env: names starting with {RESERVED_ENV_PREFIX} are reserved for the operator's bootstrap variables "
            "(MESHPLAN_REPLICA, MESHPLAN_NODE_RANK, MESHPLAN_NNODES, MESHPLAN_LEADER_ADDRESS): rename the variable",
            ".name",
            lambda e: not e.name.upper().startswith(RESERVED_ENV_PREFIX),
            "FieldValueForbidden",
        ),
    )


def _env_list(description: str):
    return Field(
        default_factory=list,
        max_length=64,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


def _unique_env_names(env: list["EnvVar"]) -> list["EnvVar"]:
    """Mirror of the CRD's list-map (key `name`): each variable at most once."""
    seen: set[str] = set()
    for i, e in enumerate(env):
        if e.name in seen:
            raise ValueError(f"env[{i}].name {e.name!r} appears twice: each variable may be set once")
        seen.add(e.name)
    return env


class SpeculativeSpec(ApiModel):
    """Speculative decoding: the engine drafts tokens and the model verifies them in one step.

    `mtp` uses the checkpoint's own multi-token-prediction modules (config.json `num_nextn_predict_layers` > 0:
    DeepSeek-V3/R1) as the drafter: vLLM `--speculative-config {"method": "mtp", ...}`, SGLang
    `--speculative-algorithm NEXTN`, TensorRT-LLM `speculative_config: {decoding_type: MTP}`. NIM and DeepSpeed-MII
    cannot be told to (refused). The planner prices it (expected tokens per step (1 - a^(k+1)) / (1 - a) at
    acceptance rate a for k draft tokens) and fits the MTP weights and KV cache in memory."""

    method: Literal["off", "mtp"] = Field(
        default="off",
        description="off (default) or mtp (the checkpoint's multi-token-prediction modules draft the tokens; the model "
        "must ship them: config.json num_nextn_predict_layers > 0).",
    )
    tokens: int = Field(
        default=1, ge=1, le=7,
        description="Draft tokens per step, k (vLLM num_speculative_tokens, SGLang --speculative-num-steps, TensorRT-LLM "
        "num_nextn_predict_layers). More than the checkpoint's MTP modules reuses them autoregressively. Default 1.",
    )
    acceptance_rate: float | None = Field(
        default=None, ge=0.0, le=0.99,
        description="Probability that a draft token is accepted, a, for pricing only (the engine measures its own). "
        "Default for mtp: 0.85, the low end of the 85-90% the DeepSeek-V3 technical report (arXiv:2412.19437, section "
        "5.4.3) gives for the second token. Measure it on your traffic (the engines export their acceptance) and set it.",
    )


def _no_plan_flags(engine: "EngineSpec") -> bool:
    return engine.allow_plan_override or not engine.plan_owned_extra_args()


class EngineSpec(ApiModel):
    """The inference engine and its serving features."""

    kind: EngineKind = Field(
        default="vllm",
        description="Engine: vllm, sglang, trtllm (trtllm-serve, PyTorch backend), nim (NVIDIA NIM for LLMs 1.8, "
        "configured by environment; needs spec.engine.image) or deepspeed (DeepSpeed-MII 0.3.3 OpenAI server; needs "
        "spec.engine.image). Immutable: metrics, "
        "bootstrap and API details differ between engines; switch by deploying a new LLMDeployment beside this one.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "spec.engine.kind is immutable; create a new LLMDeployment to change engine",
                    "reason": "FieldValueForbidden",
                }
            ]
        },
    )
    image: str | None = _str(
        "Container image of the engine. Default: the operator's pinned image for the engine kind.",
        512, r"^[^\s]+$", default=None,
    )
    prefix_caching: bool = Field(
        default=True,
        description="Reuse KV cache across requests sharing a prefix (vLLM --enable-prefix-caching, SGLang "
        "RadixAttention, TRT-LLM KV cache reuse).",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="Request scheduling: fcfs (first come, first served) or priority (requests carry a priority).",
    )
    expert_load_balancing: AutoOnOff = Field(
        default="auto",
        description="Expert-parallel load balancing (EPLB: redundant copies of hot experts, one per EP rank, held in "
        "the memory fit): auto enables it for vLLM and SGLang when the plan uses expert parallelism over more than "
        "one GPU and the engine can balance the model; TensorRT-LLM only when enabled; ignored for dense models.",
    )
    cuda_graphs: AutoOnOff = Field(
        default="auto",
        description="CUDA graph capture for decode: auto lets the engine decide (on for its default batch sizes); "
        "disabled trades decode speed for start-up time and memory.",
    )
    all_to_all: Literal["auto", "default", "deepep-normal", "deepep-low-latency"] = Field(
        default="auto",
        description="Expert-parallel all-to-all kernels: auto lets the planner price DeepEP's normal "
        "(high-throughput) and low-latency kernels where an EP group spans NVLink domains over RDMA and the engine "
        "runs them (vLLM --all2all-backend deepep_high_throughput|deepep_low_latency, SGLang --moe-a2a-backend "
        "deepep --deepep-mode normal|low_latency) and choose by the objective; default keeps the engine's own "
        "all-to-all; deepep-normal / deepep-low-latency pin the kernels for expert-parallel layouts.",
    )
    batch_overlap: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Overlap of the expert all-to-all with compute on two micro-batches (vLLM --enable-dbo, "
        "SGLang --enable-two-batch-overlap); only with DeepEP all-to-all. auto prices it on and off and chooses "
        "by the objective; on asks for it wherever the all-to-all is DeepEP; off never.",
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra engine command-line arguments, appended after the ones the plan sets. Flags the plan "
        "owns (parallel sizes, batch and chunk limits, KV-cache dtype) are refused unless allowPlanOverride is true.",
    )
    allow_plan_override: bool = Field(
        default=False,
        description="Let extraArgs override flags the plan sets. The operator then reports the override in the "
        "Planned condition, and its predictions no longer describe what runs.",
    )
    env: list[EnvVar] = _env_list("Extra environment variables of the engine container (override the operator's).")
    speculative: SpeculativeSpec = _section(SpeculativeSpec, "Speculative decoding (MTP) and the acceptance rate the "
                                            "plan prices it at; off by default.")

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        return _unique_env_names(env)

    RULES = (
        Rule(
            "(has(self.allowPlanOverride) && self.allowPlanOverride) || !has(self.extraArgs) || "
            f"self.extraArgs.all(a, !a.matches('{PLAN_OWNED_FLAG_RE}'))",
            "spec.engine.extraArgs must not set flags the plan owns (parallel sizes, max-num-seqs, batched tokens, "
            "chunked prefill, kv-cache dtype): pin them in spec.parallelism/spec.precision, or set "
            "spec.engine.allowPlanOverride: true",
            ".extraArgs",
            _no_plan_flags,
            "FieldValueForbidden",
        ),
        Rule(
            f"!has(self.extraArgs) || self.extraArgs.all(a, {RESERVED_FLAG_CEL})",
            "spec.engine.extraArgs must not abbreviate a flag the plan or the operator owns (the engines' argparse "
            "reads --tensor-parallel-siz as --tensor-parallel-size: write options in full) nor set "
            "--served-model-name (spec.model.servedName), --api-key or --hf-token (secrets, never inline)",
            ".extraArgs",
            lambda e: not any(reserved_flag_misuse(a) for a in e.extra_args),
            "FieldValueForbidden",
        ),
        Rule(
            "!has(self.kind) || (self.kind != 'nim' && self.kind != 'deepspeed') || !has(self.speculative) || "
            "!has(self.speculative.method) || self.speculative.method == 'off'",
            "spec.engine.speculative.method: NIM and DeepSpeed-MII cannot be told to run speculative decoding (NIM's "
            "profile decides; DeepSpeed-MII 0.3.3 has none): set it to off, or use engine vllm, sglang or trtllm",
            ".speculative.method",
            lambda e: e.kind not in ("nim", "deepspeed") or e.speculative.method == "off",
            "FieldValueForbidden",
        ),
        Rule(
            "!has(self.kind) || (self.kind != 'nim' && self.kind != 'deepspeed') || has(self.image)",
            "spec.engine.image is required for engine nim (NIM containers are per model, e.g. "
            "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0) and deepspeed (DeepSpeed-MII publishes no image)",
            ".image",
            lambda e: e.kind not in ("nim", "deepspeed") or e.image is not None,
            "FieldValueRequired",
        ),
    )

    def plan_owned_extra_args(self) -> list[str]:
        """extraArgs entries that set a flag the plan owns."""
        owned = rx(PLAN_OWNED_FLAG_RE)
        return [a for a in self.extra_args if owned.match(a)]


# ------------------------------------------------------------------ workload / SLO


class WorkloadSpec(ApiModel):
    """The traffic the deployment is planned for."""

    input_tokens: int = Field(default=1024, ge=1, le=16777216, description="Typical prompt length in tokens (ISL).")
    output_tokens: int = Field(default=256, ge=1, le=1048576, description="Typical generated length in tokens (OSL).")
    request_rate: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Expected requests per second over the whole deployment (open loop). Set this or concurrency, "
        "or neither to plan the whole throughput/interactivity frontier.",
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="Expected requests in flight over the whole deployment (closed loop). Set this or requestRate.",
    )
    max_context: int | None = Field(
        default=None, ge=1, le=16777216,
        description="Longest context (prompt + output) to support, in tokens. Default inputTokens + outputTokens.",
    )

    RULES = (
        Rule(
            "!(has(self.requestRate) && has(self.concurrency))",
            "spec.workload: set requestRate or concurrency, not both",
            ".concurrency",
            lambda w: not (w.request_rate is not None and w.concurrency is not None),
        ),
    )


WorkloadSpec.RULES = (
    *WorkloadSpec.RULES,
    Rule(
        f"!has(self.maxContext) || self.maxContext >= "
        f"{_or_default(WorkloadSpec, 'input_tokens')} + {_or_default(WorkloadSpec, 'output_tokens')}",
        "spec.workload.maxContext must be at least inputTokens + outputTokens",
        ".maxContext",
        lambda w: w.max_context is None or w.max_context >= w.input_tokens + w.output_tokens,
    ),
)


class SLOSpec(ApiModel):
    """Latency targets, at one percentile."""

    ttft_ms: float | None = Field(
        default=None, gt=0, le=3_600_000, description="Time-to-first-token target in milliseconds at `percentile`."
    )
    itl_ms: float | None = Field(
        default=None, gt=0, le=600_000,
        description="Inter-token latency (time per output token) target in milliseconds at `percentile`.",
    )
    percentile: Percentile = Field(default=99, description="Percentile the targets apply to: 50, 90, 95 or 99.")
    min_tokens_per_second_per_user: float | None = Field(
        default=None, gt=0, le=100_000,
        description="Reading-speed target: tokens per second each user must receive (equivalent to itlMs = 1000 / value).",
    )

    RULES = (
        Rule(
            "has(self.ttftMs) || has(self.itlMs) || has(self.minTokensPerSecondPerUser)",
            "spec.slo needs at least one target: ttftMs, itlMs or minTokensPerSecondPerUser",
            None,
            lambda s: any(v is not None for v in (s.ttft_ms, s.itl_ms, s.min_tokens_per_second_per_user)),
            "FieldValueRequired",
        ),
    )

    @property
    def effective_itl_ms(self) -> float | None:
        """The tighter of itlMs and 1000 / minTokensPerSecondPerUser."""
        limits = [v for v in (self.itl_ms,) if v is not None]
        if self.min_tokens_per_second_per_user:
            limits.append(1000.0 / self.min_tokens_per_second_per_user)
        return min(limits) if limits else None


# -------------------------------------------------------------- parallelism / GPUs

MAX_TENSOR = 512
MAX_EXPERT = 1024
MAX_PIPELINE = 256


class ParallelismSpec(ApiModel):
    """Each size is `auto` (the planner chooses) or pinned. DP is spec.replicas."""

    tensor: _auto_or_int("spec.parallelism.tensor", MAX_TENSOR) = Field(
        default="auto", description="Tensor-parallel GPUs per group (TP): 'auto' or a pinned integer."
    )
    expert: _auto_or_int("spec.parallelism.expert", MAX_EXPERT) = Field(
        default="auto",
        description="Expert-parallel groups per replica (EP; attention is data-parallel across them): 'auto' or "
        "a pinned integer. 1 for dense models.",
    )
    pipeline: _auto_or_int("spec.parallelism.pipeline", MAX_PIPELINE) = Field(
        default="auto", description="Pipeline stages per replica (PP): 'auto' or a pinned integer."
    )
    chunk_size: _auto_or_int("spec.parallelism.chunkSize", 1048576, 16) = Field(
        default="auto",
        description="Chunked-prefill budget, tokens per engine step (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size, TRT-LLM --max_num_tokens): 'auto' or pinned.",
    )
    max_num_seqs: _auto_or_int("spec.parallelism.maxNumSeqs", 65536) = Field(
        default="auto",
        description="Sequences batched per replica (vLLM --max-num-seqs, SGLang --max-running-requests, TRT-LLM "
        "--max_batch_size): 'auto' or pinned.",
    )

    def pinned_gpus_per_replica(self) -> int:
        """Lower bound of GPUs per replica from the pinned sizes (`auto` counts as 1)."""
        out = 1
        for v in (self.tensor, self.expert, self.pipeline):
            out *= pinned(v) or 1
        return out


def label_selector_problems(selector: dict[str, str], field: str = "spec.gpus.nodeSelector") -> list[str]:
    """Entries of a node selector that are not valid label keys/values (the API server refuses them in a
    pod's nodeSelector, and they would never match a node), each naming the field and the syntax."""
    out = []
    for key, value in selector.items():
        if not (re.fullmatch(LABEL_KEY_RE, key) and re.fullmatch(LABEL_KEY_LENGTHS_RE, key)):
            out.append(f"{field}: {key!r} is not a valid label key ([prefix/]name: a DNS-subdomain prefix of <= 253 "
                       "characters, a name of <= 63 characters of letters, digits, '-', '_', '.', starting and "
                       "ending with a letter or digit)")
        if not re.fullmatch(LABEL_VALUE_RE, value):
            out.append(f"{field}[{key!r}]: {value!r} is not a valid label value (<= 63 characters of letters, "
                       "digits, '-', '_', '.', starting and ending with a letter or digit; one value per key: "
                       "selector syntax such as ',', 'in (...)' or '!=' is not allowed)")
    return out


class GpusSpec(ApiModel):
    """Which GPUs the deployment may use."""

    RULES = (
        Rule(
            "!has(self.nodeSelector) || self.nodeSelector.all(k, k.matches('" + LABEL_KEY_RE + "') && "
            "k.matches('" + LABEL_KEY_LENGTHS_RE + "') && self.nodeSelector[k].matches('" + LABEL_VALUE_RE + "'))",
            "spec.gpus.nodeSelector: every key must be a label key ([prefix/]name, name <= 63 characters of "
            "letters, digits, '-', '_', '.') and every value a label value (<= 63 such characters, one value: "
            "no ',' or '!=' selector syntax)",
            ".nodeSelector",
            lambda g: not label_selector_problems(dict(g.node_selector)),
            python_message=lambda g: "; ".join(label_selector_problems(dict(g.node_selector))),
        ),
    )

    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Only nodes with all these labels are candidates (same as a pod's nodeSelector).",
    )
    products: list[Annotated[str, Field(max_length=128)]] = Field(
        default_factory=list,
        max_length=16,
        description="Allowed GPU products: nvidia.com/gpu.product label values (e.g. NVIDIA-H100-80GB-HBM3) or "
        "catalogue names (h100, h200, gb200, l40s, ...). Empty: any.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_gpus: int | None = Field(
        default=None, ge=1, le=65536,
        description="Most GPUs the deployment may use in total, all replicas together (a cost ceiling for the "
        "planner and the autoscaler).",
    )


# ---------------------------------------------------------------------- autoscaling


class MetricNames(ApiModel):
    """Prometheus metric names, for engines or exporters that rename them.

    Only names: the operator builds the queries itself (label values escaped), so
    nothing from the spec is spliced into PromQL.
    """

    ttft_histogram: str | None = _str(
        "Histogram of time to first token in seconds (default per engine, vLLM "
        "vllm:time_to_first_token_seconds_bucket).", 200, PROM_METRIC_RE, default=None,
    )
    itl_histogram: str | None = _str(
        "Histogram of inter-token latency in seconds (default per engine, vLLM "
        "vllm:inter_token_latency_seconds_bucket).", 200, PROM_METRIC_RE, default=None,
    )
    requests_waiting: str | None = _str(
        "Gauge of queued requests (default per engine, vLLM vllm:num_requests_waiting).", 200, PROM_METRIC_RE, default=None
    )
    requests_running: str | None = _str(
        "Gauge of running requests (default per engine, vLLM vllm:num_requests_running).", 200, PROM_METRIC_RE, default=None
    )
    requests_completed: str | None = _str(
        "Counter of completed requests, read as a rate (default per engine, vLLM vllm:request_success_total, "
        "SGLang sglang:num_requests_total; an engine without one can name its end-to-end latency histogram's "
        "count, e.g. sglang:e2e_request_latency_seconds_count).", 200, PROM_METRIC_RE, default=None,
    )
    kv_cache_usage: str | None = _str(
        "Gauge of KV-cache usage as a fraction 0..1 (default per engine, vLLM vllm:kv_cache_usage_perc, "
        "SGLang sglang:token_usage, TensorRT-LLM trtllm_kv_cache_utilization).", 200, PROM_METRIC_RE, default=None,
    )


class AutoscalingSpec(ApiModel):
    """Scale DP replicas from the SLO percentiles Prometheus reports.

    When enabled, meshplan decides the replica count within [minReplicas,
    maxReplicas] and reports it in status.desiredReplicas; spec.replicas is only
    the starting point (clamped into the range). When disabled, spec.replicas (and
    so the scale subresource: kubectl scale, HPA, KEDA) rules.
    """

    enabled: bool = Field(default=False, description="Turn SLO autoscaling on. Needs spec.slo.ttftMs or spec.slo.itlMs.")
    min_replicas: int = Field(default=1, ge=0, le=10000, description="Fewest replicas (0 allows scale to zero).")
    max_replicas: int | None = Field(
        default=None, ge=1, le=10000, description="Most replicas. Required when enabled: it is the cost ceiling."
    )
    prometheus: str | None = _str(
        "Name of the Prometheus endpoint to query, one of those the cluster admin allows (chart value "
        "prometheusEndpoints; `meshplan run --prometheus-endpoint NAME=URL`). Default: the operator's "
        "default endpoint (chart value prometheusUrl), named `default`.",
        63, DNS_LABEL_RE, default=None,
    )
    prometheus_url: str | None = _str(
        "Prometheus base URL (http(s)://host:port). Accepted only when it is exactly the URL of an endpoint the "
        "cluster admin allows (then it stands for that endpoint; prefer spec.autoscaling.prometheus); any other "
        "URL is refused (ScalingActive=False, PrometheusNotAllowed). Default: the operator's default endpoint.",
        2048, r"^https?://[^\s@]+$", default=None,
    )
    up_window_seconds: int = Field(
        default=60, ge=10, le=3600, description="Scale up when an SLO ratio stays above upThreshold this long."
    )
    down_window_seconds: int = Field(
        default=300, ge=10, le=86400, description="Scale down when all SLO ratios stay below downThreshold this long."
    )
    cooldown_seconds: int = Field(default=120, ge=0, le=86400, description="Least time between two scaling changes.")
    up_threshold: float = Field(
        default=1.0, gt=0, le=10,
        description="Scale up above this ratio of observed percentile to target (1.0 = at the target).",
    )
    down_threshold: float = Field(
        default=0.8, gt=0, le=10,
        description="Scale down when every ratio is below this. Must be below upThreshold. The default 0.8 "
        "leaves room for latency floors: ITL at batch 1 is often 50-70% of a typical target, so a lower "
        "threshold would never let replicas go.",
    )
    max_step_up: int = Field(default=4, ge=1, le=1000, description="Most replicas added in one decision.")
    max_step_down: int = Field(default=1, ge=1, le=1000, description="Most replicas removed in one decision.")
    initial_burst_headroom: float | None = Field(
        default=None, ge=0, le=4,
        description="The rise of demand to provision for before any rise was observed (1.5 = +150 %), "
        "halving every 4 h of watched metrics; replicas are sized for demand x (1 + the larger of this and "
        "the largest rise seen within 5 minutes over the last day). Unset: 1.5 (a new replica takes minutes "
        "to serve, so only headroom already running absorbs a burst). 0 sizes for observed rises only.",
    )
    metrics: MetricNames = _section(MetricNames, description="Metric name overrides.")



_A = AutoscalingSpec
AutoscalingSpec.RULES = (
    Rule(
        f"!{_or_default(_A, 'enabled')} || has(self.maxReplicas)",
        "spec.autoscaling.maxReplicas is required when autoscaling is enabled",
        ".maxReplicas",
        lambda a: not a.enabled or a.max_replicas is not None,
        "FieldValueRequired",
    ),
    Rule(
        f"!has(self.maxReplicas) || {_or_default(_A, 'min_replicas')} <= self.maxReplicas",
        "spec.autoscaling.minReplicas must not exceed maxReplicas",
        ".minReplicas",
        lambda a: a.max_replicas is None or a.min_replicas <= a.max_replicas,
    ),
    Rule(
        f"{_or_default(_A, 'down_threshold')} < {_or_default(_A, 'up_threshold')}",
        "spec.autoscaling.downThreshold must be below upThreshold (else replicas oscillate)",
        ".downThreshold",
        lambda a: a.down_threshold < a.up_threshold,
    ),
)


# ---------------------------------------------------------------------------- NCCL


class NcclSpec(ApiModel):
    """Collective-communication settings. Defaults come from the topology."""

    transport: Transport = Field(
        default="auto",
        description="Inter-node transport: auto (from node labels), nvlink (multi-node NVLink, e.g. GB200 NVL72), "
        "infiniband, roce, efa or tcp.",
    )
    socket_ifname: str | None = _str(
        "NCCL_SOCKET_IFNAME: interfaces for bootstrap and TCP traffic (e.g. eth0, ^lo,docker).",
        256, r"^[\^=]?[A-Za-z0-9_.:,*-]+$", default=None,
    )
    ib_hca: str | None = _str(
        "NCCL_IB_HCA: InfiniBand/RoCE adapters to use (e.g. mlx5_0:1,mlx5_1:1 or =mlx5_0).",
        512, r"^[\^=]?[A-Za-z0-9_.:,-]+$", default=None,
    )
    env: list[EnvVar] = _env_list("Extra NCCL_* (or UCX_, FI_ ...) variables; they override meshplan's defaults.")

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        return _unique_env_names(env)


# ----------------------------------------------------------------------------- spec


_AUTOSCALING_ON = "(has(self.autoscaling) && has(self.autoscaling.enabled) && self.autoscaling.enabled)"


def _pinned_gpus_cel() -> str:
    """CEL for the GPUs the pinned sizes need at least: tp x ep x pp (auto = 1) x replicas."""

    def term(f: str) -> str:
        return f"(has(self.parallelism.{f}) && type(self.parallelism.{f}) == int ? self.parallelism.{f} : 1)"

    min_replicas = _or_default(AutoscalingSpec, "min_replicas", "self.autoscaling")
    replicas = "(has(self.replicas) ? self.replicas : 1)"
    replicas = (
        f"({_AUTOSCALING_ON} ? ({min_replicas} > 0 ? {min_replicas} : 1) : ({replicas} > 0 ? {replicas} : 1))"
    )
    return f"{term('tensor')} * {term('expert')} * {term('pipeline')} * {replicas}"


_BUDGET_GUARD = "!has(self.gpus) || !has(self.gpus.maxGpus) || !has(self.parallelism)"
_BUDGET_MESSAGE = (
    "spec.gpus.maxGpus {max_gpus} is smaller than the {needed} GPUs the pinned spec.parallelism sizes need "
    "(tensor x expert x pipeline x replicas, or x autoscaling.minReplicas when autoscaling): raise "
    "spec.gpus.maxGpus or pin smaller sizes"
)


def _budget_message(spec: "LLMDeploymentSpec") -> str:
    needed = spec.parallelism.pinned_gpus_per_replica() * _replicas_at_least(spec)
    return _BUDGET_MESSAGE.format(max_gpus=spec.gpus.max_gpus, needed=needed)


def _budget_message_cel() -> str:
    before, rest = _BUDGET_MESSAGE.split("{max_gpus}")
    middle, after = rest.split("{needed}")
    # string(dyn(...)): the cost estimator (k8s 1.36) treats string(<int field>) as an
    # unbounded string and refuses the CRD; through dyn it is estimated as small.
    return (
        f"'{before}' + string(dyn(self.gpus.maxGpus)) + '{middle}' + string(dyn({_pinned_gpus_cel()})) + '{after}'"
    )


def _replicas_at_least(spec: "LLMDeploymentSpec") -> int:
    if spec.autoscaling.enabled:
        return max(spec.autoscaling.min_replicas, 1)
    return max(spec.replicas, 1)


def _pinned_fits_budget(spec: "LLMDeploymentSpec") -> bool:
    if spec.gpus.max_gpus is None:
        return True
    return spec.parallelism.pinned_gpus_per_replica() * _replicas_at_least(spec) <= spec.gpus.max_gpus


def _arch_check(spec: "LLMDeploymentSpec", fn: Callable[[Architecture, ParallelismSpec], bool]) -> bool:
    arch = spec.model.architecture
    return arch is None or fn(arch, spec.parallelism)


_ARCH = "has(self.model.architecture) && has(self.parallelism)"


# --------------------------------------------------------------------------- pod resources

_QUANTITY_RE = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_CPU_RE = r"^([0-9]+(\.[0-9]{1,3})?|[0-9]+m)$"


class ResourceList(ApiModel):
    """CPU, memory and ephemeral storage of each engine container (Kubernetes quantities). GPUs are the
    plan's: not settable here."""

    cpu: str | None = _str("CPU cores, e.g. 16 or 500m.", 32, _CPU_RE, default=None)
    memory: str | None = _str("Memory, e.g. 256Gi.", 32, _QUANTITY_RE, default=None)
    ephemeral_storage: str | None = Field(
        default=None, alias="ephemeral-storage", max_length=32, pattern=_QUANTITY_RE,
        description="Ephemeral storage (container writable layer, logs, emptyDir caches), e.g. 500Gi.")


class ResourcesSpec(ApiModel):
    """Overrides of the requests and limits meshplan sizes for every engine container from the plan
    (docs/pods.md explains each default). Each key given replaces that default; the others stay."""

    requests: ResourceList | None = Field(default=None, description="Requests replacing meshplan's defaults.")
    limits: ResourceList | None = Field(
        default=None, description="Limits replacing meshplan's defaults (memory: request + weights per pod; no "
        "CPU or ephemeral-storage limit by default). A memory limit below the memory request lowers the request.")


class RouterSpec(ApiModel):
    """The router in front of the deployment (docs/disaggregation.md, "The router"): the Gateway API Inference
    Extension's InferencePool and its endpoint picker, or, for clusters without a gateway, the engine's own
    prefill/decode router. Given on an aggregated deployment, it asks for an InferencePool in front of its
    replicas (so a KV-cache-aware picker can route to them)."""

    kind: Literal["inferencePool", "engine"] = Field(
        default="inferencePool",
        description="inferencePool (default): an InferencePool (inference.networking.k8s.io/v1, GIE v1.6.0) selecting "
        "the serving pods, with the endpoint picker `image`; for an aggregated deployment too. engine: the engine's own "
        "PD router as a Deployment and Service <name>-router (vllm-router 0.1.17, sglang-router 0.3.2, trtllm-serve "
        "disaggregated), listing the served revision's ready prefill and decode leaders; disaggregated deployments "
        "only (an aggregated one is served by its own Service).",
    )
    image: str | None = _str(
        "Container image of the router: for kind inferencePool the endpoint picker (EPP) the InferencePool names "
        "(meshplan pins none: GIE v1.6.0's lightweight EPP has no prefill/decode scheduling profile, so a pd-aware "
        "picker that reads the meshplan.dev/serving-role label and takes --pool-name/--pool-namespace is the "
        "operator's choice); for kind engine an image holding the engine's router (vllm-router, sglang-router, or "
        "the TensorRT-LLM image). Required whenever spec.serving.router is given.",
        512, r"^[^\s]+$", default=None,
    )

    RULES = (
        Rule(
            "has(self.image)",
            "spec.serving.router.image is required: the router's container image (the endpoint picker for kind "
            "inferencePool, the engine's router for kind engine; meshplan pins none)",
            ".image",
            lambda s: s.image is not None,
            "FieldValueRequired",
        ),
    )


class ServingSpec(ApiModel):
    """How requests are served: aggregated replicas, or prefill and decode on separate workers."""

    disaggregation: AutoOnOff = Field(
        default="disabled",
        description="Prefill/decode disaggregation: disabled (default: every replica prefills and decodes, as "
        "before this field existed, so existing manifests keep their plan and pods), enabled (prefill and decode "
        "groups of the planner's layouts and P:D ratio, behind an InferencePool), or auto (the planner compares "
        "both per spec.objective and deploys the better one; status.disaggregation says why).",
    )
    router: RouterSpec | None = Field(
        default=None, description="The router in front of the deployment: required when disaggregation is auto or "
        "enabled; on an aggregated deployment (disabled), an InferencePool in front of its replicas when given.")

    RULES = (
        Rule(
            "!has(self.disaggregation) || self.disaggregation == 'disabled' || "
            "(has(self.router) && has(self.router.image))",
            "spec.serving.router.image is required when spec.serving.disaggregation is auto or enabled: the "
            "prefill and decode roles need a router in front (an endpoint picker image for kind inferencePool, the "
            "engine's router image for kind engine; meshplan pins none)",
            ".router.image",
            lambda s: s.disaggregation == "disabled" or (s.router is not None and s.router.image is not None),
            "FieldValueRequired",
        ),
        Rule(
            "!has(self.router) || !has(self.router.kind) || self.router.kind != 'engine' || "
            "(has(self.disaggregation) && self.disaggregation != 'disabled')",
            "spec.serving.router.kind engine is the engine's prefill/decode router: it needs spec.serving."
            "disaggregation auto or enabled (an aggregated deployment is served by its own Service; use kind "
            "inferencePool for a pool in front of aggregated replicas)",
            ".router.kind",
            lambda s: s.router is None or s.router.kind != "engine" or s.disaggregation != "disabled",
            "FieldValueInvalid",
        ),
    )


class LLMDeploymentSpec(ApiModel):
    """Desired state of one LLM inference service. meshplan never writes spec."""

    model: ModelSpec = Field(description="The model to serve.")
    precision: Precision = _section(Precision, description="Weight and KV-cache dtypes.")
    engine: EngineSpec = _section(EngineSpec, description="Inference engine and serving features.")
    workload: WorkloadSpec = _section(WorkloadSpec, description="Traffic to plan for.")
    slo: SLOSpec | None = Field(
        default=None, description="Latency targets. Required by objective minCostWithinSLO and by autoscaling."
    )
    objective: Objective = Field(
        default="balanced",
        description="What the planner optimises on the throughput/interactivity frontier: maxThroughput (tokens/s "
        "per GPU), bestInteractivity (tokens/s per user), balanced (knee of the frontier within the SLO), "
        "minCostWithinSLO (fewest GPUs that meet the SLO).",
    )
    parallelism: ParallelismSpec = _section(
        ParallelismSpec, description="Tensor/expert/pipeline sizes and batch knobs, auto or pinned."
    )
    gpus: GpusSpec = _section(GpusSpec, description="Which GPUs, and how many at most.")
    replicas: int = Field(
        default=1, ge=0, le=10000,
        description="Data-parallel replicas (each a full TP x EP x PP group). Target of the scale subresource; "
        "ignored beyond the starting point while autoscaling.enabled is true. A disaggregated deployment counts "
        "decode groups here; its prefill groups follow at the plan's P:D ratio (rounded up), or meshplan's "
        "autoscaler decides them.",
    )
    autoscaling: AutoscalingSpec = _section(AutoscalingSpec, description="SLO-driven replica autoscaling.")
    replan: Literal["manual", "onDrift"] = Field(
        default="manual",
        description="What meshplan does when the observed latencies (status.observed) drift from the plan's "
        "predictions so far that a re-plan with the corrected figures would choose another layout: manual "
        "(default) only says so (event ReplanSuggested, status.observed.replanLayout); onDrift adopts that "
        "layout through the normal make-before-break path (new groups first). Needs autoscaling (its Prometheus).",
    )
    nccl: NcclSpec = _section(NcclSpec, description="NCCL transport and environment.")
    resources: ResourcesSpec | None = Field(
        default=None, description="CPU, memory and ephemeral-storage requests/limits of the engine containers, "
        "replacing meshplan's defaults key by key (sized from the plan: docs/pods.md).")
    serving: ServingSpec | None = Field(
        default=None, description="Aggregated or prefill/decode disaggregated serving, and the router. Absent: "
        "aggregated (disaggregation disabled); absent rather than defaulted so that a spec without it plans and "
        "hashes exactly as before.")

    RULES = (
        Rule(
            f"{_BUDGET_GUARD} || {_pinned_gpus_cel()} <= self.gpus.maxGpus",
            "spec.gpus.maxGpus is smaller than the GPUs the pinned spec.parallelism sizes need (tensor x expert x "
            "pipeline x replicas, or x autoscaling.minReplicas when autoscaling): raise spec.gpus.maxGpus or pin "
            "smaller sizes",
            ".gpus.maxGpus",
            _pinned_fits_budget,
            message_expression=_budget_message_cel(),
            python_message=_budget_message,
        ),
        Rule(
            "!has(self.objective) || self.objective != 'minCostWithinSLO' || has(self.slo)",
            "spec.slo is required when spec.objective is minCostWithinSLO",
            ".objective",
            lambda s: s.objective != "minCostWithinSLO" or s.slo is not None,
            "FieldValueRequired",
        ),
        Rule(
            f"!{_AUTOSCALING_ON} || (has(self.slo) && (has(self.slo.ttftMs) || "
            "has(self.slo.itlMs) || has(self.slo.minTokensPerSecondPerUser)))",
            "spec.autoscaling.enabled needs a latency target in spec.slo (ttftMs, itlMs or minTokensPerSecondPerUser)",
            ".autoscaling.enabled",
            lambda s: not s.autoscaling.enabled or s.slo is not None,
            "FieldValueRequired",
        ),
        Rule(
            f"!({_ARCH}) || type(self.parallelism.tensor) != int || "
            "self.model.architecture.attentionHeads % self.parallelism.tensor == 0",
            "spec.parallelism.tensor must divide spec.model.architecture.attentionHeads",
            ".parallelism.tensor",
            lambda s: _arch_check(s, lambda a, p: pinned(p.tensor) is None or a.attention_heads % p.tensor == 0),
        ),
        Rule(
            f"!({_ARCH}) || type(self.parallelism.expert) != int || self.parallelism.expert == 1 || "
            "(has(self.model.architecture.experts) && self.model.architecture.experts % self.parallelism.expert == 0)",
            "spec.parallelism.expert must be 1 for a dense model and divide spec.model.architecture.experts for MoE",
            ".parallelism.expert",
            lambda s: _arch_check(
                s,
                lambda a, p: pinned(p.expert) in (None, 1) or (a.experts is not None and a.experts % p.expert == 0),
            ),
        ),
        Rule(
            f"!({_ARCH}) || type(self.parallelism.pipeline) != int || "
            "self.parallelism.pipeline <= self.model.architecture.layers",
            "spec.parallelism.pipeline must not exceed spec.model.architecture.layers",
            ".parallelism.pipeline",
            lambda s: _arch_check(s, lambda a, p: pinned(p.pipeline) is None or p.pipeline <= a.layers),
        ),
    )


# --------------------------------------------------------------------------- status


class Condition(ApiModel):
    """A metav1.Condition: the standard shape of an observation."""

    type: str = _str(
        "Condition type: Planned, Placed, Available, Progressing, Degraded, ScalingLimited, ScalingActive (autoscaler metrics healthy) or Routed (disaggregated deployments: the InferencePool serves a revision).", 316,
        r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = _str("CamelCase machine-readable reason for the last transition.", 1024, r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = _str("Human-readable explanation, with the numbers behind it.", 32768, default="")
    last_transition_time: datetime = Field(strict=False, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation this condition describes.")


class PredictedPerformance(ApiModel):
    """The performance model's prediction for the chosen plan at the planned workload."""

    ttft_ms: float | None = Field(default=None, ge=0, description="Predicted time to first token, milliseconds: a closed-loop run's mean (the arrival wave's queue included). A TTFT target at percentile 90-99 is checked against it.")
    ttft_p50_ms: float | None = Field(default=None, ge=0, description="Predicted steady-state (median) time to first token, milliseconds. A TTFT target at percentile 50 is checked against it, and status.observed.ttftP50Ms is compared with it.")
    itl_ms: float | None = Field(default=None, ge=0, description="Predicted inter-token latency, milliseconds.")
    tokens_per_second_per_gpu: float | None = Field(default=None, ge=0, description="Predicted output tokens per second per GPU (throughput).")
    tokens_per_second_per_user: float | None = Field(default=None, ge=0, description="Predicted output tokens per second each user receives (interactivity).")


class PlanSummary(ApiModel):
    """One planned configuration (the choice, or an alternative)."""

    layout: str = _str("Blog-style layout name, e.g. TP4·EP4·PP4 (DP is replicas).", 64)
    tp: int = Field(ge=1, description="Tensor-parallel size.")
    ep: int = Field(default=1, ge=1, description="Expert-parallel size.")
    pp: int = Field(default=1, ge=1, description="Pipeline stages.")
    dp: int = Field(default=1, ge=0, description="Data-parallel replicas: in status.plan the count deployed "
                    "(desiredReplicas), in alternatives the count the SLO search sized for spec.workload.")
    gpus_per_replica: int = Field(ge=1, description="GPUs in one replica (tp x ep x pp).")
    nodes_per_replica: int | None = Field(default=None, ge=1, description="Nodes one replica spans.")
    gpu_product: str | None = _str("GPU product the plan is for.", 128, default=None)
    weights_dtype: str | None = _str("Weight dtype chosen.", 16, default=None)
    kv_cache_dtype: str | None = _str("KV-cache dtype chosen.", 16, default=None)
    chunk_size: int | None = Field(default=None, ge=1, description="Chunked-prefill tokens per step.")
    max_num_seqs: int | None = Field(default=None, ge=1, description="Sequences batched per replica.")
    memory_per_gpu_gib: float | None = Field(default=None, ge=0, description="Planned memory use per GPU, GiB.")
    predicted: PredictedPerformance | None = Field(default=None, description="Predicted performance.")
    reason: str | None = _str("Why this configuration was chosen (or ranked here).", 4096, default=None)


class PlanStatus(PlanSummary):
    """The chosen plan. `reason` describes what is deployed (the layout at desiredReplicas); `searchReason`
    what the SLO search saw (its own DP for spec.workload, the objective, the next best)."""

    search_reason: str | None = _str(
        "What the SLO search saw and why it chose this layout: its replica count (DP) is what it sized for "
        "spec.workload, which the deployed count (spec.replicas, the autoscaler) may differ from.", 4096,
        default=None)


class ReplicaPlacement(ApiModel):
    """Where one DP replica runs."""

    index: int = Field(ge=0, description="Replica index (0-based).")
    nvlink_domain: str | None = _str("NVLink domain (gpu.clique, or the node name) the replica's TP/EP groups sit in.", 253, default=None)
    nodes: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=1024, description="Nodes of the replica, stage order.")
    gpus: int = Field(default=0, ge=0, description="GPUs the replica holds.")
    ready: bool = Field(default=False, description="All of the replica's pods are ready.")
    role: Literal["prefill", "decode"] | None = Field(
        default=None, description="Disaggregated deployments: the group's role (index counts within its role).")
    revision: str | None = _str("Disaggregated deployments: the group's serving revision (meshplan.dev/serving-"
                                "revision).", 63, default=None)


class AutoscalingRoleStatus(ApiModel):
    """The last autoscaling decision and what it was based on (one role of a disaggregated deployment, or the
    whole aggregated deployment)."""

    last_decision_time: datetime | None = Field(default=None, strict=False, description="When the autoscaler last evaluated.")
    last_scale_time: datetime | None = Field(default=None, strict=False, description="When the replica count last changed.")
    from_replicas: int | None = Field(default=None, ge=0, description="Replicas before the last decision.")
    to_replicas: int | None = Field(default=None, ge=0, description="Replicas after the last decision.")
    reason: str | None = _str("Why (e.g. ttft ratio 1.4 above 1.0 for 60s).", 4096, default=None)
    observed_ttft_ms: float | None = Field(default=None, ge=0, description="Observed TTFT at the SLO percentile, milliseconds.")
    observed_itl_ms: float | None = Field(default=None, ge=0, description="Observed inter-token latency at the SLO percentile, milliseconds.")
    ttft_ratio: float | None = Field(default=None, ge=0, description="Observed TTFT / target.")
    itl_ratio: float | None = Field(default=None, ge=0, description="Observed ITL / target.")
    request_rate: float | None = Field(default=None, ge=0, description="Observed requests per second.")
    requests_waiting: float | None = Field(default=None, ge=0, description="Observed queued requests.")
    kv_cache_usage: float | None = Field(default=None, ge=0, description="Observed KV-cache usage of the fullest replica (0..1).")
    missing_metrics: list[Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None, max_length=8, description="Signals with no series, each with the metric names tried (ScalingActive=MetricsPartial)."
    )
    metrics_healthy: bool | None = Field(default=None, description="False when metrics were missing, stale or nonsensical (decision held).")
    # The policy's memory (meshplan.autoscale.policy.AutoscaleState), kept here so that a restarted
    # operator continues the windows and keeps what it learned instead of starting over.
    up_signal_since: datetime | None = Field(default=None, strict=False, description="Since when the scale-up signal has held without a break (the up window's start); absent when it does not hold.")
    down_signal_since: datetime | None = Field(default=None, strict=False, description="Since when the scale-down signal has held without a break (the down window's start); absent when it does not hold.")
    last_scale_down_time: datetime | None = Field(default=None, strict=False, description="When the replica count last went down (a latency breach soon after it teaches the autoscaler the real capacity).")
    learned_capacity_rps: float | None = Field(default=None, ge=0, description="Requests/s per replica at which the SLO broke, learned from a breach; used instead of the planner's capacity when lower.")
    learned_capacity_time: datetime | None = Field(default=None, strict=False, description="When learnedCapacityRps was last set.")
    learned_from_ttft: bool | None = Field(default=None, description="True when learnedCapacityRps came from a TTFT breach; such an estimate drifts back to the planner's (half-life 2 h).")
    learned_burst_rise: float | None = Field(default=None, ge=0, description="Largest relative rise of demand within 5 minutes seen since burstMemorySince (0.5 = +50 %); replicas are sized for demand x (1 + the largest remembered rise).")
    learned_burst_rise_previous: float | None = Field(default=None, ge=0, description="The same for the half-day before burstMemorySince (a rise is remembered for half a day to a day).")
    burst_memory_since: datetime | None = Field(default=None, strict=False, description="When the current half-day of burst memory began.")
    watching_since: datetime | None = Field(default=None, strict=False, description="When the autoscaler first had valid metrics for this deployment; its initial burst assumption (+150 %) halves every 4 h from then.")


class AutoscalingRolesStatus(ApiModel):
    """Per-role autoscaling of a disaggregated deployment (meshplan.controller.autoscaling_roles): each role's
    own decision on its own signals, the same fields as an aggregated deployment's status.autoscaling."""

    prefill: AutoscalingRoleStatus | None = Field(default=None, description="The prefill groups' decision (TTFT, "
                                                  "request rate and queue of the prefill pods).")
    decode: AutoscalingRoleStatus | None = Field(default=None, description="The decode groups' decision (ITL, "
                                                 "KV-cache usage, request rate, queue and running requests of the "
                                                 "decode pods).")
    ratio: str | None = _str("prefill:decode groups after the decision (P:D), e.g. 3:2.", 32, default=None)


class AutoscalingStatus(AutoscalingRoleStatus):
    """The last autoscaling decision and what it was based on. For a disaggregated deployment fromReplicas /
    toReplicas count decode groups (spec.replicas' unit) and `roles` holds both roles' decisions."""

    roles: AutoscalingRolesStatus | None = Field(default=None, description="Disaggregated deployments: the "
                                                 "prefill and decode decisions (toReplicas of decode is this "
                                                 "document's toReplicas).")


class ObservedStatus(ApiModel):
    """What the engines' Prometheus shows next to what the plan predicted (meshplan.autoscale.drift)."""

    time: datetime | None = Field(default=None, strict=False, description="When these were read.")
    percentile: float | None = Field(default=None, ge=0, le=100, description="The SLO's percentile (ttftMs, itlMs).")
    ttft_ms: float | None = Field(default=None, ge=0, description="Observed TTFT at the SLO percentile, milliseconds.")
    itl_ms: float | None = Field(default=None, ge=0, description="Observed inter-token latency at the SLO percentile, milliseconds.")
    ttft_p50_ms: float | None = Field(default=None, ge=0, description="Observed TTFT p50, milliseconds.")
    ttft_p99_ms: float | None = Field(default=None, ge=0, description="Observed TTFT p99, milliseconds.")
    itl_p50_ms: float | None = Field(default=None, ge=0, description="Observed ITL p50, milliseconds.")
    itl_p99_ms: float | None = Field(default=None, ge=0, description="Observed ITL p99, milliseconds.")
    tokens_per_second_per_gpu: float | None = Field(default=None, ge=0, description="Observed output tokens/s over the ready replicas' GPUs (the engine's generation-token counter; absent for engines without one).")
    tokens_per_second_per_user: float | None = Field(default=None, ge=0, description="Observed tokens/s of one stream, 1 / ITL p50.")
    predicted_ttft_ms: float | None = Field(default=None, ge=0, description="The plan's predicted TTFT that ttftP50Ms is compared with (its steady-state median, status.plan.predicted.ttftP50Ms, where the plan has one), milliseconds.")
    predicted_itl_ms: float | None = Field(default=None, ge=0, description="The plan's predicted ITL, milliseconds.")
    predicted_tokens_per_second_per_gpu: float | None = Field(default=None, ge=0, description="The plan's predicted tokens/s per GPU.")
    predicted_tokens_per_second_per_user: float | None = Field(default=None, ge=0, description="The plan's predicted tokens/s per user.")
    itl_correction: float | None = Field(default=None, ge=0, description="Learned observed/predicted ITL factor (p50 against the prediction; bounded 0.1..1000, decays toward 1 without observations, half-life 6 h). The autoscaler's per-replica capacity uses it.")
    ttft_correction: float | None = Field(default=None, ge=0, description="The same for TTFT.")
    correction_evaluations: int | None = Field(default=None, ge=0, description="Evaluations the factors were learned from.")
    correction_time: datetime | None = Field(default=None, strict=False, description="When the factors were last updated.")
    capacity_rps: float | None = Field(default=None, ge=0, description="Requests/s per replica the autoscaler sizes with: the planner's capacity with the corrected latencies (Little's law at the planned concurrency).")
    predicted_capacity_rps: float | None = Field(default=None, ge=0, description="The same from the uncorrected prediction.")
    replan_layout: str | None = _str("The layout a re-plan with the corrected figures would choose, when it differs from the running one.", 256, default=None)


class DisaggRoleStatus(ApiModel):
    """One role of a disaggregated deployment: its layout per group, its groups, its predicted latency."""

    layout: str | None = _str("Layout of one group of the role, e.g. TP8 or TP4·EP16.", 256, default=None)
    replicas: int | None = Field(default=None, ge=0, description="Groups of the role the plan deploys.")
    desired_replicas: int | None = Field(default=None, ge=0, description="Groups of the role meshplan drives "
                                         "toward now: decode = spec.replicas or the autoscaler's decode decision; "
                                         "prefill = the autoscaler's prefill decision, else the plan's P:D ratio "
                                         "applied to the decode groups (rounded up).")
    ready_replicas: int | None = Field(default=None, ge=0, description="Groups of the role of the served revision "
                                       "whose pods are all ready.")
    ttft_ms: float | None = Field(default=None, ge=0, description="Predicted time to first token of the prefill "
                                  "role (queue and prefill), milliseconds.")
    itl_ms: float | None = Field(default=None, ge=0, description="Predicted inter-token latency of the decode role, "
                                 "milliseconds.")


class KvPathStatus(ApiModel):
    """Where the KV cache moves from a prefill group to a decode group."""

    tier: str | None = _str("nvlink, rdma (with its fabric) or tcp: the slowest path any unit needs.", 64,
                            default=None)


class AggregatedAlternative(ApiModel):
    """The aggregated plan the disaggregated one was compared with."""

    label: str | None = _str("Its layout, e.g. TP8 x DP2.", 256, default=None)
    tokens_per_second_per_gpu: float | None = Field(default=None, ge=0, description="Predicted tokens/s per GPU.")
    tokens_per_second_per_user: float | None = Field(default=None, ge=0, description="Predicted tokens/s per user.")


class DisaggregationStatus(ApiModel):
    """What spec.serving.disaggregation chose and why (meshplan.planner.disagg)."""

    mode: AutoOnOff | None = Field(default=None, description="spec.serving.disaggregation as planned.")
    disaggregated: bool | None = Field(default=None, description="True when prefill and decode run on separate "
                                       "groups.")
    label: str | None = _str("The roles compactly, e.g. P2×TP4 + D1×EP16 (the Roles column).", 256, default=None)
    ratio: str | None = _str("P:D: prefill groups per decode groups of one unit, e.g. 2:1.", 32, default=None)
    prefill: DisaggRoleStatus | None = Field(default=None, description="The prefill role.")
    decode: DisaggRoleStatus | None = Field(default=None, description="The decode role.")
    kv_path: KvPathStatus | None = Field(default=None, description="The KV-cache transfer path.")
    aggregated: AggregatedAlternative | None = Field(default=None, description="The aggregated alternative.")
    reason: str | None = _str("Why: both sides' figures and the objective.", 4096, default=None)
    served_revision: str | None = _str(
        "The serving revision (pod label meshplan.dev/serving-revision) the InferencePool selects: the prefill "
        "and decode groups of one revision only, never a mix (controller.disagg_rollout).", 63, default=None)


class LLMDeploymentStatus(ApiModel):
    """Observed state, written only by meshplan."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        description="Planned, Placed, Available, Progressing, Degraded, ScalingLimited, ScalingActive.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    plan: PlanStatus | None = Field(default=None, description="The chosen plan and its predictions.")
    alternatives: list[PlanSummary] = Field(default_factory=list, max_length=8, description="Next-best plans, best first.")
    placement: list[ReplicaPlacement] = Field(default_factory=list, max_length=10000, description="Placement per replica.")
    replicas: int | None = Field(default=None, ge=0, description="Replicas that exist (scale subresource status); "
                                "decode groups of the current revision for a disaggregated deployment.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Replicas whose pods are all ready; ready "
                                      "decode groups of the served revision for a disaggregated deployment.")
    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas meshplan is driving toward.")
    selector: str | None = _str("Label selector of the replicas' pods (for the scale subresource).", 1024, default=None)
    autoscaling: AutoscalingStatus | None = Field(default=None, description="Last autoscaling decision.")
    observed: ObservedStatus | None = Field(default=None, description="Observed latencies and throughput next to the plan's predictions, and the learned correction (written by the autoscaler).")
    serving_since: datetime | None = Field(default=None, strict=False, description="When a replica of this deployment was first ready; kept afterwards. A deployment that has served gets free GPUs before one that never has (placement.incumbency_rank).")
    disaggregation: DisaggregationStatus | None = Field(default=None, description="Prefill/decode disaggregation: "
                                                         "the roles, their ratio and predictions, and the aggregated "
                                                         "alternative (absent for aggregated deployments).")

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class LLMDeployment(ApiModel):
    """An LLM inference service that meshplan plans, places, configures and autoscales."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["meshplan.dev/v1alpha1"] = Field(default=API_VERSION, description="meshplan.dev/v1alpha1")
    kind: Literal["LLMDeployment"] = Field(default=KIND, description="LLMDeployment")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: LLMDeploymentSpec = Field(description="Desired state.")
    status: LLMDeploymentStatus | None = Field(default=None, description="Observed state.")

    @field_validator("metadata")
    @classmethod
    def _metadata_name(cls, v: dict[str, Any]) -> dict[str, Any]:
        name = v.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 63 or not rx(DNS_LABEL_RE).match(name)):
            raise ValueError(
                f"metadata.name {name!r} must be a DNS label (lowercase letters, digits, '-', at most 63 characters): "
                "it names the replica Services"
            )
        return v

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> "LLMDeployment":
        """Parse a manifest (dict from YAML/JSON or the API server's body)."""
        return cls.model_validate(manifest)

    @property
    def name(self) -> str:
        return self.metadata.get("name", "")

    @property
    def namespace(self) -> str:
        return self.metadata.get("namespace", "default")


# ------------------------------------------------------------ semantic validation


def validate_semantics(spec: LLMDeploymentSpec) -> list[str]:
    """Checks the API server cannot do: they need meshplan's catalogues.

    Returns human-readable problems (empty when the spec is sound), each naming
    the field and the fix. The operator reports them as `Planned=False`.
    """
    problems: list[str] = []
    arch = spec.model.architecture
    catalog_model = None
    if arch is None:
        try:
            from meshplan.catalog import models as catalog_models  # written alongside the planner
        except ImportError:
            catalog_models = None
        if catalog_models is not None:
            try:
                catalog_model = catalog_models.get_model(spec.model.name)
            except (KeyError, ValueError, LookupError):
                catalog_model = None
            if catalog_model is None:
                known = getattr(catalog_models, "MODELS", None)
                hint = f" (known: {', '.join(sorted(known)[:20])})" if isinstance(known, dict) else ""
                problems.append(
                    f"spec.model.name {spec.model.name!r} is not in meshplan's catalogue{hint}: use a catalogue name "
                    "or give spec.model.architecture"
                )
    if catalog_model is not None:
        problems += _check_against_dimensions(
            spec,
            heads=getattr(catalog_model, "attention_heads", None) or getattr(catalog_model, "num_attention_heads", None),
            experts=getattr(catalog_model, "experts", None) or getattr(catalog_model, "num_experts", None),
            layers=getattr(catalog_model, "layers", None) or getattr(catalog_model, "num_layers", None),
        )
    if spec.gpus.products:
        try:
            from meshplan.catalog.gpus import get_gpu
        except ImportError:
            get_gpu = None
        if get_gpu is not None:
            for i, product in enumerate(spec.gpus.products):
                try:
                    ok = get_gpu(product) is not None
                except (KeyError, ValueError, LookupError):
                    ok = False
                if not ok:
                    problems.append(
                        f"spec.gpus.products[{i}] {product!r} is not a GPU meshplan knows: use a nvidia.com/gpu.product "
                        "label value or a catalogue name (h100, h200, b200, gb200, l40s, ...), or declare the GPU "
                        "(chart value gpuCatalog, `meshplan plan --gpu-catalog FILE`)"
                    )
    try:
        from meshplan.render.weights import engine_refusal
    except ImportError:
        engine_refusal = None
    if engine_refusal is not None and spec.model.weights is not None:
        refusal = engine_refusal(spec.model.weights.uri, spec.engine.kind)
        if refusal:
            problems.append(refusal)
    from meshplan.api.extra_args import extra_args_problems

    problems += extra_args_problems(spec.engine.kind, spec.engine.extra_args, spec.engine.allow_plan_override)
    if spec.engine.allow_plan_override and spec.engine.plan_owned_extra_args():
        problems.append(
            "spec.engine.extraArgs overrides flags the plan sets "
            f"({' '.join(spec.engine.plan_owned_extra_args())}); predictions may not describe what runs"
        )
    return problems


def _check_against_dimensions(spec: LLMDeploymentSpec, heads, experts, layers) -> list[str]:
    """Pinned parallel sizes against a catalogue model's dimensions (CEL does this for explicit architectures)."""
    out: list[str] = []
    p = spec.parallelism
    tp, ep, pp = pinned(p.tensor), pinned(p.expert), pinned(p.pipeline)
    name = spec.model.name
    if tp and heads and heads % tp:
        out.append(f"spec.parallelism.tensor {tp} does not divide the {heads} attention heads of {name}")
    if ep and ep > 1:
        if not experts:
            out.append(f"spec.parallelism.expert {ep} needs a MoE model; {name} is dense: use 1 or auto")
        elif experts % ep:
            out.append(f"spec.parallelism.expert {ep} does not divide the {experts} experts of {name}")
    if pp and layers and pp > layers:
        out.append(f"spec.parallelism.pipeline {pp} exceeds the {layers} layers of {name}")
    return out
