"""Kubernetes objects of one LLMDeployment: replica-group Pods, Services, ComputeDomains.

Pure builders returning plain dicts. `meshplan.render.render_deployment` wires
them together; the controller applies them with server-side apply.

Why bare Pods, not a StatefulSet per group
- Each pod is pinned to the node placement chose (stage by stage, possibly in
  different NVLink domains); a StatefulSet has one pod template, so per-ordinal
  affinity is impossible.
- Gang start: every pod is created with the scheduling gate `meshplan.dev/gang`
  and the controller removes the gates only when the whole group exists
  (all-or-nothing); a StatefulSet creates pods one ordinal at a time and would
  need patching of pods it owns anyway.
- Recovery is the operator's job in either case (a group with a dead leader must
  restart as a group), so a StatefulSet would add a second controller to fight.
Scheduling gates can only be removed after creation (KEP-3521): the controller
must create pods with `gated=True` and never re-apply the gate to a released
pod (render with `gated=False` for the apply of running groups).

Names: `<name>` is the client Service, `<name>-r<i>` the group's headless Service,
`<name>-r<i>-<rank>` its pods (hostname = pod name, subdomain = headless
Service, so `<pod>.<name>-r<i>.<ns>.svc` resolves before the pods are ready:
`publishNotReadyAddresses`). Names are cut to 63 characters with a hash suffix.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from meshplan.topology import ASSIGNED_NODE_ANNOTATION, GPU_RESOURCE, LABEL_PRODUCT

API_VERSION = "meshplan.dev/v1alpha1"
KIND = "LLMDeployment"
GANG_GATE = "meshplan.dev/gang"
LABEL_DEPLOYMENT = "meshplan.dev/deployment"
LABEL_REPLICA = "meshplan.dev/replica"
LABEL_ROLE = "meshplan.dev/role"
LABEL_RANK = "meshplan.dev/rank"
LABEL_STAGE = "meshplan.dev/stage"
LABEL_PLAN_HASH = "meshplan.dev/plan-hash"
ANNOTATION_DOMAIN = "meshplan.dev/nvlink-domain"
ANNOTATION_EXPLAIN = "meshplan.dev/explain"
IMEX_CLAIM = "imex-channel"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"   # NVIDIA DRA driver for GPUs

# Probes on the leader's GET /health. Loading a large model takes minutes: the
# startup probe allows 10 s x 180 = 30 min before liveness takes over.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180
READINESS_PERIOD_S, LIVENESS_PERIOD_S, PROBE_TIMEOUT_S = 10, 20, 5


def child_name(base: str, suffix: str = "", max_len: int = 63) -> str:
    """`base-suffix` as a DNS label (starts with a letter, <= 63 chars, hash-cut when long)."""
    name = f"{base}-{suffix}" if suffix else base
    if not name[:1].isalpha():
        name = f"m{name}"
    if len(name) <= max_len:
        return name
    h = hashlib.sha256(name.encode()).hexdigest()[:6]
    keep = max_len - len(suffix) - len(h) - 2
    return f"{name[:keep].rstrip('-')}-{h}-{suffix}" if suffix else f"{name[:max_len - 7].rstrip('-')}-{h}"


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def base_labels(name: str, engine: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": engine,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": "meshplan",
        LABEL_DEPLOYMENT: name,
    }


def group_service_name(name: str, replica: int) -> str:
    return child_name(name, f"r{replica}")


def pod_name(name: str, replica: int, rank: int) -> str:
    return child_name(name, f"r{replica}-{rank}")


def node_affinity(match_labels: Sequence[tuple[str, str]], product: str, node_hostname: str | None,
                  product_label: str = LABEL_PRODUCT) -> dict:
    """Required: the NVLink domain's labels and the planned product (under the label that carries it:
    `nvidia.com/gpu.product`, or AMD's `amd.com/gpu.product-name`); preferred: the planned node."""
    exprs = [{"key": k, "operator": "In", "values": [v]} for k, v in match_labels]
    if product_label and not any(k == product_label for k, _ in match_labels):
        exprs.append({"key": product_label, "operator": "In", "values": [product]})
    aff: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": exprs}]}}
    if node_hostname and not any(k == "kubernetes.io/hostname" for k, _ in match_labels):
        aff["preferredDuringSchedulingIgnoredDuringExecution"] = [{
            "weight": 100,
            "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_hostname]}]},
        }]
    return {"nodeAffinity": aff}


def escape_kubelet_refs(value: str) -> str:
    """`$` -> `$$`: the kubelet expands `$(VAR)` in a container's command and args with the
    container's environment (Kubernetes docs, "Define a command and arguments for a container":
    `$$(VAR)` stays literal, and `$$` becomes `$`), so a user value such as `$(HF_TOKEN)` in extraArgs
    would otherwise put a Secret's value on the command line. Escaping every `$` gives the process
    exactly the strings meshplan rendered."""
    return value.replace("$", "$$")


GIB = 1024 ** 3
# Pod resources (requests; memory also a limit) sized from the plan, per engine container:
# - CPU: 2 + 1 per GPU. vLLM runs one API-server process (HTTP, tokenization, detokenization), one
#   engine-core process (scheduler) and one worker process per GPU, each keeping a core busy
#   (docs.vllm.ai design/arch_overview, "Multi-process architecture"); SGLang (tokenizer manager,
#   scheduler per GPU, detokenizer) and TensorRT-LLM (one MPI rank per GPU + the OpenAI server) have the
#   same shape. A request, no CPU limit: a throttled scheduler stalls every GPU of the group.
CPU_BASE, CPU_PER_GPU = 2, 1
# - Memory: the weights per pod (safetensors are mmapped and copied shard by shard to the GPUs; the page
#   cache they fill is charged to the pod's memory cgroup), + 4 GiB per GPU (each worker process: torch,
#   CUDA host runtime and pinned staging buffers) + 4 GiB (API server, tokenizer, NCCL's /dev/shm segments,
#   which are memory-backed and counted against the pod). Limit = request + weights per pod: room for a
#   loader that copies a shard into anonymous memory while its pages are still cached; the limit keeps a
#   runaway engine from evicting its neighbours (memory is not compressible).
MEM_BASE_GIB, MEM_PER_GPU_GIB = 4, 4
# - Ephemeral storage: 10 GiB for logs and the JIT caches the engines write under /root/.cache (Triton,
#   torch.compile/inductor, FlashInfer, DeepGEMM), + the whole checkpoint when the engine downloads it onto
#   the node's disk (hf:// into the container or an emptyDir model cache; not with a PVC cache, pvc://,
#   file://, or the streamer's s3:// / gs://, which never touches disk).
EPHEMERAL_BASE_GIB = 10


def _gib(n_bytes: float) -> int:
    return max(0, -(-int(n_bytes) // GIB))


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity_bytes(q: str) -> float:
    """A Kubernetes memory/storage quantity (`256Gi`, `1.5T`, `1000`) in bytes."""
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suf):
            return float(q[: -len(suf)]) * _SUFFIX[suf]
    return float(q)


def pod_resources(*, gpus_per_pod: int, weights_bytes_per_pod: float, download_bytes: float = 0.0,
                  overrides: Mapping[str, Any] | None = None,
                  ) -> tuple[dict[str, dict[str, str]], list[tuple[str, str, str]]]:
    """Requests and limits (without the GPUs) of one engine container, and why each default has its value.

    `weights_bytes_per_pod`: the plan's weights on this pod's GPUs (MemoryFit.weights_bytes x GPUs per pod);
    `download_bytes`: the checkpoint the engine downloads onto the node's disk (0 when it does not);
    `overrides`: spec.resources (`{"requests": {...}, "limits": {...}}`), replacing defaults key by key.
    QoS is Burstable (requests below the unlimited CPU); never BestEffort."""
    w_gib = _gib(weights_bytes_per_pod)
    cpu = CPU_BASE + CPU_PER_GPU * gpus_per_pod
    mem = w_gib + MEM_PER_GPU_GIB * gpus_per_pod + MEM_BASE_GIB
    eph = EPHEMERAL_BASE_GIB + _gib(download_bytes)
    requests = {"cpu": str(cpu), "memory": f"{mem}Gi", "ephemeral-storage": f"{eph}Gi"}
    limits = {"memory": f"{mem + w_gib}Gi"}
    why = [
        ("cpu", str(cpu), f"{CPU_BASE} (API server, scheduler) + {CPU_PER_GPU} per GPU x {gpus_per_pod} (one "
         "worker process each); no CPU limit"),
        ("memory", f"{mem}Gi", f"weights on this pod {w_gib} GiB (host staging while loading) + "
         f"{MEM_PER_GPU_GIB} GiB per GPU x {gpus_per_pod} (worker processes) + {MEM_BASE_GIB} GiB (server, "
         f"tokenizer, /dev/shm); limit {mem + w_gib}Gi (+ the weights once more)"),
        ("ephemeral-storage", f"{eph}Gi", f"{EPHEMERAL_BASE_GIB} GiB logs and JIT caches"
         + (f" + the {_gib(download_bytes)} GiB checkpoint the engine downloads" if download_bytes else "")),
    ]
    o = overrides or {}
    for k, v in (o.get("requests") or {}).items():
        requests[k] = str(v)
        why.append((k, str(v), "request from spec.resources.requests"))
    for k, v in (o.get("limits") or {}).items():
        limits[k] = str(v)
        why.append((k, str(v), "limit from spec.resources.limits"))
    for k in ("memory", "ephemeral-storage"):
        if k in limits and k in requests and quantity_bytes(limits[k]) < quantity_bytes(requests[k]):
            requests[k] = limits[k]
            why.append((k, limits[k], "request lowered to the limit (the API server refuses a request above it)"))
    if "cpu" in limits and "cpu" in requests:
        def _cores(q: str) -> float:
            return float(q[:-1]) / 1000 if q.endswith("m") else float(q)
        if _cores(limits["cpu"]) < _cores(requests["cpu"]):
            requests["cpu"] = limits["cpu"]
            why.append(("cpu", limits["cpu"], "request lowered to the limit"))
    return {"requests": requests, "limits": limits}, why


def _probe(port_name: str, period: int, failures: int, path: str = "/health") -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port_name}, "periodSeconds": period,
            "timeoutSeconds": PROBE_TIMEOUT_S, "failureThreshold": failures}


def engine_pod(
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    subdomain: str,
    image: str,
    command: Sequence[str],
    args: Sequence[str],
    env: Sequence[Mapping[str, Any]],
    ports: Sequence[tuple[str, int]],
    gpus: int,
    serves_http: bool,
    affinity: Mapping[str, Any],
    tolerations: Sequence[Mapping[str, Any]],
    node_selector: Mapping[str, str] | None = None,
    gated: bool = True,
    compute_domain_claim_template: str | None = None,
    service_account: str | None = None,
    gpu_resource: str = GPU_RESOURCE,
    volumes: Sequence[Mapping[str, Any]] = (),
    volume_mounts: Sequence[Mapping[str, Any]] = (),
    extra_resources: Mapping[str, int] | None = None,
    capabilities_add: Sequence[str] = (),
    health_path: str = "/health",
    live_path: str = "/health",
    resources: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "command": [escape_kubelet_refs(c) for c in command],
        "args": [escape_kubelet_refs(a) for a in args],
        "env": [dict(e) for e in env],
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        # the node's device plugin resource, and CPU/memory/ephemeral storage (pod_resources)
        "resources": {**({"requests": dict((resources or {}).get("requests") or {})}
                         if (resources or {}).get("requests") else {}),
                      "limits": {**dict((resources or {}).get("limits") or {}), gpu_resource: str(gpus)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *(dict(m) for m in volume_mounts)],
        # Pod Security Standard `baseline` holds (no privileged, host namespaces, hostPath, host ports
        # or added capabilities); these two restricted-profile controls hold for every engine too.
        # Not runAsNonRoot / capabilities drop ALL: the stock engine images run as root (vLLM and
        # SGLang write their caches under /root; TensorRT-LLM workers run sshd, which needs its
        # capabilities, and the leader runs `mpirun --allow-run-as-root`): docs/security.md.
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if not command:       # the image's entrypoint starts the engine (NVIDIA NIM: configured by env)
        del container["command"]
    if not args:
        del container["args"]
    if serves_http:
        container["startupProbe"] = _probe("http", STARTUP_PERIOD_S, STARTUP_FAILURES, health_path)
        container["readinessProbe"] = _probe("http", READINESS_PERIOD_S, 3, health_path)
        container["livenessProbe"] = _probe("http", LIVENESS_PERIOD_S, 3, live_path)
    spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": subdomain,
        # Never: an engine that crashes (or fails liveness) leaves its pod Failed, and the controller
        # recreates the whole replica group (controller.decide rule 2), as LWS's RecreateGroupOnPodRestart
        # does; restarted in place it could not rejoin its peers' NCCL groups (docs/reliability.md).
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # Engines never call the Kubernetes API: no ServiceAccount token in the pod (issue #17).
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 60,
        "affinity": dict(affinity),
        "tolerations": [dict(t) for t in tolerations],
        "containers": [container],
        # NCCL and the engines' worker processes exchange tensors through /dev/shm;
        # the container runtime's default is 64 MiB. Memory-backed, counted against
        # the pod's memory.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *(dict(v) for v in volumes)],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if service_account:
        spec["serviceAccountName"] = service_account
    if extra_resources:
        # e.g. the RDMA resource of a multi-node group (render.nccl.rdma_request): extended resources are
        # limits only (their request defaults to the limit), as for the GPUs
        container["resources"]["limits"].update({k: str(v) for k, v in extra_resources.items()})
    if capabilities_add:
        container["securityContext"]["capabilities"] = {"add": list(capabilities_add)}
    if gated:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    if compute_domain_claim_template:
        spec["resourceClaims"] = [{"name": IMEX_CLAIM, "resourceClaimTemplateName": compute_domain_claim_template}]
        container["resources"]["claims"] = [{"name": IMEX_CLAIM}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                     "annotations": dict(annotations), "ownerReferences": [dict(owner)]},
        "spec": spec,
    }


def headless_service(*, name: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
                     selector: Mapping[str, str], ports: Sequence[tuple[str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,     # workers resolve the leader before it is ready
            "selector": dict(selector),
            "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports],
        },
    }


def client_service(*, name: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
                   selector: Mapping[str, str], port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def compute_domain(*, name: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
                   nodes: int, claim_template: str) -> dict[str, Any]:
    """NVIDIA DRA driver ComputeDomain (resource.nvidia.com/v1beta1) for one MNNVL group.

    `numNodes` is the group's node count: required by driver releases before the
    IMEXDaemonsWithDNSNames gate, deprecated (ignored) after it.
    """
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]},
        "spec": {"numNodes": nodes, "channel": {"resourceClaimTemplate": {"name": claim_template}}},
    }


__all__ = [
    "ANNOTATION_DOMAIN", "ANNOTATION_EXPLAIN", "ASSIGNED_NODE_ANNOTATION", "GANG_GATE", "LABEL_DEPLOYMENT",
    "LABEL_PLAN_HASH", "LABEL_RANK", "LABEL_REPLICA", "LABEL_ROLE", "LABEL_STAGE", "base_labels", "child_name",
    "client_service", "compute_domain", "engine_pod", "group_service_name", "headless_service", "node_affinity",
    "owner_reference", "pod_name", "pod_resources", "quantity_bytes",
]
