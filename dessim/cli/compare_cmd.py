"""``dessim compare``: collective algorithms side by side over message sizes."""

from __future__ import annotations

import click

from dessim.cli.collective_cmd import COLLECTIVE_PATHS, ranks_option
from dessim.cli.common import engine_options
from dessim.engine.options import EngineOptions
from dessim.units import format_size, format_time


@click.command(name="compare", epilog="Example: dessim compare allreduce --algos "
               "ring,tree,hd,direct --sizes 1KiB,1MiB,64MiB --topology switch:16")
@click.argument("op")
@click.option("--algos", required=True, help="Comma-separated algorithms (auto allowed).")
@click.option("--sizes", required=True, help="Comma-separated sizes, e.g. 1KiB,1MiB,64MiB.")
@engine_options(paths=COLLECTIVE_PATHS)
@ranks_option
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False),
              help="Write the table as CSV.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write a PNG of busbw vs size per algorithm.")
def command(op: str, algos: str, sizes: str, topology: str, ranks: str | None,
            engine: EngineOptions, csv_path: str | None, plot_path: str | None) -> None:
    """Compare algorithms for collective OP over sizes: time and busbw, winner per size."""
    from dessim.collectives import compare_collectives

    kwargs = engine.run_collective_kwargs()
    kwargs.pop("algo")                      # each of --algos in turn
    df = compare_collectives(op, algos, sizes, topology, ranks=ranks, **kwargs)
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
    if csv_path:
        df.to_csv(csv_path, index=False)
        click.echo(f"wrote {csv_path}")
    if plot_path:
        from dessim.outputs.plots import plot_busbw

        plot_busbw(df, plot_path, f"{op} on {topology}")
        click.echo(f"wrote {plot_path}")
