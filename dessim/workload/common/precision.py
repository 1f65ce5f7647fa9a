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
    FP8 (Transformer Engine recipe) casts GEMM inputs to 8 bits on the fly but keeps bf16
    weights, bf16 gradients, fp32 optimizer state and bf16 saved activations — an assumption,
    documented in docs/workloads.md.
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

    @property
    def master_weights(self) -> bool:
        """Whether the optimizer keeps fp32 master weights apart from the model's weights
        (every recipe with 16-bit or 8-bit parameters)."""
        return self.param_bytes < 4


PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    "bf16": Precision("bf16", 2, 2, 2, 2, 12),
    "fp16": Precision("fp16", 2, 2, 2, 2, 12, loss_scaling=True),
    "fp8": Precision("fp8", 1, 2, 2, 2, 12),
    "fp32": Precision("fp32", 4, 4, 4, 4, 8),
})
