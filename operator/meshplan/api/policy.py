"""The cluster admin's engine-pod policy: what an LLMDeployment may make the operator do.

Pure. A tenant who may create LLMDeployments but not Pods must not get, through the operator, a
pod running an image the admin did not allow, a Secret of the namespace in its environment, or a
ServiceAccount the admin did not choose (issue #17, "confused deputy"). The admin sets this policy
in the chart (`enginePolicy` in charts/meshplan/values.yaml); the chart passes it to the operator
as the JSON env `MESHPLAN_ENGINE_POLICY` (read by controller.settings.load_engine_policy) and renders
the same rules as a ValidatingAdmissionPolicy, so `kubectl apply` is refused up front and the
operator refuses (Planned=False/NotAllowed, no pods) what reaches it anyway.

Image patterns (per engine kind), matched against the image reference without its tag and digest
(`registry.example/llm/vllm:v1@sha256:...` -> `registry.example/llm/vllm`):
- `repo` (e.g. `vllm/vllm-openai`): exactly that repository, any tag or digest;
- `prefix/*` (e.g. `registry.example/llm/*`): any repository below that path;
- `*`: any image.
References are compared as written: `vllm/vllm-openai` and `docker.io/vllm/vllm-openai` are two
patterns (list both to allow both spellings). An LLMDeployment without spec.engine.image runs the
operator's pinned image for its engine (render.engine_args.DEFAULT_IMAGES), always allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# The chart's defaults (charts/meshplan/values.yaml enginePolicy.allowedImages): the repositories of
# the images meshplan pins (render.engine_args.DEFAULT_IMAGES), in both Docker Hub spellings.
DEFAULT_ALLOWED_IMAGES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm/vllm-openai", "docker.io/vllm/vllm-openai"),
    "sglang": ("lmsysorg/sglang", "docker.io/lmsysorg/sglang"),
    "trtllm": ("nvcr.io/nvidia/tensorrt-llm/release",),
    # NIM containers are per model under nvcr.io/nim/<org>/<model> (meshplan pins none: spec.engine.image
    # is required for nim); DeepSpeed-MII publishes no image, so none is allowed until the admin names one.
    "nim": ("nvcr.io/nim/*",),
    "deepspeed": (),
    # Not an engine: the endpoint picker of a disaggregated deployment (spec.serving.router.image). The
    # Gateway API Inference Extension publishes its pickers under registry.k8s.io/gateway-api-inference-extension/
    # (v1.6.0 config: registry.k8s.io/gateway-api-inference-extension/lwepp).
    "router": ("registry.k8s.io/gateway-api-inference-extension/*",),
}
POLICY_ENV = "MESHPLAN_ENGINE_POLICY"
_TAG_RE = re.compile(r":[^/]+$")


@dataclass(frozen=True)
class EnginePolicy:
    """enginePolicy of the chart (same keys, camelCase there)."""

    allowed_images: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_ALLOWED_IMAGES))
    allow_env_value_from: bool = False
    service_account_name: str | None = None     # None: the namespace's `default`

    @classmethod
    def from_values(cls, values: Mapping[str, Any] | None) -> "EnginePolicy":
        """From the chart's `enginePolicy` mapping; raises ValueError naming the bad key."""
        values = dict(values or {})
        known = {"allowedImages", "allowEnvValueFrom", "serviceAccountName", "admissionPolicy"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"enginePolicy: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        images = values.get("allowedImages", DEFAULT_ALLOWED_IMAGES)
        if not isinstance(images, Mapping):
            raise ValueError("enginePolicy.allowedImages must map an engine kind to a list of image patterns")
        parsed: dict[str, tuple[str, ...]] = {}
        for kind, patterns in images.items():
            if kind not in DEFAULT_ALLOWED_IMAGES:
                raise ValueError(f"enginePolicy.allowedImages.{kind}: not an engine kind or router "
                                 f"({', '.join(DEFAULT_ALLOWED_IMAGES)})")
            if isinstance(patterns, str) or not all(isinstance(p, str) and p for p in patterns or ()):
                raise ValueError(f"enginePolicy.allowedImages.{kind} must be a list of non-empty strings")
            parsed[kind] = tuple(patterns or ())
        allow = values.get("allowEnvValueFrom", False)
        if not isinstance(allow, bool):
            raise ValueError("enginePolicy.allowEnvValueFrom must be true or false")
        sa = values.get("serviceAccountName") or None
        if sa is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", str(sa)):
            raise ValueError(f"enginePolicy.serviceAccountName {sa!r} is not a ServiceAccount name")
        return cls(allowed_images=parsed, allow_env_value_from=allow, service_account_name=sa)


def image_repository(image: str) -> str:
    """`host:5000/a/b:tag@sha256:...` -> `host:5000/a/b` (the registry port is not a tag)."""
    ref = image.split("@", 1)[0]
    return _TAG_RE.sub("", ref)


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    repo = image_repository(image)
    for p in patterns:
        if p == "*":
            return True
        if p.endswith("/*"):
            if repo.startswith(p[:-1]) and len(repo) > len(p) - 1:
                return True
        elif repo == p:
            return True
    return False


def _image_problem(policy: EnginePolicy, field: str, image: str, key: str, what: str, hint: str) -> list[str]:
    """[the refusal] when `image` is outside enginePolicy.allowedImages.`key`, else []."""
    patterns = tuple(policy.allowed_images.get(key, ()))
    if image_allowed(image, patterns):
        return []
    allowed = ", ".join(patterns) if patterns else "none"
    return [f"{field} {image!r} (repository {image_repository(image)!r}) is not allowed {what}by the cluster "
            f"admin's enginePolicy.allowedImages.{key} ({allowed}): {hint}"]


def policy_problems(spec: Any, policy: EnginePolicy) -> list[str]:
    """What `spec` asks for that the admin's policy does not allow; each names the field, the value
    and the admin setting (empty when allowed)."""
    problems: list[str] = []
    kind = spec.engine.kind
    image = spec.engine.image
    if image is not None:
        problems += _image_problem(policy, "spec.engine.image", image, kind, f"for engine {kind} ",
                                   "use an allowed image, or leave spec.engine.image unset for the operator's "
                                   "pinned image")
    serving = getattr(spec, "serving", None)
    router_spec = getattr(serving, "router", None)
    router = getattr(router_spec, "image", None)
    if router is not None:
        # The engine's own router (kind engine) may run from an image the admin allows for that engine (SGLang's and
        # TensorRT-LLM's images carry their routers); any router may run from allowedImages.router.
        engine_ok = (getattr(router_spec, "kind", "inferencePool") == "engine"
                     and image_allowed(router, tuple(policy.allowed_images.get(kind, ()))))
        if not engine_ok:
            problems += _image_problem(policy, "spec.serving.router.image", router, "router", "",
                                       "the router runs in this namespace like an engine pod; use an allowed image"
                                       + (f" (for kind engine, one allowed for {kind} also does)"
                                          if getattr(router_spec, "kind", "") == "engine" else ""))
    if not policy.allow_env_value_from:
        for where, env in (("spec.engine.env", spec.engine.env), ("spec.nccl.env", spec.nccl.env)):
            for i, e in enumerate(env or ()):
                if e.value_from is not None:
                    ref = e.value_from.secret_key_ref
                    problems.append(
                        f"{where}[{i}].valueFrom (variable {e.name}, Secret {ref.name!r} key {ref.key!r}) is not "
                        "allowed by the cluster admin's enginePolicy.allowEnvValueFrom (false): only "
                        "spec.model.weights.credentialsSecretRef may read a Secret")
    return problems


__all__ = ["DEFAULT_ALLOWED_IMAGES", "POLICY_ENV", "EnginePolicy", "image_allowed", "image_repository",
           "policy_problems"]
