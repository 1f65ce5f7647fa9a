"""Pipelined reduce-up / broadcast-down over a tree given as a parent array.

Shared by :mod:`~dessim.collectives.algorithms.tree` and
:mod:`~dessim.collectives.algorithms.dbtree`. Chunks pipeline because each lane is one chunk
and connections are FIFO ("Pipelined chain and tree" in docs/references.md).
"""

from __future__ import annotations

from dessim.collectives.schedule import Lane


def depths(parent: list[int]) -> list[int]:
    """Depth of every position in a tree given by ``parent[i]`` (-1 for the root)."""
    out = [-1] * len(parent)
    for i in range(len(parent)):
        chain = []
        j = i
        while out[j] < 0 and parent[j] >= 0:
            chain.append(j)
            j = parent[j]
        base = out[j] if out[j] >= 0 else 0
        out[j] = base
        for k in reversed(chain):
            base += 1
            out[k] = base
    return out


def emit_tree(lane: Lane, nodes: tuple[int, ...], parent: list[int], size: float,
              *, up: bool, down: bool) -> None:
    """Reduce ``size`` bytes up the tree (deepest level first) and/or broadcast them down.

    ``nodes[i]`` is the global rank at position ``i``; ``parent[i]`` its parent's position.
    """
    depth = depths(parent)
    levels: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        levels.setdefault(d, []).append(i)
    if up:
        for d in sorted(levels, reverse=True):
            if d > 0:
                lane.step([(nodes[i], nodes[parent[i]], size, size) for i in levels[d]])
    if down:
        for d in sorted(levels):
            if d > 0:
                lane.step([(nodes[parent[i]], nodes[i], size, 0.0) for i in levels[d]])
