"""GPU catalogue: the hardware facts the planner stands on, each with its source.

Units and conventions (used by `meshplan.planner.memory` and `.perf`):

- `memory_gib`: device memory in GiB (2**30 bytes) as the driver reports it
  (nvidia-smi "MiB" / 1024, rounded); marketing "GB" figures are decimal and a
  little larger.
- `hbm_tb_s`: peak memory bandwidth in TB/s (10**12 bytes/s), vendor datasheet.
- `tflops`: DENSE tensor-core peak in TFLOP/s (10**12) per dtype. NVIDIA's
  headline FP8/FP16/FP4 numbers are often 2:4-sparse; we store half of those.
  A dtype missing from the dict has no tensor-core support on that GPU (e.g.
  FP8 on A100): the planner then computes it at the next wider supported dtype.
- `nvlink_gb_s`: NVLink (or Infinity Fabric) bandwidth per GPU in GB/s,
  BIDIRECTIONAL (both directions added, as NVIDIA quotes it: "900 GB/s" for
  H100). One direction is half of it: see `nvlink_uni_gb_s`. 0 for PCIe-only.
- `nvlink_domain`: GPUs that reach each other over NVLink (8 on an HGX board,
  72 on an NVL72 rack, 1 for PCIe-only cards).
- `nic_gb_s`: scale-out network bandwidth per GPU in GB/s, ONE direction
  (a 400 Gb/s NIC per GPU is 50 GB/s).

`get_gpu` accepts canonical names (`h100_sxm`), plain names (`h100`), the
calibration data's names and the `nvidia.com/gpu.product` label values that
NVIDIA's GPU Feature Discovery sets (the nvidia-smi product name with spaces
replaced by dashes, e.g. `NVIDIA-H100-80GB-HBM3`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

Family = str  # "ampere" | "hopper" | "blackwell" | "blackwell_ultra" | "ada" | "cdna3"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. `nvlink_gb_s` is BIDIRECTIONAL per GPU; `nic_gb_s` is one direction."""

    name: str
    memory_gib: float
    hbm_tb_s: float
    tflops: dict = field(hash=False, compare=True)
    nvlink_gb_s: float
    nvlink_domain: int
    gpus_per_node: int
    nic_gb_s: float
    family: Family
    product_labels: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    source: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def nvlink_uni_gb_s(self) -> float:
        """NVLink bandwidth in one direction (half the bidirectional figure)."""
        return self.nvlink_gb_s / 2

    def supports(self, dtype: str) -> bool:
        return dtype in self.tflops

    def compute_dtype(self, dtype: str) -> str:
        """The dtype a GEMM with `dtype` weights actually runs at on this GPU.

        FP4 weights without FP4 tensor cores, and INT4 weights always (AWQ/GPTQ,
        Marlin), run as weight-only kernels that dequantise to BF16; FP8 without
        FP8 cores runs at BF16.
        """
        for d in {"fp4": ("fp4", "bf16"), "int4": ("bf16",),
                  "fp8": ("fp8", "bf16"), "int8": ("int8", "bf16"),
                  "fp16": ("fp16", "bf16"), "bf16": ("bf16", "fp16")}.get(dtype, (dtype,)):
            if d in self.tflops:
                return d
        return "bf16"

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s (not TFLOP/s) for GEMMs with `dtype` operands."""
        return self.tflops[self.compute_dtype(dtype)] * 1e12


_NV_DATASHEETS = "NVIDIA datasheets"

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="a100_sxm_80gb",
            memory_gib=80.0, hbm_tb_s=2.039,
            tflops={"bf16": 312, "fp16": 312, "int8": 624, "int4": 1248},
            nvlink_gb_s=600, nvlink_domain=8, gpus_per_node=8, nic_gb_s=25,
            family="ampere",
            product_labels=("NVIDIA-A100-SXM4-80GB",),
            aliases=("a100", "a100_sxm", "a100-80gb", "a100_80gb"),
            source="NVIDIA A100 datasheet (80GB SXM: 2,039 GB/s, 312 dense BF16 TFLOP/s, "
                   "NVLink3 600 GB/s); DGX A100: 8x ConnectX-6 200 Gb/s (25 GB/s per GPU)",
        ),
        GpuSpec(
            name="h100_sxm",
            memory_gib=79.6, hbm_tb_s=3.35,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=900, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H100-80GB-HBM3",),
            aliases=("h100", "h100-sxm", "h100_sxm5", "h100-80gb"),
            source="NVIDIA H100 datasheet (SXM5: 3.35 TB/s, 989 BF16 / 1,979 FP8 dense TFLOP/s, "
                   "NVLink4 900 GB/s); DGX H100: 8x ConnectX-7 400 Gb/s; AIConfigurator systems/h100_sxm.yaml",
        ),
        GpuSpec(
            name="h200_sxm",
            memory_gib=140.4, hbm_tb_s=4.8,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=900, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e"),
            aliases=("h200", "h200-sxm"),
            source="NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s, compute as H100 SXM); "
                   "AIConfigurator systems/h200_sxm.yaml",
        ),
        GpuSpec(
            name="b200_sxm",
            memory_gib=179.1, hbm_tb_s=7.7,
            tflops={"bf16": 2250, "fp16": 2250, "fp8": 4500, "int8": 4500, "fp4": 9000},
            nvlink_gb_s=1800, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="blackwell",
            product_labels=("NVIDIA-B200",),
            aliases=("b200", "b200-sxm", "hgx-b200"),
            source="NVIDIA HGX B200 datasheet (per GPU: 180 GB, 7.7 TB/s, 2.25/4.5/9 PFLOP/s dense "
                   "BF16/FP8/FP4, NVLink5 1.8 TB/s); DGX B200: 8x ConnectX-7 400 Gb/s",
        ),
        GpuSpec(
            name="b300_sxm",
            memory_gib=268.2, hbm_tb_s=8.0,
            tflops={"bf16": 2250, "fp16": 2250, "fp8": 4500, "fp4": 13500},
            nvlink_gb_s=1800, nvlink_domain=8, gpus_per_node=8, nic_gb_s=100,
            family="blackwell_ultra",
            product_labels=("NVIDIA-B300-SXM6-AC", "NVIDIA-B300"),
            aliases=("b300", "b300-sxm", "hgx-b300"),
            source="NVIDIA HGX B300 datasheet (per GPU: 288 GB HBM3e, ~8 TB/s, 108 PF dense FP4 / 8, "
                   "BF16/FP8 as B200; INT8 tensor throughput cut on Blackwell Ultra); "
                   "DGX B300: ConnectX-8 800 Gb/s per GPU",
        ),
        GpuSpec(
            name="gb200",
            memory_gib=184.0, hbm_tb_s=8.0,
            tflops={"bf16": 2500, "fp16": 2500, "fp8": 5000, "int8": 5000, "fp4": 10000},
            nvlink_gb_s=1800, nvlink_domain=72, gpus_per_node=4, nic_gb_s=50,
            family="blackwell",
            product_labels=("NVIDIA-GB200",),
            aliases=("gb200-nvl72", "gb200_nvl72"),
            source="NVIDIA GB200 NVL72 datasheet (13.4 TB HBM3e / 72 GPUs ~186 GB, 8 TB/s, "
                   "2.5/5/10 PFLOP/s dense BF16/FP8/FP4 per GPU, NVLink5 1.8 TB/s, 72-GPU domain, "
                   "4 GPUs per compute tray, ConnectX-7 400 Gb/s per GPU); AIConfigurator systems/gb200.yaml",
        ),
        GpuSpec(
            name="gb300",
            memory_gib=268.2, hbm_tb_s=8.0,
            tflops={"bf16": 2500, "fp16": 2500, "fp8": 5000, "fp4": 15000},
            nvlink_gb_s=1800, nvlink_domain=72, gpus_per_node=4, nic_gb_s=100,
            family="blackwell_ultra",
            product_labels=("NVIDIA-GB300",),
            aliases=("gb300-nvl72", "gb300_nvl72"),
            source="NVIDIA GB300 NVL72 datasheet (288 GB HBM3e per GPU, 8 TB/s, 1,080 PF dense FP4 / 72, "
                   "NVLink5 1.8 TB/s, 72-GPU domain, ConnectX-8 800 Gb/s per GPU)",
        ),
        GpuSpec(
            name="l40s",
            memory_gib=45.0, hbm_tb_s=0.864,
            tflops={"bf16": 362, "fp16": 362, "fp8": 733, "int8": 733, "int4": 733},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=25,
            family="ada",
            product_labels=("NVIDIA-L40S",),
            aliases=("l40s-48gb",),
            source="NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, 362 BF16 / 733 FP8 dense TFLOP/s, "
                   "PCIe Gen4 x16 only, no NVLink); NIC assumed 200 Gb/s per GPU",
        ),
        GpuSpec(
            name="mi300x",
            memory_gib=192.0, hbm_tb_s=5.3,
            tflops={"bf16": 1307, "fp16": 1307, "fp8": 2615, "int8": 2615},
            nvlink_gb_s=896, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="cdna3",
            product_labels=("AMD-Instinct-MI300X", "AMD_Instinct_MI300X_OAM"),
            aliases=("amd-mi300x", "mi300x_oam"),
            source="AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1,307 BF16 / 2,615 FP8 dense "
                   "TFLOP/s, Infinity Fabric 7 links x 128 GB/s = 896 GB/s bidirectional peak; vendor "
                   "figures disagree); 400 Gb/s NIC per GPU assumed",
        ),
    )
}


def _norm(s: str) -> str:
    return s.strip().lower().replace("-", "_").replace(" ", "_")


_INDEX: dict[str, str] = {}
for _g in GPUS.values():
    for _key in (_g.name, *_g.aliases, *_g.product_labels):
        _INDEX[_norm(_key)] = _g.name


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by canonical name, plain name or GFD product label (case-insensitive)."""
    key = _norm(str(name))
    if key in _INDEX:
        return GPUS[_INDEX[key]]
    raise KeyError(
        f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))} "
        f"(also plain names like 'h100' and nvidia.com/gpu.product labels like 'NVIDIA-H100-80GB-HBM3')"
    )


# The seeds' "64 GPUs of 192 GB" (NVIDIA, "Demystifying AI Inference Deployments for Trillion
# Parameter LLMs", 2024): a GB200 NVL72 GPU with the blog's 192 GB (decimal) of memory, used by
# the seed-claim tests and the plan-speed and PP-vs-DP benchmarks.
BLOG_GPU: GpuSpec = replace(GPUS["gb200"], name="blog-192gb", memory_gib=192e9 / 2**30)
