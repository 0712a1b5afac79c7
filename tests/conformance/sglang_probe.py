"""Runs INSIDE the SGLang 0.5.23 engine venv (stdlib + SGLang only). JSON in on stdin, JSON out (last line).

Input: {"cases": [{"id", "argv", "env": [names], "model_dir", "gpu": {"name", "capability": [maj, min],
"memory_bytes", "count"}}], "eplb_architectures": [names]}.
For each case: SGLang's own parser (ServerArgs.add_cli_args + parse_args, as prepare_server_args does),
ServerArgs.from_cli_args, then the start-up configuration (ServerArgs.resolve_once(), which 0.5.23 runs in
place of the old __post_init__, then check_server_args()), with `--model-path` pointing at a config-only
directory holding the model's real config.json.

No GPU here, so the probe simulates the planned product: it patches the torch.cuda functions SGLang's
CUDA platform (sglang/srt/platforms/cuda.py CudaSRTPlatform) and utils ask: torch.cuda.is_available,
device_count, get_device_name, get_device_capability, get_device_properties (total_memory, name,
major, minor), mem_get_info, set_device, current_device. Simulated, not real: it only fixes what the
device reports.

The one stand-in beyond the device: `sgl_kernel` (sglang-kernel, SGLang's compiled CUDA ops) cannot load
without the NVIDIA driver (libcuda.so.1), and resolution imports the quantization schemes, which import
names from it at module level (`int8_scaled_mm`, `scalar_types.uint4b8`, ...). The probe puts an opaque
stand-in package under that name (every attribute and call gives another opaque name) so those imports
resolve; SGLang's configuration code itself (ServerArgs.resolve_once, check_server_args) runs unchanged,
and a configuration that would call a kernel to decide something fails loudly instead of passing.
"""

import argparse
import json
import sys
import traceback
import types

payload = json.loads(sys.stdin.read())
GPU = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "memory_bytes": 80 * 2**30, "count": 8}


def _simulate_cuda():
    import torch

    def props(device=0):
        return types.SimpleNamespace(name=GPU["name"], total_memory=int(GPU["memory_bytes"]),
                                     major=GPU["capability"][0], minor=GPU["capability"][1],
                                     multi_processor_count=132, uuid="GPU-00000000-0000-0000-0000-000000000000",
                                     is_integrated=False, L2_cache_size=50 * 2**20)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: int(GPU["count"])
    torch.cuda.get_device_name = lambda device=0: GPU["name"]
    torch.cuda.get_device_capability = lambda device=0: tuple(GPU["capability"])
    torch.cuda.get_device_properties = props
    torch.cuda.mem_get_info = lambda device=0: (int(GPU["memory_bytes"]), int(GPU["memory_bytes"]))
    torch.cuda.set_device = lambda device: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.empty_cache = lambda: None
    torch.cuda.synchronize = lambda device=None: None


_simulate_cuda()

# The pod's RDMA devices, simulated like the GPU: SGLang checks --disaggregation-ib-device against the HCAs in
# /sys/class/infiniband (arg_groups/validation_hook.py); this machine has none, so that one directory answers the
# HCA names the case's pod is given (case "hcas"; empty: no such directory, as on a node without RDMA).
import os as _os

IB_SYSFS = "/sys/class/infiniband"
HCAS: list = []
_isdir, _listdir = _os.path.isdir, _os.listdir
_os.path.isdir = lambda p: bool(HCAS) if str(p).rstrip("/") == IB_SYSFS else _isdir(p)
_os.listdir = lambda p=".": list(HCAS) if str(p).rstrip("/") == IB_SYSFS else _listdir(p)

STUBBED = ("sgl_kernel",)


class _Opaque:
    """A name of a stubbed kernel package (a kernel, a dtype table, a class): attribute access and calls give
    more opaque names, so module-level imports and tables resolve; nothing here computes anything."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Opaque(f"{self._name}.{name}")

    def __call__(self, *a, **k):
        return _Opaque(f"{self._name}()")

    def __repr__(self):
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    """A compiled-kernel package that cannot load without a GPU driver: its names exist, calling one fails."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        return _Opaque(f"{self.__name__}.{name}")


class _StubFinder:
    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())

import sglang  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402


def _env_registry():
    from sglang.srt import environ

    names = set()
    for obj in vars(environ).values():
        if isinstance(obj, type):
            for k, v in vars(obj).items():
                if k.isupper() and hasattr(v, "get"):
                    names.add(getattr(v, "name", k) or k)
    return names


class _Refused(Exception):
    pass


def _parser():
    p = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(p)

    def error(message):
        raise _Refused(message)

    p.error = error
    return p


registry = _env_registry()
results = []
for case in payload["cases"]:
    GPU.update(case.get("gpu") or {})
    HCAS[:] = case.get("hcas") or []
    out = {"id": case["id"], "parsed": False, "resolved": False, "error": "", "stage": ""}
    argv = [case["model_dir"] if a == "@MODEL@" else a for a in case["argv"]]
    try:
        out["stage"] = "parse"
        raw = _parser().parse_args(argv)
        sa = ServerArgs.from_cli_args(raw)
        out["parsed"] = True
        out["raw"] = {k: getattr(raw, k, None) for k in ("tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size",
                                                         "chunked_prefill_size", "max_running_requests",
                                                         "mem_fraction_static", "context_length", "kv_cache_dtype",
                                                         "quantization", "enable_eplb", "ep_num_redundant_experts",
                                                         "nnodes", "node_rank", "moe_a2a_backend", "deepep_mode",
                                                         "enable_two_batch_overlap", "disaggregation_mode",
                                                         "disaggregation_transfer_backend",
                                                         "disaggregation_bootstrap_port", "disaggregation_ib_device")}
        if case.get("resolve", True):
            out["stage"] = "resolve"
            sa.resolve_once()
            sa.check_server_args()
            from sglang.srt.arg_groups.overrides import resolving_view

            v = resolving_view(sa)
            out["resolved"] = True
            out["config"] = {k: getattr(v, k, None) for k in ("tp_size", "attn_dp_size", "ep_size", "chunked_prefill_size",
                                                              "page_size", "max_running_requests",
                                                              "mem_fraction_static", "context_length",
                                                              "kv_cache_dtype", "attention_backend",
                                                              "speculative_algorithm", "speculative_num_steps",
                                                              "speculative_eagle_topk",
                                                              "speculative_num_draft_tokens",
                                                              # prefill/decode disaggregation as resolved
                                                              "disaggregation_mode",
                                                              "disaggregation_transfer_backend",
                                                              "disaggregation_bootstrap_port",
                                                              "disaggregation_ib_device", "disable_radix_cache")}
    except BaseException as exc:  # noqa: BLE001 - SystemExit from argparse, AssertionError from checks
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["trace"] = traceback.format_exc()[-1500:]
    out["unknown_env"] = sorted(n for n in case.get("env", []) if n.startswith("SGLANG_") and n not in registry)
    results.append(out)

from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES

print(json.dumps({"version": sglang.__version__, "registry_size": len(registry), "results": results,
                  "facts": {"disagg_transfer_backends": list(DISAGG_TRANSFER_BACKEND_CHOICES)}}, default=str))
