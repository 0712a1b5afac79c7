"""Issue #15, the TensorRT-LLM findings: each test here failed before its fix (see the commit messages).

- max_batch_size is per rank under attention DP (one mapping, engines.trtllm.knobs);
- pinned weight / KV dtypes TensorRT-LLM cannot honour are refused with the reason (search and render),
  the ones it can are rendered (kv_cache_config.dtype, LLM-API dtype);
- expertLoadBalancing: enabled renders the MoE load balancer with redundant slots;
- the multi-node bootstrap gets operator-provisioned ssh keys (Secret, mode 0400, read-only; the
  controller creates and owns it; ssh verifies host keys);
- the pinned image is the 1.2.1 release.

The API server in the controller tests is the fake of tests/test_controller_refusals.py (nothing else
can run in tests/). The key format is checked against RFC 8032's own test vector here; that OpenSSH's
ssh-keygen reads the keys and an OpenSSH sshd accepts a login with them is docs/trtllm-multinode.md's
recorded check (`python benchmarks/trtllm_ssh_check.py`).
"""

from __future__ import annotations

import asyncio
import base64
import copy
from datetime import datetime, timezone

import pytest
import yaml
from _gpu_nodes import gb200_nvl72, hgx_h100
from test_controller_refusals import FakeApiServer
from test_render import arg, pods_of, render

from meshplan.api.models import LLMDeployment
from meshplan.catalog.models import get_model
from meshplan.controller.kube import ApiError
from meshplan.controller.reconcile import Reconciler, World, ensure_trtllm_ssh_secret
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import trtllm
from meshplan.engines.trtllm_ssh import ed25519_public_key, needs_ssh_secret, ssh_files, ssh_secret
from meshplan.planner import plan_for_spec
from meshplan.planner.types import Layout
from meshplan.render import RenderError
from meshplan.render.engine_args import DEFAULT_IMAGES, ServingOptions
from meshplan.topology import build_topology, node_info


def _options(pod) -> dict:
    script = pod["spec"]["containers"][0]["args"][0]
    body = script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    return yaml.safe_load(body)


# ---- max_batch_size per attention-DP rank ----------------------------------------------------

def test_max_batch_size_is_per_attention_dp_rank():
    out, _ = render(gb200_nvl72(1, 4), Layout(tp=1, ep=16), "trtllm", per_node=4, max_num_seqs=128)
    leader = pods_of(out)[0]
    assert _options(leader)["enable_attention_dp"] is True
    assert arg(leader, "--max_batch_size") == "8"          # 128 per replica over 16 DP ranks, not 16 x 128
    k = trtllm.knobs(Layout(tp=1, ep=16), 2048, 128)
    assert (k.max_num_seqs, k.replica_max_num_seqs, k.ranks, k.chunk_size) == (8, 128, 16, 2048)
    # not a multiple: the flag never exceeds the plan; what one replica runs is reported
    k = trtllm.knobs(Layout(tp=1, ep=16), None, 100)
    assert (k.max_num_seqs, k.replica_max_num_seqs) == (6, 96)
    assert trtllm.knobs(Layout(tp=1, ep=16), None, 4).max_num_seqs == 1


def test_max_batch_size_is_per_replica_under_attention_tp():
    for layout in (Layout(tp=8), Layout(tp=4, ep=4)):
        k = trtllm.knobs(layout, 1024, 128)
        assert (k.max_num_seqs, k.replica_max_num_seqs, k.ranks) == (128, 128, 1)
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm", max_num_seqs=128)
    assert arg(pods_of(out)[0], "--max_batch_size") == "128"


def test_max_seq_len_is_rendered_with_trtllm_serves_spelling():
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm",
                    serving=ServingOptions(engine="trtllm", model="org/model", max_model_len=20480))
    assert arg(pods_of(out)[0], "--max_seq_len") == "20480"


# ---- precision -------------------------------------------------------------------------------

def _example(name: str, **spec_patch) -> LLMDeployment:
    m = yaml.safe_load(open(f"examples/{name}.yaml"))
    m["spec"]["engine"]["kind"] = "trtllm"
    for key, value in spec_patch.items():
        m["spec"].setdefault(key, {}).update(value)
    return LLMDeployment.from_manifest(m)


def _hgx_fleet():
    return build_topology(fleet_nodes(load_fleet("hgx-h100")), [], ready_if_unknown=True)


def test_pinned_fp8_weights_on_a_bf16_checkpoint_are_refused_by_the_search_for_trtllm():
    # examples/llama-3.1-70b-hgx-h100.yaml pins fp8 (fine for vLLM: online quantization); TensorRT-LLM has none
    plan = plan_for_spec(_example("llama-3.1-70b-hgx-h100").spec, _hgx_fleet())
    assert plan.choice is None
    assert "TensorRT-LLM reads weight quantization from the checkpoint" in plan.reason
    assert "ships bf16 weights" in plan.reason and "spec.precision.weights" in plan.reason
    # with weights: auto it plans the checkpoint's own dtype
    plan = plan_for_spec(_example("llama-3.1-70b-hgx-h100", precision={"weights": "auto"}).spec, _hgx_fleet())
    assert plan.choice is not None and plan.choice.weight_dtype == "bf16"


@pytest.mark.parametrize("kv", ["int8", "fp4", "int4"])
def test_kv_dtypes_trtllm_serve_cannot_set_are_refused(kv):
    plan = plan_for_spec(_example("llama-3.1-70b-hgx-h100", precision={"weights": "auto", "kvCache": kv}).spec,
                         _hgx_fleet())
    assert plan.choice is None and f"spec.precision.kvCache {kv}" in plan.reason
    with pytest.raises(RenderError, match=f"spec.precision.kvCache {kv}: trtllm-serve sets only an fp8 KV"):
        render(hgx_h100(1), Layout(tp=8), "trtllm", kv_dtype=kv)


def test_fp8_kv_renders_kv_cache_config_dtype_and_bf16_renders_auto():
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm", kv_dtype="fp8")
    assert _options(pods_of(out)[0])["kv_cache_config"]["dtype"] == "fp8"
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm", kv_dtype="bf16")
    assert "dtype" not in _options(pods_of(out)[0])["kv_cache_config"]


def test_fp16_weights_on_a_bf16_checkpoint_render_the_llm_api_dtype():
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm", weight_dtype="fp16")
    assert _options(pods_of(out)[0])["dtype"] == "float16"


def test_precision_rule_names_the_fix():
    why = trtllm.precision_refusal("fp4", "fp8", "bf16")
    assert "spec.precision.weights fp4" in why and "fp4 checkpoint" in why and "auto or bf16" in why
    assert trtllm.precision_refusal("fp8", "fp8", "fp8") is None            # a ModelOpt FP8 checkpoint
    assert trtllm.precision_refusal("fp4", "fp8", "") is None               # checkpoint dtype not known


# ---- EPLB ------------------------------------------------------------------------------------

def _eplb(mode: str, experts: int = 256, layout: Layout = Layout(tp=1, ep=16)):
    serving = ServingOptions(engine="trtllm", model="org/model", expert_load_balancing=mode, num_experts=experts)
    out, _ = render(gb200_nvl72(1, 4), layout, "trtllm", per_node=4, serving=serving)
    return out


def test_enabled_eplb_renders_the_moe_load_balancer_with_redundant_slots():
    opts = _options(pods_of(_eplb("enabled"))[0])
    # 256 experts + one redundant slot per EP rank (16); divisible by the EP size
    assert opts["moe_config"] == {"load_balancer": {"num_slots": 272, "layer_updates_per_iter": 1}}
    assert opts["moe_config"]["load_balancer"]["num_slots"] % 16 == 0


@pytest.mark.parametrize("mode", ["auto", "disabled"])
def test_eplb_off_renders_no_load_balancer(mode):
    assert "moe_config" not in _options(pods_of(_eplb(mode))[0])


def test_eplb_without_a_known_expert_count_is_not_rendered_and_says_why():
    out = _eplb("enabled", experts=0)
    assert "moe_config" not in _options(pods_of(out)[0])
    assert any(e.subject == "expertLoadBalancing" and e.level == "warning" and "expert count" in e.reason
               for e in out.explain)


# ---- multi-node bootstrap: operator-provisioned ssh ------------------------------------------

def test_rfc8032_public_key_and_openssh_private_key_layout():
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")   # RFC 8032 7.1 TEST 1
    assert ed25519_public_key(seed).hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    files = ssh_files("llm", client_seed=seed, host_seed=bytes(32))
    pem = files[trtllm.SSH_CLIENT_KEY].splitlines()
    assert pem[0] == "-----BEGIN OPENSSH PRIVATE KEY-----" and pem[-1] == "-----END OPENSSH PRIVATE KEY-----"
    blob = base64.b64decode("".join(pem[1:-1]))
    assert blob.startswith(b"openssh-key-v1\0\0\0\0\x04none\0\0\0\x04none\0\0\0\0\0\0\0\x01")
    assert seed + ed25519_public_key(seed) in blob                  # the private section: seed || public key
    auth = files[trtllm.SSH_AUTHORIZED_KEYS].split()
    assert auth[0] == "ssh-ed25519" and base64.b64decode(auth[1])[-32:] == ed25519_public_key(seed)
    known = files[trtllm.SSH_KNOWN_HOSTS].split()
    assert known[:2] == ["*", "ssh-ed25519"] and base64.b64decode(known[2])[-32:] == ed25519_public_key(bytes(32))
    assert ssh_files("llm") != ssh_files("llm")                     # fresh keys every time


def test_multinode_pods_mount_the_ssh_secret_read_only_with_mode_0400():
    out, _ = render(hgx_h100(2), Layout(tp=8, pp=2), "trtllm")
    leader, worker = out.groups[0].pods
    for pod in (leader, worker):
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vols["trtllm-ssh"]["secret"] == {"secretName": "chat-trtllm-ssh", "defaultMode": 0o400}
        mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["trtllm-ssh"] == {"name": "trtllm-ssh", "mountPath": trtllm.SSH_DIR, "readOnly": True}
    script = worker["spec"]["containers"][0]["args"][0]
    for needed in ("mkdir -p /run/sshd", "exec /usr/sbin/sshd -D", f"-h {trtllm.SSH_DIR}/ssh_host_ed25519_key",
                   f"AuthorizedKeysFile={trtllm.SSH_DIR}/authorized_keys", "PasswordAuthentication=no"):
        assert needed in script
    rsh = leader["spec"]["containers"][0]["args"]
    rsh = rsh[rsh.index("plm_rsh_args") + 1]
    assert f"-i {trtllm.SSH_DIR}/id_ed25519" in rsh and f"UserKnownHostsFile={trtllm.SSH_DIR}/known_hosts" in rsh
    assert "StrictHostKeyChecking=yes" in rsh and "StrictHostKeyChecking=no" not in rsh
    assert needs_ssh_secret(list(pods_of(out))) == "chat-trtllm-ssh"


def test_single_pod_needs_no_ssh():
    out, _ = render(hgx_h100(1), Layout(tp=8), "trtllm")
    pod = pods_of(out)[0]
    assert all(v["name"] != "trtllm-ssh" for v in pod["spec"]["volumes"])
    assert needs_ssh_secret(pods_of(out)) is None


def _multinode_manifest() -> dict:
    m = yaml.safe_load(open("examples/llama-3.1-70b-hgx-h100.yaml"))
    m["metadata"].update(name="llama", namespace="ns", uid="u-1", generation=1)
    m["spec"].pop("slo")
    m["spec"]["engine"]["kind"] = "trtllm"
    m["spec"]["engine"].pop("extraArgs")           # vLLM's spelling; maxContext gives --max_seq_len
    m["spec"]["precision"]["weights"] = "auto"
    m["spec"]["autoscaling"] = {"enabled": False}
    m["spec"]["replicas"] = 1
    m["spec"]["parallelism"].update(tensor=8, pipeline=2)
    return m


def _reconciler(api):
    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet("hgx-h100"))]
    return Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: 1000.0,
                      clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_the_controller_creates_the_ssh_secret_once_owned_by_the_deployment():
    api = FakeApiServer(_multinode_manifest())
    rec = _reconciler(api)
    asyncio.run(rec.reconcile("ns", "llama"))
    pods = [o for (k, _), o in api.objects.items() if k == "Pod"]
    assert len(pods) == 2
    secret = api.objects[("Secret", "llama-trtllm-ssh")]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"
    assert sorted(secret["data"]) == sorted(trtllm.SSH_SECRET_KEYS)
    first = copy.deepcopy(secret["data"])
    assert all(needs_ssh_secret([p]) == "llama-trtllm-ssh" for p in pods)
    # the pods are recreated (a lost group): the keys stay those of the existing Secret
    for key in [k for k in api.objects if k[0] == "Pod"]:
        del api.objects[key]
    asyncio.run(rec.reconcile("ns", "llama"))
    assert api.objects[("Secret", "llama-trtllm-ssh")]["data"] == first


def test_a_foreign_secret_of_that_name_is_never_overwritten():
    api = FakeApiServer(_multinode_manifest())
    foreign = ssh_secret("llama", "ns", {"uid": "someone-else"}, {})
    api.objects[("Secret", "llama-trtllm-ssh")] = foreign
    pods = render(hgx_h100(2), Layout(tp=8, pp=2), "trtllm")[0]
    desired = [p for p in pods_of(pods)]
    for p in desired:
        for v in p["spec"]["volumes"]:
            if v["name"] == "trtllm-ssh":
                v["secret"]["secretName"] = "llama-trtllm-ssh"
    with pytest.raises(ApiError) as exc:
        asyncio.run(ensure_trtllm_ssh_secret(api, "ns", "llama", "u-1", desired))
    assert exc.value.status == 409 and "not owned by LLMDeployment llama" in exc.value.message
    assert api.objects[("Secret", "llama-trtllm-ssh")] is foreign


def test_single_node_trtllm_creates_no_secret():
    m = _multinode_manifest()
    m["spec"]["parallelism"].update(tensor=8, pipeline=1)
    api = FakeApiServer(m)
    asyncio.run(_reconciler(api).reconcile("ns", "llama"))
    assert any(k == "Pod" for k, _ in api.objects)
    assert not any(k == "Secret" for k, _ in api.objects)


# ---- image --------------------------------------------------------------------------------------

def test_the_pinned_image_is_the_1_2_1_release():
    assert DEFAULT_IMAGES["trtllm"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1" == trtllm.DEFAULT_IMAGE
    assert get_model("deepseek-r1").num_experts == 256     # the EPLB slot arithmetic above uses a real count


def test_enabled_eplb_reaches_the_public_render_path_with_the_models_experts():
    """render/options.py hands the model's expert count to the engine (ServingOptions.num_experts): before, the
    public path (`meshplan render`, the operator) rendered no load balancer and only warned."""
    import yaml as _yaml

    from meshplan.render.pipeline import plan_place_render

    m = _yaml.safe_load(open("examples/deepseek-r1-h200.yaml"))
    m["spec"]["engine"]["kind"] = "trtllm"
    m["spec"]["engine"]["expertLoadBalancing"] = "enabled"
    topo = build_topology(fleet_nodes(load_fleet("hgx-h200-ib")), [], ready_if_unknown=True)
    res = plan_place_render(LLMDeployment.from_manifest(m), topo)
    script = res.rendered.groups[0].pods[0]["spec"]["containers"][0]["args"][0]
    options = _yaml.safe_load(script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
    ep = options["moe_expert_parallel_size"]
    assert options["moe_config"]["load_balancer"]["num_slots"] == 256 + ep    # DeepSeek-R1: 256 routed experts
