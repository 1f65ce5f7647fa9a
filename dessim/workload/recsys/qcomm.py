"""Reduced-precision (quantised) embedding communication of DLRM (``embeddings.comm_precision``).

ZionEX/Neo (Mudigere et al. ISCA 2022) and TorchRec (``QCommsConfig`` in
``torchrec/distributed/fbgemm_qcomm_codec.py``: ``forward_precision`` and
``backward_precision`` of the all-to-all and reduce-scatter, ``CommType`` FP32, FP16, BF16,
FP8) send the pooled embeddings (forward) and their gradients (backward) in a narrower
format than the tables' ``element_bytes``::

    embeddings:
      comm_precision: {forward: fp16, backward: bf16}   # or one format for both

Wire bytes: the all-to-all matrix and the row-wise reduce-scatter / all-gather scale by
``d / e`` (``d`` bytes of the wire format, :data:`~dessim.workload.dataparallel.compression.WIRE_BYTES`).
Costs: a quantise kernel before sending (read ``n·e``, write ``n·d``; on the ``compute``
stream right after the producer) and a dequantise kernel after receiving (read ``n·d``, write
``n·e``; on stream ``a2a.codec``, so it does not hold the compute stream's bottom MLP behind
the exchange — it runs beside compute without contention, as gradient compression's
decompress does on ``dp``): memory-bound elementwise kernels (category ``compress``), the
``cast`` kernels of gradient compression
(:class:`~dessim.workload.dataparallel.compression.Compression`), FP8's amax pass included.
A format as wide as the tables costs nothing and changes nothing. The dense MLP gradients'
quantised all-reduce is ``compression: {method: cast, dtype: bf16}`` (the same kernels).
Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator

from dessim.schema import SpecModel, choice, described, inline_schema, validate
from dessim.workload.common.kernels import Kernel
from dessim.workload.dataparallel.compression import WIRE_BYTES, Compression

__all__ = ["CommPrecision", "CommPrecisionSection", "CommPrecisionValue", "comm_precision_of", "parse_comm_precision", "PHASES"]

#: Directions of the embedding exchange.
PHASES: tuple[str, ...] = ("forward", "backward")


@dataclass(frozen=True)
class CommPrecision:
    """Wire formats of the forward and backward embedding exchange; ``None``: the tables'."""

    forward: str | None = None
    backward: str | None = None

    def format(self, phase: str) -> str | None:
        return self.forward if phase == "forward" else self.backward

    def ratio(self, phase: str, element_bytes: int) -> float:
        """Wire bytes per table byte in ``phase`` (``d / e``)."""
        fmt = self.format(phase)
        return 1.0 if fmt is None else WIRE_BYTES[fmt] / element_bytes

    def kernels(self, phase: str, sent: float, received: float,
                element_bytes: int) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
        """(quantise kernels of ``sent`` table-format bytes, dequantise kernels of
        ``received`` table-format bytes) of one rank in ``phase``."""
        fmt = self.format(phase)
        if fmt is None:
            return (), ()
        codec = Compression(method="cast", dtype=fmt)
        quant = codec.kernels(sent, element_bytes, 1)[0] if sent else ()
        dequant = codec.kernels(received, element_bytes, 1)[1] if received else ()
        return quant, dequant

    def describe(self) -> dict[str, str]:
        return {p: self.format(p) or "table" for p in PHASES}


def _both(value: Any) -> Any:
    """One format name stands for both directions."""
    return {p: value for p in PHASES} if isinstance(value, str) else value


class CommPrecisionSection(SpecModel):
    """``embeddings.comm_precision``: a wire format for both directions (``fp16``) or one per
    direction (``{forward: fp16, backward: bf16}``); absent: the tables' own precision."""

    forward: choice(WIRE_BYTES) | None = None
    backward: choice(WIRE_BYTES) | None = None


#: The section as a YAML value: a format name, or the mapping.
CommPrecisionValue = Annotated[
    described(CommPrecisionSection, lambda: {"anyOf": [{"enum": list(WIRE_BYTES)},
                                                       inline_schema(CommPrecisionSection)]}),
    BeforeValidator(_both)]


def comm_precision_of(section: CommPrecisionSection | None) -> CommPrecision:
    """The :class:`CommPrecision` of a validated section (None: none)."""
    return CommPrecision() if section is None else CommPrecision(section.forward, section.backward)


def parse_comm_precision(value: Any, where: str) -> CommPrecision:
    """A format name for both directions, or a mapping ``{forward: .., backward: ..}``."""
    return comm_precision_of(None if value is None else validate(CommPrecisionValue, value, where))
