"""``dessim compare``: collective algorithms side by side over message sizes."""

from __future__ import annotations

import click

from dessim.cli.collective_cmd import TOPOLOGY_HELP
from dessim.units import format_size, format_time


def plot_busbw(df, path: str, title: str) -> None:
    """busbw vs size (log x), one line per algorithm, PNG via matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algo, part in df.groupby("algorithm", sort=False):
        ax.plot(part["size_bytes"], part["busbw_GBps"], marker="o", label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


@click.command(name="compare", epilog="Example: dessim compare allreduce --algos "
               "ring,tree,hd,direct --sizes 1KiB,1MiB,64MiB --topology switch:16")
@click.argument("op")
@click.option("--algos", required=True, help="Comma-separated algorithms (auto allowed).")
@click.option("--sizes", required=True, help="Comma-separated sizes, e.g. 1KiB,1MiB,64MiB.")
@click.option("--topology", "-t", "topology", required=True, help=TOPOLOGY_HELP)
@click.option("--ranks", default=None, help="Group: '0-7', '0,2,4,6' (default: all).")
@click.option("--chunks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pieces per channel (pipelining).")
@click.option("--channels", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parallel channels.")
@click.option("--network", type=click.Choice(["flow", "analytical"]), default="flow",
              show_default=True, help="Network model.")
@click.option("--reduction-bw", default=None, help="Reduction speed (default: free).")
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False),
              help="Write the table as CSV.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write a PNG of busbw vs size per algorithm.")
def command(op: str, algos: str, sizes: str, topology: str, ranks: str | None, chunks: int,
            channels: int, network: str, reduction_bw: str | None, csv_path: str | None,
            plot_path: str | None) -> None:
    """Compare algorithms for collective OP over sizes: time and busbw, winner per size."""
    from dessim.collectives import compare_collectives

    df = compare_collectives(op, algos, sizes, topology, ranks=ranks, chunks=chunks,
                             channels=channels, network=network, reduction_bw=reduction_bw)
    header = f"{'size':>10}  {'algorithm':<13} {'time':>12} {'busbw GB/s':>11}  winner"
    click.echo(header)
    for row in df.itertuples(index=False):
        name = row.algorithm if row.algorithm == row.chosen else f"{row.algorithm}={row.chosen}"
        click.echo(f"{format_size(row.size_bytes):>10}  {name:<13} {format_time(row.time_s):>12} "
                   f"{row.busbw_GBps:>11.3f}  {'*' if row.winner else ''}")
    winners = df[df["winner"]]
    click.echo("winners: " + ", ".join(f"{format_size(r.size_bytes)} {r.algorithm}"
                                       for r in winners.itertuples(index=False)))
    if csv_path:
        df.to_csv(csv_path, index=False)
        click.echo(f"wrote {csv_path}")
    if plot_path:
        plot_busbw(df, plot_path, f"{op} on {topology}")
        click.echo(f"wrote {plot_path}")
