"""``dessim run GRAPH.json --topology SPEC``: replay a task-graph file."""

from __future__ import annotations

from dataclasses import replace

import click

from dessim.cli.common import GanttRequest, engine_options, output_options, report_run, write_outputs
from dessim.engine import EngineOptions
from dessim.errors import DessimError


@click.command("run")
@click.argument("graph", type=click.Path(exists=True, dir_okay=False))
@engine_options()
@output_options
def command(graph: str, topology: str, engine: EngineOptions, timeline: str | None,
            gantt: GanttRequest | None, spans: str | None, as_json: bool) -> None:
    """Replay the task graph GRAPH (dessim JSON format) on a topology.

    Prints the makespan and where the time went (compute, communication, exposed
    communication, waiting, idle); optionally writes a timeline, a Gantt chart and the span
    table.

    Example: dessim run graph.json --topology ring:8,bw=50GB/s,lat=500ns --timeline t.json
    """
    from dessim.engine import simulate
    from dessim.taskgraph import load_taskgraph
    from dessim.topology import load_topology

    topo = load_topology(topology)
    tg = load_taskgraph(graph)
    options = replace(engine, record_links=bool(timeline))
    try:
        result = simulate(tg, topo, options)
    except DessimError as exc:      # the graph does not fit the topology: name both
        raise type(exc)(f"task graph {graph!r} on topology {topology!r}: {exc}") from None
    written = write_outputs(result, timeline, gantt, spans)
    title = f"{tg.name}: {len(tg)} tasks on {topo.name}"
    if tg.fold is not None:     # the summary counts the simulated ranks only: say why
        lanes, ranks = tg.fold.perm.shape
        title += (f" (replica-folded: {len(result.ranks)} simulated rank(s) stand for all {ranks}, "
                  f"{lanes} lanes each; every lane's traffic is on the network)")
    report_run(result, title, written, as_json,
               {"fold_lanes": int(tg.fold.perm.shape[0])} if tg.fold is not None else None)
