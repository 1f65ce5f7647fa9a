"""Plots of collective results: busbw against message size, like nccl-tests curves."""

from __future__ import annotations

from dessim.errors import DessimError

__all__ = ["plot_busbw"]


def plot_busbw(df, path: str, title: str) -> None:
    """busbw vs size (log x), one line per algorithm, PNG via matplotlib's Agg backend."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DessimError("busbw plots need matplotlib: pip install 'dessim[plot]'") from None

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
