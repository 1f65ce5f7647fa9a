"""Device model: how long a compute kernel takes on one GPU.

:class:`DeviceModel` costs kernels with the measured kernel models of
:mod:`dessim.engine.kernel_model`, parameterised per GPU by the calibration
(:mod:`dessim.catalog.calibration`: the built-in ``calibration/default.yaml`` or a user's
file). Kernel kinds:

``matmul`` / ``matmul.<precision>``
    ``shape = (m, n, k)`` or ``(m, n, k, batch)``: the GEMM model (tile and wave
    quantization, k efficiency, measured ceiling, memory bound) at the dense peak of the run's
    precision, or of ``<precision>`` (the 16-bit GEMMs of an FP8 run). FP8 GEMMs (1-byte
    operands) use the GPU's own FP8 fit where the calibration has one (``gemm_fp8``: Hopper,
    fitted to DeepGEMM's measured block-scaled FP8 GEMMs on H800, docs/validation.md), else
    its 16-bit fit against the FP8 peak [U].
``attention.<impl>.<phase>``
    an attention block (``impl`` flash2 or flash3: one fused kernel; unfused: the
    matmul-softmax-matmul kernels as one block; ``phase`` fwd or bwd),
    ``shape = (batch·heads, s_q, s_k, head_dim, causal)``: FLOPs in FlashAttention's convention
    at the measured TFLOP/s of that implementation, head dimension and sequence length on
    this GPU. An implementation the GPU has no table for uses H100's scaled by the dense peak
    ([U], said in docs/validation.md); FlashAttention-2 needs Ampere or later, -3 Hopper.
``attention`` (no implementation)
    a fused attention kernel known only by its FLOPs (task graphs from files): costed at the
    flash2 rate of head dimension 128, causal, sequence 4096 on this GPU.
anything else (``elementwise``, ``norm``, ``softmax``, ``dropout``, ``optimizer``, ...)
    memory-bound: ``bytes / (hbm · memory_efficiency)``, or its FLOPs at the 16-bit peak if
    that is longer.

Every kernel adds the measured per-kernel launch overhead. A kernel has the whole GPU (no
concurrent kernels of one rank) unless ``reserved_sms`` SMs are taken by communication
kernels running beside it (tensor-parallel communication overlap,
:mod:`dessim.workload.transformer.overlap`): a GEMM then runs on the remaining ``S - r`` SMs —
its peak scaled by ``(S - r)/S`` and its wave quantization on ``S - r`` SMs (what
Transformer Engine's ``set_sm_margin`` does: cuBLAS is given ``S - num_sm`` SMs); its memory
bound is unchanged. Its FLOPs and bytes are given by the workload generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dessim.catalog.calibration import Calibration, load_calibration
from dessim.catalog.devices import GPUSpec, get_device
from dessim.engine.kernel_model import AttentionRate, GemmParams, attention_flops_fa, gemm_time
from dessim.errors import SpecError, TaskGraphError
from dessim.taskgraph.model import Task

__all__ = ["DeviceModel", "RankDevices", "SM_COUNT", "ATTENTION_IMPLS", "FLASH_GENERATIONS",
           "gemm_precision"]


def gemm_precision(precision: str) -> str:
    """The device precision key (fp32, tf32, fp16, bf16, fp8) a run precision's GEMMs use:
    FP8 recipes (``fp8``, ``fp8-block``) all use the fp8 tensor cores."""
    return "fp8" if precision.startswith("fp8") else precision

#: Streaming multiprocessors (AMD: compute units) per device: the number of GEMM tiles per
#: wave. [C2] V100 80 (V100 datasheet), A100 108 (glennklockwood A100), H100/H800/H200 132
#: (glennklockwood H100; H800 is the same GH100 configuration), MI300X 304 CUs (MI300X specs);
#: B200 and GB200 148 [U] (unconfirmed; override with a calibration file). Short names of
#: docs/references.md.
SM_COUNT: dict[str, int] = {"V100": 80, "A100-40GB": 108, "A100-80GB": 108, "H100": 132,
                            "H800": 132, "H200": 132, "B200": 148, "GB200": 148, "MI300X": 304}

#: Attention implementations a workload can name (``training.attention``).
ATTENTION_IMPLS: tuple[str, ...] = ("unfused", "flash2", "flash3")
#: GPU generations each fused implementation runs on (FlashAttention-2 needs sm80+;
#: FlashAttention-3 is Hopper-only, Shah et al. 2024).
FLASH_GENERATIONS: dict[str, tuple[str, ...]] = {
    "flash2": ("ampere", "hopper", "blackwell", "cdna3"), "flash3": ("hopper",)}
#: The GPU whose measured attention tables stand in for GPUs that have none.
_ATTENTION_PROXY = "H100"
_GENERIC_ATTENTION = (128, True, 4096)      # head dim, causal, sequence of untagged attention


@dataclass(frozen=True)
class _Constants:
    gemm: GemmParams
    #: FP8 GEMMs' own fit (None: ``gemm`` against the FP8 peak)
    gemm_fp8: GemmParams | None
    #: measured rate of each attention implementation, with the peak ratio that scales it
    #: (1 for the GPU's own table, own / proxy dense peak for the proxy's)
    attention: dict[str, tuple[AttentionRate, float]]
    memory_efficiency: float
    launch_overhead: float


def _constants(device: GPUSpec, calibration: Calibration) -> _Constants:
    own = calibration.device(device.name)
    proxy = calibration.device(_ATTENTION_PROXY)
    g = own.gemm
    if g is None or None in (g.peak_efficiency, g.k_half, g.fixed):
        raise TaskGraphError(f"calibration {calibration.name!r} has no GEMM model for "
                             f"{device.name}: give devices.{device.name}.gemm (peak_efficiency, "
                             "k_half, fixed) in a calibration file")
    proxy_dev = get_device(_ATTENTION_PROXY)
    proxy_scale = (device.peak_flops(device.sixteen_bit)
                   / proxy_dev.peak_flops(proxy_dev.sixteen_bit))
    # the GPU's own tables; an implementation it has no table for takes the proxy's, scaled
    rates = {impl: (AttentionRate.from_keys(t.tflops), proxy_scale)
             for impl, t in proxy.attention.items() if impl not in own.attention}
    rates.update({impl: (AttentionRate.from_keys(t.tflops), 1.0) for impl, t in own.attention.items()})
    f8 = own.gemm_fp8
    fp8 = None if f8 is None or None in (f8.peak_efficiency, f8.k_half, f8.fixed) else \
        GemmParams(f8.peak_efficiency, f8.k_half, f8.fixed, f8.ceiling or 1.0)
    return _Constants(GemmParams(g.peak_efficiency, g.k_half, g.fixed, g.ceiling or 1.0), fp8, rates,
                      own.memory_efficiency or 0.8, own.launch_overhead or 0.0)


@dataclass(frozen=True)
class DeviceModel:
    """Costs kernels on one GPU type (see the module docstring). Seconds."""

    device: GPUSpec
    precision: str = "bf16"
    calibration: Calibration = field(default_factory=load_calibration)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_c", _constants(self.device, self.calibration))

    @classmethod
    def for_device(cls, name: str | GPUSpec, precision: str = "bf16",
                   calibration: Calibration | None = None) -> "DeviceModel":
        """A model for a catalog device name (``"H100"``, ``"a100"``, ...)."""
        return cls(get_device(name), precision,
                   calibration if calibration is not None else load_calibration())

    @property
    def peak(self) -> float:
        """Dense peak FLOP/s of the GEMMs at this model's precision (``fp8-block``: fp8)."""
        return self.device.peak_flops(gemm_precision(self.precision))

    def check_precision(self) -> None:
        """A :class:`~dessim.errors.SpecError` if this GPU cannot run the precision's GEMMs
        (FP8 before Hopper, bf16 on Volta): said before any simulation work."""
        key = gemm_precision(self.precision)
        if key not in self.device.flops:
            raise SpecError(f"precision {self.precision!r} needs {key} tensor cores, which "
                            f"{self.device.name} ({self.device.generation}) lacks; it has: "
                            f"{', '.join(self.device.flops)} — use precision: "
                            f"{self.device.sixteen_bit}")

    @property
    def launch_overhead(self) -> float:
        return self._c.launch_overhead  # type: ignore[attr-defined]

    def check_attention(self, impl: str) -> None:
        """Raise :class:`TaskGraphError` if ``impl`` cannot run on this GPU."""
        gens = FLASH_GENERATIONS.get(impl)
        if gens is not None and self.device.generation not in gens:
            raise TaskGraphError(f"attention {impl!r} does not run on {self.device.name} "
                                 f"({self.device.generation}); it needs a "
                                 f"{' or '.join(gens)} GPU — use attention: unfused"
                                 + (" or flash2" if impl == "flash3" and
                                    self.device.generation in FLASH_GENERATIONS["flash2"] else ""))

    # ------------------------------------------------------------------ kernels
    @property
    def sms(self) -> int:
        """Streaming multiprocessors of the GPU (:data:`SM_COUNT`; 108 when unknown)."""
        return SM_COUNT.get(self.device.name, 108)

    def kernel_time(self, kind: str, shape: tuple[int, ...], flops: float, nbytes: float,
                    reserved_sms: int = 0) -> float:
        """Seconds of one kernel of ``kind`` (module docstring), launch overhead included;
        ``reserved_sms``: SMs a concurrent communication kernel holds (GEMMs only)."""
        c: _Constants = self._c  # type: ignore[attr-defined]
        if kind == "matmul" or kind.startswith("matmul."):
            if len(shape) not in (3, 4) or min(shape) <= 0:
                raise TaskGraphError(f"a matmul needs shape (m, n, k) or (m, n, k, batch) > 0, "
                                     f"got {list(shape)}")
            m, n, k = shape[:3]
            batch = shape[3] if len(shape) == 4 else 1
            sms = self.sms
            if not 0 <= reserved_sms < sms:
                raise TaskGraphError(f"reserved_sms={reserved_sms} must be in 0..{sms - 1} on "
                                     f"{self.device.name} ({sms} SMs)")
            free = sms - reserved_sms
            prec = gemm_precision(self.precision) if kind == "matmul" else kind[7:]
            fp8 = prec == "fp8"
            params = c.gemm_fp8 if fp8 and c.gemm_fp8 is not None else c.gemm
            t = gemm_time(m, n, k, batch, self.device.peak_flops(prec) * free / sms, free, params,
                          operand_bytes=1.0 if fp8 else 2.0, hbm_bw=self.device.hbm_bw,
                          memory_efficiency=c.memory_efficiency)
            return float(t) + c.launch_overhead
        if kind.startswith("attention"):
            return self._attention(kind, shape, flops, nbytes) + c.launch_overhead
        t_mem = nbytes / (self.device.hbm_bw * c.memory_efficiency) if nbytes else 0.0
        t_flop = flops / self.device.peak_flops(self.device.sixteen_bit) if flops else 0.0
        return max(t_mem, t_flop) + c.launch_overhead

    def _attention(self, kind: str, shape: tuple[int, ...], flops: float, nbytes: float) -> float:
        c: _Constants = self._c  # type: ignore[attr-defined]
        parts = kind.split(".")
        impl = parts[1] if len(parts) > 1 else "flash2"
        phase = parts[2] if len(parts) > 2 else "fwd+bwd"
        self.check_attention(impl)
        got = c.attention.get(impl)
        if got is None and impl != "unfused":       # a fused kernel of unknown make: flash2's
            got = c.attention.get("flash2")
        if got is None:
            raise TaskGraphError(f"calibration {self.calibration.name!r} has no attention table "
                                 f"for {self.device.name} (devices.{self.device.name}.attention.{impl})")
        rate, scale = got
        if len(shape) == 5:
            bh, s_q, s_k, d, causal = shape
            work = attention_flops_fa(bh, s_q, s_k, d, bool(causal), phase)
            tflops = rate.tflops(d, bool(causal), s_k)
        else:                                   # known only by its FLOPs
            d, causal, s = _GENERIC_ATTENTION
            work = flops * (0.5 if causal else 1.0)
            tflops = rate.tflops(d, causal, s)
        return work / (tflops * 1e12 * scale)

    def __call__(self, task: Task) -> float:
        """Seconds ``task`` takes (ignoring rank slowdown, which the engine applies)."""
        return self.kernel_time(task.kernel, task.shape, task.flops, task.bytes)


class RankDevices:
    """Costs each compute task with the device model of its rank's GPU.

    The GPU model of a rank is the topology's ``device`` attribute of that GPU, or
    ``default`` when the topology does not say. A rank with neither gets a clear error the
    first time one of its tasks needs costing.
    """

    def __init__(self, topology, default: str | None = None, precision: str = "bf16",
                 calibration: Calibration | None = None) -> None:
        self._models: dict[str, DeviceModel] = {}
        self._by_rank: list[str | None] = [topology.device(r) or default
                                           for r in range(topology.num_gpus)]
        self.precision = precision
        self.topology_name = topology.name
        cal = calibration if calibration is not None else load_calibration()
        for name in set(self._by_rank) - {None}:
            self._models[name] = DeviceModel.for_device(name, precision, cal)

    def model(self, rank: int) -> DeviceModel:
        name = self._by_rank[rank]
        if name is None:
            raise TaskGraphError(f"rank {rank} of topology {self.topology_name!r} has no GPU "
                                 "model to cost FLOPs with: give one (e.g. --device H100)")
        return self._models[name]

    def __call__(self, task: Task) -> float:
        return self.model(task.rank)(task)
