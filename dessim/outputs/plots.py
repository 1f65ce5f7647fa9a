"""Plots of collective results: busbw against message size, like nccl-tests curves."""

from __future__ import annotations

from dessim.resources import check_output, output_format

__all__ = ["plot_busbw", "PLOT_FORMATS"]

#: Plot formats (matplotlib) by suffix → the extra that draws them.
PLOT_FORMATS: dict[str, str | None] = {".png": "plot", ".svg": "plot", ".pdf": "plot"}
#: matplotlib's metadata keys that carry its version or the date, per format, left out so
#: that a plot is the same bytes on every run (each writer accepts only its own keys: the
#: SVG writer refuses PNG's "Software").
_UNSTAMPED: dict[str, dict[str, None]] = {
    ".png": {"Software": None}, ".svg": {"Creator": None, "Date": None},
    ".pdf": {"Creator": None, "Producer": None, "CreationDate": None}}


def plot_busbw(df, path: str, title: str) -> None:
    """busbw vs size (log x), one line per algorithm, via matplotlib's Agg backend
    (:data:`PLOT_FORMATS`)."""
    kind = output_format(check_output(path, "busbw plot", PLOT_FORMATS), PLOT_FORMATS)
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
    with matplotlib.rc_context({"svg.hashsalt": "dessim"}):   # fixed SVG element ids
        fig.savefig(path, format=kind.lstrip("."), dpi=100, metadata=_UNSTAMPED[kind])
    plt.close(fig)
