"""Invalid LLMDeployment manifests, each with the field its error must name.

The table is shared: here every case must be refused by the pydantic models
(what `meshplan plan` and the operator parse with); e2e/test_api_validation.py
sends the same manifests to a real kube-apiserver, which must refuse them with
the field path in its error (CEL + OpenAPI from the generated CRD).
"""

from __future__ import annotations

import copy

import pydantic
import pytest

from meshplan.api.models import LLMDeployment

DELETE = object()  # patch value: remove the key


def base_manifest(name: str = "valid") -> dict:
    """A small valid manifest the cases start from."""
    return {
        "apiVersion": "meshplan.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "llama-3.1-8b", "servedName": "llama-8b"},
            "engine": {"kind": "vllm"},
            "workload": {"inputTokens": 1024, "outputTokens": 256},
            "slo": {"ttftMs": 500, "itlMs": 30, "percentile": 99},
            "replicas": 1,
        },
    }


def merge(target: dict, patch: dict) -> dict:
    """Deep-merge `patch` into `target` in place (lists replace; DELETE removes)."""
    for key, value in patch.items():
        if value is DELETE:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def with_spec(patch: dict, name: str = "invalid") -> dict:
    return merge(base_manifest(name), {"spec": patch})


DENSE_ARCH = {"layers": 32, "hiddenSize": 4096, "attentionHeads": 32, "kvHeads": 8, "intermediateSize": 14336, "vocabSize": 128256}

# (case id, spec patch, field path the error must name)
INVALID_CASES: list[tuple[str, dict, str]] = [
    ("replicas-negative", {"replicas": -1}, "spec.replicas"),
    ("replicas-wrong-type", {"replicas": "two"}, "spec.replicas"),
    ("replicas-absurd", {"replicas": 1_000_000}, "spec.replicas"),
    ("model-missing", {"model": DELETE}, "spec.model"),
    ("model-name-too-long", {"model": {"name": "m" * 200}}, "spec.model.name"),
    ("tensor-zero", {"parallelism": {"tensor": 0}}, "spec.parallelism.tensor"),
    ("tensor-not-auto-string", {"parallelism": {"tensor": "four"}}, "spec.parallelism.tensor"),
    ("pipeline-absurd", {"parallelism": {"pipeline": 100000}}, "spec.parallelism.pipeline"),
    ("chunk-size-tiny", {"parallelism": {"chunkSize": 1}}, "spec.parallelism.chunkSize"),
    ("pinned-exceeds-max-gpus", {"parallelism": {"tensor": 8, "pipeline": 2}, "gpus": {"maxGpus": 8}}, "spec.gpus.maxGpus"),
    ("pinned-times-replicas-exceeds-max-gpus", {"parallelism": {"tensor": 4}, "replicas": 3, "gpus": {"maxGpus": 8}}, "spec.gpus.maxGpus"),
    ("max-gpus-zero", {"gpus": {"maxGpus": 0}}, "spec.gpus.maxGpus"),
    # defect (issue 16): `meshplan plan` accepted node selectors the API server refuses in a pod
    ("node-selector-value-list", {"gpus": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3,NVIDIA-H200"}}}, "spec.gpus.nodeSelector"),
    ("node-selector-value-operator", {"gpus": {"nodeSelector": {"meshplan.dev/fleet": "!=hgx-h100"}}}, "spec.gpus.nodeSelector"),
    ("node-selector-key-space", {"gpus": {"nodeSelector": {"gpu type": "h100"}}}, "spec.gpus.nodeSelector"),
    ("node-selector-key-upper-prefix", {"gpus": {"nodeSelector": {"NVIDIA.com/gpu.product": "NVIDIA-H200"}}}, "spec.gpus.nodeSelector"),
    ("node-selector-key-name-too-long", {"gpus": {"nodeSelector": {"meshplan.dev/" + "n" * 64: "x"}}}, "spec.gpus.nodeSelector"),
    ("node-selector-key-prefix-too-long", {"gpus": {"nodeSelector": {"p" * 254 + "/fleet": "x"}}}, "spec.gpus.nodeSelector"),
    ("tensor-does-not-divide-heads", {"model": {"name": "my-dense", "architecture": DENSE_ARCH}, "parallelism": {"tensor": 3}}, "spec.parallelism.tensor"),
    ("expert-on-dense-model", {"model": {"name": "my-dense", "architecture": DENSE_ARCH}, "parallelism": {"expert": 4}}, "spec.parallelism.expert"),
    ("experts-per-token-above-experts", {"model": {"name": "my-moe", "architecture": {**{k: v for k, v in DENSE_ARCH.items() if k != "intermediateSize"}, "experts": 8, "expertsPerToken": 16, "moeIntermediateSize": 14336}}}, "spec.model.architecture.expertsPerToken"),
    ("kv-heads-not-dividing-heads", {"model": {"name": "my-dense", "architecture": {**DENSE_ARCH, "kvHeads": 5}}}, "spec.model.architecture.kvHeads"),
    ("autoscaling-min-above-max", {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, "spec.autoscaling.minReplicas"),
    ("autoscaling-without-max", {"autoscaling": {"enabled": True}}, "spec.autoscaling.maxReplicas"),
    ("autoscaling-thresholds-inverted", {"autoscaling": {"upThreshold": 0.8, "downThreshold": 0.9}}, "spec.autoscaling.downThreshold"),
    ("autoscaling-without-slo", {"slo": DELETE, "autoscaling": {"enabled": True, "maxReplicas": 4}}, "spec.autoscaling.enabled"),
    ("prometheus-url-with-credentials", {"autoscaling": {"prometheusUrl": "http://admin:secret@prometheus:9090"}}, "spec.autoscaling.prometheusUrl"),
    ("metric-name-promql-injection", {"autoscaling": {"metrics": {"ttftHistogram": 'x{job="a"} or vector(1)'}}}, "spec.autoscaling.metrics.ttftHistogram"),
    ("engine-unknown", {"engine": {"kind": "tgi"}}, "spec.engine.kind"),
    ("extra-args-set-tensor-parallel", {"engine": {"extraArgs": ["--tensor-parallel-size=8"]}}, "spec.engine.extraArgs"),
    ("extra-args-sglang-tp", {"engine": {"kind": "sglang", "extraArgs": ["--tp", "4"]}}, "spec.engine.extraArgs"),
    ("extra-args-too-many", {"engine": {"extraArgs": ["--disable-log-requests"] * 65}}, "spec.engine.extraArgs"),
    # speculative decoding (MTP): the method enum, the bounds, and engines that cannot be told to run it
    ("speculative-unknown-method", {"engine": {"speculative": {"method": "medusa"}}}, "spec.engine.speculative.method"),
    ("speculative-zero-tokens", {"engine": {"speculative": {"method": "mtp", "tokens": 0}}}, "spec.engine.speculative.tokens"),
    ("speculative-acceptance-one", {"engine": {"speculative": {"method": "mtp", "acceptanceRate": 1.0}}},
     "spec.engine.speculative.acceptanceRate"),
    ("speculative-on-nim", {"engine": {"kind": "nim", "image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0",
                                       "speculative": {"method": "mtp"}}}, "spec.engine.speculative.method"),
    ("env-inline-token", {"engine": {"env": [{"name": "HF_TOKEN", "value": "hf_abcdefghijklmnopqrstuvwxyz"}]}}, "spec.engine.env[0].value"),
    ("env-duplicate-name", {"engine": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, "spec.engine.env[1]"),
    ("weights-uri-userinfo", {"model": {"weights": {"uri": "https://user:pa55@models.example.com/llama"}}}, "spec.model.weights.uri"),
    ("weights-uri-token-query", {"model": {"weights": {"uri": "https://models.example.com/llama?token=hf_abc"}}}, "spec.model.weights.uri"),
    ("weights-uri-presigned-s3", {"model": {"weights": {"uri": "s3://bucket/llama?X-Amz-Signature=deadbeef"}}}, "spec.model.weights.uri"),
    ("weights-inline-token-field", {"model": {"weights": {"uri": "hf://meta-llama/Llama-3.1-8B", "token": "hf_abc"}}}, "spec.model.weights.token"),
    # weights forms (issue #16): each refused by the API server with the field named
    ("weights-pvc-without-claim", {"model": {"weights": {"uri": "pvc:///llama-70b"}}}, "spec.model.weights.uri"),
    ("weights-pvc-empty", {"model": {"weights": {"uri": "pvc://"}}}, "spec.model.weights.uri"),
    ("weights-hf-flag", {"model": {"weights": {"uri": "hf://--trust-remote-code"}}}, "spec.model.weights.uri"),
    ("weights-uri-starts-a-flag", {"model": {"weights": {"uri": "--trust-remote-code"}}}, "spec.model.weights.uri"),
    ("weights-file-outside-prefix", {"model": {"weights": {"uri": "file:///etc/passwd"}}}, "spec.model.weights.uri"),
    ("weights-file-dotdot", {"model": {"weights": {"uri": "file:///models/../etc/passwd"}}}, "spec.model.weights.uri"),
    ("weights-pvc-dotdot", {"model": {"weights": {"uri": "pvc://models/../../etc"}}}, "spec.model.weights.uri"),
    ("weights-hf-userinfo", {"model": {"weights": {"uri": "hf://user:hf_abc@huggingface.co/meta-llama/x"}}}, "spec.model.weights.uri"),
    ("weights-hf-token-query", {"model": {"weights": {"uri": "hf://meta-llama/Llama-3.1-8B?hf_token=hf_abc"}}}, "spec.model.weights.uri"),
    ("weights-s3-hf-token-query", {"model": {"weights": {"uri": "s3://my-models/llama?hf_token=hf_abc"}}}, "spec.model.weights.uri"),
    ("weights-s3-bad-bucket", {"model": {"weights": {"uri": "s3://My_Bucket/llama"}}}, "spec.model.weights.uri"),
    ("weights-s3-secret-without-key-id", {"model": {"weights": {"uri": "s3://my-models/llama", "credentialsSecretRef": {"name": "s3", "key": "secret"}}}}, "spec.model.weights.accessKeyIdSecretRef"),
    ("weights-key-id-on-hf", {"model": {"weights": {"uri": "hf://meta-llama/Llama-3.1-8B", "accessKeyIdSecretRef": {"name": "s3", "key": "id"}, "credentialsSecretRef": {"name": "s3", "key": "secret"}}}}, "spec.model.weights.accessKeyIdSecretRef"),
    ("weights-endpoint-on-hf", {"model": {"weights": {"uri": "hf://meta-llama/Llama-3.1-8B", "endpoint": "https://minio:9000"}}}, "spec.model.weights.endpoint"),
    ("weights-endpoint-with-credentials", {"model": {"weights": {"uri": "s3://my-models/llama", "endpoint": "https://key:secret@minio:9000"}}}, "spec.model.weights.endpoint"),
    ("weights-secret-on-pvc", {"model": {"weights": {"uri": "pvc://models/llama", "credentialsSecretRef": {"name": "x", "key": "y"}}}}, "spec.model.weights.credentialsSecretRef"),
    ("model-cache-pvc-and-emptydir", {"model": {"cache": {"claimName": "hf-cache", "sizeLimit": "10Gi"}}}, "spec.model.cache.sizeLimit"),
    ("model-cache-bad-size", {"model": {"cache": {"sizeLimit": "lots"}}}, "spec.model.cache.sizeLimit"),
    ("model-name-three-parts", {"model": {"name": "org/name/extra"}}, "spec.model.name"),
    ("model-name-hf-id-flag", {"model": {"name": "org/--trust-remote-code"}}, "spec.model.name"),
    ("architecture-weight-dtype-unknown", {"model": {"name": "my-dense", "architecture": {**DENSE_ARCH, "weightDtype": "fp2"}}}, "spec.model.architecture.weightDtype"),
    ("architecture-sliding-without-window", {"model": {"name": "my-dense", "architecture": {**DENSE_ARCH, "slidingWindowLayers": 16}}}, "spec.model.architecture.slidingWindow"),
    ("architecture-linear-without-heads", {"model": {"name": "my-dense", "architecture": {**DENSE_ARCH, "linearAttentionLayers": 24}}}, "spec.model.architecture.linearAttentionLayers"),
    ("architecture-linear-plus-sliding-above-layers", {"model": {"name": "my-dense", "architecture": {**DENSE_ARCH, "slidingWindow": 128, "slidingWindowLayers": 20, "linearAttentionLayers": 20, "linearKeyHeads": 16, "linearValueHeads": 32, "linearKeyHeadDim": 128, "linearValueHeadDim": 128}}}, "spec.model.architecture.linearAttentionLayers"),
    ("precision-unknown", {"precision": {"weights": "fp2"}}, "spec.precision.weights"),
    ("objective-unknown", {"objective": "cheapest"}, "spec.objective"),
    ("min-cost-without-slo", {"objective": "minCostWithinSLO", "slo": DELETE}, "spec.objective"),
    ("slo-ttft-zero", {"slo": {"ttftMs": 0}}, "spec.slo.ttftMs"),
    ("slo-itl-negative", {"slo": {"itlMs": -5}}, "spec.slo.itlMs"),
    ("slo-without-target", {"slo": {"ttftMs": DELETE, "itlMs": DELETE}}, "spec.slo"),
    ("slo-percentile-unsupported", {"slo": {"percentile": 75}}, "spec.slo.percentile"),
    ("workload-rate-and-concurrency", {"workload": {"requestRate": 3, "concurrency": 10}}, "spec.workload.concurrency"),
    ("workload-max-context-too-short", {"workload": {"inputTokens": 4096, "outputTokens": 512, "maxContext": 1024}}, "spec.workload.maxContext"),
    ("workload-input-zero", {"workload": {"inputTokens": 0}}, "spec.workload.inputTokens"),
    ("nccl-transport-unknown", {"nccl": {"transport": "nvswitch"}}, "spec.nccl.transport"),
    ("unknown-field", {"replicaCount": 3}, "spec.replicaCount"),
    ("disaggregation-unknown", {"serving": {"disaggregation": "on"}}, "spec.serving.disaggregation"),
    ("disaggregation-enabled-without-router-image", {"serving": {"disaggregation": "enabled"}},
     "spec.serving.router.image"),
    ("disaggregation-auto-without-router-image", {"serving": {"disaggregation": "auto", "router": {}}},
     "spec.serving.router.image"),
    ("router-kind-unknown", {"serving": {"disaggregation": "enabled", "router": {"kind": "gateway", "image": "x/y:1"}}},
     "spec.serving.router.kind"),
    ("router-engine-on-aggregated", {"serving": {"router": {"kind": "engine", "image": "x/y:1"}}},
     "spec.serving.router.kind"),
    ("router-without-image-on-aggregated", {"serving": {"router": {"kind": "inferencePool"}}},
     "spec.serving.router.image"),
]

# (case id, spec patch of the object first created, spec patch of the update, field path)
IMMUTABLE_CASES: list[tuple[str, dict, dict, str]] = [
    ("engine-kind-changed", {}, {"engine": {"kind": "sglang"}}, "spec.engine.kind"),
    ("served-name-changed", {}, {"model": {"servedName": "renamed"}}, "spec.model.servedName"),
    ("served-name-removed", {}, {"model": {"servedName": DELETE}}, "spec.model.servedName"),
]


def test_base_manifest_is_valid():
    LLMDeployment.from_manifest(base_manifest())


def test_table_is_large_enough():
    assert len(INVALID_CASES) + len(IMMUTABLE_CASES) >= 20
    assert len({c[0] for c in INVALID_CASES}) == len(INVALID_CASES)


@pytest.mark.parametrize("case_id,patch,field", INVALID_CASES, ids=[c[0] for c in INVALID_CASES])
def test_models_reject_invalid_manifest_naming_the_field(case_id, patch, field):
    with pytest.raises(pydantic.ValidationError) as info:
        LLMDeployment.from_manifest(with_spec(patch))
    text = str(info.value)
    # the error names the field: in pydantic's location (spec.gpus.maxGpus ...) or in the rule's message
    last = field.rsplit(".", 1)[-1].split("[")[0]
    assert last in text, f"{case_id}: error does not name {field}:\n{text}"


@pytest.mark.parametrize("case_id,before,after,field", IMMUTABLE_CASES, ids=[c[0] for c in IMMUTABLE_CASES])
def test_immutable_cases_are_valid_on_their_own(case_id, before, after, field):
    """Both sides of an immutable-field change are valid manifests: only the change is refused (server side)."""
    old = with_spec(before)
    LLMDeployment.from_manifest(old)
    LLMDeployment.from_manifest(merge(copy.deepcopy(old), {"spec": after}))
