"""The lanes of a folded ``memcpy`` (replica folding of far-memory transfers, issue 17).

A ``memcpy`` moves bytes between its rank's GPU and a memory node (host DRAM of a socket, a
CXL expander on a PCIe switch, a storage node). In a folded graph
(:mod:`dessim.taskgraph.fold`) the representative's task stands for the same copy on every
lane image ``fold.images(rank)[k]`` — and each image copies to and from *its own* memory
node, which is in general another node than the representative's (the GPUs of socket 1
offload to socket 1's DRAM). The graph names the representative's node only; the images'
nodes follow from one rule, the one the generators place offload by
(:func:`dessim.workload.common.placement.nearest_node`):

* the task's ``mem_node`` must be the node of its kind nearest to the rank's GPU
  (:meth:`~dessim.topology.routing.Router.nearest`: fewest hops, then latency, then name);
* lane ``k`` then copies between image ``fold.images(rank)[k]``'s GPU and the node of that
  kind nearest to it.

So the task JSON and the task table stay as they are (one ``mem_node`` per task), and a
folded graph whose memcpy names another node is refused with an error rather than given a
guessed image. The unfolded engine keys a memcpy's ECMP choice by the task's position in the
graph, which a folded graph cannot reproduce for the images; so a folded memcpy is accepted
only when every lane's route (both directions) is the same for every ECMP key
(:meth:`~dessim.topology.routing.Router.key_independent`) — true of the GPU ↔ DRAM / CXL
paths inside a host. Then each lane's flows are exactly the unfolded image task's; the lanes
end together when the network treats them alike, and the engine's lane join reports any
skew otherwise.
"""

from __future__ import annotations

from dessim.errors import TaskGraphError
from dessim.taskgraph.fold import Fold
from dessim.topology.graph import Topology
from dessim.topology.routing import Router

__all__ = ["memcpy_lanes"]


def memcpy_lanes(router: Router, topology: Topology, fold: Fold | None, rank: int, mem_node: str,
                 where: str = "memcpy") -> tuple[tuple[str, str], ...]:
    """``(GPU node, memory node)`` of every lane of a memcpy of ``rank`` to/from
    ``mem_node``, lane order (lane 0 the task itself). Unfolded (``fold`` None): the one
    pair. Folded: each image's GPU with the node of ``mem_node``'s kind nearest to it
    (module docstring); raises :class:`~dessim.errors.TaskGraphError` naming ``where`` when
    ``mem_node`` is not the nearest of its kind to the rank's GPU, or a lane's route has an
    ECMP choice."""
    mem = topology.resolve(mem_node)
    gpu = topology.node_of(rank)
    if fold is None:
        return ((gpu, mem),)
    kind = (topology.kind(mem),)
    nearest = router.nearest(gpu, kind)
    if nearest != mem:
        raise TaskGraphError(f"{where}: a folded memcpy stands for each lane image's copy to that "
                             f"image's nearest {kind[0]} node, so it must name rank {rank}'s nearest "
                             f"one ({nearest!r}), not {mem!r}; generate the graph unfolded")
    lanes = []
    for image in fold.images(rank):
        g = topology.node_of(image)
        m = router.nearest(g, kind)
        if not (router.key_independent(g, m) and router.key_independent(m, g)):
            raise TaskGraphError(f"{where}: the route between rank {image}'s GPU and {m!r} has "
                                 "several equal-cost paths (ECMP), chosen by the task's position in "
                                 "the unfolded graph, which a folded graph does not have; generate "
                                 "the graph unfolded")
        lanes.append((g, m))
    return tuple(lanes)
