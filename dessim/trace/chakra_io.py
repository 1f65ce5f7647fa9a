"""Reading and writing Chakra execution traces (ET) as plain dataclasses.

A Chakra trace is one file per rank, ``<prefix>.<rank>.et`` for ranks 0..N-1. Each file is a
stream of length-delimited protobuf messages: a varint32 byte length, then the serialized
message; first one ``ChakraProtoMsg.GlobalMetadata``, then any number of ``ChakraProtoMsg.Node``;
no count, no footer (Chakra's ``schema/protobuf/et_def.proto`` and ``protolib.encodeMessage`` /
``decodeMessage``). The schema comes from :mod:`dessim.trace.chakra_schema`; only the framing
(the varint length prefix) is coded here. Like Chakra's ``protolib.openFileRd``, a rank file
that starts with the gzip magic bytes is decompressed before decoding.

What :func:`read_chakra` returns is protobuf-free: :class:`ChakraTrace` holds one
:class:`RankTrace` per rank, whose ``nodes`` map node id -> :class:`ChakraNode`. Attribute values
are python values: every integer width -> ``int``, double/float -> ``float``, bool -> ``bool``,
string -> ``str``, bytes -> ``bytes``, ``*_list`` -> ``tuple`` of those. The protobuf value type
is kept only where it differs from the one :func:`default_attr_kind` would pick
(``ChakraNode.attr_kinds``), so that :func:`write_chakra` writes back what was read and a fresh
node needs no encoding detail at all.

Validation:

* :func:`read_chakra` rejects files that cannot be a well-formed trace: truncated framing, a
  message that does not parse (or carries fields unknown to et_def.proto), a missing or unknown
  node type, duplicate node ids, a dependency on an id absent from the same rank's file, a
  dependency cycle, a gap in the rank numbers. Every :class:`~dessim.errors.TraceError` names
  the file, the node (id and name) and the problem.
* :func:`validate_for_replay` adds what a replayer needs: peers of sends/receives, collective
  types, sizes, attribute value types, process groups, matching sends and receives.

Units: the dataclasses keep Chakra's integer microseconds (``duration_micros``) and bytes;
``ChakraNode.duration_s`` / ``start_time_s`` give seconds (SI) for dessim's task graph.
"""

from __future__ import annotations

import ast
import gzip
import heapq
import json
import os
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from dessim.errors import OutputError, TraceError
from dessim.resources import check_output, require_extra
from dessim.trace import chakra_schema as schema

__all__ = [
    "check_chakra_prefix",
    "AttrValue",
    "IOInfo",
    "ChakraNode",
    "RankTrace",
    "ChakraTrace",
    "DEFAULT_VERSION",
    "KNOWN_ATTR_KINDS",
    "default_attr_kind",
    "find_rank_files",
    "read_chakra",
    "read_chakra_file",
    "decode_rank",
    "encode_rank",
    "write_chakra",
    "process_groups",
    "resolve_group",
    "validate_for_replay",
]

#: A decoded attribute value.
AttrValue = int | float | bool | str | bytes | tuple

#: GlobalMetadata.version written for new traces (what Chakra's generator writes today; the
#: fixtures in reference/../fixtures/chakra carry it).
DEFAULT_VERSION = "1.0.0"

#: Value types of the attributes a replayer reads, as ASTRA-sim's feeder reads them
#: (mlcommons/chakra src/feeder/et_feeder_node.cpp: is_cpu_op bool_val, num_ops int64_val,
#: tensor_size uint64_val, comm_type/comm_size int64_val, comm_priority/comm_src/comm_dst/
#: comm_tag int32_val, pg_name string_val) and as Chakra's generators write them (involved_dim
#: bool_list; "Chakra generator" in docs/references.md). :func:`write_chakra` uses these
#: unless a node says otherwise in ``attr_kinds``.
KNOWN_ATTR_KINDS: dict[str, str] = {
    "is_cpu_op": "bool",
    "num_ops": "int64",
    "tensor_size": "uint64",
    "comm_type": "int64",
    "comm_size": "int64",
    "comm_priority": "int32",
    "comm_src": "int32",
    "comm_dst": "int32",
    "comm_tag": "int32",
    "pg_name": "string",
    "involved_dim": "bool_list",
}

_NODE_TYPE_NAMES: dict[int, str] = {v: k for k, v in schema.NODE_TYPES.items()}
_COMM_TYPE_NAMES: dict[int, str] = {v: k for k, v in schema.COLLECTIVE_COMM_TYPES.items()}
_INT64 = schema.INT_RANGES["int64"]
_UINT64 = schema.INT_RANGES["uint64"]


# --------------------------------------------------------------------------------------------
# Dataclasses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IOInfo:
    """``ChakraProtoMsg.IOInfo``: free-form strings (PyTorch converters write ``str(list)``)."""

    values: str = ""
    shapes: str = ""
    types: str = ""


def _normalise_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy in which lists become tuples (what the reader returns)."""
    out = dict(attrs)
    for name, value in out.items():
        if isinstance(value, list):
            out[name] = tuple(value)
    return out


def _normalise_kinds(attrs: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, str]:
    """Drop kinds equal to the default, so that equal content compares equal."""
    out: dict[str, str] = {}
    for name, kind in kinds.items():
        try:
            if name in attrs and kind == default_attr_kind(name, attrs[name]):
                continue
        except TraceError:
            pass  # an unsupported value: keep the entry, the writer reports the problem
        out[name] = kind
    return out


@dataclass(frozen=True)
class ChakraNode:
    """One ``ChakraProtoMsg.Node``.

    ``type`` is the NodeType name ("COMP_NODE", "COMM_COLL_NODE", ...). Dependencies are the
    parents' ids on the same rank: ``data_deps`` (data dependencies) and ``ctrl_deps``
    (ordering); a replayer waits on both (ASTRA-sim's dependency resolver). Times are integer
    microseconds as in the file. ``attrs`` maps attribute name -> python value (lists become
    tuples on construction); ``attr_kinds`` maps a name to its protobuf value kind ("uint64",
    "bool_list", ...) only where it differs from :func:`default_attr_kind` (entries equal to the
    default are dropped on construction); ``attr_docs`` holds
    the non-empty ``AttributeProto.doc_string`` values.
    """

    id: int
    name: str = ""
    type: str = "COMP_NODE"
    ctrl_deps: tuple[int, ...] = ()
    data_deps: tuple[int, ...] = ()
    start_time_micros: int = 0
    duration_micros: int = 0
    inputs: IOInfo = IOInfo()
    outputs: IOInfo = IOInfo()
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    attr_kinds: Mapping[str, str] = field(default_factory=dict)
    attr_docs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Cheap when the fields already have their canonical types (the reader's case).
        if type(self.ctrl_deps) is not tuple:
            object.__setattr__(self, "ctrl_deps", tuple(self.ctrl_deps))
        if type(self.data_deps) is not tuple:
            object.__setattr__(self, "data_deps", tuple(self.data_deps))
        object.__setattr__(self, "attrs", _normalise_attrs(self.attrs))
        object.__setattr__(self, "attr_kinds", _normalise_kinds(self.attrs, self.attr_kinds))
        object.__setattr__(self, "attr_docs", dict(self.attr_docs))

    # -- general -------------------------------------------------------------------------
    @property
    def deps(self) -> tuple[int, ...]:
        """All parents (data and control), sorted, without repetition."""
        return tuple(sorted(set(self.ctrl_deps) | set(self.data_deps)))

    @property
    def duration_s(self) -> float:
        """``duration_micros`` in seconds."""
        return self.duration_micros * 1e-6

    @property
    def start_time_s(self) -> float:
        """``start_time_micros`` in seconds."""
        return self.start_time_micros * 1e-6

    @property
    def is_comm(self) -> bool:
        """True for COMM_SEND_NODE, COMM_RECV_NODE and COMM_COLL_NODE."""
        return self.type in ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")

    def describe(self) -> str:
        """``node <id> (<name>, <type>)`` for error messages."""
        return f"node {self.id} ({self.name!r}, {self.type})"

    # -- typed accessors of the attributes a replayer reads ---------------------------------
    def _int(self, name: str) -> int | None:
        value = self.attrs.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{self.describe()}: attribute {name!r} must be an integer, got {value!r}")
        return value

    @property
    def comm_type(self) -> str | None:
        """CollectiveCommType name of attribute ``comm_type`` (e.g. "ALL_REDUCE"), or None."""
        value = self._int("comm_type")
        if value is None:
            return None
        if value not in _COMM_TYPE_NAMES:
            known = ", ".join(f"{v}={k}" for k, v in schema.COLLECTIVE_COMM_TYPES.items())
            raise TraceError(f"{self.describe()}: unknown comm_type {value} (known: {known})")
        return _COMM_TYPE_NAMES[value]

    @property
    def comm_size(self) -> int | None:
        """Bytes of attribute ``comm_size`` (ALL_GATHER: per-rank contribution), or None."""
        value = self._int("comm_size")
        if value is not None and value < 0:
            raise TraceError(f"{self.describe()}: comm_size {value} is negative")
        return value

    @property
    def comm_src(self) -> int | None:
        """Sending rank of a COMM_RECV_NODE (attribute ``comm_src``), or None."""
        return self._int("comm_src")

    @property
    def comm_dst(self) -> int | None:
        """Receiving rank of a COMM_SEND_NODE (attribute ``comm_dst``), or None."""
        return self._int("comm_dst")

    @property
    def comm_tag(self) -> int | None:
        """Tag matching a send with its receive (attribute ``comm_tag``), or None."""
        return self._int("comm_tag")

    @property
    def comm_priority(self) -> int | None:
        """Attribute ``comm_priority``, or None."""
        return self._int("comm_priority")

    @property
    def num_ops(self) -> int | None:
        """Floating-point operations of a compute node (attribute ``num_ops``), or None."""
        return self._int("num_ops")

    @property
    def tensor_size(self) -> int | None:
        """Bytes of attribute ``tensor_size`` (memory and roofline compute nodes), or None."""
        return self._int("tensor_size")

    @property
    def pg_name(self) -> str | None:
        """Process-group name (attribute ``pg_name``), or None."""
        value = self.attrs.get("pg_name")
        if value is not None and not isinstance(value, str):
            raise TraceError(f"{self.describe()}: attribute 'pg_name' must be a string, got {value!r}")
        return value

    @property
    def involved_dim(self) -> tuple[bool, ...] | None:
        """Network dimensions taking part (attribute ``involved_dim``, bool_list), or None (all)."""
        value = self.attrs.get("involved_dim")
        if value is None:
            return None
        if not isinstance(value, tuple) or not all(isinstance(v, bool) for v in value):
            raise TraceError(
                f"{self.describe()}: attribute 'involved_dim' must be a list of booleans, got {value!r}"
            )
        return value

    @property
    def is_cpu_op(self) -> bool:
        """Attribute ``is_cpu_op``; True when absent, as in ASTRA-sim's feeder (et_feeder_node.cpp)."""
        value = self.attrs.get("is_cpu_op", True)
        if not isinstance(value, bool):
            raise TraceError(f"{self.describe()}: attribute 'is_cpu_op' must be a boolean, got {value!r}")
        return value


@dataclass(frozen=True)
class RankTrace:
    """The trace of one rank: its GlobalMetadata and its nodes (id -> node, sorted by id).

    ``path`` is where it was read from (provenance only: not compared).
    """

    rank: int
    path: str | None = field(default=None, compare=False)
    version: str = DEFAULT_VERSION
    metadata_attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    nodes: Mapping[int, ChakraNode] = field(default_factory=dict)
    metadata_attr_kinds: Mapping[str, str] = field(default_factory=dict)
    metadata_attr_docs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata_attrs", _normalise_attrs(self.metadata_attrs))
        object.__setattr__(
            self, "metadata_attr_kinds", _normalise_kinds(self.metadata_attrs, self.metadata_attr_kinds)
        )
        object.__setattr__(self, "metadata_attr_docs", dict(self.metadata_attr_docs))
        if not isinstance(self.nodes, dict):
            object.__setattr__(self, "nodes", dict(self.nodes))

    @property
    def source(self) -> str:
        """The file name for messages (``rank <r>`` when not read from a file)."""
        return self.path if self.path is not None else f"rank {self.rank}"

    def topological_order(self) -> list[int]:
        """Node ids with every parent before its children (ties by id). Raises on cycles."""
        return _topological_order(self, self.source)


@dataclass(frozen=True)
class ChakraTrace:
    """All ranks of a trace, ``ranks[r].rank == r``. ``prefix`` is provenance (not compared)."""

    ranks: Sequence[RankTrace]
    prefix: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", list(self.ranks))

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def __iter__(self) -> Iterator[RankTrace]:
        return iter(self.ranks)


# --------------------------------------------------------------------------------------------
# Attributes: protobuf <-> python values
# --------------------------------------------------------------------------------------------


def _int_kind(values: Iterable[int]) -> str:
    return "int64" if all(_INT64[0] <= v <= _INT64[1] for v in values) else "uint64"


def default_attr_kind(name: str, value: Any) -> str:
    """The protobuf value kind :func:`write_chakra` uses for an attribute without ``attr_kinds``.

    Known replay attributes get the types of :data:`KNOWN_ATTR_KINDS`. Others follow the python
    type: bool -> bool, int -> int64 (uint64 above 2**63-1), float -> double, str -> string,
    bytes -> bytes, tuple -> the ``*_list`` of its elements (empty -> int64_list).
    """
    if name in KNOWN_ATTR_KINDS:
        return KNOWN_ATTR_KINDS[name]
    if isinstance(value, (tuple, list)):
        if not value:
            return "int64_list"
        if all(isinstance(v, bool) for v in value):
            return "bool_list"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return _int_kind(value) + "_list"
        if all(isinstance(v, float) for v in value):
            return "double_list"
        if all(isinstance(v, str) for v in value):
            return "string_list"
        if all(isinstance(v, bytes) for v in value):
            return "bytes_list"
        raise TraceError(f"attribute {name!r}: a list must hold values of one type, got {value!r}")
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return _int_kind([value])
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    raise TraceError(f"attribute {name!r}: cannot store a {type(value).__name__} value {value!r}")


#: AttributeProto oneof field -> (value kind, is a list).
_FIELD_KINDS: dict[str, tuple[str, bool]] = {
    schema.oneof_field(kind): (kind, kind.endswith("_list")) for kind in schema.ATTR_VALUE_KINDS
}


def _decode_attrs(attr_pbs: Iterable[Any]) -> tuple[dict[str, AttrValue], dict[str, str], dict[str, str]]:
    """(values, non-default kinds, non-empty doc strings) of repeated AttributeProtos.

    Error messages name the attribute; callers prefix the file and node.
    """
    attrs: dict[str, AttrValue] = {}
    kinds: dict[str, str] = {}
    docs: dict[str, str] = {}
    for pb in attr_pbs:
        name = pb.name
        if name in attrs:
            raise TraceError(f"attribute {name!r} appears twice")
        which = pb.WhichOneof("value")
        if which is None:
            raise TraceError(f"attribute {name!r} has no value")
        kind, is_list = _FIELD_KINDS[which]
        raw = getattr(pb, which)
        value: AttrValue = tuple(raw.values) if is_list else raw
        attrs[name] = value
        if kind != default_attr_kind(name, value):
            kinds[name] = kind
        if pb.doc_string:
            docs[name] = pb.doc_string
    return attrs, kinds, docs


def _check_value(name: str, kind: str, value: Any, where: str) -> Any:
    element_type = schema.ATTR_VALUE_KINDS[kind]
    scalar_kind = kind[: -len("_list")] if kind.endswith("_list") else kind

    def check(v: Any) -> Any:
        ok = isinstance(v, element_type) and not (element_type is int and isinstance(v, bool))
        if element_type is float and isinstance(v, int) and not isinstance(v, bool):
            ok, v = True, float(v)
        if not ok:
            raise TraceError(f"{where}: attribute {name!r} of kind {kind} cannot hold {v!r}")
        if scalar_kind in schema.INT_RANGES:
            lo, hi = schema.INT_RANGES[scalar_kind]
            if not lo <= v <= hi:
                raise TraceError(f"{where}: attribute {name!r} value {v} is outside the {scalar_kind} range")
        return v

    if kind.endswith("_list"):
        if not isinstance(value, (tuple, list)):
            raise TraceError(f"{where}: attribute {name!r} of kind {kind} needs a list, got {value!r}")
        return [check(v) for v in value]
    return check(value)


def _encode_attrs(target: Any, attrs: Mapping[str, Any], kinds: Mapping[str, str],
                  docs: Mapping[str, str], where: str) -> None:
    """Append AttributeProtos to the repeated field ``target``, in the mapping's order."""
    for what, mapping in (("attr_kinds", kinds), ("attr_docs", docs)):
        for name in mapping:
            if name not in attrs:
                raise TraceError(f"{where}: {what} names {name!r}, which is not an attribute")
    for name, value in attrs.items():
        kind = kinds.get(name) or default_attr_kind(name, value)
        if kind not in schema.ATTR_VALUE_KINDS:
            raise TraceError(
                f"{where}: attribute {name!r} has unknown kind {kind!r} "
                f"(known: {', '.join(schema.ATTR_VALUE_KINDS)})"
            )
        checked = _check_value(name, kind, value, where)
        pb = target.add()
        try:
            pb.name = name
            if docs.get(name):
                pb.doc_string = docs[name]
            if kind.endswith("_list"):
                getattr(pb, kind).values.extend(checked)
                getattr(pb, kind).SetInParent()  # an empty list still selects the oneof member
            else:
                setattr(pb, schema.oneof_field(kind), checked)
        except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in a string
            raise TraceError(f"{where}: attribute {name!r}: cannot encode: {exc}") from None


# --------------------------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    """Base-128 varint, least significant group first (protobuf encoding guide, "Varints")."""
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def _decode_varint32(buf: bytes, pos: int, source: str) -> tuple[int, int]:
    """Read the varint32 length prefix at ``pos``; return (value, position after it)."""
    start, result, shift = pos, 0, 0
    while True:
        if pos >= len(buf):
            raise TraceError(
                f"{source}: truncated file: the length prefix at byte {start} runs past the end "
                f"of the file ({len(buf)} bytes)"
            )
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift >= 35:
            raise TraceError(f"{source}: byte {start}: length prefix longer than 5 bytes (not a varint32)")
    if result > 0xFFFFFFFF:
        raise TraceError(f"{source}: byte {start}: length prefix {result} exceeds 32 bits")
    return result, pos


def _frames(buf: bytes, source: str) -> Iterator[tuple[int, bytes]]:
    """Yield (offset of the length prefix, message bytes) for every framed message."""
    pos = 0
    while pos < len(buf):
        start = pos
        length, pos = _decode_varint32(buf, pos, source)
        if length == 0:
            raise TraceError(
                f"{source}: byte {start}: zero-length message (Chakra's readers stop reading there, "
                "so the rest of the file would be ignored)"
            )
        if pos + length > len(buf):
            raise TraceError(
                f"{source}: truncated file: the message at byte {start} declares {length} bytes but "
                f"only {len(buf) - pos} remain"
            )
        yield start, buf[pos : pos + length]
        pos += length


def _parse(cls: type, payload: bytes, what: str, where: str) -> Any:
    msgs = schema.messages()
    pb = cls()
    try:
        pb.ParseFromString(payload)
    except msgs.DecodeError as exc:
        raise TraceError(f"{where}: cannot parse the {what}: {exc}") from None
    size = pb.ByteSize()
    pb.DiscardUnknownFields()
    if pb.ByteSize() != size:
        raise TraceError(
            f"{where}: the {what} has fields unknown to Chakra's et_def.proto "
            "(not a Chakra trace, or a newer schema than dessim reads)"
        )
    return pb


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


_EMPTY_IO = IOInfo()


def _io_from_pb(pb: Any, name: str) -> IOInfo:
    if not pb.HasField(name):
        return _EMPTY_IO
    io = getattr(pb, name)
    return IOInfo(io.values, io.shapes, io.types)


def _node_from_pb(pb: Any, where: str) -> ChakraNode:
    type_name = _NODE_TYPE_NAMES.get(pb.type)
    if type_name is None or type_name == "INVALID_NODE":
        label = f"{where}: node {pb.id} ({pb.name!r})"
        if type_name is None:
            known = ", ".join(f"{v}={k}" for k, v in schema.NODE_TYPES.items())
            raise TraceError(f"{label}: unknown node type {pb.type} (known: {known})")
        raise TraceError(f"{label}: node type is INVALID_NODE (0), i.e. unset")
    try:
        attrs, kinds, docs = _decode_attrs(pb.attr)
    except TraceError as exc:
        raise TraceError(f"{where}: node {pb.id} ({pb.name!r}): {exc}") from None
    return ChakraNode(
        id=pb.id,
        name=pb.name,
        type=type_name,
        ctrl_deps=tuple(pb.ctrl_deps),
        data_deps=tuple(pb.data_deps),
        start_time_micros=pb.start_time_micros,
        duration_micros=pb.duration_micros,
        inputs=_io_from_pb(pb, "inputs"),
        outputs=_io_from_pb(pb, "outputs"),
        attrs=attrs,
        attr_kinds=kinds,
        attr_docs=docs,
    )


def decode_rank(data: bytes, rank: int, source: str) -> RankTrace:
    """Decode the bytes of one rank file (``source`` names it in error messages)."""
    msgs = schema.messages()
    frames = _frames(data, source)
    first = next(frames, None)
    if first is None:
        raise TraceError(f"{source}: empty file (expected a GlobalMetadata message, then nodes)")
    meta = _parse(msgs.GlobalMetadata, first[1], "GlobalMetadata (first message)", f"{source}: byte 0")
    try:
        meta_attrs, meta_kinds, meta_docs = _decode_attrs(meta.attr)
    except TraceError as exc:
        raise TraceError(f"{source}: GlobalMetadata: {exc}") from None

    found: dict[int, tuple[int, ChakraNode]] = {}
    for index, (offset, payload) in enumerate(frames, start=1):
        pb = _parse(msgs.Node, payload, f"Node (message {index})", f"{source}: byte {offset}")
        node = _node_from_pb(pb, source)
        if node.id in found:
            raise TraceError(
                f"{source}: duplicate node id {node.id}: messages {found[node.id][0]} "
                f"({found[node.id][1].name!r}) and {index} ({node.name!r})"
            )
        found[node.id] = (index, node)
    rank_trace = RankTrace(
        rank=rank,
        path=source,
        version=meta.version,
        metadata_attrs=meta_attrs,
        metadata_attr_kinds=meta_kinds,
        metadata_attr_docs=meta_docs,
        nodes={nid: found[nid][1] for nid in sorted(found)},
    )
    _check_structure(rank_trace, source)
    return rank_trace


def _check_structure(rank_trace: RankTrace, source: str) -> None:
    """Node types, keys, dependencies on present ids, no cycle."""
    for key, node in rank_trace.nodes.items():
        if key != node.id:
            raise TraceError(f"{source}: nodes[{key}] holds a node whose id is {node.id}")
        if node.type not in schema.NODE_TYPES or node.type == "INVALID_NODE":
            raise TraceError(
                f"{source}: {node.describe()}: unknown node type {node.type!r} "
                f"(known: {', '.join(t for t in schema.NODE_TYPES if t != 'INVALID_NODE')})"
            )
        for kind, deps in (("data_deps", node.data_deps), ("ctrl_deps", node.ctrl_deps)):
            for dep in deps:
                if dep not in rank_trace.nodes:
                    raise TraceError(
                        f"{source}: {node.describe()}: {kind} names node {dep}, which is not in "
                        "this rank's file"
                    )
    _topological_order(rank_trace, source)


def _topological_order(rank_trace: RankTrace, source: str) -> list[int]:
    nodes = rank_trace.nodes
    indegree: dict[int, int] = {}
    children: dict[int, list[int]] = defaultdict(list)
    for nid, node in nodes.items():
        parents = set(node.data_deps).union(node.ctrl_deps) if node.ctrl_deps else set(node.data_deps)
        indegree[nid] = len(parents)
        for dep in parents:
            children[dep].append(nid)
    ready = [nid for nid, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        nid = heapq.heappop(ready)
        order.append(nid)
        for child in children[nid]:
            indegree[child] -= 1
            if indegree[child] == 0:
                heapq.heappush(ready, child)
    if len(order) != len(nodes):
        raise TraceError(f"{source}: dependency cycle: {_find_cycle(nodes, set(order))}")
    return order


def _find_cycle(nodes: Mapping[int, ChakraNode], done: set[int]) -> str:
    """A readable cycle among the nodes not in ``done`` (each has a parent left in the cycle set)."""
    current = min(nid for nid in nodes if nid not in done)
    seen: dict[int, int] = {}
    path: list[int] = []
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(dep for dep in nodes[current].deps if dep not in done)
    cycle = path[seen[current]:] + [current]
    # ``cycle`` follows child -> parent; print it parent -> child.
    return " -> ".join(f"node {nid} ({nodes[nid].name!r})" for nid in reversed(cycle))


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

_GZIP_MAGIC = b"\x1f\x8b"
_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>0|[1-9][0-9]*)\.et$")


def find_rank_files(prefix_or_dir: str | os.PathLike[str], ranks: int | None = None) -> tuple[str, list[Path]]:
    """Resolve ``<dir>/<prefix>`` (or a directory holding one trace, or one ``<prefix>.<r>.et``
    file) to (prefix, [path of rank 0, rank 1, ...]). ``ranks`` is the expected rank count.
    """
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        raise TraceError(f"ranks={ranks!r}: expected a positive number of ranks")
    text = os.fspath(prefix_or_dir)
    if not text.strip():
        raise TraceError("empty Chakra trace prefix: expected '<dir>/<prefix>' naming files <prefix>.<rank>.et")
    path = Path(text)
    if path.is_dir():
        by_prefix: dict[str, dict[int, Path]] = defaultdict(dict)
        for entry in sorted(path.iterdir()):
            m = _RANK_FILE.match(entry.name)
            if m and entry.is_file():
                by_prefix[m["prefix"]][int(m["rank"])] = entry
        if not by_prefix:
            raise TraceError(f"{path}: directory holds no Chakra files named <prefix>.<rank>.et")
        if len(by_prefix) > 1:
            raise TraceError(
                f"{path}: directory holds several Chakra traces ({', '.join(sorted(by_prefix))}); "
                f"pass '{path}/<prefix>' to choose one"
            )
        name, files = next(iter(by_prefix.items()))
        prefix = str(path / name)
    else:
        m = _RANK_FILE.match(path.name)
        if m and path.is_file():
            path = path.with_name(m["prefix"])
        directory = path.parent
        if not directory.is_dir():
            raise TraceError(f"Chakra trace prefix {text!r}: directory {str(directory)!r} does not exist")
        files = {}
        for entry in directory.iterdir():
            m = _RANK_FILE.match(entry.name)
            if m and m["prefix"] == path.name and entry.is_file():
                files[int(m["rank"])] = entry
        prefix = str(path)
        if not files:
            raise TraceError(f"Chakra trace prefix {text!r}: no files {prefix}.<rank>.et (e.g. {prefix}.0.et)")
    count = ranks if ranks is not None else max(files) + 1
    missing = [r for r in range(count) if r not in files]
    if missing:
        shown = ", ".join(f"{prefix}.{r}.et" for r in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise TraceError(
            f"Chakra trace {prefix!r}: missing rank file(s) {shown} "
            f"(found ranks {_ranges(sorted(files))}; expected 0..{count - 1})"
        )
    if ranks is not None and len(files) != ranks:
        raise TraceError(
            f"Chakra trace {prefix!r}: ranks={ranks} but there are files for ranks {_ranges(sorted(files))}"
        )
    return prefix, [files[r] for r in range(count)]


def _ranges(values: Sequence[int]) -> str:
    """Sorted ints as runs: [0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def read_chakra_file(path: str | os.PathLike[str], rank: int | None = None) -> RankTrace:
    """Read one rank file; ``rank`` defaults to the number in ``<prefix>.<rank>.et``."""
    path = Path(path)
    if rank is None:
        m = _RANK_FILE.match(path.name)
        if not m:
            raise TraceError(f"{path}: file name is not <prefix>.<rank>.et; pass rank=")
        rank = int(m["rank"])
    try:
        data = path.read_bytes()
        if data.startswith(_GZIP_MAGIC):  # Chakra's protolib.openFileRd reads gzip files too
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return decode_rank(data, rank, str(path))


def read_chakra(prefix_or_dir: str | os.PathLike[str], *, ranks: int | None = None) -> ChakraTrace:
    """Read ``<prefix>.0.et`` .. ``<prefix>.<N-1>.et`` (N discovered, or ``ranks``).

    ``prefix_or_dir`` is ``<dir>/<prefix>`` (the form ASTRA-sim takes), a directory holding a
    single trace, or one of the rank files. Raises :class:`TraceError` on any malformed input.
    """
    prefix, files = find_rank_files(prefix_or_dir, ranks)
    return ChakraTrace([read_chakra_file(p, r) for r, p in enumerate(files)], prefix=prefix)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def encode_rank(rank_trace: RankTrace, where: str | None = None) -> bytes:
    """The bytes of one rank file: GlobalMetadata, then nodes sorted by id (deterministic)."""
    where = where or rank_trace.source
    msgs = schema.messages()
    if not rank_trace.version:
        raise TraceError(
            f"{where}: GlobalMetadata.version is empty (it would encode as a zero-length message, "
            "which Chakra's readers take for the end of the file)"
        )
    _check_structure(rank_trace, where)
    try:
        meta = msgs.GlobalMetadata(version=rank_trace.version)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{where}: GlobalMetadata.version {rank_trace.version!r}: {exc}") from None
    _encode_attrs(meta.attr, rank_trace.metadata_attrs, rank_trace.metadata_attr_kinds,
                  rank_trace.metadata_attr_docs, f"{where}: GlobalMetadata")
    chunks = [meta.SerializeToString(deterministic=True)]
    for nid in sorted(rank_trace.nodes):
        node = rank_trace.nodes[nid]
        label = f"{where}: {node.describe()}"
        if not _UINT64[0] <= node.id <= _UINT64[1]:
            raise TraceError(f"{label}: id is outside the uint64 range")
        for name in ("start_time_micros", "duration_micros"):
            value = getattr(node, name)
            if isinstance(value, bool) or not isinstance(value, int) or not _UINT64[0] <= value <= _UINT64[1]:
                raise TraceError(f"{label}: {name} must be an integer in 0..2**64-1, got {value!r}")
        try:
            pb = msgs.Node(
                id=node.id,
                name=node.name,
                type=schema.NODE_TYPES[node.type],
                ctrl_deps=node.ctrl_deps,
                data_deps=node.data_deps,
                start_time_micros=node.start_time_micros,
                duration_micros=node.duration_micros,
            )
            for io_name in ("inputs", "outputs"):
                io = getattr(node, io_name)
                if io != IOInfo():
                    getattr(pb, io_name).CopyFrom(
                        msgs.IOInfo(values=io.values, shapes=io.shapes, types=io.types)
                    )
        except (TypeError, ValueError) as exc:  # e.g. a non-str name, a lone surrogate
            raise TraceError(f"{label}: cannot encode: {exc}") from None
        _encode_attrs(pb.attr, node.attrs, node.attr_kinds, node.attr_docs, label)
        chunks.append(pb.SerializeToString(deterministic=True))
    return b"".join(_encode_varint(len(c)) + c for c in chunks)


def check_chakra_prefix(prefix: str | os.PathLike, what: str = "Chakra trace prefix") -> Path:
    """Check, before any work, that rank files ``PREFIX.<rank>.et`` can be written: a valid
    ``DIR/PREFIX``, ``DIR`` existing and writable, protobuf installed
    (:class:`~dessim.errors.OutputError` otherwise)."""
    text = os.fspath(prefix)
    if not text.strip() or Path(text).name in ("", ".", "..") or text.endswith(("/", os.sep)):
        raise OutputError(f"{what} {text!r}: expected '<dir>/<prefix>' (files <prefix>.<rank>.et "
                          "in <dir>), not a directory")
    if Path(text).is_dir():                     # DIR given, DIR/PREFIX meant: not DIR.<rank>.et beside it
        raise OutputError(f"{what} {text!r} is a directory: give '<dir>/<prefix>', e.g. "
                          f"{str(Path(text) / 'trace')!r} for {str(Path(text) / 'trace')}.0.et, ...")
    name = Path(text).name
    if name.lower().endswith(".et"):            # a rank file's name given for the prefix
        stem = re.sub(r"(\.\d+)?\.et$", "", name, flags=re.IGNORECASE)
        raise OutputError(f"{what} {text!r} ends in .et: it is a prefix, and the files are "
                          f"<prefix>.<rank>.et ({name}.0.et, ...); give "
                          f"{str(Path(text).with_name(stem or 'trace'))!r} for {stem or 'trace'}.0.et, ...")
    require_extra("chakra", f"{what} {text!r}")
    check_output(f"{text}.0.et", what)
    return Path(text)


def write_chakra(trace: ChakraTrace, prefix: str | os.PathLike[str]) -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for every rank; return the paths written.

    The bytes depend only on the trace's content (nodes sorted by id, attributes in mapping order), so
    repeated writes are byte-identical; re-writing a trace read from Chakra's generator
    reproduces its bytes. Refuses to leave stale files of higher ranks behind
    (they would be read back as part of the trace). The directory must exist (it is not
    created: a typo in it fails here instead of scattering files).
    """
    text = os.fspath(prefix)
    if not text.strip() or Path(text).name in ("", ".", ".."):
        raise TraceError(f"write_chakra: invalid prefix {text!r}: expected '<dir>/<prefix>'")
    out = Path(text)
    for index, rank_trace in enumerate(trace.ranks):
        if rank_trace.rank != index:
            raise TraceError(f"write_chakra: ranks[{index}] is rank {rank_trace.rank}; ranks must be 0..N-1 in order")
    if not trace.ranks:
        raise TraceError("write_chakra: the trace has no ranks")
    paths = [out.with_name(f"{out.name}.{r}.et") for r in range(len(trace.ranks))]
    check_chakra_prefix(text)
    blobs = [encode_rank(rt, str(p)) for rt, p in zip(trace.ranks, paths)]
    stale = sorted(
        e.name for e in out.parent.iterdir()
        if (m := _RANK_FILE.match(e.name)) and m["prefix"] == out.name and int(m["rank"]) >= len(paths)
    )
    if stale:
        raise TraceError(
            f"write_chakra: {out.parent} already holds {', '.join(stale)} beyond the {len(paths)} "
            "ranks being written; remove them or choose another prefix"
        )
    for path, blob in zip(paths, blobs):
        path.write_bytes(blob)
    return paths


# --------------------------------------------------------------------------------------------
# Process groups
# --------------------------------------------------------------------------------------------


def _loads(text: str) -> Any:
    """JSON, or a python literal (PyTorch converters write ``str(list)``), or None."""
    for loader in (json.loads, ast.literal_eval):
        try:
            return loader(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def _group_dicts(value: Any, depth: int = 0) -> Iterator[dict]:
    """Dicts with a ``pg_name`` key anywhere in nested lists / JSON strings."""
    if depth > 8:
        return
    if isinstance(value, dict):
        if "pg_name" in value:
            yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _group_dicts(item, depth + 1)
    elif isinstance(value, str) and "pg_name" in value:
        yield from _group_dicts(_loads(value), depth + 1)


def process_groups(trace: ChakraTrace) -> dict[str, tuple[int, ...]]:
    """Process groups declared by METADATA nodes: pg_name -> sorted ranks.

    PyTorch records ``## process_group:init ##`` whose input is JSON (``torch.distributed``'s
    ``pg_config_info``: dicts with ``pg_name``, ``ranks``, ``pg_size``/``group_size``); Chakra's
    converter stores it in ``inputs.values`` (as ``str`` of the input list). Both plain JSON and
    that wrapping are accepted. An empty ``ranks`` list means ``range(pg_size)``, as in Chakra's
    trace loader (src/trace_link). Conflicting definitions of one name raise TraceError.
    """
    groups: dict[str, tuple[int, ...]] = {}
    origin: dict[str, str] = {}
    for rank_trace in trace.ranks:
        for node in rank_trace.nodes.values():
            if node.type != "METADATA_NODE" or "pg_name" not in node.inputs.values:
                continue
            where = f"{rank_trace.source}: {node.describe()}"
            found = list(_group_dicts(node.inputs.values))
            if not found:
                raise TraceError(f"{where}: inputs.values mentions pg_name but is neither JSON nor a list of JSON")
            for group in found:
                name = str(group["pg_name"])
                ranks = group.get("ranks") or []
                if not ranks:
                    size = group.get("pg_size", group.get("group_size"))
                    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                        raise TraceError(f"{where}: process group {name!r} has neither ranks nor a size")
                    ranks = range(size)
                if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
                    raise TraceError(f"{where}: process group {name!r} has invalid ranks {ranks!r}")
                members = tuple(sorted(set(ranks)))
                if name in groups and groups[name] != members:
                    raise TraceError(
                        f"{where}: process group {name!r} has ranks {list(members)}, but "
                        f"{origin[name]} declares {list(groups[name])}"
                    )
                groups.setdefault(name, members)
                origin.setdefault(name, where)
    return groups


def resolve_group(pg_name: str | None, groups: Mapping[str, Sequence[int]], num_ranks: int) -> tuple[int, ...] | None:
    """Ranks of process group ``pg_name``: a declared group, else all ranks for None / "" / "0"
    (ASTRA-sim Workload.cc, ``extract_comm_group``: empty or "0" = all ranks); None when the
    name is unknown."""
    if pg_name is not None and pg_name in groups:
        return tuple(sorted(groups[pg_name]))
    if pg_name in (None, "", "0"):
        return tuple(range(num_ranks))
    return None


# --------------------------------------------------------------------------------------------
# Replay validation
# --------------------------------------------------------------------------------------------


def _check_peer(node: ChakraNode, attr: str, num_ranks: int, where: str) -> int:
    value = getattr(node, attr)
    if value is None:
        role = "receiver" if attr == "comm_dst" else "sender"
        raise TraceError(
            f"{where}: {node.type} without {attr}: a replayer cannot tell the {role} "
            f"(set the int32 attribute {attr!r})"
        )
    if not 0 <= value < num_ranks:
        raise TraceError(f"{where}: {attr} {value} is not a rank of this {num_ranks}-rank trace")
    return value


_P2PKey = tuple[int, int, int | None, int]  # (src, dst, tag, bytes)


@dataclass
class _ReplayCheck:
    """Cross-rank bookkeeping of :func:`validate_for_replay`."""

    num_ranks: int
    groups: Mapping[str, Sequence[int]]
    sends: dict[_P2PKey, list[str]] = field(default_factory=lambda: defaultdict(list))
    recvs: dict[_P2PKey, list[str]] = field(default_factory=lambda: defaultdict(list))
    # (pg_name, members) -> rank -> collective type -> count
    collectives: dict[tuple[str, tuple[int, ...]], dict[int, Counter[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Counter))
    )

    def node(self, node: ChakraNode, rank: int, source: str) -> None:
        where = f"{source}: {node.describe()}"
        try:
            # Every typed accessor checks the value type of its attribute.
            for accessor in ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag",
                             "comm_priority", "num_ops", "tensor_size", "pg_name", "involved_dim",
                             "is_cpu_op"):
                getattr(node, accessor)
        except TraceError as exc:
            raise TraceError(f"{source}: {exc}") from None
        if node.involved_dim == ():
            raise TraceError(f"{where}: involved_dim is empty (it needs one boolean per network dimension)")
        if node.type in ("MEM_LOAD_NODE", "MEM_STORE_NODE") and node.tensor_size is None:
            raise TraceError(f"{where}: {node.type} without tensor_size (bytes moved)")
        if not node.is_comm:
            return
        members = resolve_group(node.pg_name, self.groups, self.num_ranks)
        if members is None:
            raise TraceError(
                f"{where}: pg_name {node.pg_name!r} is not declared by any METADATA process-group "
                f"node (declared: {', '.join(sorted(self.groups)) or 'none'})"
            )
        if rank not in members:
            raise TraceError(
                f"{where}: rank {rank} is not a member of process group {node.pg_name!r} "
                f"(ranks {_ranges(list(members))})"
            )
        if node.type == "COMM_COLL_NODE":
            comm_type = node.comm_type
            if comm_type is None:
                raise TraceError(f"{where}: COMM_COLL_NODE without comm_type (int64 CollectiveCommType)")
            if comm_type != "BARRIER" and node.comm_size is None:
                raise TraceError(f"{where}: {comm_type} without comm_size (int64 bytes)")
            self.collectives[(node.pg_name or "", members)][rank][comm_type] += 1
            return
        if node.type == "COMM_SEND_NODE":
            src, dst = rank, _check_peer(node, "comm_dst", self.num_ranks, where)
            if node.comm_src is not None and node.comm_src != rank:
                raise TraceError(f"{where}: comm_src {node.comm_src} of a send on rank {rank} is not {rank}")
        else:
            src, dst = _check_peer(node, "comm_src", self.num_ranks, where), rank
            if node.comm_dst is not None and node.comm_dst != rank:
                raise TraceError(f"{where}: comm_dst {node.comm_dst} of a receive on rank {rank} is not {rank}")
        if node.comm_size is None:
            raise TraceError(f"{where}: {node.type} without comm_size (int64 bytes)")
        book = self.sends if node.type == "COMM_SEND_NODE" else self.recvs
        book[(src, dst, node.comm_tag, node.comm_size)].append(f"{source} node {node.id}")

    def finish(self) -> None:
        for key in sorted(set(self.sends) | set(self.recvs), key=repr):
            sends, recvs = self.sends.get(key, []), self.recvs.get(key, [])
            if len(sends) != len(recvs):
                src, dst, tag, size = key
                raise TraceError(
                    f"{len(sends)} send(s) but {len(recvs)} receive(s) from rank {src} to rank {dst} "
                    f"with tag {tag} and {size} bytes (sends: {', '.join(sends) or 'none'}; "
                    f"receives: {', '.join(recvs) or 'none'})"
                )
        for (pg, members), per_rank in sorted(self.collectives.items()):
            first = members[0]
            expected = per_rank.get(first, Counter())
            for member in members:
                got = per_rank.get(member, Counter())
                if got != expected:
                    raise TraceError(
                        f"process group {pg!r} (ranks {_ranges(list(members))}): rank {member} issues "
                        f"{dict(sorted(got.items()))} but rank {first} issues "
                        f"{dict(sorted(expected.items()))}; those collectives would never complete"
                    )


def validate_for_replay(
    trace: ChakraTrace, *, extra_groups: Mapping[str, Sequence[int]] | None = None
) -> None:
    """Raise :class:`TraceError` unless every node carries what a replayer needs.

    Per node: the value types of the replay attributes (:data:`KNOWN_ATTR_KINDS`);
    COMM_SEND_NODE has ``comm_dst`` (and ``comm_src``, if present, is its own rank),
    COMM_RECV_NODE has ``comm_src`` (and ``comm_dst``, if present, is its own rank), both have
    ``comm_size``; COMM_COLL_NODE has a known ``comm_type`` and, except BARRIER, ``comm_size``;
    MEM_LOAD/MEM_STORE nodes have ``tensor_size``; a communication node's process group exists
    and holds its rank. Across ranks: every send has a receive with the same
    (src, dst, tag, size), and the members of each process group issue the same number of
    collectives of each type. ``extra_groups`` adds or overrides process groups (pg_name ->
    ranks), e.g. from a communicator-group file.
    """
    groups = dict(process_groups(trace))
    groups.update({k: tuple(sorted(v)) for k, v in (extra_groups or {}).items()})
    check = _ReplayCheck(trace.num_ranks, groups)
    for rank_trace in trace.ranks:
        for node in rank_trace.nodes.values():
            check.node(node, rank_trace.rank, rank_trace.source)
    check.finish()
