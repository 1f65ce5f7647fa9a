"""The :class:`Algorithm` contract and the registry of algorithms.

An algorithm turns (op, group, size) into transfers on a :class:`~dessim.collectives.schedule.Lane`
— one channel × one chunk of the collective; :func:`dessim.collectives.algorithms.build_schedule`
runs it once per lane. Adding an algorithm = adding one module that subclasses
:class:`Algorithm` and decorates it with :func:`register`.
"""

from __future__ import annotations

from typing import ClassVar

from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology

__all__ = ["Algorithm", "ALGORITHMS", "register", "get_algorithm", "algorithms_for"]

#: Offset between the channel ids of an algorithm's sub-lanes (e.g. the two trees of dbtree),
#: so that they never share a FIFO connection with another lane.
SUB_CHANNEL = 1 << 20


class Algorithm:
    """One collective algorithm family."""

    #: Registry name (``--algo``).
    name: ClassVar[str] = ""
    #: One line for listings and errors.
    summary: ClassVar[str] = ""
    #: Operations it can run.
    ops: ClassVar[frozenset[str]] = frozenset()
    #: Schedule parameters it sets unless the caller's options say otherwise (e.g. a
    #: connection ``window``: :mod:`dessim.collectives.executor`, "Connections").
    schedule_params: ClassVar[dict] = {}

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        """Raise :class:`CollectiveError` if it cannot run ``op`` on ``group`` (op support
        is checked by the caller)."""

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        """Add the transfers of one lane carrying ``size`` bytes (op semantics) to ``lane``."""
        raise NotImplementedError

    def lanes(self, group: tuple[int, ...], topology: Topology | None,
              channels: int | None) -> list[tuple[int, ...]]:
        """The member order of each lane: :func:`~dessim.collectives.algorithms.build_schedule`
        emits lane ``c`` with ``lanes[c]`` as its group. Default: ``channels`` lanes (None: 1)
        over the group as given."""
        return [group] * (channels or 1)

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """What :meth:`check` and :meth:`emit` read from ``topology`` beyond the routes
        between the members, with ranks given as positions in ``group`` (None: nothing).
        Groups with equal keys and equal routes (:func:`dessim.collectives.auto.group_shape`)
        get the same schedule up to renaming — an algorithm that looks at the topology in
        another way must override this."""
        return None


#: Algorithms by name, filled by :func:`register`.
ALGORITHMS: dict[str, Algorithm] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: add an algorithm to :data:`ALGORITHMS` under ``cls.name``."""
    ALGORITHMS[cls.name] = cls()
    return cls


def algorithms_for(op: Op) -> list[str]:
    """Names of the algorithms that can run ``op``."""
    return [name for name, alg in ALGORITHMS.items() if op.name in alg.ops]


def get_algorithm(name: str | Algorithm) -> Algorithm:
    """The algorithm called ``name`` (case-insensitive); a clear error listing valid names."""
    if isinstance(name, Algorithm):
        return name
    alg = ALGORITHMS.get(str(name).strip().lower())
    if alg is None:
        raise CollectiveError(f"unknown collective algorithm {name!r}; valid algorithms: "
                              f"{', '.join(ALGORITHMS)} (or auto)")
    return alg
