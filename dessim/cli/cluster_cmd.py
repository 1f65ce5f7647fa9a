"""``dessim cluster SPEC``: several training jobs sharing one cluster's network."""

from __future__ import annotations

import click

from typing import Any, Mapping

from dessim.cli.common import engine_options, print_json, write_outputs
from dessim.units import format_time


def _over(base: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a file's engine section) with the command line's settings laid over it, part
    by part (``{"collectives": {"protocol": "raw"}}`` keeps the file's other collective keys)."""
    out = dict(base)
    for key, value in given.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@click.command("cluster")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--topology", "-t", default=None, help="Replace the file's topology (any topology spec).")
@click.option("--no-alone", is_flag=True, help="Skip the runs of each job alone (no slowdown figures).")
@click.option("--timeline", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome/Perfetto trace of the shared run.")
@click.option("--gantt", type=click.Path(dir_okay=False), default=None, help="Gantt chart (.png or .html).")
@click.option("--spans", type=click.Path(dir_okay=False), default=None, help="Span table (.csv or .parquet).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@engine_options(topology=False, given_only=True)
def command(spec: str, topology: str | None, no_alone: bool, timeline: str | None,
            gantt: str | None, spans: str | None, as_json: bool, engine: dict[str, Any]) -> None:
    """Simulate the jobs of cluster file SPEC together on one network, and each alone.

    SPEC places workloads (any kind: transformer, dlrm, cnn) on disjoint GPU sets of one
    topology; their task graphs are merged and simulated at once, so their traffic shares
    links. Prints each job's iteration time alone and shared and the slowdown.

    The engine options given on the command line replace those of the file's ``engine:``
    section, one setting at a time (``--protocol raw`` keeps the file's ``collectives.algo``).

    Example: dessim cluster workloads/cluster-two-jobs.yaml
    """
    from dessim.engine import EngineOptions
    from dessim.workload.multijob import load_cluster, simulate_cluster

    cluster = load_cluster(spec)
    options = EngineOptions.of(_over(dict(cluster.engine), engine), spec,
                               record_links=bool(timeline or gantt))
    result = simulate_cluster(cluster, topology=topology, options=options, alone=not no_alone)
    written = write_outputs(result.simulation, timeline, gantt, spans)
    summary = result.summary()
    if as_json:
        summary["files"] = written
        print_json(summary)
        return
    click.echo(f"{summary['cluster']} on {result.topology.name} ({summary['gpus']} GPUs), "
               f"{len(result.jobs)} jobs, makespan {format_time(summary['makespan_s'])}, "
               f"calibration {summary['calibration']}")
    for j in result.jobs:
        gpus = ",".join(str(g) for g in j.gpus)
        click.echo(f"  {j.name:<10} {j.workload:<20} GPUs {gpus}")
        alone = "-" if no_alone else format_time(j.alone_s)
        slow = "" if no_alone else f", slowdown {j.slowdown:.3f}x"
        click.echo(f"    iteration alone {alone}, shared {format_time(j.shared_s)}{slow}")
        for cat, v in j.exposed_comm_shared_s.items():
            if v:
                base = j.exposed_comm_alone_s.get(cat, 0.0)
                click.echo(f"    exposed {cat:<8} {format_time(base)} alone -> {format_time(v)} shared")
    click.echo(f"  {summary['tasks']} tasks, {summary['events']} events, {summary['wall_s']:.2f} s wall time")
    for line in written:
        click.echo(f"  wrote {line}")
