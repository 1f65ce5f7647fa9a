"""Gradient compression for data-parallel reductions: what goes over the wire and what the
GPU computes to compress and decompress, for one gradient bucket.

Methods (:data:`METHODS`; YAML section ``compression:``)

``none``
    All-reduce of the bucket: nccl-tests size = the bucket's gradient bytes ``E·g`` (``E``
    elements of ``g`` bytes).
``cast`` (``dtype: fp16 | bf16 | fp8``) — low-precision communication
    Cast the bucket to ``dtype`` (``d`` bytes per element: :data:`WIRE_BYTES`), all-reduce
    ``E·d`` bytes, cast back. Compress kernel: read ``E·g``, write ``E·d``; decompress: read
    ``E·d``, write ``E·g`` (memory-bound elementwise kernels; a cast to a format as wide
    as the gradients, e.g. bf16 → fp16, is folded into neighbouring kernels: no task). Like PyTorch DDP's
    ``fp16_compress_hook`` / ``bf16_compress_hook``. FP8 reductions need per-tensor scaling;
    its amax pass (one more read of ``E·g``) is counted.
``topk`` (``density: ρ``) — top-k sparsification with error feedback
    Each rank keeps ``k = ceil(ρ·E)`` elements of (gradient + residual) and sends their values
    (``v`` bytes, default the gradient's) and int32 indices (``index_bytes``, 4). Sparse
    vectors with different index sets cannot be summed hop by hop in a ring, so the ranks
    **all-gather** them (nccl-tests size = the whole gathered array ``W·k·(v+i)``, each rank
    receiving ``(W-1)·k·(v+i)`` bytes) and every rank adds the ``W`` sparse vectors into a
    dense buffer (Shi et al. 2019, "A Distributed Synchronous SGD Algorithm with Global Top-k
    Sparsification"; Renggli et al. 2019, SparCML; Lin et al. 2018, Deep Gradient
    Compression, for the error feedback). Compress: residual += gradient (read ``2·E·g``,
    write ``E·g``), selection (``select_passes`` reads of ``E·g`` — 1 for a threshold pass
    on a sampled estimate, as DGC does; more for an exact radix select), gather of the
    selected values and indices (write ``k·(v+i)``) and zeroing them in the residual (write
    ``k·g``). Decompress: zero the dense buffer (write ``E·g``) and scatter-add the ``W·k``
    received elements (read ``W·k·(v+i)``, read and write ``W·k·g``).

Dense volume vs top-k (ring algorithms): a rank sends ``2(W-1)/W·E·g`` bytes for the
all-reduce and ``(W-1)·k·(v+i)`` for the all-gather: top-k saves traffic while
``ρ < 2·g / (W·(v+i))`` — e.g. fp32 gradients and values on 8 ranks: ``ρ < 12.5 %``.

Where the kernels run: the compress kernel on the ``compute`` stream right after the layer
that fills the bucket (it competes with the backward, like a DDP communication hook); the
collective and the decompress kernel on the ``dp`` stream, so decompression overlaps the
backward of earlier layers. Category of both kernels: ``compress``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import Any, Mapping, Sequence

from pydantic import Field

from dessim.errors import SpecError
from dessim.schema import PositiveCount, SpecModel, choice, converted, validate
from dessim.workload.common.emitter import TaskEmitter
from dessim.workload.common.kernels import ELEMENTWISE, Kernel

__all__ = ["Compression", "CompressionSection", "METHODS", "WIRE_BYTES", "parse_compression", "compression_of", "GradSync"]

#: Compression methods.
METHODS: tuple[str, ...] = ("none", "cast", "topk")
#: Bytes per element of the wire formats.
WIRE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class Compression:
    """How one bucket of gradients is exchanged (module docstring)."""

    method: str = "none"
    dtype: str | None = None         #: cast: wire format; topk: value format (None: gradient's)
    density: float = 0.01            #: topk: fraction ρ of the elements sent
    index_bytes: int = 4             #: topk: bytes per index (int32)
    select_passes: int = 1           #: topk: reads of the bucket to select the top k

    def __post_init__(self) -> None:
        where = "compression"
        if self.method not in METHODS:
            raise SpecError(f"{where}: method {self.method!r} is unknown; valid: {', '.join(METHODS)}")
        if self.dtype is not None and self.dtype not in WIRE_BYTES:
            raise SpecError(f"{where}: dtype {self.dtype!r} is unknown; valid: {', '.join(WIRE_BYTES)}")
        if self.method == "cast" and self.dtype is None:
            raise SpecError(f"{where}: method 'cast' needs a dtype ({', '.join(WIRE_BYTES)})")
        if not (isinstance(self.density, (int, float)) and 0 < self.density <= 1):
            raise SpecError(f"{where}: density {self.density!r} must be in (0, 1]")
        for name in ("index_bytes", "select_passes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{where}: {name} {v!r} must be a whole number >= 1")

    # ------------------------------------------------------------------ figures
    def elements(self, nbytes: float, grad_bytes: int) -> float:
        return nbytes / grad_bytes

    def kept(self, nbytes: float, grad_bytes: int) -> int:
        """top-k: elements each rank sends, ``ceil(ρ·E)``."""
        return ceil(self.density * self.elements(nbytes, grad_bytes))

    def value_bytes(self, grad_bytes: int) -> int:
        return WIRE_BYTES[self.dtype] if self.dtype else grad_bytes

    def exchange(self, nbytes: float, grad_bytes: int, ranks: int) -> tuple[str, float]:
        """(collective op, nccl-tests size in bytes) for a bucket of ``nbytes`` gradient
        bytes over ``ranks`` ranks."""
        if self.method == "topk":
            per_rank = self.kept(nbytes, grad_bytes) * (self.value_bytes(grad_bytes) + self.index_bytes)
            return "allgather", float(ranks * per_rank)
        if self.method == "cast":
            return "allreduce", self.elements(nbytes, grad_bytes) * WIRE_BYTES[self.dtype]  # type: ignore[index]
        return "allreduce", float(nbytes)

    def kernels(self, nbytes: float, grad_bytes: int, ranks: int) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
        """(compress kernels, decompress kernels) of one bucket (module docstring)."""
        e = self.elements(nbytes, grad_bytes)
        g = grad_bytes
        if self.method == "cast":
            d = WIRE_BYTES[self.dtype]  # type: ignore[index]
            if d == g:
                return (), ()
            amax = e * g if self.dtype == "fp8" else 0.0
            return ((Kernel("compress.cast", ELEMENTWISE, "bwd", e, e * g + amax, e * d),),
                    (Kernel("decompress.cast", ELEMENTWISE, "bwd", e, e * d, e * g),))
        if self.method == "topk":
            k = self.kept(nbytes, g)
            vi = self.value_bytes(g) + self.index_bytes
            compress = (
                Kernel("compress.residual", ELEMENTWISE, "bwd", e, 2 * e * g, e * g),
                Kernel("compress.select", ELEMENTWISE, "bwd", self.select_passes * e,
                       self.select_passes * e * g, k * vi + k * g),
            )
            received = ranks * k
            decompress = (Kernel("decompress.scatter", ELEMENTWISE, "bwd", received,
                                 received * (vi + g), e * g + received * g),)
            return compress, decompress
        return (), ()


def _density(value: Any, what: str) -> float:
    """A fraction (0.01) or a percentage string ("1%")."""
    if isinstance(value, str):
        try:
            return float(value.rstrip("%")) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise SpecError(f"{what}: {value!r} is not a fraction or a percentage") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{what}: expected a fraction in (0, 1] or a percentage, got {value!r}")
    return float(value)


class CompressionSection(SpecModel):
    """``compression:``: how gradient buckets are exchanged (module docstring)."""

    method: choice(METHODS) = "none"
    dtype: choice(WIRE_BYTES) | None = Field(None, description="cast: wire format; topk: value format")
    density: converted(_density, {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                            {"type": "string", "pattern": "%$"}],
                                  "description": "topk: fraction of elements sent (0.01 or '1%')"},
                       float) = 0.01
    index_bytes: PositiveCount = Field(4, description="topk: bytes per index")
    select_passes: PositiveCount = Field(1, description="topk: reads of the bucket to select the top k")


def parse_compression(data: Any, where: str) -> Compression:
    """A :class:`Compression` from a YAML ``compression:`` mapping (:class:`CompressionSection`;
    ``None``: no compression)."""
    return compression_of(None if data is None else validate(CompressionSection, data, where), where)


def compression_of(section: CompressionSection | None, where: str) -> Compression:
    """The :class:`Compression` of a validated section (None: no compression); its cross-key
    rules (``cast`` needs a ``dtype``) raise a :class:`SpecError` at ``where``."""
    if section is None:
        return Compression()
    try:
        return Compression(**section.model_dump())
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class GradSync:
    """The data-parallel reduction of one generator: its group kind's ranks per rank, the
    gradient element bytes and the compression. :meth:`bucket` emits one bucket's exchange."""

    groups: Mapping[int, tuple[int, ...]]    #: rank -> its data-parallel group
    grad_bytes: int
    compression: Compression = Compression()
    prefix: str = "dp"

    def bucket(self, em: TaskEmitter, rank: int, nbytes: float, deps: Sequence[str], label: str) -> None:
        """Compress (compute stream), exchange and decompress (dp stream) ``nbytes`` of gradients."""
        group = self.groups[rank]
        if len(group) < 2 or nbytes <= 0:
            return
        comp, decomp = self.compression.kernels(nbytes, self.grad_bytes, len(group))
        deps = list(deps)
        if comp:
            deps = [em.compute(rank, comp, f"compress {label}", "compress", deps)]
        op, size = self.compression.exchange(nbytes, self.grad_bytes, len(group))
        tid = em.collective(rank, op, size, group, self.prefix, f"dp {op} {label}", "dp", "dp", deps)
        if decomp and tid:
            em.compute(rank, decomp, f"decompress {label}", "compress", [tid], stream="dp")
