"""Rail all-to-all: the two-phase, hierarchical all-to-all of expert parallelism (DeepEP).

DeepSeek-V3's dispatch and combine kernels (report §3.2.2; deepseek-ai/DeepEP) never send a
token across the network to a GPU of another rail: a token for a GPU of another node first
crosses InfiniBand to the GPU with the *same local index* on that node (one leaf hop of a
rail-optimised fabric), which forwards it over NVLink to its final GPU. With the group's
``p = n·H`` ranks on ``H`` hosts, ``n`` per host (equal), and ``S/p`` bytes from each rank to
each rank (all-to-all semantics):

1. network phase: rank ``(h, i)`` sends to rank ``(h', i)`` of every other host the blocks of
   all ``n`` ranks of ``h'``: ``n·S/p`` bytes each;
2. NVLink phase: rank ``(h', i)`` sends to every other rank ``(h', j)`` of its host what it
   holds for it — its own block and the ``H − 1`` received ones: ``H·S/p`` bytes each.

The network carries the same bytes as a flat all-to-all, ``S·(H−1)/H`` per rank, but over
``H − 1`` rail-aligned flows instead of ``n·(H−1)`` flows that mostly cross the spine.
Phase 2 of a rank starts when its phase-1 sends and receives are done. Option
``pipeline_chunks`` ``K`` (default 1: no pipelining) splits the data into ``K`` chunks, each an independent
two-phase exchange on the same connections (FIFO): chunk ``c``'s NVLink phase runs while
chunk ``c + 1`` crosses the network, so the time tends to the slower phase's plus ``1/K`` of
the faster one's. DeepEP pipelines the two phases at a far finer grain (chunks of 8 tokens on
RDMA and 32 on NVLink for 64 ranks, ``Buffer.get_dispatch_config``), so any ``K`` is an
approximation from above (exact only as ``K`` grows).
Option ``network_share`` (default 1, in (0, 1]) scales phase 1: DeepEP sends a token over
the network once per target node, not once per expert copy, so an MoE dispatch carries
``network_share`` = (distinct target nodes per token) / ``top_k`` of the flat bytes across
nodes; with node-limited routing (each token to at most M nodes) this is at most ``M/top_k``
(:meth:`dessim.workload.transformer.routing.MoERouting.network_share`). Option
``nvlink_share`` (default 1, in (0, 1]) scales phase 2 likewise: DeepEP forwards a token over
NVLink once per target *GPU* (``is_token_in_rank``/``SourceMeta.is_token_in_nvl_rank`` in
deepseek-ai/DeepEP ``csrc/kernels/internode.cu``), and not at all when the forwarding GPU
itself holds the token's experts, i.e. (distinct target GPUs per token) / ``top_k`` of the
flat fan-out (:meth:`~dessim.workload.transformer.routing.MoERouting.nvlink_share`).

Option ``nvlink_first`` (default false) runs the two phases in reverse order, as DeepEP's
combine does (its ``combine`` kernel: ``kNVLSender`` warps send the expert outputs over NVLink
to the forwarding GPU of the token's rail, ``kNVLAndRDMAForwarder`` warps reduce them there and
send one vector per node over RDMA to the token's home GPU; DeepSeek-V3 report §3.2.2): phase
1 is the NVLink exchange — rank ``(h', j)`` sends ``(h', i)`` what the ranks of rail ``i``
receive from it, ``H·S/p`` bytes (times ``nvlink_share``) — and phase 2 the network exchange of
``n·S/p`` bytes (times ``network_share``) from ``(h', i)`` to ``(h, i)``. With ``K`` pipeline
chunks chunk ``c``'s network phase runs while chunk ``c + 1`` crosses NVLink.

Option ``nvlink_efficiency`` ``e`` (default 1, in (0, 1]): the NVLink phase's copies reach
``e`` of the NVLink links' rate (DeepEP's SM-driven copies,
:data:`dessim.catalog.links.DEEPEP_NVLINK_EFFICIENCY`); modelled as a wire factor, the phase
sends its bytes ``/ e`` (so the links' byte counters include that factor, as with an NCCL
protocol's).

Option ``window`` W (default 1) is how many chunks a connection keeps in flight. With W = 1
the chunks on a connection form a FIFO chain and each pays the step latency after the
previous one has arrived. DeepEP posts its RDMA chunks without waiting for the previous one
(deepseek-ai/DeepEP @567632dd ``csrc/kernels/internode.cu``, ``dispatch``: the
``kRDMASenderCoordinator`` warp issues ``nvshmemi_ibgda_put_nbi_warp`` per chunk of
``num_max_rdma_chunked_send_tokens`` tokens, and the ``kRDMASender`` warps stall only while
``num_max_rdma_chunked_recv_tokens`` tokens of the (channel, node) ring buffer are
unacknowledged; ``combine`` likewise), so up to ``recv / send`` chunks are in flight and
their latencies overlap: with ``window`` W > 1 the schedule is windowed
(:mod:`dessim.collectives.executor`, "Windowed connections"): a chunk's bytes still follow
the previous chunk's on the connection, but its latency runs from when it was issued.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology


def host_rows(group: tuple[int, ...], topology: Topology | None) -> list[list[int]]:
    """The group's ranks by host (hosts in order of first appearance, ranks ascending; one
    host without a topology); a CollectiveError unless every host holds the same number."""
    if topology is None:
        return [list(group)]
    from dessim.topology.hosts import host_map

    hosts = host_map(topology)
    rows: dict[int, list[int]] = {}
    for r in group:
        rows.setdefault(hosts.host_of(r).index, []).append(r)
    out = [sorted(v) for v in rows.values()]
    if len({len(v) for v in out}) != 1:
        raise CollectiveError(f"rail all-to-all: the group's {len(group)} ranks are spread "
                              f"unevenly over {len(out)} hosts ({[len(v) for v in out]} per host); "
                              "use direct or pairwise")
    return out


def _share(options: dict, key: str, meaning: str) -> float:
    """A fraction option ``key`` (default 1); a CollectiveError (saying its ``meaning``) unless
    a number in (0, 1]."""
    share = options.get(key, 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise CollectiveError(f"rail all-to-all: {key}={share!r} must be a number in (0, 1] "
                              f"({meaning})")
    return float(share)


def network_share(options: dict) -> float:
    """The ``network_share`` option (module docstring)."""
    return _share(options, "network_share", "the share of the flat all-to-all's bytes that crosses nodes")


def nvlink_share(options: dict) -> float:
    """The ``nvlink_share`` option (module docstring)."""
    return _share(options, "nvlink_share",
                  "the share of the flat all-to-all's bytes that is forwarded over NVLink")


def nvlink_efficiency(options: dict) -> float:
    """The ``nvlink_efficiency`` option (module docstring)."""
    return _share(options, "nvlink_efficiency", "the fraction of the NVLink rate its copies reach")


def nvlink_first(options: dict) -> bool:
    """The ``nvlink_first`` option (module docstring); a CollectiveError unless a bool."""
    first = options.get("nvlink_first", False)
    if not isinstance(first, bool):
        raise CollectiveError(f"rail all-to-all: nvlink_first={first!r} must be true or false "
                              "(the NVLink phase before the network phase, as DeepEP's combine)")
    return first


def pipeline_chunks(options: dict) -> int:
    """The ``pipeline_chunks`` option (module docstring); a CollectiveError unless a whole
    number >= 1."""
    chunks = options.get("pipeline_chunks", 1)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise CollectiveError(f"rail all-to-all: pipeline_chunks={chunks!r} must be a whole number >= 1 "
                              "(the network and NVLink phases pipelined in that many chunks)")
    return chunks


def window(options: dict) -> int:
    """The ``window`` option (module docstring); a CollectiveError unless a whole number >= 1."""
    got = options.get("window", 1)
    if isinstance(got, bool) or not isinstance(got, int) or got < 1:
        raise CollectiveError(f"rail all-to-all: window={got!r} must be a whole number >= 1 "
                              "(the chunks each connection keeps in flight)")
    return got


@register
class Rail(Algorithm):
    name = "rail"
    summary = "two-phase all-to-all: same-rail network sends, then NVLink forwarding (DeepEP)"
    ops = frozenset({"alltoall"})
    #: one chunk in flight per connection unless ``window`` says more (module docstring);
    #: NCCL's connections keep ``NCCL_STEPS`` (the executor's default)
    schedule_params = {"window": 1}

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        host_rows(group, topology)
        network_share(options)
        nvlink_share(options)
        nvlink_efficiency(options)
        nvlink_first(options)
        pipeline_chunks(options)
        window(options)

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        rows = host_rows(group, topology)
        hosts, n, p = len(rows), len(rows[0]), len(group)
        chunks = pipeline_chunks(options)
        part = size / chunks
        net = network_share(options) * n * part / p
        nvl = nvlink_share(options) * hosts * part / p / nvlink_efficiency(options)
        network = [(rows[h][i], rows[g][i], net, 0.0)
                   for h in range(hosts) for i in range(n) for g in range(hosts) if g != h] if hosts > 1 else []
        nvlink = [(row[i], row[j], nvl, 0.0)
                  for row in rows for i in range(n) for j in range(n) if j != i] if n > 1 else []
        phases = [ph for ph in ((nvlink, network) if nvlink_first(options) else (network, nvlink)) if ph]
        for c in range(chunks):     # each chunk its own exchange on the same (FIFO) connections
            sub = lane if c == 0 else Lane(lane.builder, lane.channel)
            for sends in phases:
                sub.step(sends)

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """The host of each member (numbered by first appearance): what :meth:`check` and
        :meth:`emit` read beyond the routes (defined for uneven groups too)."""
        from dessim.topology.hosts import host_map

        hosts = host_map(topology)
        order: dict[int, int] = {}
        return tuple(order.setdefault(hosts.host_of(r).index, len(order)) for r in group)
