"""``dessim compare``: collective algorithms side by side over message sizes."""

from __future__ import annotations

from typing import Any

import click

from dessim.cli.collective_cmd import COLLECTIVE_PATHS, ranks_option
from dessim.cli.common import engine_options, json_option, output_file, print_json, table_records, write_file
from dessim.engine.options import EngineOptions
from dessim.errors import DessimError
from dessim.units import format_size, format_time, parse_size


@click.command(name="compare", epilog="Example: dessim compare allreduce --algos "
               "ring,tree,hd,direct --sizes 1KiB,1MiB,64MiB --topology switch:16")
@click.argument("op")
@click.option("--algos", default=None,
              help="Comma-separated algorithms (auto allowed). Default: every algorithm that "
                   "can run OP on the group, in registry order (ring, tree, dbtree, rd, hd, "
                   "direct, pairwise, rail, hierarchical, nvls, nvlstree, collnet, "
                   "collnetdirect); the others are listed as skipped with the reason. Naming "
                   "one that cannot run is an error.")
@click.option("--sizes", required=True, help="Comma-separated sizes, e.g. 1KiB,1MiB,64MiB.")
@engine_options(paths=COLLECTIVE_PATHS)
@ranks_option
@click.option("--csv", "csv_path", default=None, type=output_file("csv"),
              help="Write the table as CSV (time_s in seconds, busbw_GBps in GB/s).")
@click.option("--plot", "plot_path", default=None, type=output_file("plot"),
              help="Write a plot (.png, .svg or .pdf) of busbw vs size per algorithm.")
@json_option
def command(op: str, algos: str | None, sizes: str, topology: str, ranks: str | None,
            engine: EngineOptions, csv_path: str | None, plot_path: str | None,
            as_json: bool) -> None:
    """Compare algorithms for collective OP over sizes: time and busbw, winner per size.

    --json prints {op, topology, algorithms, skipped, rows, winners, calibration, files}:
    the algorithms compared, {algorithm: why it cannot run} for those left out, and one row
    per (size, algorithm) with size_bytes, algorithm, chosen, protocol, time_s, algbw_GBps,
    busbw_GBps (GB/s = 1e9 bytes/s), events, winner.
    """
    from dessim.collectives import compare_collectives

    if algos is not None:
        _once_each("--algos", algos, lambda a: a.lower())
    _once_each("--sizes", sizes, parse_size)
    kwargs = engine.run_collective_kwargs()
    kwargs.pop("algo")                      # each of --algos in turn
    df = compare_collectives(op, algos, sizes, topology, ranks=ranks, **kwargs)
    if as_json:
        files = _write_files(df, op, topology, csv_path, plot_path)
        winners = df[df["winner"]]
        print_json({"op": op, "topology": topology, "algorithms": df.attrs["algorithms"],
                    "skipped": df.attrs["skipped"], "rows": table_records(df),
                    "winners": {str(int(r.size_bytes)): r.algorithm for r in winners.itertuples(index=False)},
                    "calibration": str(df["calibration"].iloc[0]), "files": files})
        return
    how = "as named" if algos is not None else f"every one that can run {op}"
    click.echo(f"algorithms: {', '.join(df.attrs['algorithms'])} ({how})")
    for name, reason in df.attrs["skipped"].items():
        click.echo(f"skipped {name}: {reason}")
    header = (f"{'size':>10}  {'algorithm':<16} {'protocol':<8} {'time':>12} {'busbw GB/s':>11}"
              "  winner")
    click.echo(header)
    for row in df.itertuples(index=False):
        name = row.algorithm if row.algorithm == row.chosen else f"{row.algorithm}={row.chosen}"
        click.echo(f"{format_size(row.size_bytes):>10}  {name:<16} {row.protocol:<8} "
                   f"{format_time(row.time_s):>12} {row.busbw_GBps:>11.3f}  "
                   f"{'*' if row.winner else ''}")
    winners = df[df["winner"]]
    click.echo("winners: " + ", ".join(f"{format_size(r.size_bytes)} {r.algorithm}"
                                       for r in winners.itertuples(index=False)))
    click.echo(f"calibration: {df['calibration'].iloc[0]}")
    for path in _write_files(df, op, topology, csv_path, plot_path):
        click.echo(f"wrote {path}")


def _once_each(flag: str, text: str, key) -> None:
    """Refuse an item given twice (``ring,ring``; ``1MiB,1048576``): the table would repeat
    its rows and its winners. Items that do not parse are left to the comparison's own
    message."""
    seen: dict[Any, str] = {}
    for item in (i.strip() for i in text.split(",")):
        try:
            k = key(item)
        except DessimError:
            return
        if item and k in seen:
            raise click.BadParameter(f"{item!r} repeats {seen[k]!r} in {text!r}", param_hint=flag)
        seen[k] = item


def _write_files(df, op: str, topology: str, csv_path: str | None, plot_path: str | None) -> list[str]:
    """Write the CSV table and the busbw plot asked for; the paths written."""
    written = []
    if csv_path:
        write_file(csv_path, "--csv", lambda p: df.to_csv(p, index=False))
        written.append(csv_path)
    if plot_path:
        from dessim.outputs.plots import plot_busbw

        write_file(plot_path, "--plot", lambda p: plot_busbw(df, p, f"{op} on {topology}"))
        written.append(plot_path)
    return written
