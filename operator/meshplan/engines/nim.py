"""NVIDIA NIM for LLMs: how it is told a layout (environment), what it refuses, and the pod's container.

Version: NIM for LLMs 1.8.0 (the LLM-specific containers `nvcr.io/nim/<org>/<model>:1.8.0`). NIM is
configured through environment variables, not a command line; the image's own entrypoint starts the
server (vLLM or TensorRT-LLM backend, chosen by the model profile). Every name here with its source:

- Model profiles (docs.nvidia.com/nim/large-language-models/1.8.0 "Configure Your NIM" and
  "Model Profiles"): each profile is a pre-validated configuration whose tags are the backend
  (`tensorrt_llm`, `vllm`), precision (bf16, fp8), `tp<N>`, `pp<M>` and feat_lora, e.g.
  `tensorrt_llm-trtllm_buildable-bf16-tp8-pp2` ("you will need TP * PP GPUs"); `NIM_MODEL_PROFILE`
  selects one by id or name, otherwise NIM picks one compatible with the GPUs it sees.
- `NIM_TENSOR_PARALLEL_SIZE`, `NIM_PIPELINE_PARALLEL_SIZE`: the TP/PP degree (NVIDIA/k8s-nim-operator
  api/apps/v1alpha1 NIMService multi-node env; NIM docs "Configure Your NIM": "profiles that only use
  1 GPU (for example NIM_TENSOR_PARALLEL_SIZE=1)").
- `NIM_MAX_MODEL_LEN` (context length), `NIM_SERVED_MODEL_NAME` (the model name of the API),
  `NIM_MODEL_NAME` (a local model directory for the multi-LLM NIM), `NIM_ENABLE_KV_CACHE_REUSE=1`
  (prefix caching: "KV Cache Reuse with NVIDIA NIM for LLMs"), `NIM_CACHE_PATH` (default
  /opt/nim/.cache), `NIM_SERVER_PORT` (HTTP port, default 8000), `NGC_API_KEY` (NGC credentials the
  container downloads its profile's weights with; from a Secret in spec.engine.env) — NIM docs
  "Configure Your NIM" and NVIDIA/nim-deploy helm/nim-llm templates, NVIDIA/k8s-nim-operator
  NIMService.GetStandardEnv.
- Health: GET `/v1/health/ready` (readiness/startup) and `/v1/health/live` (NIM docs multi-node
  note; NIM Operator default probes). Metrics: `/v1/metrics` with `time_to_first_token_seconds`,
  `time_per_output_token_seconds`, `e2e_request_latency_seconds`, `num_requests_running`,
  `num_requests_waiting`, `gpu_cache_usage_perc` (NIM docs "Observability").
- Multi-node, NIM 1.x (NIM docs 1.8.0 "Multi-Node Deployment",
  docs.nvidia.com/nim/large-language-models/1.8.0/multi-node-deployment.html: on Kubernetes, LeaderWorkerSet
  is the recommended method, readiness is the leader's /v1/health/ready; NIM Operator docs 3.1.1
  "Multi-Node NIM Deployment": NIM versions before 2.0 use `spec.multiNode.mpi`, 2.0+ `spec.multiNode.ray`).
  What the NIM Operator renders for `mpi` (NVIDIA/k8s-nim-operator api/apps/v1alpha1/nimservice_types.go,
  commit f63f74d: getLWSCommonEnv, GetLWSLeaderEnv, GetLWSWorkerEnv, Get{Leader,Worker}VolumeMounts,
  generateMPIConfigData, GetMPISSHSecretParams) and meshplan renders the same way on its own pods: no
  command or args on leader or workers (the image's entrypoint reads the role from the environment);
  every pod `NIM_MULTI_NODE=1`, `NIM_NUM_COMPUTE_NODES` = the pods of the group (= pipeline size: one
  stage per node), `NIM_TENSOR_PARALLEL_SIZE`, `NIM_PIPELINE_PARALLEL_SIZE`, `NIM_NODE_RANK` (LWS worker
  index: 0 = leader), `NIM_MPI_ALLOW_RUN_AS_ROOT=0`; the leader `NIM_LEADER_ROLE=1`,
  `OMPI_MCA_orte_keep_fqdn_hostnames=true`, `OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=20`,
  `GPUS_PER_NODE` (= TP), `CLUSTER_START_TIMEOUT` (300 s, DefaultMPITimeout), `CLUSTER_SIZE` (LWS size),
  `GROUP_INDEX` (selects `/etc/mpi/hostfile-<GROUP_INDEX>`); workers `NIM_LEADER_ROLE=0`, `LEADER_NAME`,
  `NAMESPACE`, `LWS_NAME` (the leader's address is `<LEADER_NAME>.<LWS_NAME>.<NAMESPACE>`, LWS's headless
  Service naming). Files: the leader's hostfile at /etc/mpi/hostfile-<i> (`localhost slots=<TP>` then one
  `<pod>.<service>.<ns>.svc slots=<TP>` line per worker), the ssh private key at
  /opt/nim/llm/pk/private.key (a Secret, mode 0400), an empty /opt/nim/llm/.ssh (the entrypoint writes the
  authorized key and ssh config there) and, on workers, an empty /ssh-confs (sshd's config and host key);
  workers' sshd listens on 2222 and the leader waits for it before `mpirun` (nim-deploy helm/nim-llm 1.1.2
  multi_node_deployment.yaml, commit 21b70b5). meshplan's pods are not LWS pods, so the values the NIM
  Operator takes from LWS labels/annotations are written as literals, the hostfile comes from a pod
  annotation through the downward API (no ConfigMap), and the Secret holds an Ed25519 key in OpenSSH's own
  format (`meshplan.engines.trtllm_ssh.client_key_files`; the NIM Operator writes an RSA PEM: both are read
  by `ssh-keygen -y` and ssh). Layouts: TP inside one pod, one pipeline stage per pod (what GPUS_PER_NODE =
  TP and NIM_NUM_COMPUTE_NODES = PP express); a tensor-parallel group split over pods is refused
  (check_pods). The profile the leader selects must carry the same tp/pp tags (pin NIM_MODEL_PROFILE);
  NIM 2.x images (Ray: `nim-serve-ray --head`) and the Slurm recipes' variables (NIM_LEADER_IP_ADDRESS,
  MASTER_ADDR) are not rendered.

Not expressible, so refused: expert parallelism / attention DP (profiles carry tp and pp only), FP8
KV cache and weight precisions (NIM's profile fixes its precision; no environment variable picks
one). The batch limit and step token budget have no NIM variable: the profile's defaults run.

The planner prices NIM as vLLM (`PRICED_AS`): NIM's backends are vLLM and TensorRT-LLM; the
multi-LLM/generic profiles run vLLM, and meshplan cannot know which profile an image will pick.
"""

from __future__ import annotations

from typing import Any

from meshplan.engines.base import (
    SIXTEEN_BIT,
    sixteen_bit_only,
    EngineCommand,
    EngineLayout,
    Explanation,
    PodRole,
    RenderError,
    ServingOptions,
)
from meshplan.planner.types import Candidate, Layout

NAME = "nim"
TITLE = "NVIDIA NIM for LLMs"
VERSION = "1.8.0"
DEFAULT_IMAGE = ""           # NIM images are per model (nvcr.io/nim/<org>/<model>:<version>)
NO_IMAGE_REASON = ("NIM containers are per model, e.g. nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.0: name the "
                   "NIM of spec.model")
PRICED_AS = "vllm"
PRICED_AS_REASON = ("NIM is priced as vLLM (its generic/multi-LLM profiles run the vLLM backend; an LLM-specific "
                    "NIM may pick a TensorRT-LLM profile, which meshplan cannot know in advance)")
SUPPORTED_WEIGHT_DTYPES = SUPPORTED_KV_DTYPES = SIXTEEN_BIT
HEALTH_READY_PATH = "/v1/health/ready"
HEALTH_LIVE_PATH = "/v1/health/live"
METRICS_PATH = "/v1/metrics"
CACHE_PATH = "/opt/nim/.cache"
_DOCS = "docs.nvidia.com/nim/large-language-models/1.8.0 (Configure Your NIM)"

# The environment variables this module may set, each with its source (tests/conformance/test_nim.py checks
# the rendered pods against this list: NIM has no package whose registry could be read).
DOCUMENTED_ENV: dict[str, str] = {
    "NIM_TENSOR_PARALLEL_SIZE": "NIM docs Configure Your NIM; NVIDIA/k8s-nim-operator NIMService LWS env",
    "NIM_PIPELINE_PARALLEL_SIZE": "NVIDIA/k8s-nim-operator NIMService LWS env (ParallelismSpec.Pipeline)",
    "NIM_MAX_MODEL_LEN": "NIM docs Configure Your NIM (context length)",
    "NIM_SERVED_MODEL_NAME": "NIM docs Configure Your NIM (model name of the API)",
    "NIM_MODEL_NAME": "NIM docs Configure Your NIM (multi-LLM NIM: model path)",
    "NIM_MODEL_PROFILE": "NIM docs Model Profiles (profile id or name)",
    "NIM_ENABLE_KV_CACHE_REUSE": "NIM docs KV Cache Reuse with NVIDIA NIM for LLMs",
    "NIM_CACHE_PATH": "NIM docs Configure Your NIM; NVIDIA/nim-deploy helm/nim-llm",
    "NIM_SERVER_PORT": "NIM docs environment variables; NVIDIA/k8s-nim-operator NIMService.GetStandardEnv",
    "NGC_API_KEY": "NIM docs Configure Your NIM (NGC credentials, from a Secret)",
}
_OP = "NVIDIA/k8s-nim-operator api/apps/v1alpha1/nimservice_types.go@f63f74d (spec.multiNode.mpi, NIM 1.x)"
_CHART = "NVIDIA/nim-deploy helm/nim-llm 1.1.2 templates/multi_node_deployment.yaml@21b70b5"
# Multi-node (MPI) variables, all pods / the leader / the workers: what the NIM Operator sets for NIM 1.x.
MULTI_NODE_ENV: dict[str, str] = {
    "NIM_MULTI_NODE": f"{_OP} getLWSCommonEnv",
    "NIM_NUM_COMPUTE_NODES": f"{_OP} getLWSCommonEnv (= pipeline parallelism); {_CHART}",
    "NIM_NODE_RANK": f"{_OP} getLWSCommonEnv (LWS worker-index)",
    "NIM_MPI_ALLOW_RUN_AS_ROOT": f"{_OP} getLWSCommonEnv",
    "NIM_LEADER_ROLE": f"{_OP} GetLWSLeaderEnv / GetLWSWorkerEnv (1 / 0)",
    "OMPI_MCA_orte_keep_fqdn_hostnames": f"{_OP} GetLWSLeaderEnv; {_CHART} (Open MPI MCA parameter)",
    "OMPI_MCA_plm_rsh_args": f"{_OP} GetLWSLeaderEnv; {_CHART} (Open MPI MCA parameter)",
    "GPUS_PER_NODE": f"{_OP} GetLWSLeaderEnv (= tensor parallelism)",
    "CLUSTER_START_TIMEOUT": f"{_OP} GetLWSLeaderEnv (DefaultMPITimeout 300); {_CHART}",
    "CLUSTER_SIZE": f"{_OP} GetLWSLeaderEnv (LWS size annotation); {_CHART}",
    "GROUP_INDEX": f"{_OP} GetLWSLeaderEnv (LWS group-index: picks /etc/mpi/hostfile-<i>); {_CHART}",
    "LEADER_NAME": f"{_OP} GetLWSWorkerEnv (LWS leader-name annotation)",
    "NAMESPACE": f"{_OP} GetLWSWorkerEnv (metadata.namespace)",
    "LWS_NAME": f"{_OP} GetLWSWorkerEnv (LWS name label = its headless Service)",
}
DOCUMENTED_ENV.update(MULTI_NODE_ENV)

# Multi-node files (NIM Operator Get{Leader,Worker}VolumeMounts, GetMPISSHSecretParams; chart 1.1.2).
MPI_HOSTFILE_DIR = "/etc/mpi"
MPI_GROUP_INDEX = 0                                   # meshplan mounts each leader only its own group's hostfile
MPI_HOSTFILE_ANNOTATION = "meshplan.dev/nim-mpi-hostfile"
MPI_START_TIMEOUT_S = 300                             # NIM Operator DefaultMPITimeout
SSH_KEY_DIR = "/opt/nim/llm/pk"
SSH_KEY_FILE = "private.key"
SSH_DOTFILES_DIR = "/opt/nim/llm/.ssh"
SSHD_CONF_DIR = "/ssh-confs"
SSH_PORT = 2222                                       # workers' sshd (chart 1.1.2: the leader waits for :2222)
SSH_VOLUME = "nim-ssh-pk"
SSH_FILE_MODE = 0o400                                 # the NIM Operator's defaultMode 256


def ssh_secret_name(deployment: str) -> str:
    """The Secret holding one deployment's NIM MPI ssh key (created and owned by the controller)."""
    from meshplan.render.workloads import child_name

    return child_name(deployment, "nim-ssh")


def ssh_secret(deployment: str, namespace: str, owner: Any, labels: Any, seed: bytes | None = None) -> dict:
    """The Secret manifest: one fresh Ed25519 key pair, the private key as `private.key`."""
    from meshplan.engines.trtllm_ssh import client_key_files, owned_secret

    files = client_key_files(f"meshplan-{deployment}-nim-mpirun", private_name=SSH_KEY_FILE, seed=seed)
    return owned_secret(ssh_secret_name(deployment), namespace, owner, labels, files)


def mpi_hostfile(role: PodRole) -> str:
    """The leader's hostfile as the NIM Operator writes it: itself as localhost, then every worker pod."""
    lines = [f"localhost slots={role.gpus_per_pod}"]
    lines += [f"{h} slots={role.gpus_per_pod}" for h in role.peer_hosts[1:]]
    return "\n".join(lines) + "\n"


def check_layout(layout: Layout, model: Any = None, *, a2a_backend: str | None = None) -> str | None:
    if layout.ep > 1:
        return (f"{TITLE} {VERSION} selects parallelism by model profile, whose tags are tp and pp only: expert "
                f"parallelism ep={layout.ep} cannot be expressed; pin spec.parallelism.expert 1 or use vllm/sglang")
    heads = getattr(model, "num_attention_heads", 0) or 0
    if heads and heads % layout.tp:
        return (f"{TITLE} (vLLM/TensorRT-LLM backends) needs the {heads} attention heads to divide by the tensor "
                f"parallel size {layout.tp}; choose tp from the divisors of {heads}")
    return None


def check_pods(layout: Layout, pods: int, gpus_per_pod: int) -> str | None:
    if pods > 1 and (pods != layout.pp or gpus_per_pod != layout.tp * layout.ep):
        return (f"{TITLE} {VERSION} runs a replica on several pods with one pipeline stage per pod: its MPI "
                "launcher gives every pod GPUS_PER_NODE = the tensor-parallel size and NIM_NUM_COMPUTE_NODES = the "
                "pipeline size (NVIDIA/k8s-nim-operator spec.multiNode.mpi; NIM docs Multi-Node Deployment), so a "
                f"tensor-parallel group cannot span pods: {layout.label()} puts TP{layout.tp} on {pods} pods of "
                f"{gpus_per_pod} GPUs; choose a tensor-parallel size that fits one node and pipeline = the nodes "
                "(e.g. TP8 x PP2 on two 8-GPU nodes), or use vllm/sglang")
    return None


def check_knobs(chunk_size: int | None, max_num_seqs: int | None) -> str | None:
    return None      # no NIM variable sets them: explained as not rendered


def check_precision(model: Any, gpu: Any, weight_dtype: str, kv_dtype: str) -> str | None:
    return sixteen_bit_only(TITLE, model, weight_dtype, kv_dtype)


def layout(layout: Layout, *, chunk_size: int | None = None, max_num_seqs: int | None = None,
           memory_fraction: float | None = None, kv_dtype: str | None = None,
           a2a_backend: str | None = None) -> EngineLayout:
    if layout.ep > 1:
        raise ValueError(check_layout(layout))
    notes: list[str] = []
    if chunk_size or max_num_seqs:
        notes.append("NIM has no variable for the step token budget or the batch limit: the selected profile's "
                     f"defaults run, not the planned chunk {chunk_size} / batch {max_num_seqs}")
    # NIM is configured by environment: the layout's "flags" are variables (EngineLayout.config), no argv.
    config = {"NIM_TENSOR_PARALLEL_SIZE": layout.tp, "NIM_PIPELINE_PARALLEL_SIZE": layout.pp}
    return EngineLayout(engine=NAME, flags={}, config=config, attention_tp=layout.tp, moe_tp=layout.tp,
                        pp=layout.pp, exact=True, notes=tuple(notes))


def command(candidate: Candidate, serving: ServingOptions, role: PodRole, el: EngineLayout,
            explain: list[Explanation]) -> EngineCommand:
    if candidate.weight_dtype not in SUPPORTED_WEIGHT_DTYPES and candidate.weight_dtype != serving.checkpoint_dtype:
        raise RenderError(f"spec.precision.weights {candidate.weight_dtype}: {TITLE} {VERSION} takes its precision "
                          "from the model profile and has no variable that sets it; pin spec.precision.weights bf16 "
                          "(or the checkpoint's dtype)")
    if candidate.kv_dtype not in SUPPORTED_KV_DTYPES:
        raise RenderError(f"spec.precision.kvCache {candidate.kv_dtype}: {TITLE} {VERSION} has no variable for the "
                          "KV-cache dtype; pin spec.precision.kvCache bf16")
    if serving.extra_args:
        raise RenderError(f"spec.engine.extraArgs: {TITLE} is configured by environment variables, not a command "
                          "line; set them in spec.engine.env")
    env: dict[str, str] = {k: str(v) for k, v in el.config.items()}
    for k, v in env.items():
        explain.append(Explanation(k, v, f"parallel layout {candidate.layout.label()}: the profile NIM selects must "
                                   "have these tp/pp tags (pin one with NIM_MODEL_PROFILE in spec.engine.env)",
                                   DOCUMENTED_ENV[k]))
    if serving.max_model_len:
        env["NIM_MAX_MODEL_LEN"] = str(serving.max_model_len)
    if serving.served_name:
        env["NIM_SERVED_MODEL_NAME"] = serving.served_name
    if serving.model.startswith("/"):
        env["NIM_MODEL_NAME"] = serving.model
        explain.append(Explanation("NIM_MODEL_NAME", serving.model, "a local model directory (multi-LLM NIM)",
                                   DOCUMENTED_ENV["NIM_MODEL_NAME"]))
    else:
        explain.append(Explanation("model", serving.model, "the NIM image serves its own model: spec.engine.image "
                                   "must be the NIM of this model (the plan was sized from its config.json)", _DOCS,
                                   "warning"))
    if serving.revision:
        raise RenderError(f"spec.model.weights revision {serving.revision!r}: a NIM image pins its model's weights; "
                          "remove the revision or serve a local directory (pvc://) with the multi-LLM NIM")
    env["NIM_ENABLE_KV_CACHE_REUSE"] = "1" if serving.prefix_caching else "0"
    env["NIM_CACHE_PATH"] = CACHE_PATH
    env["NIM_SERVER_PORT"] = str(serving.port)
    explain.append(Explanation("NIM_CACHE_PATH", CACHE_PATH, "NIM downloads the profile's weights here; set "
                               "NGC_API_KEY from a Secret in spec.engine.env for NGC-hosted models",
                               DOCUMENTED_ENV["NIM_CACHE_PATH"]))
    if serving.scheduling_policy == "priority":
        explain.append(Explanation("schedulingPolicy", "priority", "NIM has no variable for priority scheduling; "
                                   "requests are served first come, first served", _DOCS, "warning"))
    if serving.cuda_graphs == "disabled":
        explain.append(Explanation("cudaGraphs", "disabled", "NIM has no variable for CUDA graphs; the profile's "
                                   "backend decides", _DOCS, "warning"))
    if role.pods > 1:
        return _multi_node(candidate, serving, role, env, explain)
    # No command/args: the NIM image's entrypoint starts the server from the environment.
    return EngineCommand((), (), True, (("http", serving.port),), tuple(explain),
                         env=tuple(env.items()), health_path=HEALTH_READY_PATH, live_path=HEALTH_LIVE_PATH)


def _multi_node(candidate: Candidate, serving: ServingOptions, role: PodRole, env: dict[str, str],
                explain: list[Explanation]) -> EngineCommand:
    """One pod of a NIM 1.x multi-node group (MPI over ssh), as the NIM Operator's spec.multiNode.mpi renders it."""
    secret = ssh_secret_name(role.deployment)
    env.update({"NIM_MULTI_NODE": "1", "NIM_NUM_COMPUTE_NODES": str(role.pods), "NIM_NODE_RANK": str(role.rank),
                "NIM_MPI_ALLOW_RUN_AS_ROOT": "0", "NIM_LEADER_ROLE": "1" if role.leader else "0"})
    volumes: list[dict[str, Any]] = [
        {"name": SSH_VOLUME, "secret": {"secretName": secret, "defaultMode": SSH_FILE_MODE}},
        {"name": "nim-ssh-dotfiles", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": SSH_VOLUME, "mountPath": SSH_KEY_DIR, "readOnly": True},
        {"name": "nim-ssh-dotfiles", "mountPath": SSH_DOTFILES_DIR},
    ]
    explain.append(Explanation("NIM_MULTI_NODE", "1", f"one replica over {role.pods} pods (one pipeline stage of "
                               f"TP{candidate.layout.tp} each): the image's entrypoint starts NIM's MPI launcher, "
                               f"rank {role.rank} of NIM_NUM_COMPUTE_NODES={role.pods}; ssh key from the operator's "
                               f"Secret {secret} at {SSH_KEY_DIR}/{SSH_KEY_FILE}", MULTI_NODE_ENV["NIM_MULTI_NODE"]))
    if role.leader:
        env.update({"OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=20",
                    "GPUS_PER_NODE": str(role.gpus_per_pod), "CLUSTER_START_TIMEOUT": str(MPI_START_TIMEOUT_S),
                    "CLUSTER_SIZE": str(role.pods), "GROUP_INDEX": str(MPI_GROUP_INDEX)})
        volumes.append({"name": "nim-mpi-config", "downwardAPI": {"defaultMode": 0o444, "items": [
            {"path": f"hostfile-{MPI_GROUP_INDEX}",
             "fieldRef": {"fieldPath": f"metadata.annotations['{MPI_HOSTFILE_ANNOTATION}']"}}]}})
        mounts.append({"name": "nim-mpi-config", "mountPath": MPI_HOSTFILE_DIR, "readOnly": True})
        explain.append(Explanation("hostfile", f"{MPI_HOSTFILE_DIR}/hostfile-{MPI_GROUP_INDEX}",
                                   f"mpirun's hosts: this pod and {role.pods - 1} worker pod(s), "
                                   f"{role.gpus_per_pod} slots each (from the pod annotation {MPI_HOSTFILE_ANNOTATION})",
                                   f"{_OP} generateMPIConfigData"))
        return EngineCommand((), (), True, (("http", serving.port),), tuple(explain), tuple(volumes), tuple(mounts),
                             env=tuple(env.items()), health_path=HEALTH_READY_PATH, live_path=HEALTH_LIVE_PATH,
                             annotations=((MPI_HOSTFILE_ANNOTATION, mpi_hostfile(role)),))
    leader_pod, lws_name, namespace = (role.leader_host.split(".") + ["", "", ""])[:3]
    env.update({"LEADER_NAME": leader_pod, "NAMESPACE": namespace, "LWS_NAME": lws_name})
    volumes.append({"name": "nim-ssh-confs", "emptyDir": {}})
    mounts.append({"name": "nim-ssh-confs", "mountPath": SSHD_CONF_DIR})
    return EngineCommand((), (), False, (("ssh", SSH_PORT),), tuple(explain), tuple(volumes), tuple(mounts),
                         env=tuple(env.items()))
