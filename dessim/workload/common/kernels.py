"""GPU kernels as every workload kind describes them: FLOPs, bytes, a kind, a backward rule.

A :class:`Kernel` carries FLOPs, bytes read and written from HBM, and a ``kind``
(:data:`KINDS`); the device model (:class:`~dessim.engine.device.DeviceModel`) turns it into
seconds (:class:`KernelTimer`). :class:`KernelBuilder` makes kernels with the byte sizes of one
:class:`~dessim.workload.common.precision.Precision` and derives their backward kernels; the
transformer (:mod:`dessim.workload.transformer.kernels`), DLRM and vision models build theirs
with it, so that every kind follows the same conventions:

``matmul``
    ``shape = (m, n, k)``: ``C[m×n] = A[m×k] · B[k×n]``, FLOPs = ``2mnk``. Bytes: read A and
    B, write C. A *grouped* GEMM (MoE experts) holds ``groups`` weight matrices; its ``shape``
    is the sum of the groups' GEMMs along the token dimension (``m`` for forward and dgrad,
    ``k`` for wgrad) and FLOPs stay ``2mnk`` (balanced routing assumed).
``attention``
    An attention block (``impl``: ``flash2`` / ``flash3`` fused, or Megatron-LM's ``unfused``
    block), costed at the implementation's measured rate (:attr:`Kernel.device_kind`); see
    :mod:`dessim.workload.transformer.kernels`.
``elementwise`` / ``norm`` / ``softmax`` / ``dropout``
    Memory-bound kernels with their real bytes; their FLOPs are rough estimates and are not
    model FLOPs.

Backward (documented factors)
    Each matmul becomes two kernels with the forward's FLOPs each: ``dgrad``
    (``dX = dY · Wᵀ``, shape ``(m, k, n)``) and ``wgrad`` (``dW = Xᵀ · dY``, shape
    ``(k, n, m)``); a batched GEMM of two activations (unfused attention) likewise, both
    gradients being activations. Fused attention backward has 2× the forward FLOPs
    (Megatron-LM's convention for model FLOPs; its time comes from the implementation's
    measured forward + backward rate), reads Q, K, V, O, dO and writes dQ, dK, dV. Dropout
    backward reads the output gradient and the mask, writes the input gradient; softmax
    backward reads its output and the output gradient. Other kernels: 2× FLOPs, read the
    forward inputs and the output gradient, write the input gradients.

Optimizer step (:func:`optimizer_kernel`)
    One memory-bound kernel for the passes of Megatron-LM's mixed-precision optimizer step
    over the parameters a rank updates (``MixedPrecisionOptimizer.step`` in
    megatron/core/optimizer/optimizer.py; apex ``multi_tensor_adam``): with loss scaling
    (fp16) unscale the gradients and check them for inf/NaN (read and write them); the
    gradient norm for clipping (read them); Adam (read gradient, master weight, momentum and
    variance, write the three); with master weights, copy them to the 16-bit model weights
    (read fp32, write 16-bit). Clipping's rescale runs only when the norm exceeds the
    threshold and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from dessim.catalog.calibration import Calibration, load_calibration
from dessim.engine.device import DeviceModel
from dessim.workload.common.precision import Precision

__all__ = ["MATMUL", "ATTENTION", "ELEMENTWISE", "NORM", "SOFTMAX", "DROPOUT", "KINDS", "PHASES",
           "MASK_BYTES", "Kernel", "KernelSet", "KernelBuilder", "KernelTimer", "sum_flops",
           "optimizer_kernel"]

MATMUL = "matmul"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
NORM = "norm"
SOFTMAX = "softmax"
DROPOUT = "dropout"
KINDS: tuple[str, ...] = (MATMUL, ATTENTION, ELEMENTWISE, NORM, SOFTMAX, DROPOUT)
#: Bytes of a dropout mask element (PyTorch keeps a bool per element).
MASK_BYTES = 1
#: Kernel phases: forward, backward, and forward kernels re-run for recomputation.
PHASES: tuple[str, ...] = ("fwd", "bwd", "recompute")


@dataclass(frozen=True, slots=True)
class Kernel:
    """One GPU kernel (FLOPs, bytes) — see the module docstring for the conventions."""

    name: str
    kind: str
    phase: str
    flops: float
    bytes_read: float
    bytes_written: float
    shape: tuple[int, ...] | None = None
    groups: int = 1
    impl: str = ""                  #: attention implementation (flash2, flash3)
    #: (read, written) bytes of the backward kernel when the generic rule does not apply
    backward_bytes: tuple[float, float] | None = None
    #: SMs held by communication kernels running beside this GEMM (tensor-parallel comm
    #: overlap, :mod:`dessim.workload.transformer.overlap`); the device model gives the GEMM
    #: the rest (:class:`~dessim.engine.device.DeviceModel`)
    reserved_sms: int = 0
    #: a GEMM's precision when it is not the run's (the 16-bit GEMMs of an FP8 run: LM head,
    #: router, unfused attention), else ""
    precision: str = ""

    @property
    def bytes(self) -> float:
        """Bytes moved to and from HBM (read + written)."""
        return self.bytes_read + self.bytes_written

    @property
    def device_kind(self) -> str:
        """The kind the device model costs it as: ``attention.<impl>.<fwd|bwd>`` for an
        attention block (recomputation is a forward), the kind otherwise."""
        if self.kind == ATTENTION and self.impl:
            return f"{ATTENTION}.{self.impl}.{'bwd' if self.phase == 'bwd' else 'fwd'}"
        if self.kind == MATMUL and self.precision:
            return f"{MATMUL}.{self.precision}"
        return self.kind

    @property
    def is_model_flops(self) -> bool:
        """Whether the kernel's FLOPs count as *model* FLOPs: matmul and attention FLOPs of
        the forward and backward passes (not recomputation, not elementwise kernels)."""
        return self.phase != "recompute" and self.kind in (MATMUL, ATTENTION)


def sum_flops(kernels: Iterable[Kernel], model_only: bool = False) -> float:
    """Sum of FLOPs; with ``model_only`` only what counts as model FLOPs."""
    return sum(k.flops for k in kernels if k.is_model_flops or not model_only)


@dataclass(frozen=True, slots=True)
class KernelSet:
    """The kernels of one block for one micro-batch on one rank."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...] = ()

    @property
    def all(self) -> tuple[Kernel, ...]:
        """Forward, recompute and backward kernels, in that order."""
        return self.forward + self.recompute + self.backward

    def model_flops(self) -> float:
        return sum_flops(self.all, model_only=True)

    def hardware_flops(self) -> float:
        """Matmul and attention FLOPs actually executed, recomputation included."""
        return sum(k.flops for k in self.all if k.kind in (MATMUL, ATTENTION))


class KernelBuilder:
    """Makes kernels with the byte sizes of one model's precision."""

    def __init__(self, model: Precision | Any):
        """``model``: a :class:`Precision`, or a model config with a ``precision_spec``."""
        p = model if isinstance(model, Precision) else model.precision_spec
        self.precision = p
        self.operand = p.element_bytes
        self.act = p.activation_bytes
        self.grad = p.grad_bytes
        #: what a GEMM kept in 16 bits (precise=True) is tagged with in an FP8 run
        self.precise_tag = "bf16" if p.is_fp8 else ""

    def matmul(self, name: str, m: int, n: int, k: int, groups: int = 1,
               precise: bool = False) -> Kernel:
        """A GEMM (module docstring). ``precise``: one an FP8 recipe keeps in 16 bits (LM
        head, MoE router: DeepSeek-V3 report §3.3.1 and Transformer Engine's defaults)."""
        tag = self.precise_tag if precise else ""
        operand = self.act if tag else self.operand
        read = (m * k + groups * k * n) * operand
        return Kernel(name, MATMUL, "fwd", 2 * m * n * k, read, m * n * self.act, (m, n, k), groups,
                      precision=tag)

    def bmm(self, name: str, batch: int, m: int, n: int, k: int) -> Kernel:
        """``batch`` products of two activations ``[m×k]·[k×n]`` (unfused attention; 16-bit
        in an FP8 run)."""
        read = batch * (m * k + k * n) * self.act
        return Kernel(name, MATMUL, "fwd", 2.0 * batch * m * n * k, read, batch * m * n * self.act,
                      (m, n, k, batch), precision=self.precise_tag)

    def quantize(self, name: str, elements: int, grad_elements: int) -> list[Kernel]:
        """FP8 recipes: the cast of a GEMM input of ``elements`` to FP8 with its scales (read
        16-bit, write 8-bit + one fp32 scale per ``scale_block``: per-tensor scaling's amax
        is fused into the cast) and, backward, the same cast of the ``grad_elements`` output
        gradient; memory-bound, no model FLOPs. Empty for other recipes."""
        p = self.precision
        if not p.is_fp8:
            return []
        return [Kernel(name, ELEMENTWISE, "fwd", float(elements), elements * self.act,
                       p.quantized_bytes(elements),
                       backward_bytes=(grad_elements * self.act, p.quantized_bytes(grad_elements)))]

    def elementwise(self, name: str, elements_in: int, elements_out: int, flops: float,
                    kind: str = ELEMENTWISE, extra_read: float = 0.0) -> Kernel:
        return Kernel(name, kind, "fwd", flops, elements_in * self.act + extra_read, elements_out * self.act)

    def dropout(self, name: str, elements: int) -> Kernel:
        """Dropout: read x, write y and a 1-byte mask; backward reads dy and the mask."""
        n = float(elements)
        return Kernel(name, DROPOUT, "fwd", n, n * self.act, n * (self.act + MASK_BYTES),
                      backward_bytes=(n * (self.act + MASK_BYTES), n * self.act))

    def bias_dropout_add(self, name: str, elements: int, bias: float, dropout: bool) -> Kernel:
        """Megatron-LM's fused residual: out = residual + dropout(x + bias). Reads x, the
        residual and the bias; writes out (and the mask); backward reads d_out (and the mask)
        and writes dx (the residual's gradient is d_out itself)."""
        n = float(elements)
        mask = n * MASK_BYTES if dropout else 0.0
        return Kernel(name, ELEMENTWISE, "fwd", n * (3 if dropout else 2), 2 * n * self.act + bias,
                      n * self.act + mask, backward_bytes=(n * self.act + mask, n * self.act))

    def backward(self, fwd: Kernel) -> tuple[Kernel, ...]:
        """The backward kernels of a forward kernel (module docstring, "Backward")."""
        if fwd.kind == MATMUL:
            assert fwd.shape is not None
            m, n, k = fwd.shape[:3]
            if len(fwd.shape) == 4:          # two activations: both gradients are activations
                b = fwd.shape[3]
                dgrad = Kernel(f"{fwd.name}.dgrad", MATMUL, "bwd", fwd.flops,
                               b * (m * n + k * n) * self.act, b * m * k * self.act, (m, k, n, b),
                               precision=fwd.precision)
                wgrad = Kernel(f"{fwd.name}.wgrad", MATMUL, "bwd", fwd.flops,
                               b * (m * k + m * n) * self.act, b * k * n * self.act, (k, n, m, b),
                               precision=fwd.precision)
                return (dgrad, wgrad)
            g = fwd.groups
            op = self.act if fwd.precision else self.operand
            dgrad = Kernel(f"{fwd.name}.dgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * n + g * k * n) * op, m * k * self.act, (m, k, n), g,
                           precision=fwd.precision)
            wgrad = Kernel(f"{fwd.name}.wgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * k + m * n) * op, g * k * n * self.grad, (k, n, m), g,
                           precision=fwd.precision)
            return (dgrad, wgrad)
        if fwd.backward_bytes is not None:
            read, written = fwd.backward_bytes
        else:
            read = fwd.bytes_read + fwd.bytes_written  # forward inputs (and O) + output gradient
            written = fwd.bytes_read
            if fwd.kind == ATTENTION:
                read += fwd.bytes_written              # attention also re-reads O
            elif fwd.kind == SOFTMAX:
                read, written = 2 * fwd.bytes_written, fwd.bytes_read   # reads y and dy
        return (Kernel(f"{fwd.name}.bwd", fwd.kind, "bwd", 2 * fwd.flops, read, written,
                       fwd.shape, fwd.groups, fwd.impl),)



def optimizer_kernel(name: str, params: float, precision: Precision) -> Kernel:
    """The optimizer step over ``params`` parameters as one memory-bound kernel with the
    bytes of every pass (module docstring, "Optimizer step")."""
    g, k, p = precision.grad_bytes, precision.optimizer_bytes, precision.param_bytes
    scale = 1 if precision.loss_scaling else 0
    master = 4 if precision.master_weights else 0
    # Adam: without master weights the parameters themselves are read and written
    adam_read, adam_write = g + k + (0 if master else p), k + (0 if master else p)
    read = scale * g + g + adam_read + master
    written = scale * g + adam_write + (p if master else 0)
    return Kernel(name, "optimizer", "optimizer", 0.0, params * read, params * written)


class KernelTimer:
    """Seconds a kernel takes on a named GPU: one :class:`~dessim.engine.device.DeviceModel`
    per GPU model (with the run's calibration), each kernel costed once (memoised)."""

    def __init__(self, precision: str, calibration: Calibration | None = None) -> None:
        self.precision = precision
        self.calibration = calibration if calibration is not None else load_calibration()
        self._models: dict[str, DeviceModel] = {}
        self._times: dict[tuple[str, Kernel], float] = {}

    def model(self, device: str) -> DeviceModel:
        got = self._models.get(device)
        if got is None:
            got = self._models[device] = DeviceModel.for_device(device, self.precision,
                                                                self.calibration)
        return got

    def __call__(self, device: str, kernel: Kernel) -> float:
        key = (device, kernel)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = self.model(device).kernel_time(
                kernel.device_kind, kernel.shape or (), kernel.flops, kernel.bytes, kernel.reserved_sms)
        return t
