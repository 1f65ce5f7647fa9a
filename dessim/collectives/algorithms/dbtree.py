"""NCCL's Tree: double binary trees (NCCL 2.4 and later; docs/references.md).

Two complementary binary trees each carry half of the data: tree 0 is NCCL's in-order binary
tree (``ncclGetBtree``: a rank's parent is found from its lowest set bit), tree 1 its mirror
(``p`` even) or its shift by one (``p`` odd), as in ``ncclGetDtree``; a rank that is a leaf
in one tree is an inner node of the other, so the per-rank traffic is balanced.

* **Inside one host** (NCCL 2.30.7 ``ncclTopoPreset``, ``src/graph/connect.cc``) a channel's
  tree is the tree graph's intra-node order as a chain: ``tree.up = intra[i-1]``,
  ``tree.down[0] = intra[i+1]``; with no network there are no node trees
  (``connectTrees`` adds nothing on one node) and the duplicated channels
  (``c + nChannels``) are copies of the same chains. Without NICs the tree search starts in
  PCI order and replays it on every channel (``ncclTopoSearchRec``: ``FORCED_ORDER_PCI`` then
  ``FORCED_ORDER_REPLAY``), so every channel is the chain through the group in order, rooted
  at its first rank. The kernel (``src/device/all_reduce.h``, ``runTreeSplit``) reduces each
  chunk up the chain and broadcasts it down with separate threads at once, so it runs as the
  same fluid pipeline as across hosts (:func:`tree_fluid`): each chain edge is a flow up and a
  flow down, and the latency is NCCL's ``2·(ppn-1)·intra`` hops. All channels load the same
  links, so dessim runs one lane unless ``channels`` asks for more (the ring's convention,
  :mod:`~dessim.collectives.algorithms.ring`). Without a topology the two binary trees run
  over the group's ranks, store and forward per step (pipelined by ``chunks``).
* **Across hosts** (NCCL 2.30.7 ``connectTrees``, ``src/graph/connect.cc``) the trees run over
  the *nodes*: in each node the channel's data goes through a chain of the node's GPUs,
  headed by the GPU that owns the channel's NIC (one lane per rail of the first node), and
  the heads exchange with their parent and child nodes. NCCL pipelines this in 64 KiB - 2 MiB
  chunks through every edge at once, so it runs as a fluid pipeline
  (:class:`~dessim.collectives.schedule.FluidSchedule`, :func:`tree_fluid`): every chain and
  tree edge is a flow in both directions, and the latency is NCCL's
  ``2·((ppn-1)·intra + log2(nodes)·inter)`` hops.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import SUB_CHANNEL, Algorithm, register
from dessim.collectives.algorithms.trees import emit_tree
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Flow, FluidSchedule, Lane
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map


def btree_parent(p: int) -> list[int]:
    """Parents of NCCL's in-order binary tree over ranks 0..p-1 (root 0 has parent -1)."""
    parent = [-1] * p
    for rank in range(1, p):
        bit = 1
        while bit < p and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= p:
            up = rank ^ bit
        parent[rank] = up
    return parent


def dtree_parents(p: int) -> tuple[list[int], list[int]]:
    """Parents of NCCL's two complementary trees (mirror for even p, shift for odd p)."""
    t0 = btree_parent(p)
    if p % 2:   # shift: rank r plays rank r-1 of tree 0
        t1 = [-1 if t0[(r - 1) % p] < 0 else (t0[(r - 1) % p] + 1) % p for r in range(p)]
    else:       # mirror: rank r plays rank p-1-r
        t1 = [-1 if t0[p - 1 - r] < 0 else p - 1 - t0[p - 1 - r] for r in range(p)]
    return t0, t1


def node_tree_edges(n_nodes: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """NCCL's two node trees as (tree, [(child, parent)]) with node positions."""
    if n_nodes < 2:
        return []
    out = []
    for t, parent in enumerate(dtree_parents(n_nodes)):
        out.append((t, [(k, q) for k, q in enumerate(parent) if q >= 0]))
    return out


def tree_depth(n_nodes: int) -> int:
    return max(0, int(n_nodes).bit_length() - 1)


def tree_fluid(op: Op, group: tuple[int, ...], size: float, root: int | None,
               topology: Topology, channels: int | None, name: str = "dbtree") -> FluidSchedule | None:
    """NCCL's Tree (module docstring) for ``group``: the chain through the group inside one
    host, the node trees with chains inside nodes across hosts; None for fewer than 2 ranks."""
    if len(group) < 2:
        return None
    hosts = host_map(topology)
    parts = hosts.split(group)
    if len(parts) < 2:
        return chain_fluid(op, group, size, root, channels, name)
    first = hosts.host_of(group[0])
    rails = sorted({first.rail[n] for r in parts[0] for n in (first.nic_of.get(r),)
                    if n is not None and n in first.rail}, key=str) or [None]
    lanes = len(rails) if channels is None else channels
    per = size / lanes / 2            # per lane and tree
    flows: list[Flow] = []
    heads_of_lane = []
    for c in range(lanes):
        rail = rails[c % len(rails)]
        chains = []
        for part in parts:
            host = hosts.host_of(part[0])
            nic = host.nic_on_rail(rail) if rail is not None else None
            head = next((r for r in part if nic is not None and host.nic_of.get(r) == nic), part[0])
            i = part.index(head)
            chains.append(part[i:] + part[:i])
        heads_of_lane.append(chains)
        for t, edges in node_tree_edges(len(parts)):
            ch = 2 * c + t
            for chain in chains:
                for a, b in zip(chain, chain[1:]):
                    flows.append(Flow(b, a, per, ch))     # reduce up the chain
                    flows.append(Flow(a, b, per, ch))     # broadcast down
            for child, parent in edges:
                a, b = chains[child][0], chains[parent][0]
                flows.append(Flow(a, b, per, ch))
                flows.append(Flow(b, a, per, ch))
    chain0 = heads_of_lane[0][0]
    up_chain = list(zip(chain0[1:], chain0)) if len(chain0) > 1 else []
    depth = tree_depth(len(parts))
    net_hop = (heads_of_lane[0][1][0], heads_of_lane[0][0][0])
    critical = 2 * (up_chain + [net_hop] * depth)
    return FluidSchedule(op, name, group, size, root, flows, critical,
                         {"channels": lanes * 2, "chunks": 1})


def chain_fluid(op: Op, group: tuple[int, ...], size: float, root: int | None,
                channels: int | None, name: str = "dbtree") -> FluidSchedule:
    """NCCL's Tree inside one host: ``channels`` lanes (None: 1) of the chain
    ``group[0] <- group[1] <- ... <- group[-1]``, each carrying ``size / lanes`` bytes up
    (reduce) and down (broadcast) every edge; critical path ``2·(p-1)`` hops."""
    lanes = channels or 1
    per = size / lanes
    edges = list(zip(group, group[1:]))
    flows = []
    for c in range(lanes):
        for a, b in edges:
            flows.append(Flow(b, a, per, c))      # reduce up the chain
            flows.append(Flow(a, b, per, c))      # broadcast down
    critical = [(b, a) for a, b in reversed(edges)] + edges
    return FluidSchedule(op, name, group, size, root, flows, critical,
                         {"channels": lanes, "chunks": 1})


@register
class DoubleBinaryTree(Algorithm):
    name = "dbtree"
    summary = "NCCL Tree: double binary trees (over nodes, chains inside nodes, across hosts)"
    ops = frozenset({"allreduce"})

    def fluid(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
              topology: Topology | None, channels: int | None, options: dict) -> FluidSchedule | None:
        """The pipelined chain (one host) or tree over nodes (several hosts); None without a
        topology."""
        if topology is None:
            return None
        return tree_fluid(op, group, size, root, topology, channels, self.name)

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """The host partition of the group (member positions) and its rails."""
        hosts = host_map(topology)
        pos = {r: i for i, r in enumerate(group)}
        rails: dict[object, int] = {}          # rails named by order of first use
        return tuple((tuple(pos[r] for r in part),
                      tuple(rails.setdefault(hosts.rail_of(r), len(rails)) for r in part))
                     for part in hosts.split(group))

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        if len(group) < 2:
            return
        merged: dict[int, list[int]] = {}
        for t, parent in enumerate(dtree_parents(len(group))):
            sub = Lane(lane.builder, lane.channel + SUB_CHANNEL * (t + 1),
                       {r: list(v) for r, v in lane.pending.items()})
            emit_tree(sub, group, parent, size / 2, up=True, down=True)
            for r, v in sub.pending.items():
                merged.setdefault(r, []).extend(v)
        lane.pending.update(merged)
