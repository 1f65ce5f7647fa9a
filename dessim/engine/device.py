"""Device model: how long a compute kernel takes on a GPU.

A roofline with efficiency factors::

    time = max(flops / (peak(precision) * compute_eff(kernel)),
               bytes / (hbm_bw * memory_eff)) + launch_overhead

``peak`` and ``hbm_bw`` come from :mod:`dessim.catalog.devices` (dense peaks). The
efficiency factors come from kernel-level evidence, never from end-to-end training
results (those are for validation only):

Matrix multiplies (``kernel="matmul"``, ``shape=(m, n, k)``)
    ``compute_eff = GEMM_PEAK_EFF * tile_eff * wave_eff * k_eff``.
    *Tile quantization* and *wave quantization* follow NVIDIA's "Matrix Multiplication
    Background User's Guide" (DU-09799-001, §2.3 and §3.1-3.2): the output is computed in
    tiles (256x128 on A100-class GPUs in that guide's examples); partial tiles still cost a
    full tile, and the tiles run in waves of one tile per SM, so the last partial wave idles
    SMs. Like cuBLAS's heuristics, the model picks the best of :data:`GEMM_TILES`; smaller
    tiles reuse less data, so they carry a lower relative efficiency (the guide, §2.3: larger
    tiles are more efficient; the factors 1.0/0.9/0.75 are an assumption [U]). ``k_eff = k / (k + GEMM_K_HALF)`` models the fixed prologue/epilogue of each
    tile relative to its main loop over k (an assumption: half efficiency at k = 64,
    negligible loss at k >= 4096). ``GEMM_PEAK_EFF`` = 0.80 of dense peak for a large, well
    shaped GEMM [U]: vendor cuBLAS benchmarks of large BF16 GEMMs are commonly reported at
    roughly 75-90% of dense peak on A100/H100; override with ``DeviceModel(gemm_eff=...)``.
Attention (``kernel="attention"``)
    ``ATTENTION_EFF`` = 0.60 of dense peak [C2]: FlashAttention-2 reports 50-73% of the
    theoretical maximum FLOP/s on A100 for the forward pass (Dao, 2023, abstract); we take the
    middle. Backward passes use the same factor.
Memory-bound kernels (``elementwise``, ``norm``, ``softmax``, ``optimizer``, ...)
    Limited by HBM: ``memory_eff`` = 0.85 of HBM bandwidth [U] (STREAM-like copy kernels on
    A100/H100 typically reach 80-90% of the marketed bandwidth).
Every kernel
    ``LAUNCH_OVERHEAD`` = 2 us per kernel [U] (typical CUDA kernel launch + scheduling gap
    on a busy stream; set 0 to disable).

Assumptions: a kernel has the whole GPU (no concurrent-kernel sharing between streams of
one rank); its FLOPs and bytes are given by the workload generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dessim.catalog.devices import GPUSpec, get_device
from dessim.errors import TaskGraphError
from dessim.taskgraph.model import Task

__all__ = ["DeviceModel", "SM_COUNT", "GEMM_TILES", "GEMM_PEAK_EFF", "ATTENTION_EFF",
           "MEMORY_EFF", "LAUNCH_OVERHEAD", "GEMM_K_HALF"]

#: Streaming multiprocessors (compute units) per device: the number of GEMM tiles per wave.
#: Sources: NVIDIA V100/A100/H100/Blackwell architecture whitepapers (80, 108, 132, 148 SMs)
#: and AMD CDNA3 whitepaper (MI300X: 304 CUs) [U: not in the reference store].
SM_COUNT: dict[str, int] = {"V100": 80, "A100-40GB": 108, "A100-80GB": 108, "H100": 132,
                            "H200": 132, "B200": 148, "MI300X": 304}
#: Candidate GEMM output tiles (rows, cols) and their efficiency relative to the largest.
GEMM_TILES: tuple[tuple[int, int, float], ...] = ((256, 128, 1.0), (128, 128, 0.9), (128, 64, 0.75))
GEMM_PEAK_EFF = 0.80
GEMM_K_HALF = 64.0
ATTENTION_EFF = 0.60
MEMORY_EFF = 0.85
LAUNCH_OVERHEAD = 2e-6

_COMPUTE_KERNELS = {"matmul", "attention"}


@dataclass(frozen=True)
class DeviceModel:
    """Costs compute tasks on one GPU type (see the module docstring for the model)."""

    device: GPUSpec
    precision: str = "bf16"
    gemm_eff: float = GEMM_PEAK_EFF
    attention_eff: float = ATTENTION_EFF
    memory_eff: float = MEMORY_EFF
    launch_overhead: float = LAUNCH_OVERHEAD

    @classmethod
    def for_device(cls, name: str | GPUSpec, precision: str = "bf16", **overrides) -> "DeviceModel":
        """A model for a catalog device name (``"H100"``, ``"a100"``, ...)."""
        return cls(get_device(name), precision, **overrides)

    @property
    def peak(self) -> float:
        """Dense peak FLOP/s at this model's precision."""
        return self.device.peak_flops(self.precision)

    def matmul_efficiency(self, m: int, n: int, k: int) -> float:
        """Fraction of dense peak a GEMM of shape (m, n, k) achieves (tile x wave x k effects)."""
        sms = SM_COUNT.get(self.device.name, 108)
        best = 0.0
        for tm, tn, relative in GEMM_TILES:
            tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
            tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
            tiles = tiles_m * tiles_n
            wave_eff = tiles / (math.ceil(tiles / sms) * sms)
            best = max(best, relative * tile_eff * wave_eff)
        k_eff = k / (k + GEMM_K_HALF)
        return self.gemm_eff * best * k_eff

    def compute_efficiency(self, task: Task) -> float:
        if task.kernel == "matmul":
            if len(task.shape) != 3 or min(task.shape) <= 0:
                raise TaskGraphError(f"task {task.id!r}: a matmul needs shape (m, n, k) > 0, "
                                     f"got {list(task.shape)}")
            return self.matmul_efficiency(*task.shape)
        if task.kernel == "attention":
            return self.attention_eff
        return self.gemm_eff  # unclassified FLOPs: as a large GEMM

    def __call__(self, task: Task) -> float:
        """Seconds ``task`` takes (ignoring rank slowdown, which the engine applies)."""
        t_compute = 0.0
        if task.flops:
            t_compute = task.flops / (self.peak * self.compute_efficiency(task))
        t_memory = task.bytes / (self.device.hbm_bw * self.memory_eff) if task.bytes else 0.0
        return max(t_compute, t_memory) + self.launch_overhead


class RankDevices:
    """Costs each compute task with the device model of its rank's GPU.

    The GPU model of a rank is the topology's ``device`` attribute of that GPU, or
    ``default`` when the topology does not say. A rank with neither gets a clear error the
    first time one of its tasks needs costing.
    """

    def __init__(self, topology, default: str | None = None, precision: str = "bf16") -> None:
        self._models: dict[str, DeviceModel] = {}
        self._by_rank: list[str | None] = [topology.device(r) or default
                                           for r in range(topology.num_gpus)]
        self.precision = precision
        self.topology_name = topology.name
        for name in set(self._by_rank) - {None}:
            self._models[name] = DeviceModel.for_device(name, precision)

    def model(self, rank: int) -> DeviceModel:
        name = self._by_rank[rank]
        if name is None:
            raise TaskGraphError(f"rank {rank} of topology {self.topology_name!r} has no GPU "
                                 "model to cost FLOPs with: give one (e.g. --device H100)")
        return self._models[name]

    def __call__(self, task: Task) -> float:
        return self.model(task.rank)(task)
