"""GPU catalog: peak compute, HBM and scale-up bandwidth of common training accelerators.

Every figure is in SI units (FLOP/s, bytes, bytes/second) and carries its source, named by
its short name in docs/references.md ("GPUs and datasheets"), with that file's labels:
[C] confirmed in the source, [C2] confirmed via a secondary copy, [D] derived by arithmetic,
[U] unconfirmed — a default to override with a calibration or topology file, never a test
oracle.

Conventions
    * FLOP/s are *dense* peaks (no 2:4 sparsity), keyed by precision: ``fp32`` (vector/FMA),
      ``tf32``, ``fp16``, ``bf16`` and ``fp8`` where the device has it.
    * HBM capacity is the total the driver reports (nvidia-smi's memory ``Total`` on recent
      drivers, rocm-smi's ``VRAM Total Memory`` for MI300X), not the marketed figure: NVIDIA's
      "80GB" is not 80e9 B (an H100 shows 81,559 MiB = 79.6 GiB = 85.5e9 B), and reading the
      marketed GB as 1e9 B understated it by ≈ 6.5 %. nvidia-smi's unit MiB = 2**20 B is
      :data:`MiB`; the sources are "Driver-reported HBM totals" in docs/references.md. What
      CUDA lets a process allocate is slightly less again (``cudaGetDeviceProperties`` on an
      A100-SXM4-40GB: 40,339 MiB of nvidia-smi's 40,960, 1.5 % less, bottlerocket#3873). The
      memory model does not deduct that reserve: like the CUDA context and allocator
      fragmentation, it is for the user to set aside with the ``overhead`` memory option
      (:class:`dessim.workload.transformer.memory.MemoryOptions`, the ``memory.overhead``
      override of a plan or sweep point; default 0). A device
      without a public driver-reported total keeps its marketed figure and says so ([U]) in
      its ``hbm_capacity`` source.
    * ``scaleup_bw`` is the per-GPU NVLink / Infinity Fabric bandwidth **per direction**
      (half the marketed bidirectional figure; "Interconnect generations" in docs/references.md).
    * ``scaleup_link`` and ``host_link`` name entries of :data:`dessim.catalog.links.LINK_TECHS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dessim.errors import SpecError

__all__ = ["GPUSpec", "DEVICES", "PRECISIONS", "get_device", "device_names"]

#: Precision keys used in :attr:`GPUSpec.flops`.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")

T = 1e12  # TFLOP/s -> FLOP/s
GB = 1e9  # GB -> bytes, GB/s -> B/s
MiB = 2.0 ** 20  # MiB (nvidia-smi's unit) -> bytes


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator model. All figures SI; ``sources`` maps a field name to its source."""

    name: str                          #: canonical catalog key, e.g. "H100"
    flops: Mapping[str, float]         #: dense peak FLOP/s by precision (see PRECISIONS)
    hbm_capacity: float                #: bytes, the total the driver reports (see Conventions)
    hbm_bw: float                      #: bytes/second
    scaleup_bw: float                  #: per-GPU NVLink/IF bytes/second per direction
    scaleup_link: str                  #: LINK_TECHS key of the scale-up fabric
    host_link: str                     #: LINK_TECHS key of the host (PCIe) interface
    aliases: tuple[str, ...] = ()      #: other accepted names (case-insensitive)
    sources: Mapping[str, str] = field(default_factory=dict)
    #: architecture generation (volta, ampere, hopper, blackwell, cdna3): which rows of
    #: NCCL's tuning tables apply, and which kernels exist (FP8, FlashAttention-3)
    generation: str = ""

    @property
    def sixteen_bit(self) -> str:
        """The 16-bit precision of its tensor cores: bf16, or fp16 on GPUs without bf16."""
        return "bf16" if "bf16" in self.flops else "fp16"

    def peak_flops(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s at ``precision``; a SpecError if the device lacks it."""
        try:
            return self.flops[precision]
        except KeyError:
            have = ", ".join(self.flops)
            raise SpecError(f"device {self.name!r} has no {precision!r} peak "
                              f"(it has: {have})") from None


_GENERATION = {"V100": "volta", "A100-40GB": "ampere", "A100-80GB": "ampere", "H100": "hopper",
               "H800": "hopper", "H200": "hopper", "B200": "blackwell", "GB200": "blackwell",
               "MI300X": "cdna3"}


def _spec(name: str, flops: dict[str, float], hbm: float, hbm_bw: float, scaleup: float,
          scaleup_link: str, host_link: str, aliases: tuple[str, ...],
          sources: dict[str, str]) -> GPUSpec:
    return GPUSpec(name, MappingProxyType(dict(flops)), hbm, hbm_bw, scaleup, scaleup_link,
                   host_link, aliases, MappingProxyType(dict(sources)), _GENERATION[name])


#: Appended to an [U] source: what to do about the unconfirmed default.
_UNCONFIRMED = "unconfirmed; override with a calibration or topology file"

_LIST = [
    _spec("V100", {"fp32": 15.7 * T, "fp16": 125 * T},
          32768 * MiB, 900 * GB, 150 * GB, "nvlink2", "pcie3",
          ("v100-sxm2", "v100-32gb", "tesla-v100"),
          {"fp16": "[C2] V100 datasheet (125 TF tensor FP16)",
           "fp32": "[C2] V100 datasheet (15.7 TF FP32); no TF32/BF16/FP8 on Volta",
           "hbm_capacity": "[C] Driver-reported HBM totals: Wan-Video/Wan2.1#5 (nvidia-smi, "
                           "driver 525, Tesla V100-SXM2 300 W: 32768MiB); V100 datasheet "
                           "(16/32 GB HBM2; 32 GB variant)",
           "hbm_bw": "[C2] V100 datasheet (900 GB/s)",
           "scaleup_bw": "[C2] Interconnect generations (NVLink2: 6 links x 25 GB/s uni = 150)",
           "host_link": "[C2] V100 datasheet (PCIe 3.0 host interface)"}),
    _spec("A100-40GB", {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T},
          40960 * MiB, 1555 * GB, 300 * GB, "nvlink3", "pcie4",
          ("a100-sxm4-40gb", "a100-40g"),
          {"fp16": "[C2] glennklockwood A100 (312 dense / 624 sparse)",
           "bf16": "[C2] glennklockwood A100 (312 dense)",
           "fp32": "[C2] glennklockwood A100 (19.5 TF FP32)",
           "tf32": "[C2] glennklockwood A100 (156 TF TF32 dense); A100 has no FP8",
           "hbm_capacity": "[C] Driver-reported HBM totals: bottlerocket-core-kit#834 "
                           "(nvidia-smi, driver 580, A100-SXM4-40GB: 40960MiB), "
                           "modal-client#2797 (A100 40GB: 40960MiB); glennklockwood A100 "
                           "(40 GB HBM2)",
           "hbm_bw": "[C2] glennklockwood A100 (A100 40GB HBM2: 1,555 GB/s)",
           "scaleup_bw": "[C2] glennklockwood A100 ('300+300 GB/s'); Interconnect generations "
                         "(NVLink3 12 x 25 GB/s uni = 300)",
           "host_link": "[C2] glennklockwood A100 (PCIe Gen4 32+32 GB/s)"}),
    _spec("A100-80GB", {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T},
          81920 * MiB, 2039 * GB, 300 * GB, "nvlink3", "pcie4",
          ("a100", "a100-80g", "a100-sxm4-80gb", "a100-sxm"),
          {"fp16": "[C2] glennklockwood A100 (312 dense)",
           "bf16": "[C2] glennklockwood A100 (312 dense)",
           "fp32": "[C2] glennklockwood A100 (19.5 TF FP32)",
           "tf32": "[C2] glennklockwood A100 (156 TF TF32 dense); no FP8",
           "hbm_capacity": "[C] Driver-reported HBM totals: modal-client#2797 "
                           "(nvidia-smi, A100 80GB: 81920MiB); glennklockwood A100 (80 GB "
                           "HBM2e)",
           "hbm_bw": "[C2] glennklockwood A100 (2,039 GB/s)",
           "scaleup_bw": "[C2] glennklockwood A100 ('300+300 GB/s'); Interconnect generations",
           "host_link": "[C2] glennklockwood A100 (PCIe Gen4 32+32 GB/s)"}),
    _spec("H100", {"fp32": 66.9 * T, "tf32": 494.7 * T, "fp16": 989.4 * T, "bf16": 989.4 * T,
                   "fp8": 1978.9 * T},
          81559 * MiB, 3350 * GB, 450 * GB, "nvlink4", "pcie5",
          ("h100-sxm", "h100-sxm5", "h100-80gb", "h100-sxm5-80gb"),
          {"fp16": "[C2] glennklockwood H100 (989.4 dense; the datasheet's figures are with "
                   "sparsity, dense is half)",
           "bf16": "[C2] glennklockwood H100 (989.4 dense)",
           "fp8": "[C2] glennklockwood H100 (1,978.9 dense)",
           "fp32": "[C2] glennklockwood H100 (66.9 TF FP32 vector)",
           "tf32": "[C2] glennklockwood H100 (494.7 dense = 989.4 sparse / 2)",
           "hbm_capacity": "[C] Driver-reported HBM totals: nccl#1264, gpu-burn#114 "
                           "(nvidia-smi, driver 550, H100 80GB HBM3: 81559MiB), "
                           "modal-client#2797 (H100: 81559MiB = 85.52e9 B); glennklockwood "
                           "H100 (80 GB HBM3)",
           "hbm_bw": "[C2] glennklockwood H100 (3.35 TB/s)",
           "scaleup_bw": "[C] nccl-tests#212 (NVLink4 450 GB/s uni); glennklockwood H100 "
                         "(900 GB/s bidir)",
           "host_link": "[C2] glennklockwood H100 (PCIe Gen5 128 GB/s bidir)"}),
    _spec("H800", {"fp32": 66.9 * T, "tf32": 494.7 * T, "fp16": 989.4 * T, "bf16": 989.4 * T,
                   "fp8": 1978.9 * T},
          81559 * MiB, 3350 * GB, 200 * GB, "nvlink4_h800", "pcie5",
          ("h800-sxm", "h800-sxm5", "h800-80gb"),
          {"fp16": "[C2] H800 SXM datasheet (1,979 TF sparse = 989 dense, as H100: the same "
                   "GH100 die; only NVLink and FP64 are cut)",
           "bf16": "[C2] H800 SXM datasheet (989 dense, as H100)",
           "fp8": "[C2] H800 SXM datasheet (3,958 sparse = 1,979 dense, as H100)",
           "fp32": "[C2] H800 SXM datasheet (67 TF FP32, as H100)",
           "tf32": "[C2] H800 SXM datasheet (989 sparse = 494.7 dense, as H100)",
           "hbm_capacity": "[D] H800 SXM datasheet (80 GB HBM3, the GH100 and memory of H100) "
                           "-> H100's 81559MiB (Driver-reported HBM totals); no citable "
                           "H800 nvidia-smi output found",
           "hbm_bw": "[C2] H800 SXM datasheet (3.35 TB/s)",
           "scaleup_bw": "[C2] H800 SXM datasheet (NVLink 400 GB/s bidirectional = 200 uni, "
                         "8 NVLink4 links instead of 18); DeepSeek-V3 report §3.2.2 measures "
                         "≈160 GB/s achieved",
           "host_link": "[C2] H800 SXM datasheet (PCIe Gen5 128 GB/s bidir)"}),
    _spec("H200", {"fp32": 66.9 * T, "tf32": 494.7 * T, "fp16": 989.4 * T, "bf16": 989.4 * T,
                   "fp8": 1978.9 * T},
          143771 * MiB, 4800 * GB, 450 * GB, "nvlink4", "pcie5",
          ("h200-sxm", "h200-141gb"),
          {"fp16": "[C2] H200 specs (the GH100 die of H100); ml-engineering accelerators "
                   "(H200 = H100: 989 dense)",
           "bf16": "[C2] H200 specs, ml-engineering accelerators (same as H100)",
           "fp8": "[C2] H200 specs, ml-engineering accelerators (same as H100: 1,979 dense)",
           "fp32": "[C2] ml-engineering accelerators (same as H100; glennklockwood H100: 66.9)",
           "tf32": "[C2] ml-engineering accelerators (same as H100; glennklockwood H100: 494.7)",
           "hbm_capacity": "[C] Driver-reported HBM totals: sglang#3196 (nvidia-smi, "
                           "driver 550, 8x H200: 143771MiB); H200 specs (141 GB HBM3e)",
           "hbm_bw": "[C2] H200 specs (4.8 TB/s)",
           "scaleup_bw": "[C2] H200 specs (NVLink4 900 bidir = 450 uni)",
           "host_link": "[U] PCIe Gen5 like H100; " + _UNCONFIRMED}),
    _spec("B200", {"fp32": 80 * T, "tf32": 1100 * T, "fp16": 2250 * T, "bf16": 2250 * T,
                   "fp8": 4500 * T},
          183359 * MiB, 8000 * GB, 900 * GB, "nvlink5", "pcie5",
          ("b200-sxm", "hgx-b200", "b200-192gb"),
          {"fp16": "[C2] glennklockwood B200 (HGX B200 1,000 W: 2,250 dense / 4,500 sparse)",
           "bf16": "[C2] glennklockwood B200 (2,250 dense)",
           "fp8": "[C2] glennklockwood B200 (4,500 dense)",
           "fp32": "[C2] glennklockwood B200 (HGX B200: 80 TF FP32)",
           "tf32": "[C2] glennklockwood B200 (HGX B200: 1,100 dense / 2,200 sparse TF32)",
           "hbm_capacity": "[C] Driver-reported HBM totals: TensorRT-LLM#10278 "
                           "(nvidia-smi, driver 580, 8x B200: 183359MiB = 179.1 GiB = "
                           "192.3e9 B); glennklockwood B200 (192 GB HBM3e, 8 stacks)",
           "hbm_bw": "[C2] glennklockwood B200 (8 TB/s)",
           "scaleup_bw": "[C] DGX SuperPOD GB200 RA (NVLink5 18 links, 1.8 TB/s bidir = 900 "
                         "uni); Interconnect generations (18 x 50 GB/s uni)",
           "host_link": "[U] PCIe Gen5 host interface assumed (HGX B200 hosts; glennklockwood "
                        "B200 lists PCIe Gen6 on the GPU); " + _UNCONFIRMED}),
    _spec("GB200", {"fp32": 90 * T, "tf32": 1250 * T, "fp16": 2500 * T, "bf16": 2500 * T,
                    "fp8": 5000 * T},
          186 * GB, 8000 * GB, 900 * GB, "nvlink5", "pcie6",
          ("gb200-nvl72", "gb200-superchip", "b200-gb200"),
          {"fp16": "[D] GB200 NVL72 datasheet (rack: 360 PF FP16/BF16 with sparsity -> 180 "
                   "dense / 72 GPUs = 2,500 TF; the 1,200 W Blackwell of the Grace-Blackwell "
                   "superchip clocks higher than HGX B200)",
           "bf16": "[D] GB200 NVL72 datasheet (360 PF sparse / 2 / 72 = 2,500 dense)",
           "fp8": "[D] GB200 NVL72 datasheet (720 PF sparse / 2 / 72 = 5,000 dense)",
           "fp32": "[D] GB200 NVL72 datasheet (6,480 TF FP32 / 72 = 90)",
           "tf32": "[D] GB200 NVL72 datasheet (180 PF sparse / 2 / 72 = 1,250 dense)",
           "hbm_capacity": "[U] no public driver-reported total found: the marketed figure is "
                           "kept, GB200 NVL72 datasheet (13.4 TB HBM3e / 72 = 186 GB, GB = "
                           "1e9 B); " + _UNCONFIRMED,
           "hbm_bw": "[D] GB200 NVL72 datasheet (576 TB/s / 72 = 8 TB/s)",
           "scaleup_bw": "[D] GB200 NVL72 datasheet (130 TB/s NVLink / 72 = 1.8 TB/s bidir = "
                         "900 uni); DGX SuperPOD GB200 RA (NVLink5 18 links)",
           "host_link": "[U] PCIe Gen6 to its NICs (glennklockwood B200 lists PCIe Gen6 on the "
                        "GPU); the CPU link is NVLink-C2C (links.nvlink_c2c, used by the "
                        "gb200-nvl72 preset); " + _UNCONFIRMED}),
    _spec("MI300X", {"fp32": 163.4 * T, "tf32": 653.7 * T, "fp16": 1307.4 * T, "bf16": 1307.4 * T,
                     "fp8": 2614.9 * T},
          196592 * MiB, 5300 * GB, 448 * GB, "if_mi300x", "pcie5",
          ("mi300", "amd-mi300x", "instinct-mi300x"),
          {"fp16": "[C2] MI300X specs, ml-engineering accelerators (~1.3 PF); exact 1,307.4 [U] "
                   "AMD datasheet",
           "bf16": "[C2] MI300X specs, ml-engineering accelerators (~1.3 PF); exact 1,307.4 [U] "
                   "AMD datasheet",
           "fp8": "[C2] MI300X specs, ml-engineering accelerators (~2.6 PF); exact 2,614.9 [U] "
                  "AMD datasheet",
           "fp32": "[C2] ml-engineering accelerators (AMD: 163.4 TF FP32)",
           "tf32": "[C2] ml-engineering accelerators (AMD: 653.7 TF TF32 dense)",
           "hbm_capacity": "[C] Driver-reported HBM totals: ROCm#4750 (rocm-smi, ROCm "
                           "6.3-6.4, MI300X: VRAM Total Memory 206141652992 B = 196592 "
                           "MiB); MI300X specs (192 GB HBM3)",
           "hbm_bw": "[C2] MI300X specs (5.3 TB/s)",
           "scaleup_bw": "[C2] MI300X specs (7 IF links x 128 GB/s bidir = 896 bidir, "
                         "448 uni; one link to each of the 7 peers)",
           "host_link": "[C2] MI300X specs (PCIe Gen5 x16 host interface)"}),
]

#: Every GPU of the catalog by canonical name (read-only).
DEVICES: Mapping[str, GPUSpec] = MappingProxyType({d.name: d for d in _LIST})

_ALIASES: dict[str, str] = {}
for _d in _LIST:
    for _alias in (_d.name, *_d.aliases):
        key = _alias.lower()
        assert key not in _ALIASES, f"duplicate device alias {_alias!r}"
        _ALIASES[key] = _d.name


def device_names() -> tuple[str, ...]:
    """Canonical device names in catalog order."""
    return tuple(DEVICES)


def get_device(name: str | GPUSpec, what: str = "device") -> GPUSpec:
    """The :class:`GPUSpec` for ``name`` (case-insensitive; aliases like ``"h100-sxm"``,
    ``"a100"`` = A100-80GB). A :class:`GPUSpec` is returned as is.

    Raises :class:`~dessim.errors.SpecError` (a DessimError) naming the value and listing valid names.
    """
    if isinstance(name, GPUSpec):
        return name
    if isinstance(name, str):
        canonical = _ALIASES.get(name.strip().lower().replace("_", "-").replace(" ", "-"))
        if canonical is not None:
            return DEVICES[canonical]
    raise SpecError(f"{what}: unknown GPU {name!r}; valid names: {', '.join(DEVICES)} "
                      f"(case-insensitive; aliases such as 'h100-sxm', 'a100' = A100-80GB)")
