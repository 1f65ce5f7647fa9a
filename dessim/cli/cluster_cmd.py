"""``dessim cluster SPEC``: several training jobs sharing one cluster's network — started
together for one iteration, or arriving over time under a scheduler (a ``scheduler:`` section)."""

from __future__ import annotations

import click

from typing import Any, Mapping

from dessim.cli.common import GanttRequest, collectives_line, engine_options, output_file, print_json, write_file, write_outputs
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
@click.option("--timeline", type=output_file("timeline"), default=None,
              help="Write a Chrome/Perfetto trace of the shared run (.json or .json.gz).")
@click.option("--gantt", type=output_file("gantt"), default=None, help="Gantt chart (.png or .html).")
@click.option("--spans", type=output_file("spans"), default=None, help="Span table (.csv or .parquet).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--policy", type=click.Choice(["fifo", "fair", "dorm"]), default=None,
              help="Over time: replace the file's scheduler.policy.")
@click.option("--resize-overhead", default=None, metavar="TIME",
              help="Over time: pause of a job whose partition is resized, e.g. 10s.")
@click.option("--table", type=output_file("job table"), default=None,
              help="Over time: write the per-job table (.csv or .parquet).")
@engine_options(topology=False, given_only=True)
def command(spec: str, topology: str | None, no_alone: bool, timeline: str | None,
            gantt: str | None, spans: str | None, as_json: bool, policy: str | None,
            resize_overhead: str | None, table: str | None, engine: dict[str, Any]) -> None:
    """Simulate the jobs of cluster file SPEC together on one network, and each alone.

    SPEC places workloads (any kind: transformer, dlrm, cnn) on disjoint GPU sets of one
    topology; their task graphs are merged and simulated at once, so their traffic shares
    links. Prints each job's iteration time alone and shared and the slowdown.

    The engine options given on the command line replace those of the file's ``engine:``
    section, one setting at a time (``--protocol raw`` keeps the file's ``collectives.algo``).

    With a ``scheduler:`` section, SPEC is a trace of jobs arriving over time (arrival, GPUs
    requested, duration in iterations or tokens); the scheduler (fifo, fair or dorm)
    partitions the cluster, each distinct set of running jobs is simulated once for its
    interference, and the command prints utilisation, fairness loss, makespan and each job's
    completion time and slowdown against running alone (docs/shared-cluster.md).

    Example: dessim cluster workloads/cluster-two-jobs.yaml
    """
    from dessim.engine import EngineOptions
    from dessim.resources import read_yaml
    from dessim.workload.jobtrace import is_job_trace, parse_job_trace
    from dessim.workload.multijob import load_cluster, simulate_cluster

    data = read_yaml(spec, "cluster file")
    if is_job_trace(data):
        used = [flag for flag, v in (("--no-alone", no_alone), ("--timeline", timeline), ("--gantt", gantt),
                                     ("--spans", spans)) if v]
        if used:
            raise click.UsageError(f"{', '.join(used)}: not for a cluster over time (a scheduler: section); "
                                   "use --table and --json")
        trace = parse_job_trace(data, spec)
        _over_time(trace, topology, EngineOptions.of(_over(dict(trace.engine), engine), spec, record_links=False),
                   policy, resize_overhead, table, as_json)
        return
    given = [flag for flag, v in (("--policy", policy), ("--resize-overhead", resize_overhead),
                                  ("--table", table)) if v is not None]
    if given:
        raise click.UsageError(f"{', '.join(given)}: only for a cluster over time (a scheduler: section in {spec})")
    cluster = load_cluster(spec)
    options = EngineOptions.of(_over(dict(cluster.engine), engine), spec,
                               record_links=bool(timeline))
    result = simulate_cluster(cluster, topology=topology, options=options, alone=not no_alone)
    written = write_outputs(result.simulation, timeline, GanttRequest(gantt) if gantt else None, spans)
    summary = result.summary()
    if _printed_json(summary, written, as_json):
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
                if no_alone:     # nothing ran alone: no figure to compare with
                    click.echo(f"    exposed {cat:<8} {format_time(v)} shared")
                    continue
                base = j.exposed_comm_alone_s.get(cat, 0.0)
                click.echo(f"    exposed {cat:<8} {format_time(base)} alone -> {format_time(v)} shared")
    chosen = collectives_line(summary["collectives"])
    if chosen:
        click.echo(f"  collectives {chosen}")
    click.echo(f"  {summary['tasks']} tasks, {summary['events']} events, {summary['wall_s']:.2f} s wall time")
    for line in written:
        click.echo(f"  wrote {line}")


def _printed_json(summary: dict[str, Any], written: list[str], as_json: bool) -> bool:
    """With --json: print the summary and the files written as one object (True)."""
    if as_json:
        print_json({**summary, "files": written})
    return as_json


def _over_time(trace: Any, topology: str | None, options: Any, policy: str | None, resize_overhead: str | None,
               table: str | None, as_json: bool) -> None:
    """``dessim cluster`` on a trace of jobs arriving over time."""
    from dessim.outputs.tables import write_table
    from dessim.units import parse_time
    from dessim.workload.sharedcluster import simulate_job_trace

    overhead = None if resize_overhead is None else parse_time(resize_overhead, "--resize-overhead")
    result = simulate_job_trace(trace, topology=topology, options=options, policy=policy,
                                resize_overhead=overhead)
    written = ([f"jobs: {write_file(table, '--table', lambda p: write_table(result.job_table(), p, 'job table'))}"]
               if table else [])
    s = result.summary()
    if _printed_json(s, written, as_json):
        return
    click.echo(f"{s['cluster']} on {s['topology']} ({s['gpus']} GPUs), {len(result.jobs)} jobs, policy {s['policy']}"
               f" (resize overhead {format_time(s['resize_overhead_s'])})")
    click.echo(f"  makespan      {format_time(s['makespan_s'])}")
    click.echo(f"  utilization   {100 * s['utilization']:.1f}% of GPU time allocated")
    click.echo(f"  fairness loss {s['fairness_loss']:.3f} (time-mean of sum |GPUs - fair share| / 2 GPUs)")
    click.echo(f"  slowdown      mean {s['mean_slowdown']:.3f}x, max {s['max_slowdown']:.3f}x "
               f"(completion time / alone on the GPUs requested)")
    click.echo(f"  {'job':<10} {'workload':<14} {'GPUs':>4} {'arrival':>9} {'start':>9} {'finish':>9} "
               f"{'JCT':>9} {'alone':>9} {'slowdown':>8} {'mean GPUs':>9} {'resizes':>7}")
    for j in s["jobs"]:
        click.echo(f"  {j['name']:<10} {j['workload'][:14]:<14} {j['gpus_requested']:>4} "
                   f"{format_time(j['arrival_s']):>9} {format_time(j['start_s']):>9} {format_time(j['finish_s']):>9} "
                   f"{format_time(j['jct_s']):>9} {format_time(j['alone_jct_s']):>9} {j['slowdown']:>7.3f}x "
                   f"{j['mean_gpus']:>9.2f} {j['resizes']:>7}")
    click.echo(f"  {s['simulations']} distinct job sets simulated (each once)")
    for line in written:
        click.echo(f"  wrote {line}")
