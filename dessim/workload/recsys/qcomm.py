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
from typing import Any, Mapping

from dessim.errors import SpecError
from dessim.workload.common.kernels import Kernel
from dessim.workload.dataparallel.compression import WIRE_BYTES, Compression

__all__ = ["CommPrecision", "parse_comm_precision", "PHASES"]

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


def parse_comm_precision(value: Any, where: str) -> CommPrecision:
    """A format name for both directions, or a mapping ``{forward: .., backward: ..}``."""
    if value is None:
        return CommPrecision()
    raw: Mapping[str, Any] = {p: value for p in PHASES} if isinstance(value, str) else value
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a format ({', '.join(WIRE_BYTES)}) or a mapping "
                        f"{{forward: .., backward: ..}}, got {value!r}")
    for key, fmt in raw.items():
        if key not in PHASES:
            raise SpecError(f"{where}: unknown key {key!r}; valid keys: {', '.join(PHASES)}")
        if fmt not in WIRE_BYTES:
            raise SpecError(f"{where}.{key}: format {fmt!r} is unknown; valid: {', '.join(WIRE_BYTES)}")
    return CommPrecision(raw.get("forward"), raw.get("backward"))
