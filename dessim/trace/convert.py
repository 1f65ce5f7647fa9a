"""Chakra execution traces <-> dessim task graphs.

:func:`chakra_to_taskgraph` turns a :class:`~dessim.trace.chakra_io.ChakraTrace` into a
:class:`~dessim.taskgraph.TaskGraph` that the engine replays; :func:`taskgraph_to_chakra` does
the reverse, and :func:`export_chakra` writes the result as ``<prefix>.<rank>.et`` files.
:func:`replay_chakra` reads, converts and simulates in one call. docs/chakra.md ("Replaying a
trace") is the user-facing description; the facts about the format come from Chakra's
``et_def.proto`` and ASTRA-sim's ``Workload.cc`` (how its feeder consumes each node type; "Trace
formats" in docs/references.md).

Node -> task (one task per node; METADATA nodes make none)
    ``COMP_NODE``       ``compute``: ``duration_micros``; or, when that is 0 or ``cost_compute``
                        is set, FLOPs = ``num_ops`` and HBM bytes = ``tensor_size`` costed by the
                        engine's device model (GPU ops only: CPU ops always replay their
                        duration, as ASTRA-sim does). CPU ops (``is_cpu_op``, true when absent)
                        run on the ``cpu`` stream, GPU ops on ``compute``.
    ``COMM_COLL_NODE``  ``collective`` (:data:`COLLECTIVES` gives the op and size rule).
    ``COMM_SEND/RECV``  ``send``/``recv`` with the peer from ``comm_dst``/``comm_src``, the tag
                        from ``comm_tag`` (0 when absent) and ``comm_size`` bytes.
    ``MEM_LOAD/STORE``  ``memcpy`` of ``tensor_size`` bytes to/from HBM against the host or CXL
                        memory node of the topology nearest to the GPU (fewest hops, then lowest
                        latency, then name), or the one the caller names.
    ``METADATA_NODE``   no task; its process groups are read (``process_groups``) and its
                        children wait for its parents instead.

Dependencies: ``data_deps`` and ``ctrl_deps`` both become task dependencies.

Streams (a stream runs its tasks one at a time in program order, like a CUDA stream):
``compute`` (GPU kernels), ``cpu`` (CPU ops), ``mem`` (memory loads/stores), ``comm`` (collectives
of the default group) and ``comm.<group>`` (one stream per process group, as PyTorch runs one
NCCL stream per process group), ``p2p.send.<peer>[.<tag>]`` / ``p2p.recv.<peer>[.<tag>]`` (one
per peer and tag). Program order within a rank is a topological order of the nodes, ties
broken by ``start_time_micros`` and then by node id. Chakra orders nodes only by their
dependencies; because dessim's sends and receives rendezvous, a single p2p stream would
deadlock exchange patterns that the trace allows (every rank sending before receiving), so
p2p streams are per peer and tag: the k-th send of one stream meets the k-th receive of
its partner stream.

Process groups: ``pg_name`` names a group declared by a METADATA node (or ``extra_groups``);
empty / ``"0"`` means every rank. ``involved_dim`` (one flag per network dimension,
``topology.dims`` fastest-varying first) restricts the default group to the ranks that differ
from this rank only in the involved dimensions. An explicit process group wins over
``involved_dim``. Group order = trace rank order (the communicator's rank order); rooted ops
(broadcast, reduce) use the first member as root — Chakra records no root.

Collective ids: the k-th collective of a given group and type on each member share one
``coll_id``; the members must agree on the size (else a :class:`TraceError` naming both nodes).

Rank mapping: trace rank r runs on topology rank ``rank_map.get(r, r)``. Without a map the
topology must have exactly as many GPUs as the trace has ranks.

dessim-written traces carry, per node, a ``dessim.task`` attribute (the task's JSON fields)
and ``dessim.seq`` (its position in the graph), and in GlobalMetadata ``dessim.graph`` (name
and meta): reading them back gives the identical task graph (stream, category, algo,
coll_id, exact float durations and sizes, extra attrs). They are checked against the Chakra
fields; a trace edited after export is an error unless ``use_dessim_attrs=False``.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from dessim.errors import DessimError, TaskGraphError, TraceError
from dessim.resources import read_text, read_yaml
from dessim.taskgraph.model import Task, TaskGraph
from dessim.topology.graph import Topology
from dessim.trace.chakra_io import (ChakraNode, ChakraTrace, IOInfo, RankTrace, process_groups,
                                    read_chakra, resolve_group, validate_for_replay, write_chakra)

__all__ = [
    "COLLECTIVES",
    "CollectiveMapping",
    "BARRIER_BYTES",
    "MEMORY_KINDS",
    "DESSIM_TASK_ATTR",
    "DESSIM_SEQ_ATTR",
    "DESSIM_GRAPH_ATTR",
    "PG_INIT_NAME",
    "chakra_to_taskgraph",
    "taskgraph_to_chakra",
    "export_chakra",
    "replay_chakra",
    "note_forced_algo",
    "trace_collective_ops",
    "parse_rank_map",
    "nearest_memory_node",
]

#: Bytes of a BARRIER: PyTorch's ProcessGroupNCCL::barrier all-reduces a one-element float32
#: tensor (``at::zeros({1}, ...dtype(at::kFloat))``, torch/csrc/distributed/c10d).
BARRIER_BYTES = 4.0

#: Topology node kinds a MEM_LOAD/MEM_STORE node can address.
MEMORY_KINDS: tuple[str, ...] = ("host_mem", "cxl_mem")

#: Attribute names dessim adds so that its own traces read back identically.
DESSIM_TASK_ATTR = "dessim.task"
DESSIM_SEQ_ATTR = "dessim.seq"
DESSIM_GRAPH_ATTR = "dessim.graph"

#: Name of the METADATA node declaring process groups (what PyTorch records).
PG_INIT_NAME = "## process_group:init ##"

_INT32 = (-(2**31), 2**31 - 1)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class CollectiveMapping:
    """How one Chakra CollectiveCommType becomes a dessim collective.

    ``per_rank``: ``comm_size`` is one rank's contribution, so dessim's size (nccl-tests
    semantics, docs/collectives.md) is ``comm_size * group size``; otherwise ``comm_size`` is
    already dessim's size. ``algo``: the algorithm that makes the mapping faithful (it
    overrides the user's choice). ``fixed_size``: bytes used whatever ``comm_size`` says.
    """

    comm_type: str
    op: str
    per_rank: bool = False
    algo: str | None = None
    fixed_size: float | None = None
    note: str = ""


#: Chakra CollectiveCommType name -> dessim collective (ALL_REDUCE and REDUCE_SCATTER comm_size
#: = whole buffer, ALL_GATHER = per-rank contribution, as ASTRA-sim's collectives read them:
#: [U] — ASTRA-sim Workload.cc hands comm_size to ``Sys::generate_*`` unchanged, and how each
#: collective reads it was not confirmed in a public copy).
COLLECTIVES: dict[str, CollectiveMapping] = {m.comm_type: m for m in (
    CollectiveMapping("ALL_REDUCE", "allreduce"),
    CollectiveMapping("REDUCE_SCATTER", "reducescatter"),
    CollectiveMapping("REDUCE_SCATTER_BLOCK", "reducescatter",
                      note="same size rule as REDUCE_SCATTER (whole buffer)"),
    CollectiveMapping("ALL_GATHER", "allgather", per_rank=True),
    CollectiveMapping("ALL_TO_ALL", "alltoall"),
    CollectiveMapping("BROADCAST", "broadcast"),
    CollectiveMapping("REDUCE", "reduce"),
    # NCCL has no gather/scatter primitive: PyTorch runs them as grouped send/recv between the
    # root and every other rank, which is exactly dessim's direct reduce / broadcast traffic
    # (every non-root sends comm_size bytes to the root / the root sends comm_size bytes to
    # every rank). Only difference: with EngineOptions.collectives.reduction_bw set, the root
    # of the "reduce" is charged for reducing bytes a gather only stores.
    CollectiveMapping("GATHER", "reduce", algo="direct",
                      note="grouped sends of comm_size bytes to the root (direct reduce)"),
    CollectiveMapping("SCATTER", "broadcast", algo="direct",
                      note="grouped sends of comm_size bytes from the root (direct broadcast)"),
    CollectiveMapping("BARRIER", "allreduce", fixed_size=BARRIER_BYTES,
                      note="an all-reduce of one float32, as PyTorch's NCCL barrier"),
)}

#: dessim op -> the Chakra type it is written as (the inverse of the plain mappings).
_OP_TO_COMM_TYPE: dict[str, str] = {
    "allreduce": "ALL_REDUCE", "reducescatter": "REDUCE_SCATTER", "allgather": "ALL_GATHER",
    "alltoall": "ALL_TO_ALL", "broadcast": "BROADCAST", "reduce": "REDUCE",
}

_COMM_TYPE_NUMBER: dict[str, int] = {}


def _comm_type_number(name: str) -> int:
    if not _COMM_TYPE_NUMBER:
        from dessim.trace.chakra_schema import COLLECTIVE_COMM_TYPES
        _COMM_TYPE_NUMBER.update(COLLECTIVE_COMM_TYPES)
    return _COMM_TYPE_NUMBER[name]


# --------------------------------------------------------------------------------------------
# Rank maps and memory nodes
# --------------------------------------------------------------------------------------------

RankMapLike = Mapping[int, int] | Sequence[int] | str | os.PathLike[str] | None


def _rank_map_entries(value: RankMapLike, where: str) -> dict[int, int]:
    if value is None:
        return {}
    if isinstance(value, os.PathLike) or (isinstance(value, str) and Path(value).is_file()):
        path = Path(value)
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                data = read_yaml(path, "rank map file")
            else:
                text = read_text(path, "rank map file")
                data = (json.loads(text) if path.suffix.lower() == ".json"
                        else text.replace("\n", ",").strip(", "))
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"rank map file {path}: cannot parse: {exc}") from None
        return _rank_map_entries(data, f"rank map file {path}")
    if isinstance(value, str):
        out: dict[int, int] = {}
        for item in (p.strip() for p in value.split(",")):
            if not item:
                continue
            a, sep, b = item.partition(":")
            try:
                if not sep:
                    raise ValueError
                out[int(a)] = int(b)
            except ValueError:
                raise TraceError(f"{where} {value!r}: cannot parse {item!r}; expected "
                                 "TRACE_RANK:TOPOLOGY_RANK pairs, e.g. 0:3,1:2") from None
        return out
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence):
        items = list(enumerate(value))
    else:
        raise TraceError(f"{where}: expected a mapping trace rank -> topology rank, a list, "
                         f"'0:3,1:2' or a file, got {value!r}")
    out = {}
    for k, v in items:
        try:
            out[_whole(k)] = _whole(v)
        except (TypeError, ValueError):
            raise TraceError(f"{where}: entry {k!r}: {v!r} is not trace rank: topology rank "
                             "(two integers)") from None
    return out


def _whole(value: object) -> int:
    """An int, or a string of one; ValueError for anything else (1.5, inf, True, None)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return int(value)
    raise ValueError(value)


def parse_rank_map(value: RankMapLike, num_trace_ranks: int, num_gpus: int | None,
                   where: str = "rank map", trace_label: str = "the trace",
                   topology_label: str = "the topology") -> list[int]:
    """Topology rank of every trace rank, from a dict/list, ``"0:3,1:2"`` or a JSON/YAML file.

    Trace ranks the map does not mention keep their own number. Without any map the topology
    must have exactly ``num_trace_ranks`` GPUs. Raises :class:`TraceError` for a trace rank
    that does not exist, a topology rank outside ``0..num_gpus-1`` and two trace ranks on one
    GPU.
    """
    entries = _rank_map_entries(value, where)
    if not entries and num_gpus is not None and num_gpus != num_trace_ranks:
        raise TraceError(
            f"{trace_label} has {num_trace_ranks} ranks but {topology_label} has {num_gpus} GPUs; map "
            f"trace ranks onto GPUs explicitly (--rank-map 0:0,1:1,... or rank_map={{...}})")
    for r in entries:
        if not 0 <= r < num_trace_ranks:
            raise TraceError(f"{where}: trace rank {r} does not exist (the trace has ranks "
                             f"0..{num_trace_ranks - 1})")
    mapping = [entries.get(r, r) for r in range(num_trace_ranks)]
    seen: dict[int, int] = {}
    for r, g in enumerate(mapping):
        if num_gpus is not None and not 0 <= g < num_gpus:
            how = "is mapped to" if r in entries else "is not mapped and keeps"
            raise TraceError(f"{where}: trace rank {r} {how} topology rank {g}, but the topology "
                             f"has GPUs 0..{num_gpus - 1}")
        if g in seen:
            raise TraceError(f"{where}: trace ranks {seen[g]} and {r} both run on topology rank "
                             f"{g}; each trace rank needs its own GPU")
        seen[g] = r
    return mapping


def nearest_memory_node(topology: Topology, rank: int, kinds: Sequence[str] = MEMORY_KINDS) -> str:
    """The memory node of ``kinds`` nearest to GPU ``rank`` (see
    :meth:`~dessim.topology.routing.Router.nearest`). TraceError if none is reachable."""
    from dessim.topology.routing import router_for

    found = router_for(topology).nearest(topology.node_of(rank), tuple(kinds))
    if found is None:
        raise TraceError(
            f"topology {topology.name!r} has no memory node of kind {' or '.join(kinds)} "
            f"reachable from rank {rank}: MEM_LOAD/MEM_STORE nodes need one (e.g. --topology "
            "cxl:gpu=h100,expanders=4 or pcie:8), or name one with mem_node=")
    return found


class _MemoryChooser:
    """Memory node of each GPU for MEM_LOAD/MEM_STORE nodes (cached per rank)."""

    def __init__(self, topology: Topology | None, choice: str | None) -> None:
        self.topology = topology
        self.choice = choice
        self.cache: dict[int, str] = {}
        if topology is not None and choice and choice not in MEMORY_KINDS:
            if choice not in topology.graph or topology.kind(choice) not in MEMORY_KINDS:
                raise TraceError(f"mem_node {choice!r} is not a host_mem or cxl_mem node of "
                                 f"topology {topology.name!r} (memory nodes: "
                                 f"{', '.join(self.all_memory()) or 'none'})")

    def all_memory(self) -> list[str]:
        assert self.topology is not None
        return sorted(n for k in MEMORY_KINDS for n in self.topology.nodes_of_kind(k))

    def __call__(self, rank: int, where: str) -> str:
        if self.topology is None and self.choice and self.choice not in MEMORY_KINDS:
            return self.choice  # a node name, checked by the engine against its topology
        if self.topology is None:
            raise TraceError(f"{where}: a memory node needs a topology to find the host or CXL "
                             "memory it addresses (or mem_node=<node name>)")
        if rank not in self.cache:
            if self.choice and self.choice not in MEMORY_KINDS:
                self.cache[rank] = self.choice
            else:
                kinds = (self.choice,) if self.choice else MEMORY_KINDS
                try:
                    self.cache[rank] = nearest_memory_node(self.topology, rank, kinds)
                except TraceError as exc:
                    raise TraceError(f"{where}: {exc}") from None
        return self.cache[rank]


# --------------------------------------------------------------------------------------------
# Chakra -> TaskGraph
# --------------------------------------------------------------------------------------------


def _program_order(rank_trace: RankTrace) -> list[int]:
    """Topological order of a rank's node ids; ties by (start_time_micros, id)."""
    nodes = rank_trace.nodes
    rank_trace.topological_order()  # raises a named TraceError on cycles
    indeg = {nid: 0 for nid in nodes}
    children: dict[int, list[int]] = defaultdict(list)
    for nid, node in nodes.items():
        for p in node.deps:
            indeg[nid] += 1
            children[p].append(nid)
    heap = [(nodes[n].start_time_micros, n) for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, nid = heapq.heappop(heap)
        order.append(nid)
        for c in children[nid]:
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(heap, (nodes[c].start_time_micros, c))
    return order


def _ordered_deps(node: ChakraNode) -> list[int]:
    """data_deps then ctrl_deps, each parent once, in file order (the order dessim writes)."""
    out: list[int] = []
    for p in (*node.data_deps, *node.ctrl_deps):
        if p not in out:
            out.append(p)
    return out


def _ranges(ranks: Sequence[int]) -> str:
    if not ranks:
        return "none"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in list(ranks[1:]) + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


@dataclass
class _Member:
    """One rank's collective node, kept to check that the members agree."""

    task: Task
    where: str
    comm_type: str


class _Converter:
    def __init__(self, trace: ChakraTrace, topology: Topology | None, rank_map: RankMapLike,
                 cost_compute: bool, algo: str | Mapping[str, str] | None, mem_node: str | None,
                 extra_groups: Mapping[str, Sequence[int]] | None, use_dessim_attrs: bool,
                 name: str | None) -> None:
        self.trace = trace
        self.topology = topology
        self.n = trace.num_ranks
        self.map = parse_rank_map(
            rank_map, self.n, topology.num_gpus if topology else None,
            trace_label=f"trace {trace.prefix}" if trace.prefix else "the trace",
            topology_label=f"topology {topology.name!r}" if topology else "the topology")
        self.inverse = {g: r for r, g in enumerate(self.map)}
        self.cost_compute = cost_compute
        self.algo = algo
        self.memory = _MemoryChooser(topology, mem_node)
        self.use_dessim = use_dessim_attrs
        groups = dict(process_groups(trace))
        groups.update({k: tuple(sorted(v)) for k, v in (extra_groups or {}).items()})
        self.groups = groups
        self.extra_groups = extra_groups
        self.name = name
        # (rank, group label, comm type) -> collectives issued so far
        self.coll_counts: dict[tuple[int, str, str], int] = defaultdict(int)
        self.members: dict[str, list[_Member]] = defaultdict(list)

    # ---------------------------------------------------------------- groups
    def _group(self, node: ChakraNode, rank: int, where: str) -> tuple[tuple[int, ...], str]:
        """(trace ranks of the group in trace order, label used in stream names and coll ids)."""
        pg = node.pg_name
        if pg not in (None, "", "0"):
            members = resolve_group(pg, self.groups, self.n)
            if members is None:
                raise TraceError(f"{where}: unknown process group {pg!r} (declared: "
                                 f"{', '.join(sorted(self.groups)) or 'none'})")
            return tuple(members), f"pg{pg}"
        dims = node.involved_dim
        if dims is None or all(dims):
            return tuple(range(self.n)), ""
        topo = self.topology
        if topo is None:
            raise TraceError(f"{where}: involved_dim {list(dims)} needs a topology to tell which "
                             "ranks take part")
        if len(dims) < len(topo.dims):
            raise TraceError(f"{where}: involved_dim {list(dims)} has {len(dims)} entries but "
                             f"topology {topo.name!r} has {len(topo.dims)} dimensions "
                             f"{list(topo.dims)}")
        mine = topo.coords(self.map[rank])
        fixed = [i for i, d in enumerate(topo.dims) if not dims[i]]
        group_topo = [g for g in range(topo.num_gpus)
                      if all(topo.coords(g)[i] == mine[i] for i in fixed)]
        missing = [g for g in group_topo if g not in self.inverse]
        if missing:
            raise TraceError(f"{where}: involved_dim {list(dims)} makes topology ranks "
                             f"{_ranges(group_topo)} one group, but topology rank {missing[0]} "
                             "runs no trace rank (see the rank map)")
        members = tuple(sorted(self.inverse[g] for g in group_topo))
        mask = "".join("1" if d else "0" for d in dims[:len(topo.dims)])
        return members, f"dims{mask}@{members[0]}"

    # ---------------------------------------------------------------- nodes
    def convert_node(self, node: ChakraNode, rank: int, where: str) -> Task | None:
        kind = node.type
        tid = f"r{rank}.n{node.id}"
        grank = self.map[rank]
        if kind == "METADATA_NODE":
            return None
        if kind == "COMP_NODE":
            cpu = node.is_cpu_op
            has_model = bool(node.num_ops) or bool(node.tensor_size)
            use_model = has_model and not cpu and (self.cost_compute or node.duration_micros == 0)
            return Task(tid, grank, "compute", stream="cpu" if cpu else "compute", name=node.name,
                        duration=None if use_model else _seconds(node.duration_micros),
                        flops=float(node.num_ops or 0), bytes=float(node.tensor_size or 0))
        if kind in ("MEM_LOAD_NODE", "MEM_STORE_NODE"):
            return Task(tid, grank, "memcpy", stream="mem", name=node.name,
                        size=float(node.tensor_size or 0),
                        mem_node=self.memory(grank, where),
                        direction="to_hbm" if kind == "MEM_LOAD_NODE" else "from_hbm")
        if kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
            send = kind == "COMM_SEND_NODE"
            peer = self.map[node.comm_dst if send else node.comm_src]
            tag = node.comm_tag or 0
            stream = f"p2p.{'send' if send else 'recv'}.{peer}" + (f".{tag}" if tag else "")
            return Task(tid, grank, "send" if send else "recv", stream=stream, name=node.name,
                        size=float(node.comm_size or 0), peer=peer, tag=tag)
        if kind == "COMM_COLL_NODE":
            return self._collective(node, rank, tid, where)
        raise TraceError(f"{where}: node type {kind} cannot be replayed")  # pragma: no cover

    def _collective(self, node: ChakraNode, rank: int, tid: str, where: str) -> Task:
        comm_type = node.comm_type
        mapping = COLLECTIVES[comm_type]  # every CollectiveCommType has a mapping
        members, label = self._group(node, rank, where)
        key = (rank, label, comm_type)
        k = self.coll_counts[key]
        self.coll_counts[key] += 1
        coll_id = f"{label or 'world'}:{comm_type}:{k}"
        group = tuple(self.map[r] for r in members)
        grank = self.map[rank]
        if mapping.fixed_size is not None:
            size = mapping.fixed_size
        else:
            size = float(node.comm_size or 0) * (len(group) if mapping.per_rank else 1)
        attrs = {} if mapping.op in _OP_TO_COMM_TYPE and _OP_TO_COMM_TYPE[mapping.op] == comm_type \
            else {"chakra_comm_type": comm_type}
        stream = f"comm.{label}" if label else "comm"
        if len(group) < 2 or size <= 0:
            # Nothing moves (a one-rank group, or zero bytes): a zero-length wait.
            return Task(tid, grank, "delay", stream=stream, name=node.name, duration=0.0,
                        attrs={"chakra_comm_type": comm_type, "coll_id": coll_id})
        algo = mapping.algo or self.algo_of(mapping.op) or "auto"
        task = Task(tid, grank, "collective", stream=stream, name=node.name, op=mapping.op,
                    size=size, group=group, coll_id=coll_id, algo=algo, attrs=attrs)
        self.members[coll_id].append(_Member(task, where, comm_type))
        return task

    # ---------------------------------------------------------------- dessim attributes
    def algo_of(self, op: str) -> str | None:
        """The user's algorithm for collectives of ``op``: one for all, or one per op."""
        if isinstance(self.algo, Mapping):
            return self.algo.get(op)
        return self.algo

    def from_dessim(self, node: ChakraNode, rank: int, where: str) -> Task | None:
        raw = node.attrs.get(DESSIM_TASK_ATTR)
        if raw is None or not self.use_dessim:
            return None
        try:
            data = json.loads(raw)
            task = Task(**data)
        except (TypeError, ValueError, DessimError) as exc:
            raise TraceError(f"{where}: attribute {DESSIM_TASK_ATTR!r} is not a valid dessim task: "
                             f"{exc}") from None
        _check_dessim_task(task, node, rank, where)
        task.rank = self.map[task.rank]
        if task.kind in ("send", "recv"):
            task.peer = self.map[task.peer]
        if task.kind == "collective":
            if task.op == "sendrecv":
                members = (node.comm_src, node.comm_dst)
                ok = task.group == members
            else:
                members = self._group(node, rank, where)[0]
                ok = tuple(sorted(task.group)) == members
            if not ok:
                raise TraceError(f"{where}: {DESSIM_TASK_ATTR} names group {list(task.group)} but "
                                 f"the node's group is ranks {_ranges(sorted(members))}")
            task.group = tuple(self.map[r] for r in task.group)
            forced = COLLECTIVES[_comm_type_of(task)].algo if task.op != "sendrecv" else None
            if self.algo_of(task.op) and not forced:
                task.algo = self.algo_of(task.op)
            self.members[task.coll_id].append(
                _Member(task, where, node.comm_type or "SENDRECV"))
        if task.kind == "memcpy" and self.topology is not None and task.mem_node not in self.topology.graph:
            raise TraceError(f"{where}: memory node {task.mem_node!r} is not in topology "
                             f"{self.topology.name!r}")
        return task

    # ---------------------------------------------------------------- whole trace
    def run(self) -> TaskGraph:
        validate_for_replay(self.trace, extra_groups=self.extra_groups)
        graph_info = self._graph_info()
        entries: list[tuple[tuple, Task, list[str]]] = []
        for rank_trace in self.trace.ranks:
            rank = rank_trace.rank
            ids: dict[int, list[str]] = {}  # node id -> task ids it stands for (deps)
            for pos, nid in enumerate(_program_order(rank_trace)):
                node = rank_trace.nodes[nid]
                where = f"{rank_trace.source}: {node.describe()}"
                task = self.from_dessim(node, rank, where)
                if task is None:
                    task = self.convert_node(node, rank, where)
                parents: list[str] = []
                for p in _ordered_deps(node):
                    for t in ids[p]:
                        if t not in parents:
                            parents.append(t)
                if task is None:  # METADATA: children wait for its parents
                    ids[nid] = parents
                    continue
                ids[nid] = [task.id]
                seq = node.attrs.get(DESSIM_SEQ_ATTR) if self.use_dessim else None
                key = (0, seq, 0, 0) if isinstance(seq, int) and not isinstance(seq, bool) \
                    else (1, 0, rank, pos)
                entries.append((key, task, parents))
        entries.sort(key=lambda e: e[0])
        self._check_members()
        graph = TaskGraph(graph_info.get("name") or self.name or _default_name(self.trace),
                          meta=graph_info.get("meta") or {})
        for _key, task, parents in entries:
            try:
                graph.add(task, parents)
            except TaskGraphError as exc:
                raise TraceError(f"converting {self.trace.prefix or 'the trace'}: {exc}") from None
        try:
            graph.validate(num_ranks=self.topology.num_gpus if self.topology else None)
        except TaskGraphError as exc:
            raise TraceError(f"trace {self.trace.prefix or ''}: {exc}") from None
        return graph

    def _graph_info(self) -> dict[str, Any]:
        if not self.use_dessim or not self.trace.ranks:
            return {}
        raw = self.trace.ranks[0].metadata_attrs.get(DESSIM_GRAPH_ATTR)
        if raw is None:
            return {}
        try:
            info = json.loads(raw)
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{self.trace.ranks[0].source}: GlobalMetadata attribute "
                             f"{DESSIM_GRAPH_ATTR!r} is not valid JSON: {exc}") from None
        return info

    def _check_members(self) -> None:
        """The members of each collective agree (size, op, group) and all of them issue it."""
        for cid, members in self.members.items():
            first = members[0]
            for m in members[1:]:
                for attr in ("op", "size", "group", "algo"):
                    a, b = getattr(first.task, attr), getattr(m.task, attr)
                    if a != b:
                        what = {"size": "size (bytes, dessim semantics)"}.get(attr, attr)
                        raise TraceError(
                            f"collective {cid}: the ranks disagree: {m.where} has {what} {b!r} "
                            f"but {first.where} has {a!r}")
            present = {m.task.rank for m in members}
            missing = [r for r in first.task.group if r not in present]
            if missing:
                t = first.task
                raise TraceError(
                    f"collective {cid} ({first.comm_type}, ranks {_ranges(sorted(t.group))}): "
                    f"issued by {first.where} but topology rank {missing[0]} (trace rank "
                    f"{self.inverse.get(missing[0], missing[0])}) never issues it; the ranks "
                    "disagree on the collectives of this group")


def _default_name(trace: ChakraTrace) -> str:
    return Path(trace.prefix).name if trace.prefix else "chakra"


def _check_dessim_task(task: Task, node: ChakraNode, rank: int, where: str) -> None:
    """The Chakra fields still say what dessim wrote (the trace was not edited since)."""
    problems = []
    expected_type = _node_type(task)
    if node.type != expected_type:
        problems.append(f"type {node.type} but the task is a {task.kind} ({expected_type})")
    if task.rank != rank:
        problems.append(f"rank {task.rank} but the node is in rank {rank}'s file")
    if task.kind in ("compute", "delay") and task.duration is not None:
        if _micros(task.duration) != node.duration_micros:
            problems.append(f"duration {task.duration!r} s but duration_micros "
                            f"{node.duration_micros}")
    if task.kind in ("send", "recv", "collective", "memcpy"):
        expected = _chakra_size(task)
        actual = node.tensor_size if task.kind == "memcpy" else node.comm_size
        if expected is not None and actual != expected:
            problems.append(f"size {task.size!r} B but the node says {actual}")
    if task.kind in ("send", "recv"):
        peer = node.comm_dst if task.kind == "send" else node.comm_src
        if peer != task.peer or (node.comm_tag or 0) != task.tag:
            problems.append(f"peer {task.peer} tag {task.tag} but the node says peer {peer} tag "
                            f"{node.comm_tag}")
    if task.kind == "collective" and task.op != "sendrecv":
        ct = _comm_type_of(task)
        if node.comm_type != ct:
            problems.append(f"op {task.op} ({ct}) but comm_type {node.comm_type}")
    if problems:
        raise TraceError(
            f"{where}: the Chakra fields disagree with attribute {DESSIM_TASK_ATTR!r} written "
            f"by dessim ({'; '.join(problems)}); the trace was edited after export — replay the "
            "Chakra fields only with use_dessim_attrs=False (--ignore-dessim-attrs)")


def chakra_to_taskgraph(trace: ChakraTrace | str | os.PathLike[str],
                        topology: Topology | None = None, *, rank_map: RankMapLike = None,
                        cost_compute: bool = False, algo: str | Mapping[str, str] | None = None,
                        mem_node: str | None = None,
                        extra_groups: Mapping[str, Sequence[int]] | None = None,
                        use_dessim_attrs: bool = True, name: str | None = None) -> TaskGraph:
    """The task graph of a Chakra trace (a :class:`ChakraTrace` or a prefix to read).

    ``topology`` is needed for ``involved_dim`` groups, memory nodes and the rank-count check
    (see the module docstring for every rule). ``rank_map`` (trace rank -> topology rank: a
    dict, a list, ``"0:3,1:2"`` or a JSON/YAML file) places ranks. ``cost_compute`` costs every
    GPU compute node that carries ``num_ops``/``tensor_size`` with the device model instead of
    its duration. ``algo`` sets the algorithm of every collective (except GATHER/SCATTER,
    which need ``direct``), or, as a mapping dessim op → algorithm (``{"allreduce": "ring"}``,
    an ASTRA-sim system file's implementations), of the collectives of those ops only. ``mem_node`` picks the memory of MEM nodes: a node name, or a kind
    (``host_mem``/``cxl_mem``) of which the nearest is used; default the nearest of either.
    ``extra_groups`` adds process groups (pg_name -> ranks). Raises :class:`TraceError` naming
    the file, the node and the problem.
    """
    if not isinstance(trace, ChakraTrace):
        trace = read_chakra(trace)
    conv = _Converter(trace, topology, rank_map, cost_compute, algo, mem_node, extra_groups,
                      use_dessim_attrs, name)
    return conv.run()


# --------------------------------------------------------------------------------------------
# TaskGraph -> Chakra
# --------------------------------------------------------------------------------------------


def _seconds(micros: int) -> float:
    """Integer microseconds -> seconds, correctly rounded (5 -> 5e-06 exactly as "5us")."""
    return micros / 1e6


def _micros(seconds: float) -> int:
    return int(round(seconds * 1e6))


def _node_type(task: Task) -> str:
    if task.kind in ("compute", "delay"):
        return "COMP_NODE"
    if task.kind == "memcpy":
        return "MEM_LOAD_NODE" if task.direction == "to_hbm" else "MEM_STORE_NODE"
    if task.kind == "send" or (task.kind == "collective" and task.op == "sendrecv"
                               and task.rank == task.group[0]):
        return "COMM_SEND_NODE"
    if task.kind == "recv" or (task.kind == "collective" and task.op == "sendrecv"):
        return "COMM_RECV_NODE"
    return "COMM_COLL_NODE"


def trace_collective_ops(trace: ChakraTrace) -> set[str]:
    """The dessim ops of the collectives a trace runs (``{"allreduce", "alltoall"}``)."""
    return {COLLECTIVES[n.comm_type].op for r in trace.ranks for n in r.nodes.values()
            if n.type == "COMM_COLL_NODE" and n.comm_type in COLLECTIVES}


def _comm_type_of(task: Task) -> str:
    forced = task.attrs.get("chakra_comm_type") if isinstance(task.attrs, dict) else None
    if isinstance(forced, str) and forced in COLLECTIVES and COLLECTIVES[forced].op == task.op:
        return forced
    try:
        return _OP_TO_COMM_TYPE[task.op]
    except KeyError:
        raise TraceError(f"task {task.id!r}: collective op {task.op!r} has no Chakra "
                         f"CollectiveCommType (writable: {', '.join(_OP_TO_COMM_TYPE)}, "
                         "sendrecv)") from None


def _chakra_size(task: Task) -> int | None:
    """The integer bytes a Chakra node of ``task`` carries (comm_size / tensor_size)."""
    size = task.size
    if task.kind == "collective" and task.op != "sendrecv":
        mapping = COLLECTIVES[_comm_type_of(task)]
        if mapping.fixed_size is not None:
            return 0
        if mapping.per_rank:
            size = size / len(task.group)
    if not math.isfinite(size) or round(size) > _INT64_MAX:
        raise TraceError(f"task {task.id!r}: size {size!r} B does not fit Chakra's int64 bytes")
    return int(round(size))


def _int_attr(value: float, what: str, task: Task, hi: int = _INT64_MAX) -> int:
    if not math.isfinite(value) or round(value) > hi:
        raise TraceError(f"task {task.id!r}: {what} {value!r} does not fit Chakra's int64")
    return int(round(value))


def _collective_groups(graph: TaskGraph, num_ranks: int) -> dict[tuple[int, ...], str]:
    """Sorted member sets of the non-world collective groups -> pg_name ("1", "2", ...)."""
    world = tuple(range(num_ranks))
    names: dict[tuple[int, ...], str] = {}
    for t in graph:
        if t.kind == "collective" and t.op != "sendrecv":  # sendrecv: a send/recv pair
            members = tuple(sorted(t.group))
            if members != world and members not in names:
                names[members] = str(len(names) + 1)
    return names


def _pg_metadata_node(groups: Mapping[tuple[int, ...], str]) -> ChakraNode:
    """A METADATA node declaring the process groups as PyTorch records them: inputs.values is
    ``str([json])`` (ASTRA-sim strips the two outer characters on each side and parses JSON)."""
    info = [{"pg_name": name, "pg_desc": f"dessim group {name}", "backend_config": "cuda:nccl",
             "pg_size": len(members), "ranks": list(members)} for members, name in groups.items()]
    text = json.dumps(info, separators=(",", ":"))
    return ChakraNode(0, PG_INIT_NAME, "METADATA_NODE", inputs=IOInfo(values=str([text])))


def _task_node(task: Task, node_id: int, deps: list[int], seq: int,
               groups: Mapping[tuple[int, ...], str]) -> ChakraNode:
    attrs: dict[str, Any] = {}
    duration = 0
    kind = task.kind
    if kind in ("compute", "delay"):
        attrs["is_cpu_op"] = kind == "delay" or task.stream == "cpu"
        if task.duration is not None:
            duration = _micros(task.duration)
        if task.flops:
            attrs["num_ops"] = _int_attr(task.flops, "flops", task)
        if task.bytes:
            attrs["tensor_size"] = _int_attr(task.bytes, "bytes", task)
    else:
        attrs["is_cpu_op"] = False
    if kind == "memcpy":
        attrs["tensor_size"] = _chakra_size(task)
    elif kind in ("send", "recv") or (kind == "collective" and task.op == "sendrecv"):
        if kind == "collective":
            src, dst = task.group[0], task.group[1]
            tag = zlib.crc32(task.coll_id.encode()) & 0x7FFFFFFF
        else:
            src, dst = (task.rank, task.peer) if kind == "send" else (task.peer, task.rank)
            tag = task.tag
        if not _INT32[0] <= tag <= _INT32[1]:
            raise TraceError(f"task {task.id!r}: tag {tag} does not fit Chakra's int32 comm_tag")
        attrs.update(comm_src=src, comm_dst=dst, comm_tag=tag, comm_size=_chakra_size(task))
    elif kind == "collective":
        attrs["comm_type"] = _comm_type_number(_comm_type_of(task))
        attrs["comm_size"] = _chakra_size(task)
        pg = groups.get(tuple(sorted(task.group)))
        if pg is not None:
            attrs["pg_name"] = pg
    try:
        attrs[DESSIM_TASK_ATTR] = json.dumps(task.to_dict(), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"task {task.id!r}: cannot store it in the trace: {exc} (attrs must "
                         "be JSON values)") from None
    attrs[DESSIM_SEQ_ATTR] = seq
    return ChakraNode(node_id, task.name or task.id, _node_type(task), data_deps=tuple(deps),
                      duration_micros=duration, attrs=attrs)


def taskgraph_to_chakra(graph: TaskGraph, num_ranks: int | None = None) -> ChakraTrace:
    """The Chakra trace of ``graph``: one :class:`RankTrace` per rank 0..N-1.

    Per rank, node 0 is a METADATA node declaring the process groups (when some collective
    does not span every rank; ``pg_name`` "1", "2", ... — integers, as ASTRA-sim requires) and
    nodes 1.. are the rank's tasks in graph order, each with the Chakra fields replayers read
    (types in :data:`~dessim.trace.chakra_io.KNOWN_ATTR_KINDS`) plus ``dessim.task`` /
    ``dessim.seq``. A ``sendrecv`` collective becomes a COMM_SEND / COMM_RECV pair. Raises
    :class:`TraceError` for what Chakra cannot express: a dependency between tasks of two
    ranks (Chakra dependencies stay within a rank: use send/recv), a value that does not fit
    its Chakra type, attrs that are not JSON, and folded graphs (tasks of representative ranks
    only, :mod:`dessim.taskgraph.fold`: Chakra has one trace per rank).
    """
    if graph.fold is not None:
        raise TraceError(f"task graph {graph.name!r} is folded ({graph.fold.lanes} lanes: it holds the "
                         "tasks of representative ranks only); generate it without folding to export "
                         "one Chakra trace per rank")
    graph.validate(num_ranks)
    n = max(graph.num_ranks, num_ranks or 0, 1)
    groups = _collective_groups(graph, n)
    per_rank: dict[int, list[Task]] = defaultdict(list)
    seq_of: dict[str, int] = {}
    for seq, t in enumerate(graph):
        per_rank[t.rank].append(t)
        seq_of[t.id] = seq
    ranks = []
    meta_info = json.dumps({"name": graph.name, "meta": graph.meta}, sort_keys=True)
    for r in range(n):
        nodes: dict[int, ChakraNode] = {}
        if groups:
            nodes[0] = _pg_metadata_node(groups)
        local: dict[str, int] = {}
        for i, t in enumerate(per_rank.get(r, []), start=1):
            local[t.id] = i
            deps = []
            for d in graph.deps(t.id):
                if d not in local:
                    other = graph.task(d)
                    raise TraceError(
                        f"task {t.id!r} (rank {t.rank}) depends on task {d!r} of rank {other.rank}: "
                        "Chakra dependencies stay within one rank; express it with a send/recv")
                deps.append(local[d])
            nodes[i] = _task_node(t, i, deps, seq_of[t.id], groups)
        ranks.append(RankTrace(r, metadata_attrs={DESSIM_GRAPH_ATTR: meta_info}, nodes=nodes))
    return ChakraTrace(ranks)


def export_chakra(graph: TaskGraph, prefix: str | os.PathLike[str],
                  num_ranks: int | None = None) -> list[Path]:
    """Write ``graph`` as ``<prefix>.<rank>.et`` files (see :func:`taskgraph_to_chakra`);
    return the paths. ``dessim simulate --export-chakra DIR/prefix`` calls this."""
    return write_chakra(taskgraph_to_chakra(graph, num_ranks), prefix)


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


def replay_chakra(trace: ChakraTrace | str | os.PathLike[str], topology: Topology | str,
                  options=None, *, rank_map: RankMapLike = None, cost_compute: bool = False,
                  algo: str | Mapping[str, str] | None = None, mem_node: str | None = None,
                  extra_groups: Mapping[str, Sequence[int]] | None = None,
                  use_dessim_attrs: bool = True):
    """Read (if needed), convert and simulate a Chakra trace; return the SimulationResult.

    ``options`` is an :class:`~dessim.engine.EngineOptions`; its ``collectives.algo``, unless
    ``auto``, is applied like ``algo`` here (per collective, so GATHER/SCATTER keep ``direct``).
    """
    from dataclasses import replace

    from dessim.engine import EngineOptions, simulate
    from dessim.topology import load_topology

    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    options = options or EngineOptions()
    algo = algo or options.forced_algo
    graph = chakra_to_taskgraph(trace, topo, rank_map=rank_map, cost_compute=cost_compute,
                                algo=algo, mem_node=mem_node, extra_groups=extra_groups,
                                use_dessim_attrs=use_dessim_attrs)
    result = simulate(graph, topo, replace(options, collectives=options.collectives.with_(algo="auto")))
    return note_forced_algo(result, algo)


def note_forced_algo(result, algo: str | Mapping[str, str] | None):
    """``result`` of a replay whose collectives were each given the forced algorithm ``algo``
    (the engine itself ran with ``auto``), its collective settings saying ``algorithm ALGO``
    rather than ``algorithm auto`` (the summaries' "as asked" instead of "NCCL's tuning
    model"). A per-op mapping (an ASTRA-sim system file) or None leaves them as they are."""
    if isinstance(algo, str) and algo != "auto":
        c = result.meta.get("collectives") or {}
        if str(c.get("settings", "")).startswith("algorithm auto,"):
            c["settings"] = f"algorithm {algo}," + c["settings"][len("algorithm auto,"):]
    return result
