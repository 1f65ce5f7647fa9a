"""Simulate a list of point-to-point transfers on a topology: the network layer's one-call API."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Iterable, Sequence

import simpy

from dessim.errors import DessimError, NetworkError
from dessim.network.base import make_network
from dessim.topology.graph import Topology
from dessim.units import parse_size, parse_time

__all__ = ["TransferResult", "simulate_transfers"]


@dataclass(frozen=True)
class TransferResult:
    """What :func:`simulate_transfers` measured (SI units)."""

    #: ``(src node, dst node, bytes, start s)`` of each transfer, in input order.
    transfers: tuple[tuple[str, str, int, float], ...]
    #: Finish time (s) of each transfer, in input order.
    finish_times: list[float]
    #: Bytes carried per link direction ``(a, b)``.
    link_bytes: dict[tuple[str, str], float]
    #: Latest finish time (s); 0.0 without transfers.
    makespan: float
    #: Network model work: flow starts + finishes + rate solves.
    events: int
    #: Wall-clock seconds the simulation took.
    wall_s: float
    #: Name of the network model used.
    network: str = "flow"
    #: Per-channel utilisation change points ``(s, (a, b), fraction)`` if recorded.
    utilisation: list[tuple[float, tuple[str, str], float]] = field(default_factory=list)

    def to_frame(self) -> Any:
        """A pandas DataFrame with one row per transfer: src, dst, bytes, start_s, finish_s,
        duration_s and the achieved rate ``bytes / duration`` (bytes/s, NaN when 0 s)."""
        import pandas as pd

        rows = []
        for (src, dst, nbytes, start), finish in zip(self.transfers, self.finish_times):
            duration = finish - start
            rows.append({"src": src, "dst": dst, "bytes": nbytes, "start_s": start,
                         "finish_s": finish, "duration_s": duration,
                         "rate_Bps": nbytes / duration if duration > 0 else float("nan")})
        return pd.DataFrame(rows, columns=["src", "dst", "bytes", "start_s", "finish_s",
                                           "duration_s", "rate_Bps"])


def _parse(topology: Topology, transfers: Iterable[Sequence[Any]]) -> list[tuple[str, str, int, float]]:
    parsed = []
    for i, item in enumerate(transfers):
        where = f"transfer #{i}"
        try:
            src, dst, nbytes, start = item
        except (TypeError, ValueError):
            raise NetworkError(f"{where}: expected (src, dst, nbytes, start_s), got {item!r}") from None
        try:
            s = topology.resolve(src)
            d = topology.resolve(dst)
            n = parse_size(nbytes, f"{where} size")
            t = parse_time(start, f"{where} start")
        except DessimError as exc:
            raise NetworkError(f"{where}: {exc}") from None
        parsed.append((s, d, n, t))
    return parsed


def simulate_transfers(topology: Topology, transfers: Iterable[Sequence[Any]], *,
                       network: str = "flow", record_links: bool = False,
                       **options: Any) -> TransferResult:
    """Run ``transfers`` — ``(src, dst, nbytes, start_s)`` each, endpoints as node names or GPU
    ranks, sizes and start times as numbers (bytes, s) or unit strings (``"1MiB"``, ``"5us"``) —
    on ``topology`` with the network model ``network`` (see
    :data:`~dessim.network.base.NETWORK_MODELS`) and return a :class:`TransferResult`.

    Transfers starting at the same time start in input order; the i-th transfer uses ECMP key
    ``i`` so that parallel transfers between the same endpoints may spread over equal-cost paths.
    """
    parsed = _parse(topology, transfers)
    wall0 = time.perf_counter()
    env = simpy.Environment()
    net = make_network(network, env, topology, record_links=record_links, **options)
    finish: list[float] = [0.0] * len(parsed)

    def start_group(indices: list[int]) -> None:
        for i in indices:
            src, dst, nbytes, _ = parsed[i]
            done = net.transfer(src, dst, nbytes, key=i)
            done.callbacks.append(lambda ev, i=i: finish.__setitem__(i, ev.value))

    order = sorted(range(len(parsed)), key=lambda i: (parsed[i][3], i))
    for start, group in groupby(order, key=lambda i: parsed[i][3]):
        members = list(group)
        env.timeout(start).callbacks.append(lambda _, m=members: start_group(m))
    env.run()
    wall = time.perf_counter() - wall0
    return TransferResult(
        transfers=tuple(parsed), finish_times=finish, link_bytes=net.link_bytes(),
        makespan=max(finish, default=0.0), events=net.events, wall_s=wall, network=network,
        utilisation=list(net.utilisation))
