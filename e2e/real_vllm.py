"""A real vLLM server (the CPU build, engine venv `vllm-0.32.0`) started from a pod meshplan rendered.

Used by e2e/test_real_vllm.py and benchmarks/real_vllm.py. Pieces, each small and honest:

- `write_tiny_model(dir)`: a config-only Llama directory. config.json is the real
  meta-llama/Meta-Llama-3.1-8B config (tests/fixtures/models/, source in its SOURCES.md) with only
  the size fields shrunk (layers, widths, heads, vocabulary) so it runs on two CPU cores; weights
  come from `--load-format dummy` (vLLM initialises them randomly), so nothing downloads. The
  tokenizer (needed by the load generator, which samples random token ids and detokenises them) is
  a byte-level BPE trained here with the `tokenizers` library on this repository's docs.
- `cpu_launch(pod, ...)`: the leader pod's container command + args, exactly as the API server has
  them, with only what a CPU machine forces changed; returns the changes so the test can assert the
  diff is exactly that list.
- `podmonitor_scrape_config(doc)` / `pod_sd_labels(pod)`: the chart's engine PodMonitor turned into
  the Prometheus scrape config the Prometheus Operator generates for it, and the `__meta_kubernetes_*`
  labels Prometheus' Kubernetes pod discovery gives the pod; a real Prometheus applies the relabelling.
  (`RelabelPrometheus`: e2e/autoscale_fleet.py's `OwnPrometheus`, the one e2e helper that starts a
  real Prometheus, with that job).
- `RealVllm`: the process (its own process group; `stop()` ends it and its engine-core child).
- `bench(...)`: `vllm bench serve` from the same venv (the load generator), its JSON result.
- `evaluations(...)`: the correction evaluations status.observed shows in every version of the
  LLMDeployment a `kubectl get --watch` (e2e/reliability/kit.py `Watch`) sees (issue 20's predicted
  vs observed).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENGINE_VENV = "vllm-0.32.0"
LLAMA_8B_CONFIG = REPO / "tests" / "fixtures" / "models" / "meta-llama--Meta-Llama-3.1-8B_config.json"

# The size fields shrunk; everything else of the real config.json is kept (architecture, rope scaling,
# norms, context length). head_dim 64 (256 / 4) is one of the head sizes vLLM's CPU attention supports
# (vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes at 0.32.0: 32, 64, 80, 96, 112, 128,
# 160, 192, 224, 256); 4 query heads over 1 KV head keeps the 8B's 4:1 GQA ratio (32:8).
TINY_SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1}
TOKENIZER_VOCAB = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"   # the Llama 3 special tokens' spelling

# vLLM CPU settings (vLLM 0.32.0 vllm/envs.py; docs/getting_started/installation/cpu.md):
# VLLM_CPU_KVCACHE_SPACE is the KV cache size in GiB (the CPU backend's stand-in for
# --gpu-memory-utilization); 1 GiB holds ~4M tokens of this model's fp8 KV (2 layers x 2 x 1 head x 64).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# Nothing may download or phone home on this machine (the model is a local directory; usage stats off):
# HF_HUB_OFFLINE (huggingface_hub), VLLM_NO_USAGE_STATS / DO_NOT_TRACK (vllm/usage/usage_lib.py).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def engine_python() -> Path:
    sys.path.insert(0, str(REPO / "engines-venv"))
    import install as engine_venvs  # noqa: PLC0415

    py = engine_venvs.python_of(ENGINE_VENV)
    if py is None:
        raise RuntimeError(f"engine venv {ENGINE_VENV!r} is not built: run "
                           f"`.venv/bin/python engines-venv/install.py {ENGINE_VENV}` (make setup builds it)")
    return py


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process' environment without our venv, the engine venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{engine_python().parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(extra or {})
    return env


# vLLM 0.32.0's CPU attention holds an FP8 KV cache only on x86 with AVX-512 or AMX: _get_attn_isa
# (vllm/v1/attention/backends/cpu_attn.py) raises "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
# unless torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported(). The same two calls, asked of
# the engine venv's torch, say whether this machine can run a plan's fp8 KV cache (an AVX2-only EPYC cannot).
_FP8_KV_PROBE = ("import torch; "
                 "print(int(bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported())))")


@functools.cache
def cpu_runs_fp8_kv() -> bool:
    """Whether vLLM's CPU attention on this machine takes an FP8 KV cache (vLLM's own test, above)."""
    out = subprocess.run([str(engine_python()), "-c", _FP8_KV_PROBE], capture_output=True, text=True,
                         timeout=180, env=engine_env())
    if out.returncode != 0 or out.stdout.strip()[-1:] not in ("0", "1"):
        raise RuntimeError(f"the engine venv's torch did not answer the FP8 KV probe: {out.stderr[-2000:]}")
    return out.stdout.strip()[-1:] == "1"


def cpu_precision(manifest: dict[str, Any]) -> None:
    """A CPU-forced change to an LLMDeployment manifest, made before it is applied: where this machine's vLLM
    cannot hold an FP8 KV cache (`cpu_runs_fp8_kv`), an `auto` or `fp8` `spec.precision.kvCache` is pinned to
    bf16 (the model's own dtype), so the plan the operator renders is one this CPU runs (a pinned dtype is
    used as given: api.models Precision.kv_cache). Nothing changes on AVX-512 / AMX machines."""
    precision = manifest["spec"].setdefault("precision", {})
    if not cpu_runs_fp8_kv() and precision.get("kvCache", "auto") in ("auto", "fp8"):
        precision["kvCache"] = "bf16"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- the tiny model

_TOKENIZER_SCRIPT = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out, vocab, bos, eos = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
texts = [Path(p).read_text(errors="ignore") for p in sys.argv[5:]]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[bos, eos],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(texts, trainer)
tok.save(str(out / "tokenizer.json"))
print(json.dumps({"vocab_size": tok.get_vocab_size(), "bos": tok.token_to_id(bos), "eos": tok.token_to_id(eos)}))
"""


def tiny_model_dir() -> Path:
    """A fixed place for the tiny model: vLLM keys its torch.compile cache (~/.cache/vllm) on the
    model path among others, so a stable path lets a second run skip the ~2 min CPU compile."""
    from meshplan.devcluster.cluster import cache_dir  # noqa: PLC0415

    return cache_dir() / "real-vllm" / "tiny-llama"


def write_tiny_model(directory: Path) -> dict[str, Any]:
    """Write config.json + a locally trained tokenizer into `directory`; returns the config."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    out = subprocess.run([str(engine_python()), "-c", _TOKENIZER_SCRIPT, str(directory), str(TOKENIZER_VOCAB),
                          BOS, EOS, *map(str, corpus)], capture_output=True, text=True, timeout=300,
                         env=engine_env())
    if out.returncode != 0:
        raise RuntimeError(f"training the tokenizer failed:\n{out.stderr[-3000:]}")
    tok = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = json.loads(LLAMA_8B_CONFIG.read_text())
    cfg.update(TINY_SIZES)
    cfg.update({"vocab_size": tok["vocab_size"], "bos_token_id": tok["bos"], "eos_token_id": tok["eos"]})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "model_max_length": cfg["max_position_embeddings"], "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tok["bos"], "eos_token_id": tok["eos"]}, indent=2) + "\n")
    return cfg


# ----------------------------------------------------------------------------- the argv a CPU machine runs


@dataclass
class Launch:
    """What runs: argv, env, and every change from the pod's container (to assert on)."""

    argv: list[str]
    env: dict[str, str]
    port: int
    changes: list[str] = field(default_factory=list)


def _flag_index(args: list[str], flag: str) -> int:
    hits = [i for i, a in enumerate(args) if a == flag]
    if len(hits) != 1:
        raise AssertionError(f"the rendered args carry {flag} {len(hits)} times, expected once: {args}")
    return hits[0]


def cpu_launch(pod: dict[str, Any], model_dir: Path, port: int, secrets: dict[tuple[str, str], str]) -> Launch:
    """The engine container of `pod` as a local process; only CPU-forced changes, each recorded.

    - the model (first positional argument of `vllm serve`) -> the tiny local directory;
    - `--load-format dummy` added (no weights exist);
    - `--host 0.0.0.0` -> 127.0.0.1 and `--port` -> a free port (a shared machine, not a pod network);
    - env: the container's own variables (secretKeyRef resolved from the Secret, as the kubelet does),
      plus VLLM_CPU_KVCACHE_SPACE (the CPU backend's KV size), the offline switches, and the engine
      venv's bin first on PATH (the image has `vllm` on its PATH).
    """
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
    command, args = list(c.get("command") or []), list(c.get("args") or [])
    if command[:2] != ["vllm", "serve"]:
        raise AssertionError(f"not a vLLM serve container: {command}")
    changes: list[str] = []
    new = list(args)
    if not new or new[0].startswith("-"):
        raise AssertionError(f"no model positional argument first in {args}")
    changes.append(f"model {new[0]} -> {model_dir}")
    new[0] = str(model_dir)
    i = _flag_index(new, "--host")
    changes.append(f"--host {new[i + 1]} -> 127.0.0.1")
    new[i + 1] = "127.0.0.1"
    i = _flag_index(new, "--port")
    changes.append(f"--port {new[i + 1]} -> {port}")
    new[i + 1] = str(port)
    new += ["--load-format", "dummy"]
    changes.append("+ --load-format dummy")

    env: dict[str, str] = {}
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif ref := (e.get("valueFrom") or {}).get("secretKeyRef"):
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            raise AssertionError(f"env {e['name']}: a source this launcher does not resolve: {e}")
    for k, v in {**CPU_ENV, **OFFLINE_ENV}.items():
        changes.append(f"+ env {k}={v}")
        env[k] = v
    full = engine_env(env)
    changes.append("env PATH: the engine venv's bin first")
    return Launch(argv=command + new, env=full, port=port, changes=changes)


# ----------------------------------------------------------------------------- PodMonitor -> scrape config

_SANITIZE = re.compile(r"[^a-zA-Z0-9_]")


def _sanitize(name: str) -> str:
    # Prometheus Kubernetes SD: "any unsupported characters converted to an underscore"
    # (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#pod)
    return _SANITIZE.sub("_", name)


def pod_sd_labels(pod: dict[str, Any], container: str, port_name: str) -> dict[str, str]:
    """The `__meta_kubernetes_*` labels Prometheus' Kubernetes SD (role: pod) gives one container port.

    Names from https://prometheus.io/docs/prometheus/latest/configuration/configuration/#pod (one
    target per declared container port). `__address__` is set by the caller (this machine's loopback
    port in place of the pod IP; the only address in reach).
    """
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    (c,) = [c for c in spec["containers"] if c["name"] == container]
    (p,) = [p for p in c.get("ports") or [] if p.get("name") == port_name]
    ready = any(x["type"] == "Ready" and x["status"] == "True" for x in status.get("conditions") or [])
    out = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_ready": "true" if ready else "false",
        "__meta_kubernetes_pod_container_name": c["name"],
        "__meta_kubernetes_pod_container_image": c.get("image", ""),
        "__meta_kubernetes_pod_container_init": "false",
        "__meta_kubernetes_pod_container_port_name": p["name"],
        "__meta_kubernetes_pod_container_port_number": str(p["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": p.get("protocol", "TCP"),
    }
    for k, v in (meta.get("labels") or {}).items():
        out[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
        out[f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"] = "true"
    for k, v in (meta.get("annotations") or {}).items():
        out[f"__meta_kubernetes_pod_annotation_{_sanitize(k)}"] = v
        out[f"__meta_kubernetes_pod_annotationpresent_{_sanitize(k)}"] = "true"
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            out["__meta_kubernetes_pod_controller_kind"] = ref["kind"]
            out["__meta_kubernetes_pod_controller_name"] = ref["name"]
    return out


_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "separator": "separator",
                 "regex": "regex", "replacement": "replacement", "action": "action", "modulus": "modulus"}


def podmonitor_scrape_config(doc: dict[str, Any], scrape_interval: str = "1s") -> dict[str, Any]:
    """The Prometheus scrape config the Prometheus Operator generates for the PodMonitor's first endpoint.

    Shape of prometheus-operator pkg/prometheus/promcfg.go (generatePodMonitorConfig; its expected
    output in pkg/prometheus/promcfg_test.go, e.g. `job_name: podMonitor/default/testpodmonitor1/0`):
    keep the selector's labels (`__meta_kubernetes_pod_label_<k>` + `..._labelpresent_<k>`, regex
    `(<v>);true`), keep the endpoint's port name, set namespace / container / pod / job / endpoint,
    then the endpoint's own `relabelings` (the chart's), camelCase keys as snake_case. Pod discovery
    is replaced by file service discovery (labels from `pod_sd_labels`); the namespace selector is
    applied by the caller (which pods it registers). The interval is the test's (1 s), not the chart's.
    """
    if doc.get("kind") != "PodMonitor":
        raise ValueError(f"not a PodMonitor: {doc.get('kind')}")
    meta, spec = doc["metadata"], doc["spec"]
    (ep,) = spec["podMetricsEndpoints"][:1]
    rc: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for k, v in sorted((spec.get("selector") or {}).get("matchLabels", {}).items()):
        s = _sanitize(k)
        rc.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{s}",
                                                        f"__meta_kubernetes_pod_labelpresent_{s}"],
                   "regex": f"({v});true"})
    # matchExpressions as promcfg.go writes them: In keeps / NotIn drops `(<v1>|<v2>);true` on the label and
    # its labelpresent twin; Exists keeps / DoesNotExist drops labelpresent `true`
    for e in (spec.get("selector") or {}).get("matchExpressions", []):
        s, op = _sanitize(e["key"]), e["operator"]
        if op in ("In", "NotIn"):
            rc.append({"action": "keep" if op == "In" else "drop",
                       "source_labels": [f"__meta_kubernetes_pod_label_{s}", f"__meta_kubernetes_pod_labelpresent_{s}"],
                       "regex": f"({'|'.join(e['values'])});true"})
        elif op in ("Exists", "DoesNotExist"):
            rc.append({"action": "keep" if op == "Exists" else "drop",
                       "source_labels": [f"__meta_kubernetes_pod_labelpresent_{s}"], "regex": "true"})
        else:
            raise NotImplementedError(f"matchExpressions operator {op}")
    rc.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
               "regex": ep["port"]})
    rc += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    for r in ep.get("relabelings") or []:
        unknown = set(r) - set(_RELABEL_KEYS)
        if unknown:
            raise NotImplementedError(f"relabeling keys {sorted(unknown)}")
        rc.append({_RELABEL_KEYS[k]: v for k, v in r.items()})
    return {"job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0", "honor_labels": False,
            "scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
            "metrics_path": ep.get("path", "/metrics"), "relabel_configs": rc}


def _sibling(name: str):
    """An e2e helper module next to this one (e2e/ is not a package)."""
    import importlib.util

    key = f"e2e_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


class RelabelPrometheus(_sibling("autoscale_fleet").OwnPrometheus):
    """A private Prometheus whose one scrape job is the PodMonitor's (file SD in place of pod SD):
    e2e/autoscale_fleet.py's `OwnPrometheus` with that job."""

    def __init__(self, scrape_config: dict[str, Any], port: int | None = None, binary: str = "prometheus") -> None:
        super().__init__(binary=binary, port=port, scrape_job=scrape_config, prefix="meshplan-real-vllm-prom-")

    def register(self, name: str, address: str, sd_labels: dict[str, str]) -> None:
        """One target with the `__meta_kubernetes_*` labels pod discovery would give it."""
        self.add_scrape_target(name, address, sd_labels)


# ----------------------------------------------------------------------------- the server process


class RealVllm:
    """`vllm serve` as a process in its own group (the API server and its EngineCore child)."""

    def __init__(self, launch: Launch, log_path: Path) -> None:
        self.launch, self.log_path = launch, log_path
        self.url = f"http://127.0.0.1:{launch.port}"
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> "RealVllm":
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.launch.argv, env=self.launch.env, stdout=open(self.log_path, "wb"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float = 400.0) -> float:
        """Seconds from start until GET /health answered 200; raises with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}:\n{self.log_tail(80)}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f}s:\n{self.log_tail(80)}")

    def complete(self, model: str, prompt: str, max_tokens: int = 16) -> dict[str, Any]:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        # the EngineCore child shares the group; make sure none is left
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ----------------------------------------------------------------------------- status over time


def _epoch(rfc3339: str | None) -> float | None:
    from datetime import datetime, timezone

    if not rfc3339:
        return None
    return datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


@dataclass
class Evaluation:
    """One correction evaluation as status.observed shows it (the first write that carries it)."""

    n: int                          # status.observed.correctionEvaluations
    time: float                     # status.observed.time (the evaluation's, whole seconds)
    itl: float                      # the factors after this evaluation
    ttft: float
    itl_target: float | None        # this evaluation's observed p50 / predicted (what the factor moves toward)
    ttft_target: float | None
    observed: dict[str, Any]
    obj: dict[str, Any]             # the whole object of that write (conditions, autoscaling, readyReplicas)


def evaluations(objects: list[tuple[float, dict[str, Any]]]) -> list[Evaluation]:
    """The correction's evaluations seen in a watch, in order, one per evaluation count."""
    out: dict[int, Evaluation] = {}
    for _, o in objects:
        obs = (o.get("status") or {}).get("observed") or {}
        n = obs.get("correctionEvaluations")
        if not isinstance(n, int) or n <= 0 or n in out or obs.get("itlCorrection") is None:
            continue

        def target(kind: str) -> float | None:
            seen, pred = obs.get(f"{kind}P50Ms"), obs.get(f"predicted{kind[0].upper()}{kind[1:]}Ms")
            return seen / pred if seen and pred else None
        out[n] = Evaluation(n=n, time=_epoch(obs.get("time")) or 0.0, itl=obs["itlCorrection"],
                            ttft=obs["ttftCorrection"], itl_target=target("itl"), ttft_target=target("ttft"),
                            observed=obs, obj=o)
    return [out[n] for n in sorted(out)]


# ----------------------------------------------------------------------------- the load generator


class Bench:
    """`vllm bench serve` (the same venv) against the server, random prompts, in the background."""

    def __init__(self, server: RealVllm, model: str, tokenizer: Path, out_dir: Path, *, input_len: int,
                 output_len: int, num_prompts: int, request_rate: float | str, max_concurrency: int,
                 label: str) -> None:
        self.out_dir, self.label = out_dir, label
        self.result = out_dir / f"{label}.json"
        self.argv = ["vllm", "bench", "serve", "--backend", "vllm", "--base-url", server.url,
                     "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
                     "--dataset-name", "random", "--random-input-len", str(input_len),
                     "--random-output-len", str(output_len), "--num-prompts", str(num_prompts),
                     "--request-rate", str(request_rate), "--max-concurrency", str(max_concurrency),
                     "--ignore-eos", "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,99",
                     "--save-result", "--result-dir", str(out_dir), "--result-filename", self.result.name,
                     "--seed", "0"]
        self.env = engine_env(OFFLINE_ENV)
        self.proc: subprocess.Popen | None = None
        self.log = out_dir / f"{label}.log"

    def start(self) -> "Bench":
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"vllm bench serve ({self.label}) ran over {timeout_s:.0f}s:\n{self.tail()}")
        if rc != 0 or not self.result.exists():
            raise AssertionError(f"vllm bench serve ({self.label}) exited {rc}:\n{self.tail()}")
        return json.loads(self.result.read_text())

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


__all__ = ["Bench", "Evaluation", "Launch", "RealVllm", "RelabelPrometheus", "cpu_launch",
           "engine_python", "evaluations", "pod_sd_labels",
           "podmonitor_scrape_config", "write_tiny_model"]
