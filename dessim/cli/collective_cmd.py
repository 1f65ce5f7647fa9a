"""``dessim collective``: simulate one collective on a topology and report nccl-tests figures."""

from __future__ import annotations

import json

import click

from dessim.cli.common import engine_options, output_file, suggest_compressed_timeline, write_file
from dessim.engine.options import EngineOptions
from dessim.units import format_bandwidth, format_size, format_time

#: Where the collective runs, and the engine options that apply to one collective.
COLLECTIVE_PATHS = ("network", "collectives.protocol", "collectives.chunks", "collectives.channels",
                     "collectives.reduction_bw", "calibration")

#: The group a collective runs on (``collective`` and ``compare``).
ranks_option = click.option("--ranks", default=None,
                            help="Group: '0-7', '0,2,4,6', '0-3,8-11' (default: all).")


@click.command(name="collective", epilog="Example: dessim collective allreduce --algo ring "
               "--size 1GiB --topology switch:8,bw=50GB/s,lat=500ns")
@click.argument("op")
@engine_options(paths=("collectives.algo", *COLLECTIVE_PATHS, "shortcuts.stream_rings",
                       "collectives.gpus_per_process"))
@click.option("--size", required=True, help="Bytes in nccl-tests semantics: per-rank buffer "
              "(allreduce, broadcast, reduce, alltoall, sendrecv) or the whole array "
              "(allgather, reducescatter). E.g. 1MiB, 1GB.")
@ranks_option
@click.option("--root", type=int, default=None, help="Root rank of broadcast/reduce "
              "(default: first rank of the group).")
@click.option("--inner", default=None, help="hierarchical only: flat algorithm per dimension, "
              "e.g. 'ring' or 'ring,tree' (default ring).")
@click.option("--links", "show_links", type=click.IntRange(min=0), default=5, show_default=True,
              help="Print the N busiest links (JSON: all with --links > 0).")
@click.option("--timeline", type=output_file("timeline"), default=None,
              help="Write every transfer as a span to a Chrome/Perfetto trace (times in us): "
                   ".json or .json.gz.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(op: str, size: str, topology: str, ranks: str | None, root: int | None,
            engine: EngineOptions, inner: str | None, show_links: int, timeline: str | None,
            as_json: bool) -> None:
    """Simulate collective OP (allreduce, reducescatter, allgather, broadcast, reduce,
    alltoall, sendrecv) on an idle network and print time, algbw and busbw
    (nccl-tests definitions, GB/s = 1e9 B/s)."""
    from dessim.collectives import run_collective

    options = {"inner": inner} if inner else {}
    res = run_collective(op, size, topology, ranks=ranks, root=root,
                         **engine.run_collective_kwargs(), **options)
    if timeline:
        from dessim.outputs import write_chrome_trace
        from dessim.outputs.collective_trace import collective_result_as_run

        write_file(timeline, "--timeline", lambda p: write_chrome_trace(collective_result_as_run(res), p))
        suggest_compressed_timeline(timeline)
    if as_json:
        out = res.to_dict(links=show_links > 0)
        if timeline:
            out["timeline"] = timeline
        click.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    if res.auto:
        click.echo(res.explanation)
    click.echo(f"{res.op} {format_size(res.size)} on {len(res.ranks)} ranks, algorithm "
               f"{res.algorithm}, protocol {res.protocol}, {res.network} network, "
               f"{res.channels} lane(s) x {res.chunks} chunk(s), calibration {res.calibration}")
    click.echo(f"time    {format_time(res.time_s)}  ({res.time_s:.9g} s)")
    click.echo(f"algbw   {res.algbw_GBps:.4f} GB/s")
    click.echo(f"busbw   {res.busbw_GBps:.4f} GB/s")
    click.echo(f"transfers {res.transfers}, network events {res.events}, "
               f"wall {res.wall_s:.3f} s")
    click.echo(f"busiest link utilisation {res.link_util_max:.3f}")
    for row in res.link_util[:show_links]:
        click.echo(f"  {row['link']:<40} {format_size(row['bytes']):>10}  "
                   f"{row['utilisation']:.3f}  ({format_bandwidth(row['bytes'] / res.time_s)})")
    if timeline:
        click.echo(f"wrote timeline: {timeline}")
