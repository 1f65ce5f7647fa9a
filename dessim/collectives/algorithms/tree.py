"""Binary tree (heap order: position i has children 2i+1 and 2i+2), pipelined by chunks.

allreduce = reduce up to the root, then broadcast down; reduce / broadcast use one half.
Cost with k chunks ≈ (2⌈lg p⌉ + k - 1)(α + 2(S/k)β) per phase ([D]; "Pipelined chain and
tree" in docs/references.md): a tree reaches the root in ⌈lg p⌉ steps, which beats the ring's
p-1 for small messages.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.algorithms.trees import emit_tree
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


@register
class Tree(Algorithm):
    name = "tree"
    summary = "binary tree, pipelined chunks: reduce up then broadcast down"
    ops = frozenset({"allreduce", "reduce", "broadcast"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        start = group.index(root) if root is not None else 0
        nodes = group[start:] + group[:start]
        parent = [(i - 1) // 2 if i else -1 for i in range(len(nodes))]
        emit_tree(lane, nodes, parent, size,
                  up=op.name in ("allreduce", "reduce"),
                  down=op.name in ("allreduce", "broadcast"))
