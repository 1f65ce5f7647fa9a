"""Hierarchical (multi-dimensional) collectives over the topology's ``dims``.

As NCCL's intra/inter-node split and ASTRA-sim's multi-dim collectives: with the group's
dimensions ``D0`` (fastest varying, e.g. the 8 GPUs of a node) ... ``Dm-1`` (e.g. nodes),

* allreduce = reduce-scatter along D0, ..., D(m-2); all-reduce along Dm-1 on the remaining
  ``S / (D0···Dm-2)`` bytes (across "rails"); all-gather back along D(m-2), ..., D0;
* reducescatter = reduce-scatter along D0, ..., Dm-1; allgather = all-gather along Dm-1, ..., D0.

Each phase runs a flat algorithm (``inner``, default ``ring``; one name for all dimensions or
one per dimension) on every line of ranks along that dimension at once. The group must span
whole dimensions: for ``dims=(8, 4)``, ranks 0-31 (both) or 8-15 (the first, node 1).

Each phase uses its own connections (a sub-channel), so with ``chunks`` k the chunks
pipeline through the phases: while chunk 2 is reduce-scattered inside the nodes, chunk 1
crosses the network — the NICs stay busy instead of idling during the intra-node phases.
"""

from __future__ import annotations

from math import prod

from dessim.collectives.algorithms.base import SUB_CHANNEL, Algorithm, get_algorithm, register
from dessim.collectives.ops import Op, get_op
from dessim.collectives.schedule import Lane
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology

_PHASE_OPS = {"allreduce": ("reducescatter", "allreduce", "allgather"),
              "reducescatter": ("reducescatter",), "allgather": ("allgather",)}


def spanned_lines(group: tuple[int, ...], topology: Topology) -> list[list[tuple[int, ...]]]:
    """For each dimension the group spans (size > 1), the lines of ranks along it.

    Raises :class:`CollectiveError` if the group is not a whole sub-grid of ``topology.dims``.
    """
    dims = topology.dims
    coords = {r: topology.coords(r) for r in group}
    values = [sorted({c[d] for c in coords.values()}) for d in range(len(dims))]
    ok = all(len(v) in (1, dims[d]) for d, v in enumerate(values))
    ok = ok and len(group) == prod(len(v) for v in values)
    if not ok:
        raise CollectiveError(
            f"hierarchical: the group of {len(group)} ranks ({_show(group)}) does not span whole "
            f"dimensions of the topology dims {list(dims)}; use a group such as 0-"
            f"{topology.num_gpus - 1} or 0-{dims[0] - 1}, or a flat algorithm (ring, tree, ...)")
    out = []
    for d in range(len(dims)):
        if len(values[d]) < 2:
            continue
        lines: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for r, c in coords.items():
            lines.setdefault(c[:d] + c[d + 1:], []).append((c[d], r))
        out.append([tuple(r for _, r in sorted(v)) for _, v in sorted(lines.items())])
    return out


def _show(group: tuple[int, ...]) -> str:
    return ",".join(map(str, group[:8])) + (",..." if len(group) > 8 else "")


@register
class Hierarchical(Algorithm):
    name = "hierarchical"
    summary = "per topology dimension: reduce-scatter in, all-reduce across, all-gather out"
    ops = frozenset(_PHASE_OPS)

    def _inner(self, options: dict, ndims: int) -> list[str]:
        inner = options.get("inner") or ("ring",)
        if isinstance(inner, str):
            inner = tuple(x for x in inner.split(",") if x)
        if len(inner) == 1:
            inner = tuple(inner) * ndims
        if len(inner) != ndims:
            raise CollectiveError(f"hierarchical: {len(inner)} inner algorithms "
                                  f"({','.join(inner)}) for {ndims} spanned dimensions")
        return list(inner)

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        if topology is None:
            raise CollectiveError("hierarchical needs a topology (its dims)")
        lines = spanned_lines(group, topology)
        inner = self._inner(options, len(lines))
        for d, name in enumerate(inner):
            alg = get_algorithm(name)
            if alg is self:
                raise CollectiveError("hierarchical: an inner algorithm cannot be hierarchical")
            last = d == len(inner) - 1
            phase_ops = (("allreduce",) if last else ("reducescatter", "allgather")) \
                if op.name == "allreduce" else _PHASE_OPS[op.name]
            for ph in phase_ops:
                if ph not in alg.ops:
                    raise CollectiveError(f"hierarchical: inner algorithm {name!r} for dimension "
                                          f"{d} cannot run {ph}")

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """The lines of each spanned dimension as member positions ("no" if not a sub-grid)."""
        try:
            lines = spanned_lines(group, topology)
        except CollectiveError:
            return "no"
        pos = {r: i for i, r in enumerate(group)}
        return tuple(tuple(tuple(pos[r] for r in line) for line in dim) for dim in lines)

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        lines = spanned_lines(group, topology)
        inner = [get_algorithm(n) for n in self._inner(options, len(lines))]
        widths = [len(ls[0]) for ls in lines]
        m = len(lines)
        if m == 0:
            return

        phases = iter(range(1, 2 * m + 1))

        def phase(ph: str, d: int, nbytes: float) -> None:
            # each phase on its own connections (sub-channel): chunk k+1's first phase
            # waits only for chunk k's first phase there, so chunks pipeline through the
            # phases (an in-node reduce-scatter overlaps the previous chunk's cross-node step)
            sub = Lane(lane.builder, lane.channel + SUB_CHANNEL * next(phases), lane.pending)
            for line in lines[d]:
                inner[d].emit(sub, get_op(ph), line, nbytes, None, topology, options)

        cur = size
        if op.name in ("allreduce", "reducescatter"):
            last_rs = m - 1 if op.name == "allreduce" else m
            for d in range(last_rs):
                phase("reducescatter", d, cur)
                cur /= widths[d]
            if op.name == "reducescatter":
                return
            phase("allreduce", m - 1, cur)
            first_ag = m - 2
        else:
            cur = size / prod(widths)
            first_ag = m - 1
        for d in range(first_ag, -1, -1):
            cur *= widths[d]
            phase("allgather", d, cur)
