"""Weights sources rendered as the engines need them: one golden file per form, refusals with reasons.

    pytest tests/test_render_weights.py                              # compare
    MESHPLAN_UPDATE_GOLDEN=1 pytest tests/test_render_weights.py     # rewrite tests/golden/weights-*.yaml

The spec goes through the real path (LLMDeploymentSpec -> render.options.options_from_spec ->
render_deployment); the plan is a fixed Candidate (TP1 on one H100) so the files only move when the
weights rendering does.
"""

from __future__ import annotations


import pytest
from _golden import GOLDEN, check_golden
from _gpu_nodes import hgx_h100

from meshplan.api.models import LLMDeploymentSpec, validate_semantics
from meshplan.placement import place, request_for_layout
from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
from meshplan.render import Owner, RenderError, render_deployment
from meshplan.render.options import options_from_spec
from meshplan.topology import build_topology


_MEM = MemoryFit(fits=True, weights_bytes=0, kv_bytes_per_token=0, activation_bytes=0, runtime_bytes=0,
                 usable_bytes=0, kv_capacity_tokens=0, max_concurrency=0)
_PRED = Prediction(ttft_ms=0, tpot_ms=0, tokens_per_s_per_gpu=0, tokens_per_s_per_user=0, concurrency=0)

# form -> (engine, spec.model)
FORMS = {
    "hf-token": ("vllm", {"name": "llama-3.1-8b", "weights": {
        "uri": "hf://meta-llama/Llama-3.1-8B-Instruct@main", "credentialsSecretRef": {"name": "hf", "key": "token"}}}),
    "hf-id-name": ("vllm", {"name": "meta-llama/Llama-3.1-8B-Instruct"}),
    "pvc": ("vllm", {"name": "llama-3.1-8b", "weights": {"uri": "pvc://models/llama-3.1-8b-instruct"}}),
    "pvc-sglang": ("sglang", {"name": "llama-3.1-8b", "weights": {"uri": "pvc://models/llama-3.1-8b-instruct"}}),
    "pvc-trtllm": ("trtllm", {"name": "llama-3.1-8b", "weights": {"uri": "pvc://models/llama-3.1-8b-instruct"}}),
    "s3": ("vllm", {"name": "llama-3.1-8b", "weights": {
        "uri": "s3://my-models/llama-3.1-8b-instruct", "endpoint": "https://minio.storage.svc:9000",
        "accessKeyIdSecretRef": {"name": "s3", "key": "AWS_ACCESS_KEY_ID"},
        "credentialsSecretRef": {"name": "s3", "key": "AWS_SECRET_ACCESS_KEY"}}}),
    "gs": ("vllm", {"name": "llama-3.1-8b", "weights": {
        "uri": "gs://my-models/llama-3.1-8b-instruct", "credentialsSecretRef": {"name": "gcs", "key": "key.json"}}}),
    "file": ("vllm", {"name": "llama-3.1-8b", "weights": {"uri": "file:///models/llama-3.1-8b-instruct"}}),
    "cache-pvc": ("vllm", {"name": "llama-3.1-8b", "cache": {"claimName": "hf-cache"}}),
    "cache-emptydir": ("sglang", {"name": "llama-3.1-8b", "cache": {"sizeLimit": "100Gi"}}),
}


def spec_for(engine: str, model: dict) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": model, "engine": {"kind": engine}})


def render(spec: LLMDeploymentSpec) -> list[dict]:
    topo = build_topology(hgx_h100(1))
    layout = Layout(tp=1)
    placement = place(request_for_layout(layout, 8, product="NVIDIA-H100-80GB-HBM3"), topo)
    cand = Candidate(layout=layout, weight_dtype="bf16", kv_dtype="fp8", chunk_size=2048, max_num_seqs=64,
                     memory=_MEM, prediction=_PRED, engine=spec.engine.kind)
    serving, network, pods = options_from_spec(spec)
    out = render_deployment(Owner("llm", "serving", "0b9e4c1a-5f6d-4e1a-9c1b-1234567890ab"), cand, placement,
                            topo, serving, network, pods)
    return out.objects


def _pod(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "Pod")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_weights_golden(form: str) -> None:
    engine, model = FORMS[form]
    spec = spec_for(engine, model)
    assert validate_semantics(spec) == []
    check_golden(render(spec), GOLDEN / f"weights-{form}.yaml", __file__)


# ------------------------------------------------------------- what each form must contain (beside the goldens)

def _container(form: str) -> tuple[dict, dict]:
    engine, model = FORMS[form]
    pod = _pod(render(spec_for(engine, model)))
    return pod, pod["spec"]["containers"][0]


def _env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c["env"]}


def _argv(c: dict) -> list[str]:
    return list(c["command"]) + list(c["args"])


def test_pvc_is_a_read_only_volume_and_the_engine_gets_the_mounted_path():
    for form, flag in (("pvc", None), ("pvc-sglang", "--model-path"), ("pvc-trtllm", None)):
        pod, c = _container(form)
        vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "weights")
        assert vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
        mount = next(m for m in c["volumeMounts"] if m["name"] == "weights")
        assert mount == {"name": "weights", "mountPath": "/mnt/models", "readOnly": True}
        argv = " ".join(_argv(c))
        assert "/mnt/models/llama-3.1-8b-instruct" in argv and "pvc://" not in argv, form
        if flag:
            assert f"{flag} /mnt/models/llama-3.1-8b-instruct" in argv


def test_hf_token_comes_from_the_secret_never_inline():
    _, c = _container("hf-token")
    assert _env(c)["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    argv = _argv(c)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert argv[argv.index("--revision") + 1] == "main"


def test_hf_id_as_name_is_what_the_engine_loads():
    _, c = _container("hf-id-name")
    assert _argv(c)[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]


def test_s3_streams_with_runai_and_reads_credentials_from_the_secret():
    pod, c = _container("s3")
    argv = _argv(c)
    assert argv[2] == "s3://my-models/llama-3.1-8b-instruct"
    assert argv[argv.index("--load-format") + 1] == "runai_streamer"
    env = _env(c)
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3", "key": "AWS_ACCESS_KEY_ID"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "s3", "key": "AWS_SECRET_ACCESS_KEY"}
    assert env["AWS_ENDPOINT_URL"] == {"name": "AWS_ENDPOINT_URL", "value": "https://minio.storage.svc:9000"}
    assert "HF_TOKEN" not in env


def test_gs_key_is_a_secret_file_named_by_google_application_credentials():
    pod, c = _container("gs")
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "weights-credentials")
    assert vol["secret"]["secretName"] == "gcs" and vol["secret"]["items"] == [{"key": "key.json",
                                                                                 "path": "credentials.json"}]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "weights-credentials")
    assert mount["readOnly"] is True
    assert _env(c)["GOOGLE_APPLICATION_CREDENTIALS"]["value"] == mount["mountPath"] + "/credentials.json"
    argv = _argv(c)
    assert argv[2] == "gs://my-models/llama-3.1-8b-instruct" and "runai_streamer" in argv


def test_model_cache_volume_is_mounted_at_hf_home():
    for form, kind in (("cache-pvc", {"persistentVolumeClaim": {"claimName": "hf-cache"}}),
                       ("cache-emptydir", {"emptyDir": {"sizeLimit": "100Gi"}})):
        pod, c = _container(form)
        vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
        assert {k: v for k, v in vol.items() if k != "name"} == kind
        mount = next(m for m in c["volumeMounts"] if m["name"] == "model-cache")
        assert _env(c)["HF_HOME"]["value"] == mount["mountPath"] == "/cache/huggingface"


def test_without_a_weights_form_nothing_is_added():
    pod, c = _container("hf-id-name")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm"]
    assert [m["name"] for m in c["volumeMounts"]] == ["dshm"]


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
@pytest.mark.parametrize("uri", ["s3://my-models/llama", "gs://my-models/llama"])
def test_engines_without_an_object_store_loader_refuse_with_the_reason(engine, uri):
    spec = spec_for(engine, {"name": "llama-3.1-8b", "weights": {"uri": uri}})
    problems = validate_semantics(spec)
    assert len(problems) == 1 and "spec.model.weights.uri" in problems[0] and "pvc://" in problems[0]
    assert "cannot open " + uri.split("://")[0] + "://" in problems[0]
    with pytest.raises(RenderError, match="cannot open"):
        render(spec)


@pytest.mark.parametrize("uri", ["oci://registry.example.com/models/llama:1", "https://models.example.com/llama",
                                 "az://container/llama"])
def test_schemes_no_engine_opens_are_refused(uri):
    spec = spec_for("vllm", {"name": "llama-3.1-8b", "weights": {"uri": uri}})
    assert any("no engine meshplan renders opens" in p for p in validate_semantics(spec))
    with pytest.raises(RenderError, match="no engine meshplan renders opens"):
        render(spec)
