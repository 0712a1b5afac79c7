"""Rendering: plan x placement -> the Kubernetes objects of one LLMDeployment.

Pure: `render_deployment(...)` takes the plan's `Candidate`, the
`PlacementResult`, the `Topology` it was computed on and plain settings, and
returns manifests (dicts) plus explanations. No client, no clock: the same
inputs always give the same objects, which is what golden tests and
server-side apply want.

What is rendered
- one client Service `<name>` selecting the leaders (role=leader) of every group;
- per placed replica group `i`: a headless Service `<name>-r<i>`, its pods
  `<name>-r<i>-<rank>` (see `workloads` for why bare Pods), and a NVIDIA
  ComputeDomain when the group uses multi-node NVLink and the DRA CRDs exist;
- unplaced replicas render nothing (all-or-nothing); their reasons stay in the
  placement result for status.

Each pod carries `meshplan.dev/plan-hash`: a hash of everything that shapes the
pods except where they run (layout, precision, knobs, engine settings, image,
env, NCCL settings). The controller replaces a group whose hash differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from meshplan.placement import PlacementResult, ReplicaPlacement
from meshplan.planner.types import Candidate
from meshplan.render.engine_args import (
    DEFAULT_IMAGES,
    EngineCommand,
    PodRole,
    RenderError,
    ServingOptions,
    engine_command,
)
from meshplan.render.nccl import Explanation, GroupTopology, nccl_env, nvshmem_env, rdma_request
from meshplan.render.workloads import (
    ANNOTATION_DOMAIN,
    ANNOTATION_EXPLAIN,
    ASSIGNED_NODE_ANNOTATION,
    LABEL_PLAN_HASH,
    LABEL_RANK,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_STAGE,
    base_labels,
    child_name,
    client_service,
    compute_domain,
    engine_pod,
    group_service_name,
    headless_service,
    node_affinity,
    owner_reference,
    pod_name,
    pod_resources,
)
from meshplan.topology import DEFAULT_TOLERATIONS, Topology


@dataclass(frozen=True)
class Owner:
    """The LLMDeployment the children belong to."""

    name: str
    namespace: str = "default"
    uid: str = ""


@dataclass(frozen=True)
class NetworkOptions:
    """spec.nccl plus what the cluster offers."""

    transport: str = "auto"
    socket_ifname: str | None = None
    ib_hca: str | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    compute_domains: bool = False          # the NVIDIA DRA ComputeDomain CRD is installed


@dataclass(frozen=True)
class PodOptions:
    """Pod-level settings from spec (image, env, node selector) and the operator."""

    image: str | None = None
    env: tuple[Mapping[str, Any], ...] = ()             # spec.engine.env (Kubernetes EnvVar dicts)
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = DEFAULT_TOLERATIONS
    weights_secret: tuple[str, str] | None = None        # (Secret name, key) -> HF_TOKEN
    service_account: str | None = None
    # weights source (render.weights): credential variables, volumes and mounts
    weights_env: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    # pod resources (render.workloads.pod_resources): spec.resources, and the checkpoint bytes the engine
    # downloads onto the node's disk (0 when it does not: PVC cache, pvc://, file://, s3:// / gs:// streaming)
    resources: Mapping[str, Any] | None = None
    download_bytes: float = 0.0


@dataclass(frozen=True)
class RenderedGroup:
    index: int
    service: dict[str, Any]
    pods: tuple[dict[str, Any], ...]
    compute_domain: dict[str, Any] | None = None
    explain: tuple[Explanation, ...] = ()

    @property
    def objects(self) -> list[dict[str, Any]]:
        return ([self.compute_domain] if self.compute_domain else []) + [self.service, *self.pods]


@dataclass(frozen=True)
class Rendered:
    client_service: dict[str, Any]
    groups: tuple[RenderedGroup, ...]
    plan_hash: str
    explain: tuple[Explanation, ...] = field(default=())

    @property
    def objects(self) -> list[dict[str, Any]]:
        out = [self.client_service]
        for g in self.groups:
            out += g.objects
        return out


# Bumped when the renderer changes an immutable pod field for every deployment (2: no SA token,
# seccomp/allowPrivilegeEscalation, `$$` escaping, TRT-LLM argv; issue #17): the new hash makes the
# controller replace running groups by its rolling update (one at a time, surge first) instead of
# deleting every pod whose re-apply the API server refuses as an immutable change.
# 3: restartPolicy Never, CPU/memory/ephemeral-storage requests, a maximum length always rendered (issue #15).
POD_TEMPLATE_VERSION = 3


def _deepep_signals(cmd: EngineCommand) -> list[str]:
    """What says a pod runs DeepEP: its arguments and the environment the engine module sets (TensorRT-LLM
    selects DeepEP by TRTLLM_FORCE_ALLTOALL_METHOD, not by a flag)."""
    return [*cmd.args, *(v for _, v in cmd.env)]


def plan_hash(candidate: Candidate, serving: ServingOptions, network: NetworkOptions, pods: PodOptions,
              gpus_per_pod: int, pods_per_replica: int) -> str:
    """10 hex chars over everything that shapes the pods except their nodes."""
    # fields added after v1alpha1 shipped enter the hash only when set, so an operator upgrade does not
    # change the hash (and roll) of groups that do not use them
    added = {"load_format": None, "weights_refusal": "", "weights_env": (), "volumes": (), "volume_mounts": (),
             "num_experts": 0, "max_model_len_why": "", "speculative": None,
             "disagg": None}

    # derived from what the hash already holds (spec.model): never part of it (model_name: the EPLB rule's family)
    derived = {"model_name"}

    def _asdict(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(obj).items()
                if k not in derived and not (k in added and v == added[k])}

    doc = {
        "pod_template": POD_TEMPLATE_VERSION,
        "layout": dataclasses.asdict(candidate.layout),
        "weight_dtype": candidate.weight_dtype, "kv_dtype": candidate.kv_dtype,
        "chunk_size": candidate.chunk_size, "max_num_seqs": candidate.max_num_seqs,
        "serving": _asdict(serving),
        "network": dataclasses.asdict(network),
        "pods": _asdict(pods),
        "gpus_per_pod": gpus_per_pod, "pods_per_replica": pods_per_replica,
    }
    # the wide-EP all-to-all and batch overlap (issue 18), likewise only when set
    if getattr(candidate, "a2a_backend", ""):
        doc["a2a_backend"] = candidate.a2a_backend
    if getattr(candidate, "batch_overlap", False):
        doc["batch_overlap"] = True
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _group_topology(replica: ReplicaPlacement, topology: Topology) -> GroupTopology:
    nodes = set(replica.nodes)
    domains = [topology.domain(d) for d in replica.domains]
    mnnvl = any(
        d.nvlink and d.multi_node and len({p.node for p in replica.pods if p.domain == d.name}) > 1
        for d in domains
    )
    # RDMA: a group that reaches beyond NVLink, on domains of one network block with one RDMA resource
    crosses = len(nodes) > 1 and (not mnnvl or len(domains) > 1)
    fabric = {(d.fabric, d.rdma_resource) for d in domains}
    rdma = next(iter(fabric)) if crosses and len(fabric) == 1 and all(d.rdma_resource for d in domains) else ("", "")
    return GroupTopology(nodes=len(nodes), nvlink=all(d.nvlink for d in domains), multi_node_nvlink=mnnvl,
                         spans_domains=len(domains) > 1, rdma_fabric=rdma[0], rdma_resource=rdma[1])


# Multus attachment annotation (github.com/k8snetworkplumbingwg/multus-cni docs/how-to-use.md)
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def _rdma_pod_settings(gt: GroupTopology, topology: Topology, node: str, gpus_per_pod: int
                       ) -> tuple[dict[str, int], tuple[str, ...], dict[str, str], list[Explanation]]:
    """(extra resources, added capabilities, annotations, why) of one pod of a group that uses RDMA."""
    if not gt.rdma_resource:
        return {}, (), {}, []
    dom = topology.domain_of(node)
    info = topology.nodes[node].info
    n = rdma_request(gt.rdma_resource, dom.rdma_per_node if dom else 1, gpus_per_pod, info.gpus)
    why = [Explanation(f"resources {gt.rdma_resource}", str(n),
                       f"the group reaches beyond NVLink over {gt.rdma_fabric}: the pod requests the RDMA devices "
                       f"its nodes advertise (shared-device plugins: one share; exclusive devices: its GPUs' share)",
                       "k8s-rdma-shared-dev-plugin / aws-efa-k8s-device-plugin READMEs"),
           Explanation("securityContext.capabilities.add", "IPC_LOCK",
                       "RDMA registers (pins) GPU and host buffers (ibv_reg_mr), beyond the container's default "
                       "RLIMIT_MEMLOCK without IPC_LOCK; NVIDIA network operator's RDMA pod examples add it. Not "
                       "allowed by Pod Security baseline (docs/security.md)",
                       "NVIDIA network operator docs; Linux capabilities(7)")]
    annotations = {}
    if topology.network.multus_networks:
        annotations[MULTUS_ANNOTATION] = ",".join(topology.network.multus_networks)
        why.append(Explanation(f"annotation {MULTUS_ANNOTATION}", annotations[MULTUS_ANNOTATION],
                               "secondary RDMA networks from the chart value network.multusNetworks", "Multus docs"))
    return {gt.rdma_resource: n}, ("IPC_LOCK",), annotations, why


def _merge_env(*layers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Later layers win by name; order of first appearance kept."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for e in layer:
            out[e["name"]] = dict(e)
    return list(out.values())


def render_group(
    owner: Owner,
    candidate: Candidate,
    replica: ReplicaPlacement,
    topology: Topology,
    serving: ServingOptions,
    network: NetworkOptions,
    pods: PodOptions,
    *,
    gpus_per_pod: int,
    plan_hash_value: str,
    gated: bool = True,
) -> RenderedGroup:
    """Objects of one placed replica group."""
    ns, name = owner.namespace, owner.name
    owner_ref = owner_reference(name, owner.uid)
    labels = base_labels(name, serving.engine)
    svc_name = group_service_name(name, replica.index)
    group_labels = {**labels, LABEL_REPLICA: str(replica.index), LABEL_PLAN_HASH: plan_hash_value}
    n_pods = len(replica.pods)
    hosts = tuple(f"{pod_name(name, replica.index, p.rank)}.{svc_name}.{ns}.svc" for p in replica.pods)

    gt = _group_topology(replica, topology)
    nccl = nccl_env(gt, network.transport, socket_ifname=network.socket_ifname, ib_hca=network.ib_hca,
                    user_env=network.env, compute_domain_available=network.compute_domains)
    cd_obj = None
    claim_template = None
    if nccl.needs_compute_domain:
        claim_template = child_name(name, f"r{replica.index}-imex")
        cd_obj = compute_domain(name=child_name(name, f"r{replica.index}-cd"), namespace=ns, owner=owner_ref,
                                labels=group_labels, nodes=gt.nodes, claim_template=claim_template)
    secret_env = []
    if pods.weights_secret:
        secret_env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": pods.weights_secret[0], "key": pods.weights_secret[1]}}})
    # MESHPLAN_* are the operator's bootstrap variables (the API refuses them in spec env; dropped
    # here too, so that no user layer can override them).
    shared_env = [e for e in _merge_env(nccl.env, secret_env, pods.weights_env, pods.env)
                  if not str(e.get("name", "")).upper().startswith("MESHPLAN_")]
    env_names = tuple(e["name"] for e in shared_env)

    image = pods.image or DEFAULT_IMAGES[serving.engine]
    if not image:   # engines without a published image (NIM images are per model; DeepSpeed-MII has none)
        from meshplan import engines as _engines

        why = getattr(_engines.get(serving.engine), "NO_IMAGE_REASON", "none pinned")
        raise RenderError(f"spec.engine.image: engine {serving.engine} has no image meshplan can pin ({why}); "
                          "set spec.engine.image")
    resources, resources_why = pod_resources(
        gpus_per_pod=gpus_per_pod, weights_bytes_per_pod=candidate.memory.weights_bytes * gpus_per_pod,
        download_bytes=pods.download_bytes, overrides=pods.resources)
    out_pods = []
    commands: list[EngineCommand] = []
    all_ports: dict[str, int] = {}
    group_why: list[Explanation] = []
    # NVSHMEM's variables (DeepEP across nodes) reach the engine's every rank: an engine that starts its ranks
    # itself (TensorRT-LLM's mpirun -x) must forward them too, so their names join the forwarded ones
    probe = engine_command(candidate, serving, PodRole(rank=0, pods=n_pods, gpus_per_pod=gpus_per_pod,
                                                       leader_host=hosts[0], peer_hosts=hosts,
                                                       env_names=env_names, deployment=name))
    nv_names, _ = nvshmem_env(gt, _deepep_signals(probe), ib_hca=network.ib_hca, user_env=network.env)
    env_names += tuple(e["name"] for e in nv_names if e["name"] not in env_names)
    for p in replica.pods:
        role = PodRole(rank=p.rank, pods=n_pods, gpus_per_pod=gpus_per_pod, leader_host=hosts[0],
                       peer_hosts=hosts, env_names=env_names, deployment=name)
        cmd = engine_command(candidate, serving, role)
        commands.append(cmd)
        nv_env, nv_why = nvshmem_env(gt, _deepep_signals(cmd), ib_hca=network.ib_hca, user_env=network.env)
        rdma_res, rdma_caps, rdma_ann, rdma_why = _rdma_pod_settings(gt, topology, p.node, gpus_per_pod)
        if p.rank == 0:
            group_why = [*nv_why, *rdma_why]
        for pn, port in cmd.ports:
            all_ports.setdefault(pn, port)
        bootstrap_env = [
            {"name": "MESHPLAN_REPLICA", "value": str(replica.index)},
            {"name": "MESHPLAN_NODE_RANK", "value": str(p.rank)},
            {"name": "MESHPLAN_NNODES", "value": str(n_pods)},
            {"name": "MESHPLAN_LEADER_ADDRESS", "value": hosts[0]},
        ]
        # On the pod: why each NCCL variable is set, and every warning; engine flags explain
        # themselves in args (the full list is Rendered.explain, printed by `meshplan render --explain`).
        explain_lines = [e.line() for e in (*nccl.explain, *nv_why, *rdma_why,
                                            *(e for e in cmd.explain if e.level == "warning"))]
        domain = topology.domain(p.domain)
        node = topology.nodes[p.node].info
        pod = engine_pod(
            name=pod_name(name, replica.index, p.rank),
            namespace=ns,
            owner=owner_ref,
            labels={**group_labels, LABEL_ROLE: "leader" if p.rank == 0 else "worker",
                    LABEL_RANK: str(p.rank), LABEL_STAGE: str(p.stage)},
            annotations={ASSIGNED_NODE_ANNOTATION: p.node, ANNOTATION_DOMAIN: p.domain,
                         ANNOTATION_EXPLAIN: "\n".join(explain_lines), **rdma_ann, **dict(cmd.annotations)},
            subdomain=svc_name,
            image=image,
            command=cmd.command,
            args=cmd.args,
            env=_merge_env(bootstrap_env, nv_env, [{"name": k, "value": v} for k, v in cmd.env]
                          + [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": f}}} for k, f in cmd.env_fields],
                          shared_env),
            ports=cmd.ports,
            gpus=gpus_per_pod,
            serves_http=cmd.serves_http,
            health_path=cmd.health_path,
            live_path=cmd.live_path or cmd.health_path,
            affinity=node_affinity(domain.match_labels, domain.product, node.hostname, domain.product_label),
            tolerations=pods.tolerations,
            node_selector=dict(pods.node_selector),
            gated=gated,
            compute_domain_claim_template=claim_template,
            service_account=pods.service_account,
            gpu_resource=node.resource,
            volumes=(*pods.volumes, *cmd.volumes),
            volume_mounts=(*pods.volume_mounts, *cmd.volume_mounts),
            extra_resources=rdma_res,
            capabilities_add=rdma_caps,
            resources=resources,
        )
        out_pods.append(pod)
    svc = headless_service(name=svc_name, namespace=ns, owner=owner_ref, labels=group_labels,
                           selector={"meshplan.dev/deployment": name, LABEL_REPLICA: str(replica.index)},
                           ports=sorted(all_ports.items(), key=lambda x: x[1]))
    tp = candidate.layout.tp
    if tp > 1 and any(tp > d.total_gpus for d in (topology.domain(n) for n in replica.domains)):
        # only a pinned spec.parallelism.tensor gets here (the planner never proposes it): rendered, warned
        group_why.append(Explanation("spec.parallelism.tensor", str(tp),
                                     f"TP{tp} crosses NVLink domains ({', '.join(replica.domains)}): its all-reduces "
                                     f"run over {gt.rdma_fabric or 'the network'}, much slower than NVLink",
                                     "meshplan.topology tiers", "warning"))
    res_explain = tuple(Explanation(f"resources {k}", v, why, "meshplan.render.workloads.pod_resources")
                        for k, v, why in resources_why)
    explain = tuple(dict.fromkeys((*nccl.explain, *group_why, *commands[0].explain, *res_explain)))
    return RenderedGroup(replica.index, svc, tuple(out_pods), cd_obj, explain)


def render_deployment(
    owner: Owner,
    candidate: Candidate,
    placement: PlacementResult,
    topology: Topology,
    serving: ServingOptions,
    network: NetworkOptions = NetworkOptions(),
    pods: PodOptions = PodOptions(),
    *,
    gated: bool = True,
) -> Rendered:
    """All children of one LLMDeployment for the placed replicas (see module doc)."""
    if serving.engine != candidate.engine:
        serving = dataclasses.replace(serving, engine=candidate.engine)
    req = placement.request
    h = plan_hash(candidate, serving, network, pods, req.gpus_per_pod, req.pods_per_replica)
    labels = base_labels(owner.name, serving.engine)
    client = client_service(name=child_name(owner.name), namespace=owner.namespace,
                            owner=owner_reference(owner.name, owner.uid), labels=labels,
                            selector={"meshplan.dev/deployment": owner.name, LABEL_ROLE: "leader"},
                            port=serving.port)
    groups = tuple(
        render_group(owner, candidate, r, topology, serving, network, pods, gpus_per_pod=req.gpus_per_pod,
                     plan_hash_value=h, gated=gated)
        for r in placement.placed
    )
    explain = tuple(dict.fromkeys(e for g in groups for e in g.explain))
    if serving.max_model_len:
        # every engine module renders it (vLLM --max-model-len, SGLang --context-length, trtllm-serve --max_seq_len)
        explain += (Explanation("max sequence length", str(serving.max_model_len),
                                "longest prompt + output each engine admits, from "
                                + (serving.max_model_len_why or "spec"),
                                "meshplan.render.options.planned_context"),)
    return Rendered(client, groups, h, explain)


__all__ = [
    "NetworkOptions", "Owner", "PodOptions", "RenderError", "Rendered", "RenderedGroup", "ServingOptions",
    "plan_hash", "render_deployment", "render_group",
]
