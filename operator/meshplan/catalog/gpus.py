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
from typing import Any

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
    # How the GPUs of one NVLink domain talk: "nvswitch" (HGX/DGX boards), "mnnvl" (multi-node NVLink racks),
    # "nvlink-bridge" (PCIe cards with 2- or 4-way bridges: treated as PCIe), "pcie", "infinity-fabric" (AMD),
    # "nvlink-c2c" (Grace Hopper: NVLink to the CPU only). The NVLink/PCIe decision is `nvlink_domain > 1`.
    interconnect: str = ""
    vendor: str = "nvidia"                 # "nvidia" | "amd"
    device_ids: tuple[str, ...] = ()       # PCI device ids (AMD node labeller's amd.com/gpu.device-id)
    mig_compute_slices: int = 0            # MIG compute slices of the full GPU (7 on A100/H100/H200/B200); 0: no MIG

    @property
    def resource(self) -> str:
        """The device plugin's extended resource for a whole GPU of this vendor."""
        return "amd.com/gpu" if self.vendor == "amd" else "nvidia.com/gpu"

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
        return "bf16" if "bf16" in self.tflops else "fp16"

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
            product_labels=("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
            aliases=("a100", "a100_sxm", "a100-80gb", "a100_80gb", "a100-sxm4-80gb"),
            source="NVIDIA A100 datasheet (80GB SXM: 2,039 GB/s, 312 dense BF16 TFLOP/s, "
                   "NVLink3 600 GB/s); DGX A100: 8x ConnectX-6 200 Gb/s (25 GB/s per GPU)",
            interconnect="nvswitch", mig_compute_slices=7,
        ),
        GpuSpec(
            name="h100_sxm",
            memory_gib=79.6, hbm_tb_s=3.35,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=900, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H100-80GB-HBM3", "H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
            aliases=("h100", "h100-sxm", "h100_sxm5", "h100-80gb"),
            source="NVIDIA H100 datasheet (SXM5: 3.35 TB/s, 989 BF16 / 1,979 FP8 dense TFLOP/s, "
                   "NVLink4 900 GB/s); DGX H100: 8x ConnectX-7 400 Gb/s; AIConfigurator systems/h100_sxm.yaml",
            interconnect="nvswitch", mig_compute_slices=7,
        ),
        GpuSpec(
            name="h200_sxm",
            memory_gib=140.4, hbm_tb_s=4.8,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=900, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "NVIDIA-H200-SXM-141GB"),
            aliases=("h200", "h200-sxm"),
            source="NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s, compute as H100 SXM); "
                   "AIConfigurator systems/h200_sxm.yaml",
            interconnect="nvswitch", mig_compute_slices=7,
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
            interconnect="nvswitch", mig_compute_slices=7,
        ),
        GpuSpec(
            name="b300_sxm",
            memory_gib=268.2, hbm_tb_s=8.0,
            tflops={"bf16": 2250, "fp16": 2250, "fp8": 4500, "fp4": 13500},
            nvlink_gb_s=1800, nvlink_domain=8, gpus_per_node=8, nic_gb_s=100,
            family="blackwell_ultra",
            product_labels=("NVIDIA-B300-SXM6-AC", "NVIDIA-B300-SXM6-AC-269GB", "NVIDIA-B300-SXM6-PC", "NVIDIA-B300"),
            aliases=("b300", "b300-sxm", "hgx-b300"),
            source="NVIDIA HGX B300 datasheet (per GPU: 288 GB HBM3e, ~8 TB/s, 108 PF dense FP4 / 8, "
                   "BF16/FP8 as B200; INT8 tensor throughput cut on Blackwell Ultra); "
                   "DGX B300: ConnectX-8 800 Gb/s per GPU",
            interconnect="nvswitch", mig_compute_slices=7,
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
            interconnect="mnnvl", mig_compute_slices=7,
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
            interconnect="mnnvl", mig_compute_slices=7,
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
            interconnect="pcie",
        ),
        GpuSpec(
            name="mi300x",
            memory_gib=192.0, hbm_tb_s=5.3,
            tflops={"bf16": 1307, "fp16": 1307, "fp8": 2615, "int8": 2615},
            nvlink_gb_s=896, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="cdna3",
            product_labels=("AMD-Instinct-MI300X", "AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI300X"),
            aliases=("amd-mi300x", "mi300x_oam"),
            source="AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1,307 BF16 / 2,615 FP8 dense "
                   "TFLOP/s, Infinity Fabric 7 links x 128 GB/s = 896 GB/s bidirectional peak; vendor "
                   "figures disagree); 400 Gb/s NIC per GPU assumed",
            interconnect="infinity-fabric", vendor="amd", device_ids=("74a1",),
        ),
        # --- Ampere, PCIe and 40 GB SXM --------------------------------------------------------
        GpuSpec(
            name="a100_sxm_40gb",
            memory_gib=39.6, hbm_tb_s=1.555,
            tflops={"bf16": 312, "fp16": 312, "int8": 624, "int4": 1248},
            nvlink_gb_s=600, nvlink_domain=8, gpus_per_node=8, nic_gb_s=25,
            family="ampere",
            product_labels=("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
            aliases=("a100-40gb", "a100_40gb", "a100-sxm4-40gb"),
            interconnect="nvswitch", mig_compute_slices=7,
            source="NVIDIA A100 Tensor Core GPU datasheet (40GB SXM: 1,555 GB/s HBM2, 312 dense BF16 / 624 INT8 "
                   "TOPS, NVLink3 600 GB/s, MIG up to 7 instances); nvidia-smi reports 40,536 MiB; DGX A100 NIC",
        ),
        GpuSpec(
            name="a100_pcie_40gb",
            memory_gib=39.6, hbm_tb_s=1.555,
            tflops={"bf16": 312, "fp16": 312, "int8": 624, "int4": 1248},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=25,
            family="ampere",
            product_labels=("NVIDIA-A100-PCIE-40GB", "A100-PCIE-40GB"),
            aliases=("a100-pcie", "a100_pcie"),
            interconnect="nvlink-bridge", mig_compute_slices=7,
            source="NVIDIA A100 datasheet (40GB PCIe: 1,555 GB/s, 312 dense BF16; PCIe Gen4, optional 2-GPU "
                   "NVLink bridge 600 GB/s, treated as PCIe); NIC assumed 200 Gb/s per GPU",
        ),
        GpuSpec(
            name="a100_pcie_80gb",
            memory_gib=80.0, hbm_tb_s=1.935,
            tflops={"bf16": 312, "fp16": 312, "int8": 624, "int4": 1248},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=25,
            family="ampere",
            product_labels=("NVIDIA-A100-80GB-PCIe", "A100-PCIE-80GB"),
            aliases=("a100-80gb-pcie",),
            interconnect="nvlink-bridge", mig_compute_slices=7,
            source="NVIDIA A100 datasheet (80GB PCIe: 1,935 GB/s HBM2e, 312 dense BF16; PCIe Gen4, optional "
                   "2-GPU NVLink bridge, treated as PCIe); NIC assumed 200 Gb/s per GPU",
        ),
        GpuSpec(
            name="a10",
            memory_gib=22.5, hbm_tb_s=0.600,
            tflops={"bf16": 125, "fp16": 125, "int8": 250, "int4": 500},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=4, nic_gb_s=12.5,
            family="ampere",
            product_labels=("NVIDIA-A10", "NVIDIA-A10G"),
            aliases=("a10g",),
            interconnect="pcie",
            source="NVIDIA A10 datasheet (24 GB GDDR6, 600 GB/s, 125 dense BF16 / 250 INT8 TOPS (250/500 sparse), "
                   "PCIe Gen4, no NVLink); nvidia-smi reports 23,028 MiB; A10G (AWS G5) spelled as its label; "
                   "NIC assumed 100 Gb/s per GPU",
        ),
        # --- Hopper PCIe / NVL / Grace Hopper --------------------------------------------------
        GpuSpec(
            name="h100_pcie",
            memory_gib=79.6, hbm_tb_s=2.0,
            tflops={"bf16": 756, "fp16": 756, "fp8": 1513, "int8": 1513},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H100-PCIe", "H100-PCIe"),
            aliases=("h100-pcie",),
            interconnect="nvlink-bridge", mig_compute_slices=7,
            source="NVIDIA H100 datasheet (PCIe: 80 GB HBM2e, 2 TB/s, 756 BF16 / 1,513 FP8 dense TFLOP/s "
                   "(1,513/3,026 sparse), PCIe Gen5, 2-GPU NVLink bridge 600 GB/s treated as PCIe)",
        ),
        GpuSpec(
            name="h100_nvl",
            memory_gib=93.6, hbm_tb_s=3.9,
            tflops={"bf16": 835, "fp16": 835, "fp8": 1671, "int8": 1671},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-H100-NVL",),
            aliases=("h100-nvl",),
            interconnect="nvlink-bridge", mig_compute_slices=7,
            source="NVIDIA H100 datasheet (NVL: 94 GB HBM3, 3.9 TB/s, 835 BF16 / 1,671 FP8 dense TFLOP/s "
                   "(1,671/3,341 sparse), PCIe Gen5, 2-GPU NVLink bridge 600 GB/s treated as PCIe); nvidia-smi "
                   "reports 95,830 MiB",
        ),
        GpuSpec(
            name="h200_nvl",
            memory_gib=140.4, hbm_tb_s=4.8,
            tflops={"bf16": 835, "fp16": 835, "fp8": 1671, "int8": 1671},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=25,
            family="hopper",
            product_labels=("NVIDIA-H200-NVL",),
            aliases=("h200-nvl",),
            interconnect="nvlink-bridge", mig_compute_slices=7,
            source="NVIDIA H200 datasheet (NVL: 141 GB HBM3e, 4.8 TB/s, 835 BF16 / 1,671 FP8 dense TFLOP/s "
                   "(1,671/3,341 sparse), PCIe Gen5, 2- or 4-way NVLink bridge 900 GB/s treated as PCIe); "
                   "H200 NVL enterprise reference architecture: 2:1 GPU:NIC (400 Gb/s), 25 GB/s per GPU",
        ),
        GpuSpec(
            name="gh200_96gb",
            memory_gib=95.6, hbm_tb_s=4.0,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=1, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-GH200-480GB", "NVIDIA-GH200-96GB-HBM3"),
            aliases=("gh200", "gh200-480gb"),
            interconnect="nvlink-c2c", mig_compute_slices=7,
            source="NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3, 4 TB/s, compute as H100 SXM: "
                   "989 BF16 / 1,979 FP8 dense; NVLink-C2C 900 GB/s to the Grace CPU, no GPU-GPU NVLink "
                   "outside NVL32 racks; one superchip per node); nvidia-smi reports 97,871 MiB; 400 Gb/s NIC",
        ),
        GpuSpec(
            name="gh200_144gb",
            memory_gib=134.1, hbm_tb_s=4.9,
            tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=1, nic_gb_s=50,
            family="hopper",
            product_labels=("NVIDIA-GH200-144G-HBM3e", "NVIDIA-GH200-144GB-HBM3e"),
            aliases=("gh200-144gb",),
            interconnect="nvlink-c2c", mig_compute_slices=7,
            source="NVIDIA GH200 datasheet (144 GB HBM3e = 134.1 GiB, 4.9 TB/s, compute as H100 SXM; NVLink-C2C "
                   "to Grace only); the node's nvidia.com/gpu.memory label wins when present",
        ),
        # --- Ada / Turing / Blackwell PCIe -----------------------------------------------------
        GpuSpec(
            name="l4",
            memory_gib=22.5, hbm_tb_s=0.300,
            tflops={"bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5, "int4": 242.5},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=12.5,
            family="ada",
            product_labels=("NVIDIA-L4",),
            aliases=("l4-24gb",),
            interconnect="pcie",
            source="NVIDIA L4 datasheet (24 GB GDDR6, 300 GB/s, 121 BF16 / 242.5 FP8 dense TFLOP/s (242/485 "
                   "sparse), PCIe Gen4 x16, no NVLink); nvidia-smi reports 23,034 MiB; NIC assumed 100 Gb/s",
        ),
        GpuSpec(
            name="l40",
            memory_gib=45.0, hbm_tb_s=0.864,
            tflops={"bf16": 181, "fp16": 181, "fp8": 362, "int8": 362, "int4": 362},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=25,
            family="ada",
            product_labels=("NVIDIA-L40",),
            aliases=("l40-48gb",),
            interconnect="pcie",
            source="NVIDIA L40 datasheet (48 GB GDDR6, 864 GB/s, 181 BF16 / 362 FP8 dense TFLOP/s (362/724 "
                   "sparse), PCIe Gen4 x16, no NVLink); NIC assumed 200 Gb/s per GPU",
        ),
        GpuSpec(
            name="t4",
            memory_gib=15.0, hbm_tb_s=0.320,
            tflops={"fp16": 65, "int8": 130, "int4": 260},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=4, nic_gb_s=6.25,
            family="turing",
            product_labels=("Tesla-T4", "NVIDIA-T4"),
            aliases=("tesla-t4",),
            interconnect="pcie",
            source="NVIDIA T4 datasheet (16 GB GDDR6, 320 GB/s, 65 FP16 mixed-precision TFLOP/s, 130 INT8 / "
                   "260 INT4 TOPS, no BF16/FP8, PCIe Gen3, no NVLink); nvidia-smi reports 15,360 MiB; "
                   "NIC assumed 50 Gb/s per GPU",
        ),
        GpuSpec(
            name="rtx_pro_6000",
            memory_gib=95.6, hbm_tb_s=1.597,
            tflops={"bf16": 500, "fp16": 500, "fp8": 1000, "int8": 1000, "fp4": 2000},
            nvlink_gb_s=0, nvlink_domain=1, gpus_per_node=8, nic_gb_s=50,
            family="blackwell",
            product_labels=("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",),
            aliases=("rtx-pro-6000", "rtx_pro_6000_blackwell"),
            interconnect="pcie", mig_compute_slices=4,
            source="NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet (96 GB GDDR7, 1,597 GB/s, 4 PFLOP/s "
                   "FP4 sparse -> 2,000 dense; FP8 and BF16 each half the previous step; PCIe Gen5, no NVLink, "
                   "MIG up to 4 instances); nvidia-smi reports 97,887 MiB",
        ),
        # --- AMD Instinct ----------------------------------------------------------------------
        GpuSpec(
            name="mi325x",
            memory_gib=256.0, hbm_tb_s=6.0,
            tflops={"bf16": 1307, "fp16": 1307, "fp8": 2615, "int8": 2615},
            nvlink_gb_s=896, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="cdna3",
            product_labels=("AMD_Instinct_MI325X_OAM", "AMD_Instinct_MI325X", "AMD_Instinct_MI325_OAM"),
            aliases=("amd-mi325x",),
            interconnect="infinity-fabric", vendor="amd", device_ids=("74a5",),
            source="AMD Instinct MI325X datasheet (256 GB HBM3E, 6 TB/s, compute as MI300X: 1,307 BF16 / 2,615 "
                   "FP8 dense TFLOP/s; Infinity Fabric 7 x 128 GB/s = 896 GB/s, 8-GPU platform); PCI id 74a5 "
                   "(ROCm/k8s-device-plugin cmd/k8s-node-labeller/amdgpu.ids); 400 Gb/s NIC per GPU assumed",
        ),
        GpuSpec(
            name="mi355x",
            memory_gib=288.0, hbm_tb_s=8.0,
            tflops={"bf16": 2500, "fp16": 2500, "fp8": 5000, "int8": 5000, "fp4": 10000},
            nvlink_gb_s=1075, nvlink_domain=8, gpus_per_node=8, nic_gb_s=50,
            family="cdna4",
            product_labels=("AMD_Instinct_MI355X_OAM", "AMD_Instinct_MI355X"),
            aliases=("amd-mi355x",),
            interconnect="infinity-fabric", vendor="amd", device_ids=("75a3",),
            source="AMD Instinct MI355X datasheet (288 GB HBM3E, 8 TB/s, 2.5 PF BF16 / 5 PF FP8 / 10 PF MXFP4 "
                   "dense; Infinity Fabric 7 x 153.6 GB/s = 1,075 GB/s, 8-GPU platform); PCI id 75a3 "
                   "(ROCm/k8s-device-plugin amdgpu.ids); 400 Gb/s NIC per GPU assumed",
        ),
    )
}


def _norm(s: str) -> str:
    return s.strip().lower().replace("-", "_").replace(" ", "_")


_INDEX: dict[str, str] = {}
_DEVICE_IDS: dict[str, str] = {}
_CUSTOM: dict[str, GpuSpec] = {}


def _index(g: GpuSpec) -> None:
    for _key in (g.name, *g.aliases, *g.product_labels):
        _INDEX[_norm(_key)] = g.name
    for d in g.device_ids:
        _DEVICE_IDS[d.lower()] = g.name


for _g in GPUS.values():
    _index(_g)


# Derived GPUs (what a node really offers of a catalogue product) are named so that the name alone
# rebuilds them: `<base>@<MiB>mib` (the node's memory label differs from the catalogue),
# `<base>/mig-<profile>` (a MIG slice), `<base>/shared-<n>` (one of n time-sliced replicas), combinable
# (`a100_sxm_40gb/mig-1g.5gb@4864mib`). `get_gpu` parses them, so a plan's `gpu` stays a plain string.
MEMORY_TOLERANCE = 0.02   # a memory label within 2% of the catalogue is the same product (MiB vs GiB rounding)


def _derive(name: str) -> GpuSpec | None:
    base, _, mem = name.partition("@")
    parts = base.split("/")
    try:
        spec = get_gpu(parts[0])
    except KeyError:
        return None
    full_mem = spec.memory_gib
    for mod in parts[1:]:
        if mod.startswith("mig-"):
            profile = mod[4:]
            try:
                g_slices = int(profile.split("g.", 1)[0])
                slice_gb = float(profile.split("g.", 1)[1].rstrip("gb"))
            except (IndexError, ValueError):
                return None
            frac = g_slices / max(1, spec.mig_compute_slices or 7)
            mem_gib = slice_gb * 1e9 / 2**30
            spec = replace(spec, memory_gib=mem_gib, hbm_tb_s=spec.hbm_tb_s * min(1.0, mem_gib / full_mem),
                           tflops={k: v * frac for k, v in spec.tflops.items()}, nvlink_gb_s=0, nvlink_domain=1,
                           gpus_per_node=1, interconnect="mig", mig_compute_slices=0)
        elif mod.startswith("shared-"):
            try:
                n = max(1, int(mod[7:]))
            except ValueError:
                return None
            spec = replace(spec, memory_gib=spec.memory_gib / n, hbm_tb_s=spec.hbm_tb_s / n,
                           tflops={k: v / n for k, v in spec.tflops.items()}, nvlink_gb_s=0, nvlink_domain=1,
                           gpus_per_node=1, interconnect="time-sliced", mig_compute_slices=0)
        else:
            return None
    if mem:
        try:
            mib = int(mem.removesuffix("mib"))
        except ValueError:
            return None
        spec = replace(spec, memory_gib=mib / 1024)
    return replace(spec, name=name, product_labels=(), aliases=(),
                   source=f"{spec.source}; derived for {name} from the node's labels (meshplan.topology)")


def is_fractional(name: str | None) -> bool:
    """Whether a (derived) GPU name is a MIG slice or a time-sliced replica: a GPU that is never part of a
    multi-GPU group (its group is 1 GPU). Reads meshplan's own name grammar (above), not a product label."""
    return bool(name) and ("/mig-" in name or "/shared-" in name)


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by canonical name, plain name, GFD product label (case-insensitive), a declared
    custom GPU, or a derived name (`h100_sxm@40536mib`, `a100_sxm_40gb/mig-1g.5gb`, `l4/shared-4`)."""
    raw = str(name).strip()
    if raw in _CUSTOM:
        return _CUSTOM[raw]
    key = _norm(raw)
    if key in _INDEX:
        n = _INDEX[key]
        return GPUS[n] if n in GPUS else _CUSTOM[n]
    if "@" in raw or "/" in raw:
        derived = _derive(raw.lower())
        if derived is not None:
            return derived
    # A product label of a MIG slice or a time-sliced GPU as GFD writes it (`A100-SXM4-40GB-MIG-1g.5gb`,
    # `Tesla-T4-SHARED`): the slice / a shared replica of the catalogue GPU (replicas unknown here: 1).
    base, shared = (raw[:-len("-SHARED")], True) if raw.upper().endswith("-SHARED") else (raw, False)
    base, _, profile = base.partition("-MIG-")
    if (shared or profile) and _norm(base) in _INDEX:
        derived = _derive(_INDEX[_norm(base)] + (f"/mig-{profile.lower()}" if profile else "")
                          + ("/shared-1" if shared else ""))
        if derived is not None:
            return derived
    raise KeyError(
        f"unknown GPU {name!r}; known: {', '.join(sorted({**GPUS, **_CUSTOM}))} "
        f"(also plain names like 'h100' and nvidia.com/gpu.product labels like 'NVIDIA-H100-80GB-HBM3'); "
        f"declare others with the chart value gpuCatalog or `meshplan plan --gpu-catalog FILE`"
    )


def gpu_for_device_id(device_id: str) -> GpuSpec | None:
    """An AMD GPU by its PCI device id (`amd.com/gpu.device-id`, e.g. 74a1), None when unknown."""
    n = _DEVICE_IDS.get(str(device_id).strip().lower().removeprefix("0x"))
    if n is None:
        return None
    return GPUS[n] if n in GPUS else _CUSTOM[n]


def with_memory(spec: GpuSpec, memory_mib: int) -> GpuSpec:
    """`spec` with the memory a node reports (`nvidia.com/gpu.memory` MiB), when it differs by more than
    `MEMORY_TOLERANCE`; else `spec` itself."""
    if memory_mib <= 0 or abs(memory_mib / 1024 - spec.memory_gib) <= MEMORY_TOLERANCE * spec.memory_gib:
        return spec
    return get_gpu(f"{spec.name.split('@')[0]}@{int(memory_mib)}mib")


# ---- user-declared GPUs (chart value gpuCatalog, `meshplan plan --gpu-catalog FILE`) ------------------

_CUSTOM_FIELDS = {
    "name": str, "productLabels": list, "deviceIds": list, "memoryGiB": float, "memoryBandwidthTBs": float,
    "tflops": dict, "nvlinkGBs": float, "nvlinkDomain": int, "gpusPerNode": int, "nicGBs": float,
    "interconnect": str, "vendor": str, "family": str, "source": str, "migComputeSlices": int,
}
_REQUIRED = ("name", "productLabels", "memoryGiB", "memoryBandwidthTBs", "tflops")
_DTYPES = ("fp4", "int4", "fp8", "int8", "fp16", "bf16")


def parse_gpu_catalog(doc: Any, origin: str = "gpuCatalog") -> list[GpuSpec]:
    """User-declared GPUs from a mapping `{gpus: [...]}` (or the list itself); raises ValueError naming the
    field and the fix. Each entry:

        name: foo_96gb                          # catalogue name (letters, digits, _ and -)
        productLabels: [NVIDIA-Foo-96GB]        # nvidia.com/gpu.product / amd.com/gpu.product-name values
        deviceIds: []                           # optional: AMD PCI device ids
        memoryGiB: 96                           # per GPU
        memoryBandwidthTBs: 3.35                # TB/s
        tflops: {bf16: 990, fp8: 1979}          # DENSE TFLOP/s per dtype (fp4 int4 fp8 int8 fp16 bf16)
        nvlinkGBs: 900                          # per GPU, bidirectional; 0 = PCIe only (default 0)
        nvlinkDomain: 8                         # GPUs that share NVLink (default 1)
        gpusPerNode: 8                          # default 8
        nicGBs: 50                              # scale-out GB/s per GPU, one direction (default 25)
        interconnect: nvswitch                  # free text (default pcie / nvswitch from nvlinkDomain)
        vendor: nvidia                          # nvidia | amd (default nvidia)
        source: "vendor datasheet URL"          # where the numbers come from
    """
    entries = doc.get("gpus", doc) if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise ValueError(f"{origin}: expected a list of GPUs under 'gpus:' (see docs/install.md, gpuCatalog)")
    out = []
    for i, e in enumerate(entries):
        where = f"{origin}.gpus[{i}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: expected a mapping with {', '.join(_REQUIRED)}")
        for k in e:
            if k not in _CUSTOM_FIELDS:
                raise ValueError(f"{where}.{k}: unknown field; known: {', '.join(_CUSTOM_FIELDS)}")
        for k in _REQUIRED:
            if k not in e:
                raise ValueError(f"{where}.{k}: required (the GPU's {k}); see docs/install.md, gpuCatalog")
        try:
            name = str(e["name"]).strip()
            if not name or any(c in name for c in "@/ "):
                raise ValueError("a name without '@', '/' or spaces")
            if name in GPUS:
                raise ValueError(f"a name not already in the built-in catalogue ({name!r} is)")
            labels = [str(x) for x in e["productLabels"]]
            if not labels and not e.get("deviceIds"):
                raise ValueError("at least one product label")
            tflops = {str(k).lower(): float(v) for k, v in dict(e["tflops"]).items()}
            bad = [k for k in tflops if k not in _DTYPES]
            if bad or not tflops or any(v <= 0 for v in tflops.values()):
                raise ValueError(f"tflops: positive dense TFLOP/s keyed by {', '.join(_DTYPES)} (got {bad or tflops})")
            mem = float(e["memoryGiB"])
            bw = float(e["memoryBandwidthTBs"])
            if mem <= 0 or bw <= 0:
                raise ValueError("memoryGiB and memoryBandwidthTBs > 0")
            domain = int(e.get("nvlinkDomain", 1))
            nvl = float(e.get("nvlinkGBs", 0))
            if domain < 1 or (domain > 1 and nvl <= 0):
                raise ValueError("nvlinkDomain >= 1, and nvlinkGBs > 0 when nvlinkDomain > 1")
            vendor = str(e.get("vendor", "nvidia"))
            if vendor not in ("nvidia", "amd"):
                raise ValueError("vendor: nvidia or amd")
            spec = GpuSpec(
                name=name, memory_gib=mem, hbm_tb_s=bw, tflops=tflops,
                nvlink_gb_s=nvl if domain > 1 else 0, nvlink_domain=domain,
                gpus_per_node=int(e.get("gpusPerNode", 8)), nic_gb_s=float(e.get("nicGBs", 25)),
                family=str(e.get("family", "custom")), product_labels=tuple(labels),
                source=str(e.get("source", f"declared by the user in {origin}")),
                interconnect=str(e.get("interconnect", "nvswitch" if domain > 1 else "pcie")),
                vendor=vendor, device_ids=tuple(str(d).lower() for d in e.get("deviceIds", ())),
                mig_compute_slices=int(e.get("migComputeSlices", 0)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: needs {exc}") from None
        out.append(spec)
    return out


def register_custom_gpus(specs: list[GpuSpec]) -> None:
    """Make declared GPUs known to `get_gpu` (done once at start: operator settings, CLI flag)."""
    for g in specs:
        _CUSTOM[g.name] = g
        _index(g)


def clear_custom_gpus() -> None:
    """Forget every declared GPU (tests; a restarted operator reads its catalogue again)."""
    for g in _CUSTOM.values():
        for key in (g.name, *g.aliases, *g.product_labels):
            _INDEX.pop(_norm(key), None)
        for d in g.device_ids:
            _DEVICE_IDS.pop(d.lower(), None)
    _CUSTOM.clear()
    for g in GPUS.values():     # a declaration may have shadowed a built-in label: restore the built-ins
        _index(g)


def load_gpu_catalog(path: str) -> list[GpuSpec]:
    """Read, check and register a GPU catalogue extension file (YAML or JSON)."""
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    specs = parse_gpu_catalog(doc or {"gpus": []}, origin=path)
    register_custom_gpus(specs)
    return specs


# The seeds' "64 GPUs of 192 GB" (NVIDIA, "Demystifying AI Inference Deployments for Trillion
# Parameter LLMs", 2024): a GB200 NVL72 GPU with the blog's 192 GB (decimal) of memory, used by
# the seed-claim tests and the plan-speed and PP-vs-DP benchmarks.
BLOG_GPU: GpuSpec = replace(GPUS["gb200"], name="blog-192gb", memory_gib=192e9 / 2**30)
