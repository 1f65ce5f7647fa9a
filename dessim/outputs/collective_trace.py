"""Timeline of one collective: every transfer of its schedule as a span.

:func:`collective_result_as_run` turns a :class:`~dessim.collectives.CollectiveResult` (run
with its :class:`~dessim.collectives.ScheduleRun` kept) into a
:class:`~dessim.engine.SimulationResult` whose spans are the transfers, so that the one
Chrome-trace exporter (:mod:`dessim.outputs.chrome_trace`) and the Gantt writer serve
collectives too. Each transfer is a span on its *sending* rank, on a stream ``send lane K``:
lanes are assigned greedily so that spans on one lane never overlap (a rank sending on
several connections or channels at once gets several lanes). ``active_s`` is when the
transfer started moving data, ``start_s`` the same (schedules have no waiting phase).
"""

from __future__ import annotations

from dessim.collectives import CollectiveResult
from dessim.engine.result import SimulationResult
from dessim.errors import DessimError

__all__ = ["collective_result_as_run"]


def collective_result_as_run(result: CollectiveResult, max_transfers: int = 200_000) -> SimulationResult:
    """The transfers of ``result`` as a SimulationResult (spans only; no link series)."""
    run = result.run
    if run is None:
        raise DessimError("this collective result kept no schedule run to draw a timeline from")
    schedule = run.schedule
    if len(schedule) > max_transfers:
        raise DessimError(f"the collective has {len(schedule)} transfers; a timeline is limited "
                          f"to {max_transfers} (use fewer ranks or chunks)")
    starts, finishes = run.transfer_start, run.transfer_finish
    order = sorted(range(len(schedule)), key=lambda i: (starts[i], i))
    transfers = schedule.transfers
    lanes: dict[int, list[float]] = {}
    records = []
    for i in order:
        t = transfers[i]
        s, e = float(starts[i]), float(finishes[i])
        ends = lanes.setdefault(t.src, [])
        lane = next((k for k, end in enumerate(ends) if end <= s), len(ends))
        if lane == len(ends):
            ends.append(e)
        else:
            ends[lane] = e
        records.append((t.src, f"send lane {lane}", f"t{i}", f"{result.op} -> {t.dst}",
                        "send", result.algorithm, s, s, e, float(t.nbytes), 0.0, result.op, t.dst))
    return SimulationResult(makespan_s=result.time_s, ranks=[], span_records=records,
                            link_bytes={}, link_capacity={}, link_series=[],
                            events=result.events, wall_s=result.wall_s, network=result.network,
                            meta={"graph": f"{result.op} {result.algorithm}",
                                  "topology": "", "flows": []})
