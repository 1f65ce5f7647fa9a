"""Training precision recipes: bytes per element of every kind of tensor, for every workload kind.

A :class:`Precision` is what the memory estimates, the kernels' bytes and the optimizer step
of a transformer (:mod:`dessim.workload.transformer`), a DLRM or a vision model read;
:data:`PRECISIONS` are the recipes a workload file's ``precision`` names.

Gradients. ``grad_bytes`` is the element size of the gradient buffer the backward accumulates
into over the micro-batches and the data-parallel reduction sends (the same buffer in every
framework modelled: the reduction runs on it in place). The bf16 recipes (``bf16``, ``fp8``,
``fp8-block``) keep **fp32** gradients, as the frameworks whose runs dessim follows do:

* Megatron-LM ``megatron/training/arguments.py``: with ``--bf16`` it sets
  ``accumulate_allreduce_grads_in_fp32`` ("bfloat16 requires gradient accumulation and
  all-reduce to be done in fp32") unless ``--grad-reduce-in-bf16``; its distributed-optimizer
  table (``docs/user-guide/features/dist_optimizer.md``): "bf16 parameters, fp32 gradients:
  18 bytes per parameter, 6 + 12/d with the distributed optimizer";
* Llama 3 (Dubey et al. 2024, arXiv:2407.21783 §3.3.2 "Numerical stability"): "FP32 gradient
  accumulation during backward computation over multiple micro-batches and also reduce-scatter
  gradients in FP32 across data parallel workers in FSDP";
* DeepSpeed's ``BF16_Optimizer`` (Megatron-DeepSpeed, BLOOM): fp32 gradient accumulation by
  default (deepspeed PR #4713: "the default accumulation data type is fp32");
* PyTorch DDP under ``torch.autocast`` (the DLRM and vision workloads): the parameters stay
  fp32, so their ``.grad`` and DDP's buckets are fp32 (``fp16_compress_wrapper`` "casts the
  resulting tensors ... back to the input data type, such as float32").

``fp16`` keeps fp16 gradients: Megatron-LM sets ``accumulate_allreduce_grads_in_fp32`` only for
``--bf16`` (its table's "fp16 parameters, fp16 gradients" row), as SC21's fp16 runs used.
:meth:`Precision.with_grad_precision` gives a recipe with other gradients: ``bf16`` for the
bf16 recipes (Megatron's ``--grad-reduce-in-bf16``, FSDP ``reduce_dtype=bfloat16``), ``fp32``
for every recipe (Megatron's ``--accumulate-allreduce-grads-in-fp32`` with ``--fp16``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from dessim.errors import WorkloadError

__all__ = ["Precision", "PRECISIONS", "GRAD_PRECISIONS"]

#: Gradient precisions a workload can ask for (``training.grad_precision``): bytes per element.
GRAD_PRECISIONS: Mapping[str, int] = MappingProxyType({"fp32": 4, "bf16": 2, "fp16": 2})


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per element of each kind of tensor for one training precision recipe.

    ``optimizer_bytes`` is ZeRO's *K*: bytes of optimizer state per parameter. For 16-bit
    mixed-precision Adam K = 12 (fp32 master weights 4 + momentum 4 + variance 4), so one
    parameter costs 2 + 2 + 12 = 16 bytes with 16-bit gradients (ZeRO paper §3.1; "ZeRO
    (Rajbhandari et al. 2020)" in docs/references.md) and 2 + 4 + 12 = 18 with the fp32
    gradients of the bf16 recipes (module docstring, "Gradients"). fp32 training keeps no master copy: K = 8 (momentum + variance).
    FP8 recipes run the GEMMs of the linear layers on FP8 tensor cores (e4m3 operands; e5m2
    gradients in Transformer Engine's hybrid format: the same tensor-core rate on Hopper and
    Blackwell) and keep bf16 saved activations (an assumption: DeepSeek-V3 caches some in FP8,
    which would lower memory), the LM head, MoE router and attention core in 16 bits:

    * ``fp8`` — Transformer Engine's per-tensor (delayed) scaling, ``scale_block = 0``:
      bf16 weights, fp32 gradients, fp32 optimizer state (K = 12), as the bf16 recipe
      (Megatron-LM runs FP8 with ``--bf16``: module docstring, "Gradients");
    * ``fp8-block`` — DeepSeek-V3's fine-grained recipe (report §3.3, arXiv:2412.19437):
      activations scaled per 1×128 tile and weights per 128×128 block (one fp32 scale per
      ``scale_block = 128`` elements), fp32 gradients for accumulation (4 bytes), fp32 master
      weights and bf16 AdamW moments (K = 4 + 2 + 2 = 8), MoE dispatch in FP8, and its
      ``low_precision_storage`` (§3.2.3, §3.3.3): the inputs of the linear layers and of the
      SwiGLU are cached in FP8, the norms, MLA up-projections and SwiGLU outputs are
      recomputed in the backward instead of stored (the memory model and the kernels' recompute
      list of :mod:`dessim.workload.transformer` follow it when ``recompute: none``).

    Quantising a GEMM input is a memory-bound kernel (read 16-bit, write 8-bit and the
    scales: :meth:`~dessim.workload.common.kernels.KernelBuilder.quantize`).
    """

    name: str
    element_bytes: int      #: bytes per element of GEMM operands (weights and activations)
    activation_bytes: int   #: bytes per element of stored activations and kernel outputs
    param_bytes: int        #: bytes per parameter held for forward/backward
    grad_bytes: int         #: bytes per gradient element
    optimizer_bytes: int    #: ZeRO's K: optimizer-state bytes per parameter
    #: dynamic loss scaling (fp16): the optimizer unscales the gradients and checks them for
    #: inf/NaN before the step (Micikevicius et al. 2018; Megatron-LM's MixedPrecisionOptimizer)
    loss_scaling: bool = False
    #: FP8: elements per fp32 scaling factor (128: DeepSeek-V3's tiles/blocks); 0 = one scale
    #: per tensor. Unused by 16/32-bit recipes.
    scale_block: int = 0
    #: DeepSeek-V3's FP8 caching of GEMM/SwiGLU inputs with recomputation of norms and
    #: up-projections (see above)
    low_precision_storage: bool = False

    @property
    def is_fp8(self) -> bool:
        """Whether the linear layers' GEMMs run in FP8 (operands narrower than activations)."""
        return self.element_bytes < self.activation_bytes

    @property
    def gemm_precision(self) -> str:
        """The device precision key (``dessim.catalog.devices.PRECISIONS``) of its GEMMs."""
        return "fp8" if self.is_fp8 else self.name

    @property
    def weight_dtype(self) -> str:
        """The 16/32-bit type of the model's weights: ``fp32``, ``fp16`` (loss-scaled) or
        ``bf16`` (the bf16 and FP8 recipes)."""
        return "fp32" if self.param_bytes >= 4 else "fp16" if self.loss_scaling else "bf16"

    @property
    def grad_dtype(self) -> str:
        """The type of the gradients: ``fp32`` (4 bytes) or the weights' own 16-bit type."""
        return "fp32" if self.grad_bytes >= 4 else self.weight_dtype

    def with_grad_precision(self, grad: str | None, where: str = "training.grad_precision") -> "Precision":
        """This recipe with ``grad`` gradients (a :data:`GRAD_PRECISIONS` key; None: the
        recipe's own). Gradients are fp32 or the weights' own 16-bit type (module docstring);
        anything else raises :class:`~dessim.errors.WorkloadError` naming ``where``."""
        return self if grad is None else _with_grad(self, grad, where)

    def quantized_bytes(self, elements: float) -> float:
        """Bytes of ``elements`` quantised to FP8 with their scales (fp32 per block)."""
        scales = elements * 4.0 / self.scale_block if self.scale_block else 4.0
        return elements * self.element_bytes + scales

    @property
    def master_weights(self) -> bool:
        """Whether the optimizer keeps fp32 master weights apart from the model's weights
        (every recipe with 16-bit or 8-bit parameters)."""
        return self.param_bytes < 4


PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    "bf16": Precision("bf16", 2, 2, 2, 4, 12),
    "fp16": Precision("fp16", 2, 2, 2, 2, 12, loss_scaling=True),
    "fp8": Precision("fp8", 1, 2, 2, 4, 12),
    "fp8-block": Precision("fp8-block", 1, 2, 2, 4, 8, scale_block=128, low_precision_storage=True),
    "fp32": Precision("fp32", 4, 4, 4, 4, 8),
})


@lru_cache(maxsize=None)
def _with_grad(precision: Precision, grad: str, where: str) -> Precision:
    """:meth:`Precision.with_grad_precision`, memoised (a model's precision is read per kernel)."""
    if grad not in GRAD_PRECISIONS:
        raise WorkloadError(f"{where}: {grad!r} is not a gradient precision; valid: {', '.join(GRAD_PRECISIONS)}")
    if grad not in ("fp32", precision.weight_dtype):
        raise WorkloadError(f"{where}: {grad} gradients need {grad} weights; precision {precision.name} "
                            f"has {precision.weight_dtype} weights (gradients: fp32 or {precision.weight_dtype})")
    return replace(precision, grad_bytes=GRAD_PRECISIONS[grad])
