"""The network side of in-network reduction across nodes (IB SHARP), shared by NCCL's
CollNet algorithms (:mod:`~dessim.collectives.algorithms.collnet`) and NVLS across nodes
(:mod:`~dessim.collectives.algorithms.nvls`).

A *lane* is one CollNet channel: one NIC per node (NCCL: one head GPU per NIC, the GPU that
owns it), and the SHARP tree that joins those NICs (:func:`dessim.topology.sharp.sharp_tree`).
:func:`sharp_flows` gives its flows: every head to and from its NIC's aggregation switch,
and both directions of every tree edge. Where NCCL runs CollNet at all (at least
``NCCL_COLLNET_NODE_THRESHOLD`` = 2 nodes, at most ``NCCL_MAX_DIRECT_ARITY`` + 1 = 8 GPUs per
node, SHARP on every rail; NCCL 2.30.7 ``init.cc``, ``enqueue.cc``) is checked by
:func:`sharp_lanes`, which raises a :class:`~dessim.errors.CollectiveError` saying why not.
"""

from __future__ import annotations

from dataclasses import dataclass

from dessim.collectives.schedule import Flow
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map
from dessim.topology.sharp import SharpTree, aggregation_switch, has_sharp, sharp_tree

__all__ = ["SharpLane", "sharp_lanes", "sharp_flows", "sharp_key", "network_hop",
           "one_nic_per_gpu", "MAX_LOCAL_RANKS", "NODE_THRESHOLD"]

#: NCCL_MAX_DIRECT_ARITY + 1: the most GPUs per node CollNet runs with (enqueue.cc).
MAX_LOCAL_RANKS = 8
#: NCCL_COLLNET_NODE_THRESHOLD default: CollNet needs at least this many nodes (init.cc).
NODE_THRESHOLD = 2


@dataclass(frozen=True)
class SharpLane:
    """One CollNet channel: per node, the GPU whose NIC carries it, that NIC, and the SHARP
    tree that joins the NICs."""

    heads: tuple[int, ...]          #: per node (group order of the nodes), a global rank
    nics: tuple[str, ...]           #: per node, the head's NIC
    tree: SharpTree


def _split(group: tuple[int, ...], topology: Topology | None, what: str) -> list[tuple[int, ...]]:
    if topology is None:
        raise CollectiveError(f"{what} needs a topology (it reduces in the network's switches)")
    parts = host_map(topology).split(group)
    if len(parts) < NODE_THRESHOLD:
        raise CollectiveError(f"{what} runs across nodes (NCCL enables CollNet from "
                              f"{NODE_THRESHOLD} nodes); this group lies in one node")
    sizes = sorted({len(p) for p in parts})
    if len(sizes) != 1:
        raise CollectiveError(f"{what}: every node must hold the same number of ranks of the "
                              f"group, got {sizes}")
    if sizes[0] > MAX_LOCAL_RANKS:
        raise CollectiveError(f"{what}: NCCL runs CollNet with at most {MAX_LOCAL_RANKS} GPUs "
                              f"per node (NCCL_MAX_DIRECT_ARITY + 1), this group has {sizes[0]}")
    if not has_sharp(topology):
        raise CollectiveError(f"{what}: no switch of this topology reduces in the network; "
                              "declare IB SHARP (dgx-h100:...,sharp=true, or sharp: true on "
                              "switches of a topology file)")
    return parts


def sharp_lanes(group: tuple[int, ...], topology: Topology | None, channels: int | None,
                what: str = "collnet") -> tuple[list[tuple[int, ...]], list[SharpLane]]:
    """The group per node and its CollNet channels: one per NIC owned by a member of the
    first node (NCCL: one collnet channel / head per NIC), or ``channels`` lanes taking those
    NICs in turn. In every other node a lane uses the NIC on the same rail if a member owns
    it, else the NIC of the member at the same position. Raises :class:`CollectiveError`
    naming why CollNet cannot run (see the module docstring)."""
    parts = _split(group, topology, what)
    hosts = host_map(topology)  # type: ignore[arg-type]
    first = hosts.host_of(parts[0][0])
    owners: list[int] = []                      # positions in a node, one per distinct NIC
    seen: set[str] = set()
    for i, r in enumerate(parts[0]):
        nic = first.nic_of.get(r)
        if nic is not None and nic not in seen:
            seen.add(nic)
            owners.append(i)
    if not owners:
        raise CollectiveError(f"{what}: ranks {list(parts[0])} of one node name no NIC "
                              "(GPU attribute nic); CollNet sends through the GPUs' own NICs")
    count = len(owners) if channels is None else channels
    lanes = []
    for c in range(count):
        pos = owners[c % len(owners)]
        rail = first.rail.get(first.nic_of[parts[0][pos]])
        heads, nics = [], []
        for part in parts:
            host = hosts.host_of(part[0])
            on_rail = host.nic_on_rail(rail) if rail is not None else None
            head = next((r for r in part if on_rail is not None and host.nic_of.get(r) == on_rail),
                        part[pos])
            nic = host.nic_of.get(head)
            if nic is None:
                raise CollectiveError(f"{what}: rank {head} names no NIC (GPU attribute nic)")
            heads.append(head)
            nics.append(nic)
        tree = sharp_tree(topology, nics, salt=c)  # type: ignore[arg-type]
        if tree is None:
            plain = [n for n in nics if aggregation_switch(topology, n) is None]  # type: ignore[arg-type]
            why = (f"NIC {plain[0]} is not cabled to a switch that declares sharp" if plain
                   else f"no SHARP switch joins the switches of NICs {', '.join(nics)}")
            raise CollectiveError(f"{what}: no SHARP reduction tree for channel {c}: {why}")
        lanes.append(SharpLane(tuple(heads), tuple(nics), tree))
    return parts, lanes


def one_nic_per_gpu(op: str, parts: list[tuple[int, ...]], lanes: list[SharpLane],
                    what: str) -> None:
    """NCCL runs all-gather and reduce-scatter over CollNet (and NVLS across nodes) only with
    at least as many CollNet heads (NICs) as GPUs per node (``ncclTopoTuneModel``)."""
    if op != "allreduce" and len(lanes) < len(parts[0]):
        raise CollectiveError(f"{what}: NCCL runs {op} across nodes with one NIC per GPU; "
                              f"this group has {len(parts[0])} GPUs and {len(lanes)} NIC(s) "
                              "per node")


def sharp_flows(op: str, lane: SharpLane, nbytes: float, channel: int) -> list[Flow]:
    """The network flows of one lane: heads to and from their aggregation switches and both
    directions of every tree edge. ``nbytes``: per node, the lane's data (all-reduce), or
    one node's block of the lane (all-gather, reduce-scatter: a node contributes / receives
    ``nbytes`` and the tree carries the blocks of every node below an edge)."""
    tree = lane.tree
    n = len(lane.heads)
    flows = []
    for head, sw in zip(lane.heads, tree.attach):
        up, down = {"allreduce": (nbytes, nbytes), "allgather": (nbytes, n * nbytes),
                    "reducescatter": (n * nbytes, nbytes)}[op]
        flows.append(Flow(head, sw, up, channel))
        flows.append(Flow(sw, head, down, channel))
    for child, parent in tree.edges:
        k = tree.below[child]
        up, down = {"allreduce": (nbytes, nbytes), "allgather": (k * nbytes, n * nbytes),
                    "reducescatter": (n * nbytes, k * nbytes)}[op]
        flows.append(Flow(child, parent, up, channel))
        flows.append(Flow(parent, child, down, channel))
    return flows


def network_hop(lane: SharpLane) -> tuple[int, int]:
    """The critical path's network round trip: the first node's head to the head of a node
    behind another aggregation switch (or of the second node when they all share one)."""
    far = next((k for k, sw in enumerate(lane.tree.attach) if sw != lane.tree.attach[0]), 1)
    return (lane.heads[0], lane.heads[far])


def sharp_key(group: tuple[int, ...], topology: Topology) -> object:
    """What CollNet reads from the topology beyond the routes between the members: per lane,
    the head positions, the aggregation switches and tree edges (switches numbered by first
    use) and the figures of those links; None on a topology without SHARP switches,
    ("refused",) where CollNet cannot run on the group."""
    if not has_sharp(topology):
        return None
    memo = topology.derived("sharp_keys", lambda _t: {})
    got = memo.get(group)
    if got is None:
        got = memo[group] = _sharp_key(group, topology)
    return got


def _sharp_key(group: tuple[int, ...], topology: Topology) -> object:
    try:
        _, lanes = sharp_lanes(group, topology, None)
    except CollectiveError:
        return ("refused",)
    pos = {r: i for i, r in enumerate(group)}
    ids: dict[str, int] = {}
    graph = topology.graph

    def link(a: str, b: str) -> tuple[float, float, float]:
        d = graph.edges[a, b]
        return (float(d["bw"]), float(d["lat"]), float(d["efficiency"]))

    out = []
    for lane in lanes:
        t = lane.tree
        out.append((tuple(pos[h] for h in lane.heads),
                    tuple(ids.setdefault(sw, len(ids)) for sw in t.attach),
                    tuple((ids.setdefault(a, len(ids)), ids.setdefault(b, len(ids)), link(a, b))
                          for a, b in t.edges),
                    tuple(link(nic, sw) for nic, sw in zip(lane.nics, t.attach))))
    return tuple(out)
