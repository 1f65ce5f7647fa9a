"""Training precision recipes: bytes per element of every kind of tensor, for every workload kind.

A :class:`Precision` is what the memory estimates, the kernels' bytes and the optimizer step
of a transformer (:mod:`dessim.workload.transformer`), a DLRM or a vision model read;
:data:`PRECISIONS` are the recipes a workload file's ``precision`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

__all__ = ["Precision", "PRECISIONS"]


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per element of each kind of tensor for one training precision recipe.

    ``optimizer_bytes`` is ZeRO's *K*: bytes of optimizer state per parameter. For 16-bit
    mixed-precision Adam K = 12 (fp32 master weights 4 + momentum 4 + variance 4), so one
    parameter costs 2 + 2 + 12 = 16 bytes (ZeRO paper §3.1; "ZeRO (Rajbhandari et al. 2020)"
    in docs/references.md). fp32 training keeps no master copy: K = 8 (momentum + variance).
    FP8 recipes run the GEMMs of the linear layers on FP8 tensor cores (e4m3 operands; e5m2
    gradients in Transformer Engine's hybrid format: the same tensor-core rate on Hopper and
    Blackwell) and keep bf16 saved activations (an assumption: DeepSeek-V3 caches some in FP8,
    which would lower memory), the LM head, MoE router and attention core in 16 bits:

    * ``fp8`` — Transformer Engine's per-tensor (delayed) scaling, ``scale_block = 0``:
      bf16 weights, bf16 gradients, fp32 optimizer state (K = 12), as the bf16 recipe;
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
    "bf16": Precision("bf16", 2, 2, 2, 2, 12),
    "fp16": Precision("fp16", 2, 2, 2, 2, 12, loss_scaling=True),
    "fp8": Precision("fp8", 1, 2, 2, 2, 12),
    "fp8-block": Precision("fp8-block", 1, 2, 2, 4, 8, scale_block=128, low_precision_storage=True),
    "fp32": Precision("fp32", 4, 4, 4, 4, 8),
})
