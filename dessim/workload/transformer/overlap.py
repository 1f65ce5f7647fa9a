"""Fused and overlapped computation–communication (``training.tp_comm_overlap``,
``training.fuse_optimizer_allreduce``).

Tensor-parallel communication overlap (Wang et al. ASPLOS 2023, "Overlap Communication with
Dependent Computation via Decomposition"; Jangda et al. ASPLOS 2022, CoCoNet; Transformer
Engine's userbuffers, ``initialize_ub`` in ``transformer_engine/pytorch/module/base.py``)
    A TP collective that feeds a GEMM, or is fed by one, is split into ``n`` chunks along the
    token dimension and the GEMM into the same ``n`` row blocks, so that chunk ``i``'s
    communication runs while the neighbouring chunk computes:

    * *before* a GEMM (``pre``: the sequence-parallel all-gather before a column-parallel GEMM
      forward, and before a row-parallel GEMM's data gradient backward): GEMM chunk ``i`` waits
      for communication chunk ``i``;
    * *after* a GEMM (``post``: the reduce-scatter — or, without sequence parallelism, the
      all-reduce, as CoCoNet fuses GEMM + all-reduce — after a row-parallel GEMM forward):
      communication chunk ``i`` waits for GEMM chunk ``i``, and the next kernel for the last
      chunk.

    With per-chunk compute ``c`` and communication ``m`` on idle streams the pair takes
    ``c + m + (n-1)·max(c, m) = max(n·c, n·m) + min(c, m)``: the longer of compute and
    communication plus one chunk of the other (tests/test_comp_comm_overlap.py). Chunks are
    costed on their own: the device model sees ``n`` smaller GEMMs (launch overhead, wave
    quantization) and the network ``n`` collectives of ``size/n`` (latency ``n`` times).

    Each overlapped position uses one of Transformer Engine's methods (:data:`METHODS`, TE's
    defaults): ``ring_exchange`` for the all-gathers (``qkv_fprop``, ``fc1_fprop``,
    ``proj_dgrad``, ``fc2_dgrad``: ``tp`` chunks, copy-engine transfers, ``num_sm = 1`` and no
    SM margin — the GEMM keeps every SM), ``pipeline`` for the reduce-scatters after a
    row-parallel GEMM (``proj_fprop``, ``fc2_fprop``: 4 chunks, ``num_sm = 16`` SMs running
    the reduction kernels and ``set_sm_margin`` — cuBLAS gets the other SMs). The all-reduce
    after a row-parallel GEMM without sequence parallelism (CoCoNet's fused GEMM + all-reduce;
    TE overlaps only with SP) takes the ``pipeline`` method: an assumption. The GEMM chunks of
    a method with an SM margin carry ``reserved_sms = num_sm`` (:class:`Kernel`), so the
    device model runs them on ``SMs − num_sm`` SMs (16 of H100's 132: 12 % of its peak).

    Modelled as chunked collectives: TE's ring exchange is ``tp − 1`` point-to-point steps of
    ``size/tp``; here ``tp`` all-gathers of ``size/tp`` move the same bytes with more
    latency, and the first GEMM chunk waits for a transfer where TE's starts on the rank's
    local rows (both conservative: one more chunk of communication may be exposed, and each chunk pays
    an all-gather's latency instead of one hop's). TE's ``bulk`` overlaps (the backward re-gather beside the
    data-gradient GEMM, the input-gradient reduce-scatter beside the weight-gradient GEMM)
    exist without this option already (:mod:`dessim.workload.transformer.passes`, "Overlap in
    backward") and are left as they are, without SM margin.

Optimizer fusion (CoCoNet, Jangda et al. 2022, §5 "fused AllReduce + optimizer")
    The data-parallel gradient all-reduce and the optimizer step become, per gradient
    bucket, a reduce-scatter, the optimizer update of the rank's ``1/dp`` slice of the
    bucket's parameters and an all-gather of the updated 16-bit parameters
    (:mod:`dessim.workload.transformer.generator`): the update runs as soon as its bucket is
    reduced (during the rest of the backward and the other buckets' reductions) instead of
    after the last reduction, and on ``1/dp`` of the parameters. It assumes no global
    gradient-norm clipping between the reduction and the update (CoCoNet's fused Adam has
    none); with ZeRO 1/2 the buckets are already reduce-scattered and only the per-bucket
    update changes.

Units: seconds, bytes; SM counts are whole SMs of :data:`dessim.engine.device.SM_COUNT`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from dessim.errors import WorkloadError
from dessim.workload.common.kernels import MATMUL, Kernel

__all__ = ["OverlapOptions", "OverlapMethod", "METHODS", "method_for", "chunk_kernel"]


@dataclass(frozen=True, slots=True)
class OverlapOptions:
    """``training.tp_comm_overlap`` and ``training.fuse_optimizer_allreduce`` (module doc)."""

    tp_comm_overlap: bool = False
    fuse_optimizer_allreduce: bool = False

    def __post_init__(self) -> None:
        for name in ("tp_comm_overlap", "fuse_optimizer_allreduce"):
            if not isinstance(getattr(self, name), bool):
                raise WorkloadError(f"training.{name}={getattr(self, name)!r} must be true or false")

    def describe(self) -> str:
        """Short form for reports: ``tp-overlap``, ``fused-opt``, both, or ``none``."""
        parts = [n for n, on in (("tp-overlap", self.tp_comm_overlap),
                                 ("fused-opt", self.fuse_optimizer_allreduce)) if on]
        return "+".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class OverlapMethod:
    """One of Transformer Engine's userbuffers overlap methods (its ``initialize_ub``
    defaults): ``splits`` chunks (0: the TP size), ``num_sm`` SMs for the communication
    kernels, and whether the GEMM leaves them (``sm_margin``)."""

    name: str
    splits: int
    num_sm: int
    sm_margin: bool

    def chunks(self, tp: int) -> int:
        return self.splits or tp

    @property
    def reserved_sms(self) -> int:
        """SMs the overlapped GEMM chunks cannot use."""
        return self.num_sm if self.sm_margin else 0


#: TE's defaults (``get_default_config`` in ``initialize_ub``, transformer_engine/pytorch/
#: module/base.py): ring_exchange ``num_splits = tp_size, num_sm = 1, set_sm_margin = False,
#: use_ce = True``; pipeline ``num_splits = 4, num_sm = 16, set_sm_margin = True``.
METHODS: Mapping[str, OverlapMethod] = MappingProxyType({
    "ring_exchange": OverlapMethod("ring_exchange", 0, 1, False),
    "pipeline": OverlapMethod("pipeline", 4, 16, True),
})

#: The method of each (position, collective) pair (module docstring).
_METHOD_OF: Mapping[tuple[str, str], str] = MappingProxyType({
    ("pre", "allgather"): "ring_exchange",
    ("post", "reducescatter"): "pipeline",
    ("post", "allreduce"): "pipeline",
})


def method_for(position: str, op: str) -> OverlapMethod | None:
    """The overlap method of collective ``op`` before (``pre``) or after (``post``) a GEMM,
    or None when that pair is not overlapped."""
    name = _METHOD_OF.get((position, op))
    return METHODS[name] if name is not None else None


def _split(total: int, n: int) -> list[int]:
    """``total`` split into ``n`` whole parts differing by at most one (larger first)."""
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def chunk_kernel(kernel: Kernel, n: int, reserved_sms: int = 0) -> list[Kernel]:
    """``kernel`` as ``n`` row blocks ``<name>#i`` (in order), each with ``reserved_sms``.

    A GEMM ``(m, n, k)`` splits ``m`` into whole rows (``n`` at most ``m`` chunks); each chunk
    reads its rows of the activation and the whole weight again and writes its rows. Other
    kernels split FLOPs and bytes evenly. The chunks' FLOPs add up to the kernel's."""
    if n < 1:
        raise WorkloadError(f"chunk_kernel: {n} chunks of {kernel.name!r}; need >= 1")
    if kernel.kind == MATMUL and kernel.shape is not None and len(kernel.shape) == 3:
        m, cols, inner = kernel.shape
        rows = [r for r in _split(m, min(n, m)) if r > 0]
        weight_elems = kernel.groups * inner * cols
        operand = kernel.bytes_read / (m * inner + weight_elems)
        return [replace(kernel, name=f"{kernel.name}#{i}", flops=kernel.flops * r / m,
                        bytes_read=(r * inner + weight_elems) * operand,
                        bytes_written=kernel.bytes_written * r / m, shape=(r, cols, inner),
                        reserved_sms=reserved_sms)
                for i, r in enumerate(rows)]
    return [replace(kernel, name=f"{kernel.name}#{i}", flops=kernel.flops / n,
                    bytes_read=kernel.bytes_read / n, bytes_written=kernel.bytes_written / n,
                    reserved_sms=reserved_sms if kernel.kind == MATMUL else 0)
            for i in range(n)]
