"""Collective algorithms and :func:`build_schedule`.

Importing this package registers every algorithm module in :data:`ALGORITHMS`:
ring, tree, dbtree, rd, hd, direct, pairwise, hierarchical, nvls, nvlstree, collnet,
collnetdirect.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import (ALGORITHMS, Algorithm, algorithms_for,
                                                get_algorithm, register)
# Registration order = listing order = auto's tie-break order (simplest first).
from dessim.collectives.algorithms import ring, tree, dbtree, rd, hd  # noqa: F401,E402,I001
from dessim.collectives.algorithms import direct, pairwise, rail, hierarchical  # noqa: F401,E402,I001
from dessim.collectives.algorithms import nvls, collnet  # noqa: F401,E402,I001
from dessim.collectives.ops import Op, get_op
from dessim.collectives.schedule import CompactSchedule, Lane, Schedule, ScheduleBuilder
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology

__all__ = ["ALGORITHMS", "Algorithm", "register", "get_algorithm", "algorithms_for",
           "build_schedule", "check_supported", "split_applicable"]


def check_supported(op: Op, alg: Algorithm, group: tuple[int, ...],
                    topology: Topology | None, options: dict | None = None) -> None:
    """Raise :class:`CollectiveError` saying why ``alg`` cannot run ``op`` on ``group``."""
    if op.name not in alg.ops:
        raise CollectiveError(f"algorithm {alg.name!r} cannot run {op.name} (it runs: "
                              f"{', '.join(sorted(alg.ops))}); algorithms for {op.name}: "
                              f"{', '.join(algorithms_for(op))}")
    if op.name == "sendrecv" and len(group) != 2:
        raise CollectiveError(f"sendrecv needs a group of exactly 2 ranks (source, destination), "
                              f"got {len(group)}; give e.g. ranks '0,1'")
    alg.check(op, group, topology, options or {})


def split_applicable(op: Op, group: tuple[int, ...], topology: Topology | None,
                     options: dict | None = None, names: list[str] | None = None,
                     ) -> tuple[list[str], dict[str, str]]:
    """Which algorithms can run ``op`` on ``group``: (those that can, {name: why not}).

    ``names``: the algorithms to check, in the caller's order (``auto`` always can: it picks
    among those that can); None: every registered algorithm that runs ``op``, in registration
    order (:data:`ALGORITHMS`: simplest first), which is deterministic. A reason is one short
    clause without the algorithm's name (the caller prefixes it)."""
    wanted = algorithms_for(op) if names is None else names
    ok: list[str] = []
    why_not: dict[str, str] = {}
    for name in wanted:
        if str(name).strip().lower() == "auto":
            ok.append(name)
            continue
        alg = get_algorithm(name)
        if op.name not in alg.ops:
            why_not[name] = f"it runs {', '.join(sorted(alg.ops))}, not {op.name}"
            continue
        try:
            check_supported(op, alg, tuple(group), topology, options)
        except CollectiveError as exc:
            reason = str(exc)
            why_not[name] = reason[len(alg.name) + 2:] if reason.startswith(alg.name + ": ") else reason
            continue
        ok.append(name)
    return ok, why_not


def build_schedule(op: str | Op, algo: str | Algorithm, group: tuple[int, ...] | list[int],
                   size: float, *, chunks: int = 1, channels: int | None = None,
                   root: int | None = None, topology: Topology | None = None,
                   compact_schedules: bool = True, pipelined: bool = False,
                   **options) -> Schedule:
    """The transfers of ``op`` over ``group`` (global ranks) with ``size`` bytes.

    ``channels`` C splits the data over C independent lanes (None: as the algorithm lays
    them out — for rings, NCCL's one lane per rail across nodes, see
    :mod:`~dessim.collectives.algorithms.ring`; 1 otherwise); ``chunks`` K splits each
    lane's data into K pieces sent one after the other on the same connections, which
    pipelines trees and chains. Each lane carries ``size / (lanes·K)``.
    ``root`` (broadcast, reduce; default ``group[0]``) is a global rank. ``options`` are
    algorithm options (hierarchical: ``inner``). ``pipelined``: the collective runs under
    one of NCCL's protocols, which pipeline a chain in small chunks through every hop at
    once; an algorithm with a ``pipelined`` method (ring broadcast and reduce) then returns
    that method's :class:`~dessim.collectives.schedule.FluidSchedule` instead of ``chunks``
    store-and-forward pieces.

    ``compact_schedules`` (default): an algorithm with a ``plan`` method (ring all-reduce, reduce-scatter,
    all-gather) returns a :class:`~dessim.collectives.schedule.CompactSchedule` — the same
    transfers and dependencies stored as uniform steps, O(steps) to build instead of
    O(transfers). ``compact_schedules=False`` always builds the per-transfer rows. An algorithm with a
    ``fluid`` method (trees across nodes, NVLS) returns a
    :class:`~dessim.collectives.schedule.FluidSchedule`.
    """
    op = get_op(op)
    alg = get_algorithm(algo)
    group = tuple(group)
    if not group:
        raise CollectiveError(f"{op.name}: the group of ranks is empty")
    if len(set(group)) != len(group):
        raise CollectiveError(f"{op.name}: the group {list(group)} repeats a rank")
    if not size > 0:
        raise CollectiveError(f"{op.name}: size {size!r} must be > 0 bytes")
    for what, value in (("chunks", chunks), ("channels", channels)):
        if value is None and what == "channels":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CollectiveError(f"{op.name}: {what} {value!r} must be a whole number >= 1")
    check_supported(op, alg, group, topology, options)
    if op.rooted:
        root = group[0] if root is None else root
        if root not in group:
            raise CollectiveError(f"{op.name}: root rank {root} is not in the group")
    else:
        root = None
    fluid = getattr(alg, "fluid", None)
    if fluid is not None:
        found = fluid(op, group, float(size), root, topology, channels, options)
        if found is not None:
            return found
    pipeline = getattr(alg, "pipelined", None) if pipelined else None
    if pipeline is not None:
        found = pipeline(op, group, float(size), root, topology, channels)
        if found is not None:
            return found
    lanes = alg.lanes(group, topology, channels)
    params = {"chunks": chunks, "channels": len(lanes), **alg.schedule_params, **options}
    plan_of = getattr(alg, "plan", None)
    if compact_schedules and plan_of is not None and not options:
        plan = plan_of(op, group, float(size), chunks, lanes)
        if plan is not None:
            return CompactSchedule(op, alg.name, group, float(size), root, plan, params)
    schedule = Schedule(op, alg.name, group, float(size), root, params=params)
    builder = ScheduleBuilder(schedule)
    lane_size = float(size) / (chunks * len(lanes))
    for c, members in enumerate(lanes):
        for _ in range(chunks):
            alg.emit(Lane(builder, c), op, members, lane_size, root, topology, options)
    return schedule
