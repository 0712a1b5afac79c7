"""Issue #15, NVIDIA NIM multi-node: a replica over several nodes renders as NIM 1.x documents it.

Before this change `engines.nim.check_pods` refused every layout of more than one pod per replica, so
DeepSeek-R1 TP8 x PP2 on two 8 x H100 nodes (examples/deepseek-r1-nim-multinode.yaml) had no plan: each
test below that renders or plans such a replica failed then (checked on the parent commit).

What NIM 1.x multi-node is (sources in meshplan/engines/nim.py): the NIM Operator's `spec.multiNode.mpi`
rendering for NIM < 2.0 (NVIDIA/k8s-nim-operator nimservice_types.go) and the nim-llm Helm chart: no
command, the image's entrypoint reads NIM_MULTI_NODE / NIM_LEADER_ROLE / NIM_NODE_RANK / NIM_NUM_COMPUTE_NODES;
the leader runs mpirun over /etc/mpi/hostfile-<GROUP_INDEX> with ssh, workers run sshd on 2222; one
pipeline stage per node. NIM has no package to run here, so these tests check the rendered pods against
those documents; the API server of the controller tests is tests/test_controller_refusals.py's fake.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from _gpu_nodes import hgx_h100
from test_controller_refusals import FakeApiServer
from test_render import OWNER, cand, pods_of

from meshplan.api.models import LLMDeployment
from meshplan.controller.kube import ApiError
from meshplan.controller.reconcile import Reconciler, World, ensure_nim_ssh_secret
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.engines import nim
from meshplan.engines.trtllm_ssh import ed25519_public_key, mounted_secret
from meshplan.planner import plan_for_spec
from meshplan.planner.engines import check_layout
from meshplan.planner.types import Layout
from meshplan.placement import place, request_for_layout
from meshplan.render import NetworkOptions, PodOptions, RenderError, render_deployment
from meshplan.render.engine_args import ServingOptions
from meshplan.render.pipeline import plan_place_render
from meshplan.topology import build_topology, node_info

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "deepseek-r1-nim-multinode.yaml"
IMAGE = "nvcr.io/nim/deepseek-ai/deepseek-r1:1.8.0"


def render(nodes, layout, model, image, **ckw):
    topo = build_topology(nodes)
    placement = place(request_for_layout(layout, 8), topo)
    assert placement.ok, placement.message()
    serving = ServingOptions(engine="nim", model=model)
    return render_deployment(OWNER, cand(layout, "nim", **ckw), placement, topo, serving, NetworkOptions(),
                             PodOptions(image=image)), placement


def _env(pod) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def _manifest() -> dict:
    m = yaml.safe_load(EXAMPLE.read_text())
    m["metadata"].update(namespace="ns", uid="u-1", generation=1)
    m["spec"]["engine"].pop("env")       # valueFrom needs the admin's enginePolicy; not what is checked here
    return m


def _example_render():
    llmd = LLMDeployment.from_manifest(_manifest())
    topo = build_topology(fleet_nodes(load_fleet("hgx-h100-ib")), [], ready_if_unknown=True)
    return plan_place_render(llmd, topo)


def test_the_example_plans_tp8_pp2_over_two_nodes_and_renders_one_group_of_two_pods():
    res = _example_render()
    assert res.rendered is not None, res.message
    assert res.plan.choice.layout.label() == "TP8·PP2"
    (group,) = res.rendered.groups
    leader, worker = group.pods
    assert leader["metadata"]["labels"]["meshplan.dev/role"] == "leader"
    assert worker["metadata"]["labels"]["meshplan.dev/role"] == "worker"
    # one pipeline stage of 8 GPUs per pod, on two different nodes
    assert [p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in group.pods] == ["8", "8"]
    nodes = {p["metadata"]["annotations"]["meshplan.dev/assigned-node"] for p in group.pods}
    assert len(nodes) == 2


def test_leader_and_worker_get_nim_s_multi_node_environment_and_no_command():
    leader, worker = _example_render().rendered.groups[0].pods
    for pod in (leader, worker):
        c = pod["spec"]["containers"][0]
        assert "command" not in c and "args" not in c          # the NIM image's entrypoint reads the role
    le, we = _env(leader), _env(worker)
    for env, rank in ((le, "0"), (we, "1")):
        assert env["NIM_MULTI_NODE"] == "1"
        assert env["NIM_NUM_COMPUTE_NODES"] == "2"               # the group's size: one pipeline stage per node
        assert env["NIM_NODE_RANK"] == rank
        assert (env["NIM_TENSOR_PARALLEL_SIZE"], env["NIM_PIPELINE_PARALLEL_SIZE"]) == ("8", "2")
        assert env["NIM_MPI_ALLOW_RUN_AS_ROOT"] == "0"
    assert le["NIM_LEADER_ROLE"] == "1" and we["NIM_LEADER_ROLE"] == "0"
    assert le["GPUS_PER_NODE"] == "8" and le["CLUSTER_SIZE"] == "2" and le["CLUSTER_START_TIMEOUT"] == "300"
    assert le["OMPI_MCA_orte_keep_fqdn_hostnames"] == "true"
    assert le["OMPI_MCA_plm_rsh_args"] == "-o ConnectionAttempts=20"
    assert le["GROUP_INDEX"] == "0"
    # the worker finds its leader as <LEADER_NAME>.<LWS_NAME>.<NAMESPACE>: the leader pod's own DNS name
    assert f'{we["LEADER_NAME"]}.{we["LWS_NAME"]}.{we["NAMESPACE"]}' == leader["metadata"]["name"] + "." + \
        leader["spec"]["subdomain"] + ".ns"
    assert "LEADER_NAME" not in le and "GPUS_PER_NODE" not in we
    # only the leader serves HTTP (NIM's /v1/health/ready); the worker exposes its sshd
    lc, wc = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
    assert lc["readinessProbe"]["httpGet"]["path"] == "/v1/health/ready"
    assert "readinessProbe" not in wc and [p["containerPort"] for p in wc["ports"]] == [nim.SSH_PORT]


def test_the_leader_s_hostfile_lists_every_pod_with_its_gpus_as_slots():
    leader, worker = _example_render().rendered.groups[0].pods
    text = leader["metadata"]["annotations"][nim.MPI_HOSTFILE_ANNOTATION]
    worker_dns = f'{worker["spec"]["hostname"]}.{worker["spec"]["subdomain"]}.ns.svc'
    assert text == f"localhost slots=8\n{worker_dns} slots=8\n"
    vols = {v["name"]: v for v in leader["spec"]["volumes"]}
    (item,) = vols["nim-mpi-config"]["downwardAPI"]["items"]
    assert item["path"] == "hostfile-0"                          # /etc/mpi/hostfile-${GROUP_INDEX}
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{nim.MPI_HOSTFILE_ANNOTATION}']"
    mounts = {m["name"]: m for m in leader["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["nim-mpi-config"]["mountPath"] == "/etc/mpi"
    assert nim.MPI_HOSTFILE_ANNOTATION not in worker["metadata"]["annotations"]


def test_every_pod_mounts_the_ssh_key_read_only_0400_and_the_worker_its_sshd_directory():
    res = _example_render()
    for pod in res.rendered.groups[0].pods:
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert vols[nim.SSH_VOLUME]["secret"] == {"secretName": "deepseek-r1-nim-nim-ssh", "defaultMode": 0o400}
        assert mounts[nim.SSH_VOLUME] == {"name": nim.SSH_VOLUME, "mountPath": "/opt/nim/llm/pk", "readOnly": True}
        assert mounts["nim-ssh-dotfiles"]["mountPath"] == "/opt/nim/llm/.ssh" and "emptyDir" in vols["nim-ssh-dotfiles"]
    worker = res.rendered.groups[0].pods[1]
    assert {m["mountPath"] for m in worker["spec"]["containers"][0]["volumeMounts"]} >= {"/ssh-confs"}
    assert mounted_secret(pods_of(res.rendered), nim.SSH_VOLUME) == "deepseek-r1-nim-nim-ssh"


def test_single_pod_nim_is_unchanged_no_multi_node_env_no_ssh():
    out, _ = render(hgx_h100(1), Layout(tp=2), model="meta-llama/Llama-3.1-8B-Instruct",
                    image="nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0")
    (pod,) = pods_of(out)
    assert not any(k.startswith(("NIM_MULTI", "NIM_LEADER", "GPUS_PER")) for k in _env(pod))
    assert mounted_secret([pod], nim.SSH_VOLUME) is None


@pytest.mark.parametrize("layout,pods,gpus,ok", [
    (Layout(tp=8, pp=2), 2, 8, True),       # one stage per node: what NIM 1.x multi-node runs
    (Layout(tp=4, pp=2), 2, 4, True),       # two stages of 4 GPUs (meshplan renders a pod per stage)
    (Layout(tp=8, pp=4), 4, 8, True),
    (Layout(tp=16), 2, 8, False),           # a tensor-parallel group over two pods: GPUS_PER_NODE = TP cannot say it
    (Layout(tp=16, pp=2), 4, 8, False),
])
def test_check_pods_accepts_one_pipeline_stage_per_pod_only(layout, pods, gpus, ok):
    why = nim.check_pods(layout, pods, gpus)
    assert (why is None) == ok, why
    if not ok:
        assert "tensor-parallel group cannot span pods" in why and "GPUS_PER_NODE" in why


def test_the_planner_never_proposes_tp_across_nodes_for_nim_and_says_why():
    assert check_layout(Layout(tp=16), "nim", gpus_per_node=8) is not None
    assert check_layout(Layout(tp=8, pp=2), "nim", gpus_per_node=8) is None
    m = _manifest()
    m["spec"]["parallelism"] = {"tensor": 16, "pipeline": 1, "expert": 1}
    topo = build_topology(fleet_nodes(load_fleet("hgx-h100-ib")), [], ready_if_unknown=True)
    plan = plan_for_spec(LLMDeployment.from_manifest(m).spec, topo)
    assert plan.choice is None
    assert any("cannot span pods" in r.reason for r in plan.rejected) or "cannot span pods" in plan.reason


def test_the_renderer_refuses_a_pinned_cross_node_tp_group_with_the_reason():
    # the renderer's own predicate (render.engine_args.engine_command), for a pod of a TP16 group over two pods
    from meshplan.engines.base import PodRole
    from meshplan.render.engine_args import engine_command

    role = PodRole(rank=0, pods=2, gpus_per_pod=8, leader_host="a.b.ns.svc", peer_hosts=("a.b.ns.svc", "c.b.ns.svc"),
                   deployment="deepseek-r1-nim")
    with pytest.raises(RenderError, match="tensor-parallel group cannot span pods"):
        engine_command(cand(Layout(tp=16), "nim"), ServingOptions(engine="nim", model="deepseek-ai/DeepSeek-R1"), role)


# ---- the controller provisions the ssh key ------------------------------------------------------------

def _reconciler(api):
    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet("hgx-h100-ib"))]
    return Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: 1000.0,
                      clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_the_controller_creates_the_nim_ssh_secret_once_owned_by_the_deployment():
    api = FakeApiServer(_manifest())
    rec = _reconciler(api)
    asyncio.run(rec.reconcile("ns", "deepseek-r1-nim"))
    pods = [o for (k, _), o in api.objects.items() if k == "Pod"]
    assert len(pods) == 2
    secret = api.objects[("Secret", "deepseek-r1-nim-nim-ssh")]
    ref = secret["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"]) == ("LLMDeployment", "u-1")
    assert sorted(secret["data"]) == ["private.key"]
    key = base64.b64decode(secret["data"]["private.key"]).decode()
    assert key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    # a real Ed25519 key in OpenSSH's format: the private section holds seed + public key (64 bytes), and the
    # public key is the one RFC 8032 derives from the seed
    blob = base64.b64decode("".join(key.strip().splitlines()[1:-1]))
    assert blob.startswith(b"openssh-key-v1\0") and b"ssh-ed25519" in blob
    i = blob.index(b"\x00\x00\x00\x40") + 4
    assert ed25519_public_key(blob[i:i + 32]) == blob[i + 32:i + 64]
    first = copy.deepcopy(secret["data"])
    for k in [k for k in api.objects if k[0] == "Pod"]:       # a lost group is recreated: the key stays
        del api.objects[k]
    asyncio.run(rec.reconcile("ns", "deepseek-r1-nim"))
    assert api.objects[("Secret", "deepseek-r1-nim-nim-ssh")]["data"] == first
    assert not any(k == ("Secret", "deepseek-r1-nim-trtllm-ssh") for k in api.objects)


def test_a_foreign_secret_of_the_nim_name_is_never_overwritten():
    api = FakeApiServer(_manifest())
    foreign = nim.ssh_secret("deepseek-r1-nim", "ns", {"uid": "someone-else"}, {})
    api.objects[("Secret", "deepseek-r1-nim-nim-ssh")] = foreign
    desired = pods_of(_example_render().rendered)
    with pytest.raises(ApiError) as exc:
        asyncio.run(ensure_nim_ssh_secret(api, "ns", "deepseek-r1-nim", "u-1", desired))
    assert exc.value.status == 409 and "not owned by LLMDeployment deepseek-r1-nim" in exc.value.message
    assert api.objects[("Secret", "deepseek-r1-nim-nim-ssh")] is foreign
