"""Weights sources rendered as the engines need them (pure).

`spec.model.weights.uri` -> what the engine is told to load, the volumes and
mounts the pod needs, the credential variables (always `valueFrom.secretKeyRef`
or a Secret volume, never a value), and the engine flag a streaming loader needs:

| form | engine loads | pod gets |
|---|---|---|
| hf://org/name[@rev] | `org/name` (+ `--revision rev`) | `HF_TOKEN` from credentialsSecretRef |
| pvc://claim/path | `/mnt/models/path` | volume `weights` = PVC `claim`, readOnly, mounted readOnly at /mnt/models |
| s3://bucket/key | vLLM: `s3://bucket/key` with `--load-format runai_streamer` | `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`) from the Secret keys, `AWS_REGION` from weights.region, `AWS_ENDPOINT_URL` (+ `RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0`, `AWS_EC2_METADATA_DISABLED=true`) from weights.endpoint; never HF_TOKEN |
| gs://bucket/obj | vLLM: `gs://bucket/obj` with `--load-format runai_streamer` | the key JSON as a read-only Secret volume, `GOOGLE_APPLICATION_CREDENTIALS` its path |
| file:///models/... | the path | nothing (the path is in the image) |
| unset | spec.model.name when it is an HF id, else the catalogue entry's HF repo | as hf:// |

Facts:
- vLLM (pinned image vllm/vllm-openai:v0.12.0) streams safetensors from S3 and
  GCS with the Run:ai Model Streamer: `vllm serve s3://bucket/path --load-format
  runai_streamer`, likewise `gs://` (docs.vllm.ai/en/stable/models/extensions/
  runai_model_streamer; the streamer reads AWS_ACCESS_KEY_ID /
  AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL for S3 (vLLM copies AWS_ENDPOINT_URL
  to RUNAI_STREAMER_S3_ENDPOINT, runai_streamer_loader.py) and Google
  application-default credentials, i.e. GOOGLE_APPLICATION_CREDENTIALS, for GCS).
- The streamer reads S3 credentials through the AWS SDK's default chain: AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (else instance metadata / IRSA web identity), its
  endpoint from AWS_ENDPOINT_URL (run-ai/runai-model-streamer docs/src/env-vars.md); SGLang 0.5.23's copy
  of the loader does the same (sglang/srt/model_loader/weight_utils.py set_runai_streamer_env copies
  AWS_ENDPOINT_URL to RUNAI_STREAMER_S3_ENDPOINT) and chooses `runai_streamer` itself for an s3:// / gs://
  `--model-path` (sglang/srt/arg_groups/model_path_hook.py), but only with the optional `sglang[runai]`
  extra installed: meshplan keeps refusing object stores for SGLang until the pinned image is checked to
  carry it.
- SGLang (lmsysorg/sglang:v0.5.5) and trtllm-serve (TensorRT-LLM 1.1.0) take a
  Hugging Face id or a local directory as the model (`--model-path`, the
  positional model of trtllm-serve; docs.sglang.io server arguments,
  nvidia.github.io/TensorRT-LLM commands/trtllm-serve) and have no object-store
  loader: s3:// and gs:// are refused for them with the reason.
- huggingface_hub reads the token from HF_TOKEN and the cache root from HF_HOME
  (huggingface.co/docs/huggingface_hub/package_reference/environment_variables).
- /mnt/models is where KServe mounts a model volume (its storage-initializer and
  `pvc://` storageUri convention); we use the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

WEIGHTS_VOLUME = "weights"
WEIGHTS_MOUNT = "/mnt/models"
CACHE_VOLUME = "model-cache"
CACHE_MOUNT = "/cache/huggingface"
GCS_VOLUME = "weights-credentials"
GCS_DIR = "/var/run/secrets/meshplan.dev/weights"
GCS_FILE = "credentials.json"

# engine -> URI schemes whose weights it can open (after the rendering above)
ENGINE_SCHEMES: dict[str, tuple[str, ...]] = {
    "vllm": ("hf", "pvc", "file", "s3", "gs"),
    "sglang": ("hf", "pvc", "file"),
    "trtllm": ("hf", "pvc", "file"),
    # NIM: the image's own model (hf: spec.model names it) or a local directory (NIM_MODEL_NAME, multi-LLM NIM);
    # DeepSpeed-MII: what transformers' from_pretrained opens (a Hugging Face id or a directory).
    "nim": ("hf", "pvc", "file"),
    "deepspeed": ("hf", "pvc", "file"),
}
_ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "trtllm-serve", "nim": "NVIDIA NIM",
                 "deepspeed": "DeepSpeed-MII"}


@dataclass(frozen=True)
class WeightsSource:
    model: str                                        # what the engine loads
    revision: str | None = None
    load_format: str | None = None                    # vLLM --load-format
    env: tuple[Mapping[str, Any], ...] = ()           # credential variables (secretKeyRef / plain paths)
    volumes: tuple[Mapping[str, Any], ...] = ()
    mounts: tuple[Mapping[str, Any], ...] = ()
    refusal: str = ""                                 # why this engine cannot open these weights
    notes: tuple[str, ...] = field(default=())


def cache_size_limit(checkpoint_bytes: float) -> str:
    """emptyDir sizeLimit of a model cache sized from the weights: the checkpoint + 10 % (tokenizer files,
    the hub's lock and metadata files, an incomplete download's partial file), whole GiB. An emptyDir
    above its sizeLimit gets the pod evicted by the kubelet, so it is an upper bound, never tight."""
    return f"{-(-int(checkpoint_bytes * 1.1) // 2**30)}Gi"


def scheme_of(uri: str | None) -> str:
    return uri.split("://", 1)[0].lower() if uri and "://" in uri else ""


def engine_refusal(uri: str | None, engine: str) -> str:
    """Why `engine` cannot open weights at `uri` ("" when it can)."""
    scheme = scheme_of(uri) or "hf"
    name = _ENGINE_NAMES.get(engine, engine)
    if scheme not in ENGINE_SCHEMES.get(engine, ()):
        if scheme in ("s3", "gs"):
            return (f"spec.model.weights.uri: {name} cannot open {scheme}:// weights (it has no object-store loader, "
                    "only a Hugging Face id or a local directory): copy the checkpoint to a volume and use "
                    "pvc://claim/path, or serve with engine.kind vllm (Run:ai model streamer)")
        return (f"spec.model.weights.uri: no engine meshplan renders opens {scheme}:// weights; use hf://, pvc://, "
                "s3:// or gs:// (vLLM), or file:///models/...")
    return ""


def _secret_env(name: str, ref: Any) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def weights_source(model_spec: Any, engine: str, catalogue_repo: str | None = None,
                   checkpoint_bytes: float = 0.0) -> WeightsSource:
    """How `engine` gets the weights of `spec.model` (see module doc). `catalogue_repo` is the catalogue
    entry's Hugging Face repository, used when weights.uri is unset; `checkpoint_bytes` the checkpoint's
    size, which sizes a model cache given neither claimName nor sizeLimit (`cache: {}`)."""
    weights = getattr(model_spec, "weights", None)
    uri = getattr(weights, "uri", None)
    cred = getattr(weights, "credentials_secret_ref", None)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    env: list[dict[str, Any]] = []
    revision = None
    load_format = None
    scheme = scheme_of(uri) or "hf"
    if uri is None:
        # an HF id as spec.model.name names the checkpoint (meta-llama/Llama-3.1-8B-Instruct, not the catalogue
        # entry's base repository); a catalogue name loads the catalogue entry's repository
        name = str(model_spec.name)
        model = name if "/" in name else (catalogue_repo or name)
    elif scheme == "hf":
        model = uri[len("hf://"):]
        if "@" in model:
            model, revision = model.split("@", 1)
    elif scheme == "pvc":
        rest = uri[len("pvc://"):]
        claim, _, path = rest.partition("/")
        volumes.append({"name": WEIGHTS_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": WEIGHTS_VOLUME, "mountPath": WEIGHTS_MOUNT, "readOnly": True})
        model = f"{WEIGHTS_MOUNT}/{path.strip('/')}" if path.strip("/") else WEIGHTS_MOUNT
    elif scheme == "file":
        model = uri[len("file://"):]
    elif scheme in ("s3", "gs"):
        model = uri
        load_format = "runai_streamer"
        if scheme == "s3":
            key_id = getattr(weights, "access_key_id_secret_ref", None)
            if key_id is not None:
                env.append(_secret_env("AWS_ACCESS_KEY_ID", key_id))
            if cred is not None:
                env.append(_secret_env("AWS_SECRET_ACCESS_KEY", cred))
            token = getattr(weights, "session_token_secret_ref", None)
            if token is not None:
                env.append(_secret_env("AWS_SESSION_TOKEN", token))
            region = getattr(weights, "region", None)
            if region:
                env.append({"name": "AWS_REGION", "value": region})
            endpoint = getattr(weights, "endpoint", None)
            if endpoint:
                env.append({"name": "AWS_ENDPOINT_URL", "value": endpoint})
                # an S3-compatible store: path-style URLs, and no EC2 instance-metadata lookup for credentials
                # (docs.vllm.ai models/extensions/runai_model_streamer, "S3 compatible object store";
                # run-ai/runai-model-streamer docs/src/env-vars.md)
                env.append({"name": "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "value": "0"})
                env.append({"name": "AWS_EC2_METADATA_DISABLED", "value": "true"})
        elif cred is not None:
            volumes.append({"name": GCS_VOLUME, "secret": {"secretName": cred.name, "defaultMode": 0o440,
                                                           "items": [{"key": cred.key, "path": GCS_FILE}]}})
            mounts.append({"name": GCS_VOLUME, "mountPath": GCS_DIR, "readOnly": True})
            env.append({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{GCS_DIR}/{GCS_FILE}"})
    else:
        model = uri
    if scheme == "hf" and cred is not None:
        env.append(_secret_env("HF_TOKEN", cred))
    cache = getattr(model_spec, "cache", None)
    if cache is not None:
        if cache.claim_name:
            volumes.append({"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}})
        else:
            vol: dict[str, Any] = {}
            if cache.size_limit:
                vol["sizeLimit"] = cache.size_limit
            elif checkpoint_bytes > 0:
                vol["sizeLimit"] = cache_size_limit(checkpoint_bytes)
            volumes.append({"name": CACHE_VOLUME, "emptyDir": vol})
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT})
        env.append({"name": "HF_HOME", "value": CACHE_MOUNT})
    return WeightsSource(model=model, revision=revision, load_format=load_format, env=tuple(env),
                         volumes=tuple(volumes), mounts=tuple(mounts),
                         refusal=engine_refusal(uri, engine))


__all__ = ["CACHE_MOUNT", "cache_size_limit", "ENGINE_SCHEMES", "WEIGHTS_MOUNT", "WeightsSource", "engine_refusal", "scheme_of",
           "weights_source"]
