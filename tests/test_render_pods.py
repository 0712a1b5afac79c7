"""What every engine pod needs to start and be recovered (issue #15, Build 2, generic part):
a maximum sequence length always rendered, object-store credentials as the loaders read them,
CPU/memory/ephemeral-storage requests sized from the plan, a model cache, and a restart policy
that turns an engine crash into a lost pod (the whole group is recreated)."""

from __future__ import annotations

import pytest
from _gpu_nodes import hgx_h100

from meshplan.api.models import LLMDeployment
from meshplan.planner.types import Candidate, Layout, MemoryFit, Plan, Prediction
from meshplan.render.engine_args import parse_args
from meshplan.render.options import options_from_spec, planned_context
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology

GIB = 1024 ** 3
PRED = Prediction(0, 0, 0, 0, 0)


def llmd(**spec) -> LLMDeployment:
    base = {"model": {"name": "llama-3.1-8b"}}
    base.update(spec)
    return LLMDeployment.from_manifest({"apiVersion": "meshplan.dev/v1alpha1", "kind": "LLMDeployment",
                                        "metadata": {"name": "l8", "namespace": "ml", "uid": "u-1"},
                                        "spec": base})


def fixed_plan(layout: Layout, engine: str = "vllm", weights_gib: float = 0.0) -> Plan:
    mem = MemoryFit(True, weights_gib * GIB, 0, 0, 0, 0, 0, 0)
    c = Candidate(layout, "bf16", "bf16", 2048, 64, mem, PRED, engine=engine, gpu="h100_sxm")
    return Plan(choice=c, objective="balanced", reason="fixed for the test")


def render_pods(d: LLMDeployment, layout: Layout = Layout(tp=1), weights_gib: float = 15.0) -> list[dict]:
    res = plan_place_render(d, build_topology(hgx_h100(2)),
                            plan=fixed_plan(layout, d.spec.engine.kind, weights_gib))
    assert res.rendered is not None and res.placement.ok
    return [p for g in res.rendered.groups for p in g.pods]


def flag_value(pod: dict, flag: str) -> str | None:
    for k, vs in parse_args(pod["spec"]["containers"][0]["args"]):
        if k == flag:
            return vs[0] if vs else ""
    return None


# ----------------------------------------------------------------------- 1. maximum length


def test_planned_context_is_isl_plus_osl_unless_max_context_is_set():
    assert planned_context(llmd(workload={"inputTokens": 3000, "outputTokens": 500}).spec.workload) == 3500
    assert planned_context(llmd(workload={"maxContext": 32768}).spec.workload) == 32768
    serving, _, _ = options_from_spec(llmd().spec)
    assert serving.max_model_len == 1024 + 256          # the API defaults of inputTokens / outputTokens
    assert "inputTokens 1024 + outputTokens 256" in serving.max_model_len_why


@pytest.mark.parametrize("engine,flag", [("vllm", "--max-model-len"), ("sglang", "--context-length"),
                                         ("trtllm", "--max_seq_len")])
def test_every_engine_renders_the_planned_maximum_length(engine, flag):
    """Without the flag the engines size for the model's full context (128K for Llama-3.1), not the plan's."""
    d = llmd(engine={"kind": engine}, workload={"inputTokens": 2000, "outputTokens": 400})
    pod = render_pods(d)[0]
    assert flag_value(pod, flag) == "2400"
    d = llmd(engine={"kind": engine}, workload={"inputTokens": 2000, "outputTokens": 400, "maxContext": 16384})
    assert flag_value(render_pods(d)[0], flag) == "16384"


def test_the_maximum_length_is_explained():
    res = plan_place_render(llmd(), build_topology(hgx_h100(1)), plan=fixed_plan(Layout(tp=1)))
    lines = [e.line() for e in res.rendered.explain]
    assert any(line.startswith("max sequence length=1280:") and "sized KV memory" in line for line in lines)


# ----------------------------------------------------------------------- 5. engine restart = lost pod


class CrashSim:
    """test_controller_decide's Sim, whose kubelet leaves a crashed pod's status as the test set it."""

    def __new__(cls, fleet: str):
        from test_controller_decide import Sim

        class _Sim(Sim):
            crashed: dict[str, dict] = {}

            def kubelet(self) -> None:
                super().kubelet()
                for (kind, name), o in self.objects.items():
                    if kind == "Pod" and name in self.crashed:
                        o["status"] = self.crashed[name]

        return _Sim(fleet)


RUNNING_RESTARTED = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                     "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 1,
                                            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                                            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
# what a crash under restartPolicy Never leaves (kubelet: phase Failed, the container terminated)
FAILED = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
          "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0,
                                 "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}


def test_rendered_pods_do_not_restart_in_place():
    pod = render_pods(llmd())[0]
    assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("status", [RUNNING_RESTARTED, FAILED], ids=["restartCount", "Failed"])
def test_an_engine_container_restart_recreates_the_whole_group(status):
    """A worker's engine container restarts (restartCount 1 while Running, as under restartPolicy Always) or
    exits (phase Failed, as under Never): the leader is deleted with it, then the group comes back whole."""
    from test_controller_decide import converge, llmd as decide_llmd

    sim = CrashSim("gb200-nvl72")
    model = decide_llmd("NVIDIA-GB200", tensor=8, replicas=2)
    converge(sim, model)
    assert sim.ready_groups() == 2
    uids = {n: o["metadata"]["uid"] for (k, n), o in sim.objects.items() if k == "Pod"}
    sim.crashed["llama-r0-1"] = status
    out = sim.step(model)
    deleted = {name for _, kind, name, _ in out.delete if kind == "Pod"}
    assert deleted == {"llama-r0-0", "llama-r0-1"}          # the whole group, and only that group
    warnings = [m for level, reason, m in out.events if reason == "ReplicaRestarted"]
    assert warnings and warnings[0].startswith("replica 0 ")
    if status is RUNNING_RESTARTED:
        assert "engine container of llama-r0-1 restarted" in warnings[0]
    sim.crashed.clear()
    converge(sim, model)
    assert sim.ready_groups() == 2
    now = {n: o["metadata"]["uid"] for (k, n), o in sim.objects.items() if k == "Pod"}
    assert now["llama-r0-0"] != uids["llama-r0-0"] and now["llama-r0-1"] != uids["llama-r0-1"]
    assert now["llama-r1-0"] == uids["llama-r1-0"] and now["llama-r1-1"] == uids["llama-r1-1"]


def test_container_restarted_reads_the_kubelet_count():
    from meshplan.controller.decide import container_restarted

    assert container_restarted(RUNNING_RESTARTED)
    assert not container_restarted(FAILED)
    assert not container_restarted({"phase": "Running"})
    assert not container_restarted({"containerStatuses": [{"name": "engine", "restartCount": 0}]})


# ----------------------------------------------------------------------- 3. object-store credentials


def _env(pod: dict) -> dict[str, dict]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


S3 = {"uri": "s3://my-models/llama-3.1-8b-instruct", "endpoint": "https://minio.storage.svc:9000",
      "region": "eu-west-1",
      "accessKeyIdSecretRef": {"name": "s3", "key": "id"}, "credentialsSecretRef": {"name": "s3", "key": "secret"},
      "sessionTokenSecretRef": {"name": "s3", "key": "token"}}


def test_s3_credentials_arrive_as_the_variables_the_streamer_reads():
    """The Run:ai streamer (vLLM --load-format runai_streamer) reads the AWS SDK's variables, never HF_TOKEN."""
    env = _env(render_pods(llmd(model={"name": "llama-3.1-8b", "weights": S3}))[0])
    assert "HF_TOKEN" not in env
    refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "valueFrom" in e}
    assert refs == {"AWS_ACCESS_KEY_ID": {"name": "s3", "key": "id"},
                    "AWS_SECRET_ACCESS_KEY": {"name": "s3", "key": "secret"},
                    "AWS_SESSION_TOKEN": {"name": "s3", "key": "token"}}
    assert env["AWS_REGION"]["value"] == "eu-west-1"
    assert env["AWS_ENDPOINT_URL"]["value"] == "https://minio.storage.svc:9000"
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"]["value"] == "0"     # path-style for MinIO & co.


def test_gs_credentials_are_a_key_file_and_hf_token_is_only_for_hf():
    gs = {"uri": "gs://my-models/llama", "credentialsSecretRef": {"name": "gcs", "key": "key.json"}}
    env = _env(render_pods(llmd(model={"name": "llama-3.1-8b", "weights": gs}))[0])
    assert "HF_TOKEN" not in env and not any(n.startswith("AWS_") for n in env)
    assert env["GOOGLE_APPLICATION_CREDENTIALS"]["value"].endswith("/credentials.json")
    hf = {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "credentialsSecretRef": {"name": "hf", "key": "token"}}
    env = _env(render_pods(llmd(model={"name": "llama-3.1-8b", "weights": hf}))[0])
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert not any(n.startswith(("AWS_", "GOOGLE_")) for n in env)


def test_s3_fields_are_refused_where_they_have_no_use():
    with pytest.raises(ValueError, match="weights.region is only for s3"):
        llmd(model={"name": "llama-3.1-8b", "weights": {"uri": "gs://b-1/m", "region": "eu-west-1"}})
    with pytest.raises(ValueError, match="sessionTokenSecretRef belongs to temporary S3 credentials"):
        llmd(model={"name": "llama-3.1-8b", "weights": {"uri": "s3://b-1/m",
                                                        "sessionTokenSecretRef": {"name": "s3", "key": "t"}}})


def test_trtllm_serve_cannot_open_object_stores():
    from meshplan.api.models import validate_semantics

    for uri in ("s3://my-models/llama", "gs://my-models/llama"):
        d = llmd(engine={"kind": "trtllm"}, model={"name": "llama-3.1-8b", "weights": {"uri": uri}})
        problems = validate_semantics(d.spec)
        assert any("trtllm-serve cannot open" in p and uri[:5] in p for p in problems), problems


# ----------------------------------------------------------------------- 4. pod resources and model cache


def _resources(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["resources"]


def test_pod_resources_are_sized_from_the_plan():
    from meshplan.render.workloads import pod_resources

    res, why = pod_resources(gpus_per_pod=8, weights_bytes_per_pod=8 * 17.6 * GIB, download_bytes=0)
    # 8 GPUs: cpu 2 + 8; memory 141 GiB weights + 4 x 8 + 4; limit + the weights again
    assert res == {"requests": {"cpu": "10", "memory": "177Gi", "ephemeral-storage": "10Gi"},
                   "limits": {"memory": "318Gi"}}
    assert [k for k, _, _ in why] == ["cpu", "memory", "ephemeral-storage"]
    res, _ = pod_resources(gpus_per_pod=1, weights_bytes_per_pod=15 * GIB, download_bytes=15 * GIB)
    assert res["requests"] == {"cpu": "3", "memory": "23Gi", "ephemeral-storage": "25Gi"}


def test_rendered_pods_are_not_best_effort_and_count_the_download():
    """Llama-3.1-8B bf16 from Hugging Face: its 15 GiB checkpoint lands on the node's disk."""
    pod = render_pods(llmd(), weights_gib=15.0)[0]
    res = _resources(pod)
    assert res["requests"] == {"cpu": "3", "memory": "23Gi", "ephemeral-storage": "25Gi"}
    assert res["limits"] == {"memory": "38Gi", "nvidia.com/gpu": "1"}
    # streamed from S3 or read from a PVC: nothing is downloaded
    for weights in (S3, {"uri": "pvc://models/llama"}):
        pod = render_pods(llmd(model={"name": "llama-3.1-8b", "weights": weights}), weights_gib=15.0)[0]
        assert _resources(pod)["requests"]["ephemeral-storage"] == "10Gi"
    # a PVC model cache holds the download instead of the node's disk
    pod = render_pods(llmd(model={"name": "llama-3.1-8b", "cache": {"claimName": "hf"}}), weights_gib=15.0)[0]
    assert _resources(pod)["requests"]["ephemeral-storage"] == "10Gi"


def test_spec_resources_replace_defaults_key_by_key():
    d = llmd(resources={"requests": {"cpu": "16", "ephemeral-storage": "200Gi"}, "limits": {"memory": "20Gi"}})
    res = _resources(render_pods(d, weights_gib=15.0)[0])
    assert res["requests"] == {"cpu": "16", "memory": "20Gi", "ephemeral-storage": "200Gi"}   # memory: the limit
    assert res["limits"] == {"memory": "20Gi", "nvidia.com/gpu": "1"}
    with pytest.raises(ValueError):
        llmd(resources={"requests": {"nvidia.com/gpu": "2"}})        # GPUs are the plan's
    with pytest.raises(ValueError):
        llmd(resources={"requests": {"memory": "lots"}})


def test_model_cache_without_a_size_is_sized_from_the_weights():
    from meshplan.render.weights import cache_size_limit

    pod = render_pods(llmd(model={"name": "llama-3.1-8b", "cache": {}}))[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
    serving, _, pods = options_from_spec(llmd().spec)
    assert pods.download_bytes > 14 * GIB                 # Llama-3.1-8B bf16: ~15 GiB (planner weight model)
    assert vol == {"name": "model-cache", "emptyDir": {"sizeLimit": cache_size_limit(pods.download_bytes)}}
    assert _env(pod)["HF_HOME"]["value"] == "/cache/huggingface"


# ----------------------------------------------------------------------- 2. extraArgs at the pinned versions


@pytest.mark.parametrize("engine,args,refused", [
    ("sglang", ["--context_length", "4096"], True),     # SGLang registers --context-length only
    ("trtllm", ["--max-seq-len", "4096"], True),        # click: --max_seq_len only
    ("vllm", ["--max_model_len", "4096"], False),       # FlexibleArgumentParser turns _ into -
    ("sglang", ["--context-length", "4096"], False),
    ("trtllm", ["--max_seq_len", "4096"], False),
    ("sglang", ["--cuda-graph-max-bs", "64"], True),    # gone by SGLang 0.5.23 (was in 0.5.5)
    ("vllm", ["--swap-space", "4"], True),              # gone by vLLM 0.32.0 (was in 0.12.0)
    ("sglang", ["--attn-dp-size", "8"], True),          # new in 0.5.23, and the plan's
    ("sglang", ["--attention-data-parallel-size", "8"], True),
])
def test_extra_args_are_judged_by_the_pinned_parsers(engine, args, refused):
    from meshplan.api.extra_args import extra_args_problems
    from meshplan.catalog.engine_options import VERSIONS

    problems = extra_args_problems(engine, args)
    assert bool(problems) == refused, problems
    if refused:
        assert f"{VERSIONS[engine]}" in problems[0] or "plan owns" in problems[0], problems


def test_extra_args_keep_the_users_exact_spelling():
    """vLLM accepts `--max_model_len`; it replaces meshplan's planned `--max-model-len` as written."""
    d = llmd(engine={"kind": "vllm", "extraArgs": ["--max_model_len", "4096"]})
    args = render_pods(d)[0]["spec"]["containers"][0]["args"]
    assert "--max-model-len" not in args
    i = args.index("--max_model_len")
    assert args[i + 1] == "4096" and args.count("--max_model_len") == 1
