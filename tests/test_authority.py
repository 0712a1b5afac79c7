"""Issue #17 part A: guards by exact names, no unintended `$(VAR)` expansion, least authority.

The spec cases of UP_FRONT_CASES must be refused by the pydantic models here (the CEL rules'
Python twins); e2e/reliability/test_redteam_authority.py sends the same manifests, as a tenant, to a
real kube-apiserver, which must refuse them with the field named (CEL of the generated CRD).
"""

from __future__ import annotations

import copy
import re

import pydantic
import pytest

from meshplan.api.extra_args import extra_args_problems, option_index, owned_options
from meshplan.api.models import (
    PLAN_OWNED_FLAG_RE,
    PLAN_OWNED_FLAGS,
    RESERVED_FLAG_NAMES,
    LLMDeployment,
    reserved_flag_misuse,
    validate_semantics,
)
from meshplan.catalog import engine_options

BASE = {
    "apiVersion": "meshplan.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "x"},
    "spec": {"model": {"name": "llama-3.1-8b"}, "engine": {"kind": "vllm"}, "replicas": 1},
}


def manifest(spec_patch: dict, name: str = "x") -> dict:
    m = copy.deepcopy(BASE)
    m["metadata"]["name"] = name
    for k, v in spec_patch.items():
        if isinstance(v, dict) and isinstance(m["spec"].get(k), dict):
            m["spec"][k].update(v)
        else:
            m["spec"][k] = v
    return m


def secret_env(name: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}


# (case id, spec patch, field the error must name): refused up front (CRD CEL / pydantic).
UP_FRONT_CASES: list[tuple[str, dict, str]] = [
    ("prefix-tensor-parallel-siz", {"engine": {"kind": "vllm", "extraArgs": ["--tensor-parallel-siz=8"]}},
     "spec.engine.extraArgs"),
    ("prefix-max-num-seq", {"engine": {"kind": "vllm", "extraArgs": ["--max-num-seq", "512"]}},
     "spec.engine.extraArgs"),
    ("prefix-sglang-tp-siz", {"engine": {"kind": "sglang", "extraArgs": ["--tp-siz", "8"]}},
     "spec.engine.extraArgs"),
    ("prefix-even-with-override", {"engine": {"kind": "vllm", "allowPlanOverride": True,
                                              "extraArgs": ["--tensor_parallel_siz=8"]}}, "spec.engine.extraArgs"),
    ("served-model-name-in-extra-args", {"engine": {"kind": "vllm", "allowPlanOverride": True,
                                                     "extraArgs": ["--served-model-name", "other"]}},
     "spec.engine.extraArgs"),
    ("api-key-inline", {"engine": {"kind": "vllm", "extraArgs": ["--api-key", "sk-abcdefghijklmnopqrstuvwx"]}},
     "spec.engine.extraArgs"),
    ("hf-token-inline", {"engine": {"kind": "vllm", "extraArgs": ["--hf-token=abc"]}}, "spec.engine.extraArgs"),
    ("env-HFTOKEN-inline", {"engine": {"kind": "vllm", "env": [{"name": "HFTOKEN", "value": "x"}]}},
     "spec.engine.env[0].value"),
    ("env-HF-TOKEN-inline", {"engine": {"kind": "vllm", "env": [{"name": "HF-TOKEN", "value": "x"}]}},
     "spec.engine.env[0].value"),
    ("env-OPENAI_KEY-inline", {"engine": {"kind": "vllm", "env": [{"name": "OPENAI_KEY", "value": "x"}]}},
     "spec.engine.env[0].value"),
    ("env-value-is-a-token", {"engine": {"kind": "vllm", "env": [
        {"name": "FOO", "value": "hf_abcdefghijklmnopqrstuvwxyz"}]}}, "spec.engine.env[0].value"),
    ("env-meshplan-reserved", {"engine": {"kind": "vllm", "env": [{"name": "MESHPLAN_NNODES", "value": "9"}]}},
     "spec.engine.env[0].name"),
    ("nccl-env-meshplan-reserved", {"nccl": {"env": [{"name": "MESHPLAN_LEADER_ADDRESS", "value": "evil"}]}},
     "spec.nccl.env[0].name"),
    ("uri-hf_token-query", {"model": {"name": "llama-3.1-8b", "weights": {
        "uri": "https://example.com/m.tar?hf_token=abc"}}}, "spec.model.weights.uri"),
    ("uri-hf-userinfo", {"model": {"name": "llama-3.1-8b", "weights": {
        "uri": "hf://user:hf_secret@huggingface.co/meta-llama/Llama-3.1-8B"}}}, "spec.model.weights.uri"),
]


@pytest.mark.parametrize("case_id,patch,field", UP_FRONT_CASES, ids=[c[0] for c in UP_FRONT_CASES])
def test_up_front_cases_are_refused_by_the_models(case_id, patch, field):
    with pytest.raises(pydantic.ValidationError):
        LLMDeployment.from_manifest(manifest(patch))


@pytest.mark.parametrize("spec", [
    {"engine": {"kind": "vllm", "env": [{"name": "TOKENIZERS_PARALLELISM", "value": "false"},
                                        {"name": "VLLM_MAX_TOKENS_PER_EXPERT", "value": "8"},
                                        {"name": "SSL_KEY_FILE", "value": "/etc/tls/key.pem"}]}},
    {"engine": {"kind": "vllm", "env": [secret_env("HFTOKEN"), secret_env("OPENAI_KEY")]}},
    {"engine": {"kind": "vllm", "extraArgs": ["--max-model-len", "8192", "--enable-chunked-prefill",
                                              "--no-enable-log-requests", "--seed", "-1"]}},
    {"engine": {"kind": "sglang", "extraArgs": ["--ep", "1"], "allowPlanOverride": True}},
    {"model": {"name": "llama-3.1-8b", "weights": {"uri": "hf://meta-llama/Llama-3.1-8B@main"}}},
    {"model": {"name": "llama-3.1-8b", "weights": {"uri": "hf://gpt2@6c0e608"}}},
], ids=["env-look-alikes", "secrets-by-reference", "real-vllm-options", "sglang-ep-exact", "hf-revision",
        "hf-single-segment-revision"])
def test_legitimate_specs_still_pass(spec):
    llmd = LLMDeployment.from_manifest(manifest(spec))
    assert not [p for p in validate_semantics(llmd.spec) if "extraArgs" in p and "predictions may not" not in p]


def test_prefix_rule_twin_refuses_every_strict_prefix_of_plan_owned_flags():
    for name in ("--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype"):
        for cut in range(3, len(name)):
            prefix = name[:cut]
            if prefix in ("--tp", "--pp", "--dp", "--ep", "--tensor-parallel"):
                # PLAN_OWNED_FLAGS spellings (DeepSpeed-MII's --tensor-parallel): the exact plan-owned rule
                # judges them
                continue
            assert reserved_flag_misuse(prefix + "=8"), prefix
    assert not reserved_flag_misuse("--max-model-len")
    assert not reserved_flag_misuse("--tensor-parallel-size")   # exact: the plan-owned rule decides
    assert re.match(PLAN_OWNED_FLAG_RE, "--tensor-parallel=8")  # ...and refuses MII's --tensor-parallel


@pytest.mark.parametrize("engine,args,expect", [
    ("vllm", ["--tensor-parallel-siz=8"], "abbreviation of --tensor-parallel-size"),
    ("vllm", ["--max-num-seq", "512"], "abbreviation of --max-num-seqs"),
    ("vllm", ["-t", "8"], "abbreviation of -tp"),
    ("sglang", ["--tp-siz", "8"], "abbreviation of --tp-size"),
    ("sglang", ["--tp", "8"], "abbreviation of --tp-size"),
    ("vllm", ["--tensor-parallel-size", "8"], "flag the plan owns"),
    ("vllm", ["--tensor_parallel_size=8"], "flag the plan owns"),      # vLLM reads _ as -
    ("trtllm", ["--moe_expert_parallel_size", "8"], "flag the plan owns"),   # alias of --ep_size
    ("sglang", ["--tensor-parallel-size", "8"], "flag the plan owns"),       # alias of --tp-size
    ("vllm", ["--served-model-name", "x"], "servedName"),
    ("sglang", ["--api-key", "x"], "takes a secret"),
    ("vllm", ["--api-key", "sk-abcdefghijklmnopqrstuvwx"], "looks like a credential"),
    ("vllm", ["--no-such-option"], "not an option"),
    ("sglang", ["--max_running_requests", "8"], "not an option"),   # SGLang has no _ spelling
    ("vllm", ["--", "--trust-remote-code"], "ends the engine's options"),
])
def test_operator_exact_check_refuses(engine, args, expect):
    problems = extra_args_problems(engine, args)
    assert problems and any(expect in p for p in problems), problems


@pytest.mark.parametrize("engine,args", [
    ("vllm", ["--max_model_len", "8192", "-O3", "--compilation-config.cudagraph_mode", "FULL", "-cc.level=3",
              "--no-enable-prefix-caching", "--trust-remote-code", "--seed", "-1"]),
    ("sglang", ["--context-length", "8192", "--trust-remote-code", "--disable-radix-cache"]),
    ("trtllm", ["--trust_remote_code", "--log_level", "info", "--max_seq_len", "8192"]),
])
def test_operator_exact_check_accepts_real_options(engine, args):
    assert extra_args_problems(engine, args) == []


def test_plan_owned_actions_cover_every_alias():
    assert {"--tensor-parallel-size", "-tp", "--max-num-seqs"} <= owned_options("vllm")
    assert {"--tp-size", "--tensor-parallel-size", "--ep", "--expert-parallel-size"} <= owned_options("sglang")
    assert {"--tp_size", "--tensor_parallel_size", "--ep_size", "--moe_expert_parallel_size"} <= \
        owned_options("trtllm")
    assert "--max-model-len" not in owned_options("vllm")


def test_every_flag_meshplan_renders_is_a_real_option():
    """The option tables agree with the renderer: each flag meshplan itself writes exists."""
    from meshplan.planner.engines import engine_layout
    from meshplan.planner.types import Layout

    rendered = {
        "vllm": {"--host", "--port", "--served-model-name", "--revision", "--dtype", "--quantization",
                 "--max-model-len", "--enable-prefix-caching", "--scheduling-policy", "--enforce-eager",
                 "--enable-eplb", "--data-parallel-size-local", "--data-parallel-address",
                 "--data-parallel-rpc-port", "--data-parallel-start-rank", "--headless",
                 "--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr", "--master-port"},
        "sglang": {"--model-path", "--host", "--port", "--served-model-name", "--revision", "--dtype",
                   "--quantization", "--enable-metrics", "--context-length", "--disable-radix-cache",
                   "--enable-priority-scheduling", "--schedule-policy", "--disable-cuda-graph", "--enable-eplb",
                   "--dist-init-addr", "--nnodes", "--node-rank"},
        "trtllm": {"--host", "--port", "--backend", "--max_seq_len", "--extra_llm_api_options"},
    }
    for engine in rendered:
        for layout in (Layout(tp=8), Layout(tp=2, ep=8), Layout(tp=4, pp=2)):
            el = engine_layout(layout, engine, chunk_size=2048, max_num_seqs=64, memory_fraction=0.9,
                               kv_dtype="fp8")
            rendered[engine] |= set(el.flags)
        index = option_index(engine)
        missing = {f for f in rendered[engine]
                   if (f.replace("_", "-") if engine == "vllm" else f) not in index}
        assert not missing, (engine, missing)


def test_option_tables_say_where_they_come_from():
    assert engine_options.VERSIONS == {"vllm": "0.32.0", "sglang": "0.5.23", "trtllm": "1.2.1"}
    assert all(engine_options.SOURCES[e] for e in ("vllm", "sglang", "trtllm"))
    assert len(engine_options.VLLM_OPTIONS) > 150 and len(engine_options.SGLANG_OPTIONS) > 200
    from meshplan.render.engine_args import DEFAULT_IMAGES

    # TRANSITIONAL (branch pods): the engine modules' branches move vLLM/SGLang's DEFAULT_IMAGE to the
    # versions of these tables; until they are merged the images may still carry the previous pins. The
    # lead drops `previous` when merging, so that the images and tables must agree again.
    previous = {"vllm": "0.12.0", "sglang": "0.5.5"}
    for engine, version in engine_options.VERSIONS.items():
        assert DEFAULT_IMAGES[engine].endswith((version, previous.get(engine, version))), \
            (engine, DEFAULT_IMAGES[engine])


def test_reserved_names_include_plan_owned_spellings():
    assert {f"--{n}" for n in PLAN_OWNED_FLAGS} <= set(RESERVED_FLAG_NAMES)
    assert "--served-model-name" in RESERVED_FLAG_NAMES and "--api-key" in RESERVED_FLAG_NAMES


def test_validate_semantics_reports_abbreviation_the_crd_cannot_see():
    """`--tp` passes the CRD with allowPlanOverride (a PLAN_OWNED_FLAGS spelling) but SGLang would read
    it as an abbreviation of --tp-size: the operator reports it (Planned=False/InvalidSpec)."""
    llmd = LLMDeployment.from_manifest(manifest({"engine": {"kind": "sglang", "allowPlanOverride": True,
                                                            "extraArgs": ["--tp", "4"]}}))
    problems = validate_semantics(llmd.spec)
    assert any("abbreviation of --tp-size" in p and "SGLang 0.5.23" in p for p in problems), problems


# ------------------------------------------------------------------ rendering: $(VAR), sh -c, SA token


def _render(engine: str, layout_kw: dict, nodes: int = 1, extra_args=(), env=(), model="org/model"):
    from _gpu_nodes import hgx_h100

    from meshplan.placement import place, request_for_layout
    from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
    from meshplan.render import Owner, PodOptions, render_deployment
    from meshplan.render.engine_args import ServingOptions
    from meshplan.topology import build_topology

    layout = Layout(**layout_kw)
    topo = build_topology(hgx_h100(nodes))
    placement = place(request_for_layout(layout, 8), topo)
    assert placement.ok, placement.message()
    cand = Candidate(layout=layout, weight_dtype="bf16", kv_dtype="bf16", chunk_size=1024, max_num_seqs=64,
                     memory=MemoryFit(True, 0, 0, 0, 0, 0, 0, 0), prediction=Prediction(0, 0, 0, 0, 0),
                     engine=engine)
    serving = ServingOptions(engine=engine, model=model, extra_args=tuple(extra_args))
    out = render_deployment(Owner("chat", "team-a", "uid"), cand, placement, topo, serving,
                            pods=PodOptions(env=tuple(env)))
    return [p for g in out.groups for p in g.pods]


def _kubelet_expand(s: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command/args (k8s.io/kubernetes third_party expansion):
    `$$` -> `$`, `$(NAME)` -> the variable's value when defined, anything else as written."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if s[i + 1] == "(" and ")" in s[i + 2:]:
                end = s.index(")", i + 2)
                name = s[i + 2:end]
                if name in env:
                    out.append(env[name])
                    i = end + 1
                    continue
        out.append(s[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("engine,layout,nodes", [("vllm", {"tp": 8}, 1), ("sglang", {"tp": 8}, 1),
                                                 ("trtllm", {"tp": 8}, 1), ("trtllm", {"tp": 8, "pp": 2}, 2)])
def test_no_kubelet_expansion_reaches_the_engine(engine, layout, nodes):
    """A user value `$(HF_TOKEN)` in extraArgs or the model reaches the process as written, never as the
    Secret's value: every `$` of command/args is rendered as `$$`."""
    pods = _render(engine, layout, nodes, extra_args=["--chat-template", "$(HF_TOKEN)"],
                   env=[{"name": "HF_TOKEN", "value": "the-secret"}], model="org/m$(HF_TOKEN)")
    for pod in pods:
        c = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value", "") for e in c["env"]}
        seen = [_kubelet_expand(x, env) for x in c["command"] + c["args"]]
        assert not any("the-secret" in x for x in seen), seen
    leader = pods[0]["spec"]["containers"][0]
    seen = [_kubelet_expand(x, {}) for x in leader["command"] + leader["args"]]
    assert "$(HF_TOKEN)" in seen and any("org/m$(HF_TOKEN)" in x for x in seen)


@pytest.mark.parametrize("nodes,layout", [(1, {"tp": 8}), (2, {"tp": 8, "pp": 2})])
def test_trtllm_script_carries_no_user_value(nodes, layout):
    """The leader's `sh -c` script is the operator's text only; model and extraArgs follow it as
    arguments (`exec "$@"`), so no quoting or `$(...)` in a user value is ever parsed by sh."""
    evil = "'; touch /tmp/pwned; echo '"
    pods = _render("trtllm", layout, nodes, extra_args=["--chat_template", evil], model="org/model")
    c = pods[0]["spec"]["containers"][0]
    assert c["command"] == ["/bin/sh", "-c"]
    script, name, *argv = c["args"]
    assert evil not in script and "org/model" not in script and "trtllm-serve" not in script
    assert name == "meshplan-trtllm" and evil in argv and "org/model" in argv
    assert script.rstrip().endswith('exec "$$@"')


def test_engine_pods_mount_no_token_and_keep_baseline():
    for engine in ("vllm", "sglang", "trtllm"):
        for pod in _render(engine, {"tp": 8, "pp": 2} if engine == "trtllm" else {"tp": 8},
                           2 if engine == "trtllm" else 1):
            spec = pod["spec"]
            assert spec["automountServiceAccountToken"] is False
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in spec["containers"]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert not c["securityContext"].get("privileged") and "capabilities" not in c["securityContext"]
            assert not any(k in spec for k in ("hostNetwork", "hostPID", "hostIPC"))
            assert all("hostPath" not in v for v in spec["volumes"])


def test_user_env_cannot_override_bootstrap_variables():
    """Even past the API (an object stored before the rule existed), MESHPLAN_* comes from the operator."""
    pods = _render("vllm", {"tp": 8, "pp": 2}, 2, env=[{"name": "MESHPLAN_NNODES", "value": "99"},
                                                       {"name": "MESHPLAN_LEADER_ADDRESS", "value": "evil"}])
    for pod in pods:
        env = [e for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith("MESHPLAN_")]
        values = {e["name"]: e["value"] for e in env}
        assert len(env) == len(values) and values["MESHPLAN_NNODES"] == "2"
        assert values["MESHPLAN_LEADER_ADDRESS"].startswith("chat-r0-0.")


# ------------------------------------------------------------------ the admin's engine-pod policy


def test_image_patterns():
    from meshplan.api.policy import image_allowed, image_repository

    assert image_repository("vllm/vllm-openai:v0.12.0") == "vllm/vllm-openai"
    assert image_repository("reg.example:5000/llm/vllm@sha256:" + "a" * 64) == "reg.example:5000/llm/vllm"
    assert image_repository("reg.example:5000/llm/vllm:v1@sha256:" + "a" * 64) == "reg.example:5000/llm/vllm"
    assert image_allowed("vllm/vllm-openai:v0.13.0", ["vllm/vllm-openai"])
    assert not image_allowed("vllm/vllm-openai-evil:v1", ["vllm/vllm-openai"])
    assert not image_allowed("evil.example/vllm/vllm-openai:v1", ["vllm/vllm-openai"])
    assert image_allowed("reg.example/llm/sglang:v1", ["reg.example/llm/*"])
    assert not image_allowed("reg.example/llmx/sglang:v1", ["reg.example/llm/*"])
    assert not image_allowed("reg.example/llm", ["reg.example/llm/*"])
    assert image_allowed("anything:1", ["*"]) and not image_allowed("anything:1", [])


def test_policy_from_values_names_bad_keys():
    from meshplan.api.policy import EnginePolicy

    with pytest.raises(ValueError, match="enginePolicy.allowedImages.tgi"):
        EnginePolicy.from_values({"allowedImages": {"tgi": ["x"]}})
    with pytest.raises(ValueError, match="enginePolicy: unknown key"):
        EnginePolicy.from_values({"allowImages": {}})
    with pytest.raises(ValueError, match="allowEnvValueFrom"):
        EnginePolicy.from_values({"allowEnvValueFrom": "yes"})
    p = EnginePolicy.from_values({"allowedImages": {"vllm": ["reg/*"]}, "serviceAccountName": "engines"})
    assert p.allowed_images == {"vllm": ("reg/*",)} and p.service_account_name == "engines"


def test_settings_reads_the_chart_json_and_refuses_garbage():
    from meshplan.api.policy import DEFAULT_ALLOWED_IMAGES
    from meshplan.controller.settings import load_engine_policy

    assert load_engine_policy({}).allowed_images == DEFAULT_ALLOWED_IMAGES
    assert load_engine_policy({}).allow_env_value_from is False
    p = load_engine_policy({"MESHPLAN_ENGINE_POLICY": '{"allowEnvValueFrom": true, "serviceAccountName": "x"}'})
    assert p.allow_env_value_from and p.service_account_name == "x"
    with pytest.raises(ValueError, match="MESHPLAN_ENGINE_POLICY is not JSON"):
        load_engine_policy({"MESHPLAN_ENGINE_POLICY": "{nope"})


def _policy_spec(**engine):
    llmd = LLMDeployment.from_manifest(manifest({"engine": {"kind": "vllm", **engine}}))
    return llmd.spec


def test_policy_problems_name_field_value_and_admin_setting():
    from meshplan.api.policy import EnginePolicy, policy_problems

    default = EnginePolicy()
    assert policy_problems(_policy_spec(), default) == []
    assert policy_problems(_policy_spec(image="vllm/vllm-openai:v0.13.0"), default) == []
    [p] = policy_problems(_policy_spec(image="evil.example/miner:1"), default)
    assert "spec.engine.image 'evil.example/miner:1'" in p and "enginePolicy.allowedImages.vllm" in p
    [p] = policy_problems(_policy_spec(env=[secret_env("DB_PASSWORD")]), default)
    assert "spec.engine.env[0].valueFrom" in p and "Secret 's'" in p and "enginePolicy.allowEnvValueFrom" in p
    nccl = LLMDeployment.from_manifest(manifest({"nccl": {"env": [secret_env("NCCL_X")]}})).spec
    assert any("spec.nccl.env[0].valueFrom" in p for p in policy_problems(nccl, default))
    assert policy_problems(nccl, EnginePolicy(allow_env_value_from=True)) == []
    # weights credentials are the one Secret reference a CR may make
    weights = LLMDeployment.from_manifest(manifest({"model": {"name": "llama-3.1-8b", "weights": {
        "uri": "hf://meta-llama/Llama-3.1-8B", "credentialsSecretRef": {"name": "hf", "key": "token"}}}})).spec
    assert policy_problems(weights, default) == []


def _hgx_manifest(**engine):
    import yaml as _yaml
    from pathlib import Path

    m = _yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "llama-3.1-70b-hgx-h100.yaml")
                        .read_text())
    m["metadata"].update({"namespace": "team-a", "uid": "u-policy", "generation": 1})
    m["spec"].pop("slo", None)
    m["spec"].update({"objective": "maxThroughput", "replicas": 1, "autoscaling": {"enabled": False},
                      "parallelism": {"tensor": 8, "pipeline": 1}})
    m["spec"]["engine"].update(engine)
    return m


def _hgx_topology():
    from meshplan.devcluster.fleets import fleet_nodes
    from meshplan.topology import build_topology_from_infos, node_info

    fleet = {"name": "t", "nodeGroups": [{"namePrefix": "t-h", "count": 2, "gpusPerNode": 8,
                                          "product": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559}]}
    infos = []
    for n in fleet_nodes(fleet):
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        infos.append(node_info(n))
    return build_topology_from_infos(infos, [])


def test_operator_refuses_a_disallowed_image_with_a_condition_and_creates_nothing():
    from meshplan.api.policy import EnginePolicy
    from meshplan.controller.reconcile import Reconciler, World

    r = Reconciler(kube=None, world=World(), compute_domains=False, engine_policy=EnginePolicy())
    out = r._decide(_hgx_manifest(image="evil.example/miner:1"), _hgx_topology(), [], [], [])
    planned = {c["type"]: c for c in out.status["conditions"]}["Planned"]
    assert planned["status"] == "False" and planned["reason"] == "NotAllowed"
    assert "evil.example/miner:1" in planned["message"] and "enginePolicy.allowedImages.vllm" in planned["message"]
    assert not [d for d, _ in out.apply if d.get("kind") == "Pod"]


def test_operator_runs_engine_pods_as_the_admins_service_account_without_token():
    from meshplan.api.policy import EnginePolicy
    from meshplan.controller.reconcile import Reconciler, World

    r = Reconciler(kube=None, world=World(), compute_domains=False,
                   engine_policy=EnginePolicy(service_account_name="llm-engines"))
    out = r._decide(_hgx_manifest(), _hgx_topology(), [], [], [])
    pods = [d for d, _ in out.apply if d.get("kind") == "Pod"]
    assert pods
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == "llm-engines"
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.32.0"


def test_renderer_drops_served_model_name_from_extra_args():
    """Defence in depth for objects stored before the API rule: the served name stays the spec's."""
    from meshplan.planner.types import Candidate, Layout, MemoryFit, Prediction
    from meshplan.render.engine_args import PodRole, ServingOptions, engine_command

    cand = Candidate(layout=Layout(tp=1), weight_dtype="bf16", kv_dtype="bf16", chunk_size=1024, max_num_seqs=64,
                     memory=MemoryFit(True, 0, 0, 0, 0, 0, 0, 0), prediction=Prediction(0, 0, 0, 0, 0),
                     engine="vllm")
    cmd = engine_command(cand, ServingOptions(engine="vllm", model="org/m", served_name="chat",
                                              extra_args=("--served-model-name", "other")), PodRole())
    args = list(cmd.args)
    assert args.count("--served-model-name") == 1 and args[args.index("--served-model-name") + 1] == "chat"
    assert "other" not in args


def test_upgrade_replaces_running_groups_by_rolling_update_not_by_deleting_them(monkeypatch):
    """A group rendered by an operator before issue #17 (token mounted, no securityContext) cannot be
    re-applied in place (the API server refuses immutable pod changes, and the reconciler would then
    delete the pod). POD_TEMPLATE_VERSION is part of the plan hash, so such a group is stale: the new
    group is created beside it (surge) and the old one is neither patched nor deleted yet."""
    import copy as _copy

    from meshplan.api.policy import EnginePolicy
    from meshplan.controller.reconcile import Reconciler, World
    import meshplan.render as render_pkg

    topo = _hgx_topology()
    # what the previous template version rendered (same spec, same options)
    monkeypatch.setattr(render_pkg, "POD_TEMPLATE_VERSION", render_pkg.POD_TEMPLATE_VERSION - 1)
    first = Reconciler(kube=None, world=World(), compute_domains=False,
                       engine_policy=EnginePolicy())._decide(_hgx_manifest(), topo, [], [], [])
    monkeypatch.undo()
    r = Reconciler(kube=None, world=World(), compute_domains=False, engine_policy=EnginePolicy())
    old_pods = []
    for pod, _ in first.apply:
        if pod.get("kind") != "Pod":
            continue
        pod = _copy.deepcopy(pod)
        pod["metadata"]["uid"] = "uid-" + pod["metadata"]["name"]
        for key in ("automountServiceAccountToken", "securityContext", "schedulingGates"):
            pod["spec"].pop(key, None)
        pod["spec"]["containers"][0].pop("securityContext", None)
        pod["spec"]["nodeName"] = pod["metadata"]["annotations"]["meshplan.dev/assigned-node"]
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        old_pods.append(pod)
    assert old_pods
    out = r._decide(_hgx_manifest(), topo, old_pods, [], [])
    old_names = {p["metadata"]["name"] for p in old_pods}
    applied = {d["metadata"]["name"] for d, _ in out.apply if d.get("kind") == "Pod"}
    assert applied and not applied & old_names, (applied, old_names)
    assert not [c for _, kind, c, _ in out.delete if kind == "Pod"]
