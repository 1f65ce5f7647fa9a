"""Collective operations: names, nccl-tests size semantics, bus-bandwidth factors.

Source of the definitions: nccl-tests ``doc/PERFORMANCE.md`` ("nccl-tests PERFORMANCE.md" in
docs/references.md): ``algbw = S / t`` and ``busbw = algbw * factor(n)``, where ``S`` is

* the per-rank buffer for ``allreduce``, ``broadcast``, ``reduce``, ``alltoall``, ``sendrecv``;
* the *whole* gathered / reduced array (``n`` blocks of ``S / n``) for ``allgather`` and
  ``reducescatter``.

Each :class:`Op` also carries the lower bounds that :meth:`Schedule.validate
<dessim.collectives.schedule.Schedule.validate>` checks (bytes every rank must send and
receive, reductions needed, who must hear from whom); they follow from the op's definition
and the lower bounds of Chan et al. 2007, Table 1 ([U]: recalled, not checked in a copy of the
paper; they match the best cases of Thakur et al. 2005).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dessim.errors import CollectiveError

__all__ = ["Op", "OPS", "get_op", "op_names"]


@dataclass(frozen=True)
class Op:
    """A collective operation and its accounting rules (sizes in bytes)."""

    name: str
    summary: str
    #: What ``size`` means (nccl-tests semantics).
    size_meaning: str
    #: busbw / algbw as a function of the number of ranks n (nccl-tests PERFORMANCE.md).
    busbw_factor: Callable[[int], float]
    #: Whether the receiver of data combines it (sum) with its own.
    reduces: bool = False
    #: Whether the op has a root rank (broadcast, reduce) or a source (sendrecv).
    rooted: bool = False
    #: Lower bound of bytes a rank sends: f(n ranks, size, is_root).
    min_sent: Callable[[int, float, bool], float] = lambda n, s, root: 0.0
    #: Lower bound of bytes a rank receives: f(n ranks, size, is_root).
    min_received: Callable[[int, float, bool], float] = lambda n, s, root: 0.0
    #: Elements (bytes) that must be reduced from n inputs: needs >= (n-1) * this reductions.
    reduced_bytes: Callable[[int, float], float] = lambda n, s: 0.0
    #: Who must (causally) hear from whom: "all" (everyone from everyone), "from_root"
    #: (everyone from the root), "to_root" (the root from everyone).
    hears: str = "all"


def _frac(n: int) -> float:
    return (n - 1) / n


OPS: dict[str, Op] = {op.name: op for op in (
    Op("allreduce", "every rank ends with the sum of all ranks' buffers",
       "per-rank buffer", lambda n: 2 * _frac(n), reduces=True,
       min_sent=lambda n, s, r: _frac(n) * s, min_received=lambda n, s, r: _frac(n) * s,
       reduced_bytes=lambda n, s: s),
    Op("reducescatter", "rank i ends with block i of the sum (blocks of size/n)",
       "whole reduced array (n blocks)", _frac, reduces=True,
       min_sent=lambda n, s, r: _frac(n) * s, min_received=lambda n, s, r: s / n,
       reduced_bytes=lambda n, s: s),
    Op("allgather", "every rank ends with every rank's block (blocks of size/n)",
       "whole gathered array (n blocks)", _frac,
       min_sent=lambda n, s, r: s / n, min_received=lambda n, s, r: _frac(n) * s),
    Op("broadcast", "every rank ends with the root's buffer",
       "per-rank buffer", lambda n: 1.0, rooted=True,
       min_sent=lambda n, s, r: s if r else 0.0, min_received=lambda n, s, r: 0.0 if r else s,
       hears="from_root"),
    Op("reduce", "the root ends with the sum of all ranks' buffers",
       "per-rank buffer", lambda n: 1.0, reduces=True, rooted=True,
       min_sent=lambda n, s, r: 0.0 if r else s, min_received=lambda n, s, r: s if r else 0.0,
       reduced_bytes=lambda n, s: s, hears="to_root"),
    Op("alltoall", "rank i sends block j (size/n) of its buffer to rank j",
       "per-rank buffer (n blocks)", _frac,
       min_sent=lambda n, s, r: _frac(n) * s, min_received=lambda n, s, r: _frac(n) * s),
    Op("sendrecv", "the first rank of the group sends its buffer to the second",
       "message", lambda n: 1.0, rooted=True,
       min_sent=lambda n, s, r: s if r else 0.0, min_received=lambda n, s, r: 0.0 if r else s,
       hears="from_root"),
)}


def op_names() -> list[str]:
    """Valid operation names."""
    return list(OPS)


def get_op(name: str | Op) -> Op:
    """The :class:`Op` called ``name`` (case, ``-`` and ``_`` ignored: ``All-Reduce`` works)."""
    if isinstance(name, Op):
        return name
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    op = OPS.get(key)
    if op is None:
        raise CollectiveError(f"unknown collective operation {name!r}; valid operations: "
                              f"{', '.join(OPS)}")
    return op
