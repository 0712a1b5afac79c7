"""LLMDeployment models: defaulting, YAML <-> model round trips, examples, semantic checks."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml

from meshplan.api.models import (
    PLAN_OWNED_FLAGS,
    LLMDeployment,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    SLOSpec,
    validate_semantics,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def spec_of(**patch) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}, **patch})


# ---------------------------------------------------------------- defaulting


def test_minimal_spec_gets_documented_defaults():
    spec = spec_of()
    assert spec.engine.kind == "vllm"
    assert spec.engine.prefix_caching is True
    assert spec.engine.scheduling_policy == "fcfs"
    assert spec.engine.expert_load_balancing == "auto" and spec.engine.cuda_graphs == "auto"
    assert spec.precision.weights == "auto" and spec.precision.kv_cache == "auto"
    assert spec.precision.accuracy_floor == "fp8"
    assert (spec.parallelism.tensor, spec.parallelism.expert, spec.parallelism.pipeline) == ("auto",) * 3
    assert spec.replicas == 1
    assert spec.autoscaling.enabled is False and spec.autoscaling.max_replicas is None
    assert spec.nccl.transport == "auto"
    assert spec.objective == "balanced"
    assert spec.slo is None


def test_defaults_agree_with_the_planner_workload_type():
    from meshplan.planner.types import SLO, Workload

    spec = spec_of()
    assert spec.workload.input_tokens == Workload().isl
    assert spec.workload.output_tokens == Workload().osl
    assert SLOSpec(ttft_ms=1).percentile == SLO().percentile


def test_pinned_sizes_stay_integers_and_auto_stays_auto():
    spec = spec_of(parallelism={"tensor": 4, "expert": "auto", "pipeline": 2, "chunkSize": 896})
    assert spec.parallelism.tensor == 4 and isinstance(spec.parallelism.tensor, int)
    assert spec.parallelism.expert == "auto"
    assert spec.parallelism.chunk_size == 896
    assert spec.parallelism.pinned_gpus_per_replica() == 8


@pytest.mark.parametrize("value", ["4", True, 4.0, "AUTO", None])
def test_auto_or_int_refuses_look_alikes(value):
    """The CRD accepts only an integer or the string 'auto'; the models must not be laxer."""
    with pytest.raises(pydantic.ValidationError):
        spec_of(parallelism={"tensor": value})


def test_accuracy_floor_orders_dtypes_by_bits():
    spec = spec_of(precision={"accuracyFloor": "fp8"})
    assert set(spec.precision.allowed_auto_dtypes()) == {"bf16", "fp16", "fp8", "int8"}
    spec = spec_of(precision={"accuracyFloor": "bf16"})
    assert set(spec.precision.allowed_auto_dtypes()) == {"bf16", "fp16"}


def test_slo_reading_speed_tightens_itl():
    assert SLOSpec(itl_ms=50, min_tokens_per_second_per_user=25).effective_itl_ms == 40.0
    assert SLOSpec(itl_ms=30, min_tokens_per_second_per_user=25).effective_itl_ms == 30.0
    assert SLOSpec(ttft_ms=100).effective_itl_ms is None


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_parses_and_round_trips_through_yaml(path):
    manifest = yaml.safe_load(path.read_text())
    obj = LLMDeployment.from_manifest(manifest)
    dumped = yaml.safe_dump(obj.to_manifest(), sort_keys=False)
    again = LLMDeployment.from_manifest(yaml.safe_load(dumped))
    assert again == obj
    # every key the user wrote comes back with the same value (camelCase kept)
    assert _contains(obj.to_manifest()["spec"], manifest["spec"])


def _contains(full, part) -> bool:
    if isinstance(part, dict):
        return isinstance(full, dict) and all(k in full and _contains(full[k], v) for k, v in part.items())
    return full == part


def test_examples_cover_the_issue_list():
    names = {LLMDeployment.from_manifest(yaml.safe_load(p.read_text())).spec.model.name for p in EXAMPLES}
    assert {"llama-3.1-8b", "llama-3.1-70b", "deepseek-r1", "gpt-moe-1.8t", "mixtral-8x7b"} <= names


def test_gpt_moe_example_architecture_adds_up_to_1_8t():
    """The example's estimated dimensions must reproduce the published 1.8T total (within 5%)."""
    manifest = yaml.safe_load((REPO / "examples" / "gpt-moe-1.8t-gb200-nvl72.yaml").read_text())
    a = LLMDeployment.from_manifest(manifest).spec.model.architecture
    head_dim = a.head_dim or a.hidden_size // a.attention_heads
    attention = 2 * a.hidden_size * a.attention_heads * head_dim + 2 * a.hidden_size * a.kv_heads * head_dim
    experts = a.experts * 3 * a.hidden_size * a.moe_intermediate_size  # SwiGLU: gate, up, down
    embeddings = 2 * a.vocab_size * a.hidden_size
    total = a.layers * (attention + experts) + embeddings
    assert abs(total - a.total_params) / a.total_params < 0.05
    assert a.experts == 16  # the seeds


def test_to_manifest_is_camel_case_and_leaves_out_unset_fields():
    out = spec_of(slo={"ttftMs": 300}).to_manifest()
    assert out["slo"] == {"ttftMs": 300.0, "percentile": 99}
    assert "maxGpus" not in out["gpus"] and "architecture" not in out["model"]
    assert "prefixCaching" in out["engine"]
    assert not any("_" in k for k in _keys(out))


def _keys(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from _keys(v)


def test_snake_case_names_are_accepted_in_python():
    spec = LLMDeploymentSpec(model={"name": "llama-3.1-8b", "served_name": "x"}, replicas=2)
    assert spec.model.served_name == "x" and spec.to_manifest()["model"]["servedName"] == "x"


def test_status_round_trips_with_conditions_and_plan():
    status = {
        "observedGeneration": 3,
        "conditions": [
            {"type": "Planned", "status": "True", "reason": "PlanChosen", "message": "TP4 fits",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
        ],
        "plan": {"layout": "TP4·EP4·PP4", "tp": 4, "ep": 4, "pp": 4, "gpusPerReplica": 64,
                 "predicted": {"ttftMs": 250.5, "tokensPerSecondPerGpu": 1200.0}},
        "alternatives": [{"layout": "TP64", "tp": 64, "gpusPerReplica": 64}],
        "placement": [{"index": 0, "nvlinkDomain": "clique-a", "nodes": ["n1", "n2"], "gpus": 8, "ready": True}],
        "replicas": 1, "readyReplicas": 1, "desiredReplicas": 1, "selector": "meshplan.dev/deployment=x",
    }
    parsed = LLMDeploymentStatus.model_validate(status)
    assert parsed.condition("Planned").reason == "PlanChosen"
    assert parsed.condition("Available") is None
    again = LLMDeploymentStatus.model_validate(parsed.to_manifest())
    assert again == parsed
    assert parsed.to_manifest()["conditions"][0]["lastTransitionTime"].startswith("2026-01-01T00:00:00")


def test_metadata_name_must_be_a_dns_label():
    with pytest.raises(pydantic.ValidationError, match="metadata.name"):
        LLMDeployment.from_manifest({"metadata": {"name": "Llama_8B"}, "spec": {"model": {"name": "x"}}})


# ----------------------------------------------------------- engine flag guard


@pytest.mark.parametrize("arg", ["--tensor-parallel-size=4", "--tensor_parallel_size", "-tp", "--tp", "--dp-size=2",
                                 "--ep_size", "--enable-expert-parallel", "--max-num-seqs=64", "--kv-cache-dtype=fp8"])
def test_extra_args_may_not_set_plan_flags(arg):
    with pytest.raises(pydantic.ValidationError, match="allowPlanOverride"):
        spec_of(engine={"extraArgs": [arg]})


@pytest.mark.parametrize("arg", ["--max-model-len=8192", "--enable-chunked-prefill", "--tpu-topology", "--dtype=auto",
                                 "--disable-log-requests", "4"])
def test_extra_args_that_the_plan_does_not_own_pass(arg):
    assert spec_of(engine={"extraArgs": [arg]}).engine.extra_args == [arg]


def test_plan_override_is_allowed_when_asked_and_reported():
    spec = spec_of(engine={"extraArgs": ["--tensor-parallel-size=2"], "allowPlanOverride": True})
    problems = validate_semantics(spec)
    assert any("--tensor-parallel-size=2" in p for p in problems)


def test_every_plan_owned_flag_is_caught_in_both_spellings():
    for flag in PLAN_OWNED_FLAGS:
        for spelled in (f"--{flag}", f"--{flag.replace('-', '_')}=1"):
            assert spec_of(engine={"extraArgs": [spelled], "allowPlanOverride": True}).engine.plan_owned_extra_args()


# --------------------------------------------------------- semantic validation


def test_semantics_accepts_an_explicit_architecture():
    manifest = yaml.safe_load((REPO / "examples" / "gpt-moe-1.8t-gb200-nvl72.yaml").read_text())
    assert validate_semantics(LLMDeployment.from_manifest(manifest).spec) == []


def test_semantics_names_unknown_gpu_products():
    spec = spec_of(gpus={"products": ["h100", "NVIDIA-H100-80GB-HBM3", "tpu-v5e"]})
    problems = validate_semantics(spec)
    assert len(problems) == 1 and "spec.gpus.products[2]" in problems[0] and "tpu-v5e" in problems[0]


def test_semantics_checks_catalogue_model_names_and_dimensions():
    catalog = pytest.importorskip("meshplan.catalog.models")
    assert any("spec.model.name" in p for p in validate_semantics(spec_of(model={"name": "no-such-model-xyz"})))
    assert not any("spec.model.name" in p for p in validate_semantics(spec_of()))
    dense = catalog.get_model("llama-3.1-8b")
    assert dense is not None
    problems = validate_semantics(spec_of(parallelism={"expert": 2}))
    assert any("spec.parallelism.expert" in p for p in problems)


# ------------------------------------------------------------ credential guards


@pytest.mark.parametrize("uri", ["hf://gpt2@main", "hf://meta-llama/Llama-3.1-8B@refs-pr-1", "s3://bucket/models/llama",
                                 "pvc://models/llama-70b", "https://models.example.com/llama?revision=main"])
def test_weights_uris_without_credentials_pass(uri):
    assert spec_of(model={"name": "llama-3.1-8b", "weights": {"uri": uri}}).model.weights.uri == uri


@pytest.mark.parametrize("uri", ["https://user@host/m", "s3://AKIA:secret@bucket/m", "gs://bucket/m?X-Goog-Signature=ab",
                                 "https://host/m?access_token=x", "https://host/m?a=1&sig=x"])
def test_weights_uris_with_credentials_fail(uri):
    with pytest.raises(pydantic.ValidationError, match="credentialsSecretRef"):
        spec_of(model={"name": "llama-3.1-8b", "weights": {"uri": uri}})


@pytest.mark.parametrize("name", ["GOOGLE_APPLICATION_CREDENTIALS", "TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS", "NCCL_DEBUG"])
def test_ordinary_env_names_may_have_inline_values(name):
    assert spec_of(engine={"env": [{"name": name, "value": "x"}]}).engine.env[0].value == "x"


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf_token", "AWS_SECRET_ACCESS_KEY", "VLLM_API_KEY", "DB_PASSWORD"])
def test_secret_env_names_need_a_secret_ref(name):
    with pytest.raises(pydantic.ValidationError, match="valueFrom"):
        spec_of(engine={"env": [{"name": name, "value": "x"}]})
    ref = {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert spec_of(engine={"env": [{"name": name, "valueFrom": ref}]}).engine.env[0].value_from is not None


@pytest.mark.parametrize("value", ["3", True, 3.5])
def test_models_are_as_strict_about_types_as_the_api_server(value):
    with pytest.raises(pydantic.ValidationError, match="replicas"):
        spec_of(replicas=value)
