"""The Chakra ET schema (``et_def.proto``) for the protobuf runtime, built in Python.

Chakra (github mlcommons/chakra, ``schema/protobuf/et_def.proto``, proto3, package
``ChakraProtoMsg``) defines the messages of an execution trace. Instead of checking in
``protoc`` output (which pins the protobuf version it was generated with), this module builds
the same ``FileDescriptorProto`` with :mod:`google.protobuf.descriptor_pb2` and asks
:mod:`google.protobuf.message_factory` for the message classes. Field names and numbers are
exactly those of upstream ("Chakra et_def.proto" in docs/references.md), so the bytes on the
wire are the same as those written by Chakra's own Python bindings.

Scope: the released schema — ``GlobalMetadata``, ``AttributeProto`` (its ``value`` oneof with
all 30 value types) and the ``*List`` messages, ``IOInfo``, ``Tensor``, ``Node`` (fields 1..10),
``NodeType`` (0..7) and ``CollectiveCommType`` (0..9). The open upstream storage proposal
(NodeType 8..10 and ``Node.storage`` = 11) is not included: such nodes are reported as unknown.

``protobuf`` is imported lazily: ``import dessim`` (and this module) works without it, and the
first call to :func:`messages` raises a :class:`~dessim.errors.DessimError` telling the user to
``pip install dessim[chakra]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from dessim.errors import DessimError
from dessim.resources import install_hint

__all__ = [
    "PACKAGE",
    "NODE_TYPES",
    "COLLECTIVE_COMM_TYPES",
    "ATTR_VALUE_KINDS",
    "ChakraMessages",
    "messages",
]

#: The protobuf package of every Chakra message (``package ChakraProtoMsg;``).
PACKAGE = "ChakraProtoMsg"

#: ``enum NodeType``: name -> number (et_def.proto).
NODE_TYPES: dict[str, int] = {
    "INVALID_NODE": 0,
    "METADATA_NODE": 1,
    "MEM_LOAD_NODE": 2,
    "MEM_STORE_NODE": 3,
    "COMP_NODE": 4,
    "COMM_SEND_NODE": 5,
    "COMM_RECV_NODE": 6,
    "COMM_COLL_NODE": 7,
}

#: ``enum CollectiveCommType``: name -> number (et_def.proto).
COLLECTIVE_COMM_TYPES: dict[str, int] = {
    "ALL_REDUCE": 0,
    "REDUCE": 1,
    "ALL_GATHER": 2,
    "GATHER": 3,
    "SCATTER": 4,
    "BROADCAST": 5,
    "ALL_TO_ALL": 6,
    "REDUCE_SCATTER": 7,
    "REDUCE_SCATTER_BLOCK": 8,
    "BARRIER": 9,
}

# descriptor_pb2.FieldDescriptorProto.Type numbers (descriptor.proto); kept as plain ints so
# this table needs no protobuf import.
_TYPE_DOUBLE, _TYPE_FLOAT, _TYPE_INT64, _TYPE_UINT64, _TYPE_INT32 = 1, 2, 3, 4, 5
_TYPE_FIXED64, _TYPE_FIXED32, _TYPE_BOOL, _TYPE_STRING = 6, 7, 8, 9
_TYPE_MESSAGE, _TYPE_BYTES, _TYPE_UINT32, _TYPE_ENUM = 11, 12, 13, 14
_TYPE_SFIXED32, _TYPE_SFIXED64, _TYPE_SINT32, _TYPE_SINT64 = 15, 16, 17, 18
_LABEL_OPTIONAL, _LABEL_REPEATED = 1, 3


@dataclass(frozen=True, slots=True)
class _ValueKind:
    """One scalar type of the ``AttributeProto.value`` oneof."""

    kind: str         # dessim's short name, e.g. "int64"
    scalar_field: str  # e.g. "int64_val" (field number ``number``)
    list_field: str    # e.g. "int64_list" (field number ``number + 1``)
    list_message: str  # e.g. "Int64List"
    number: int
    proto_type: int
    python_type: type


_KINDS: tuple[_ValueKind, ...] = tuple(
    _ValueKind(kind, f"{kind}_val", f"{kind}_list", msg, number, ptype, pytype)
    for kind, msg, number, ptype, pytype in (
        ("double", "DoubleList", 3, _TYPE_DOUBLE, float),
        ("float", "FloatList", 5, _TYPE_FLOAT, float),
        ("int32", "Int32List", 7, _TYPE_INT32, int),
        ("int64", "Int64List", 9, _TYPE_INT64, int),
        ("uint32", "Uint32List", 11, _TYPE_UINT32, int),
        ("uint64", "Uint64List", 13, _TYPE_UINT64, int),
        ("sint32", "Sint32List", 15, _TYPE_SINT32, int),
        ("sint64", "Sint64List", 17, _TYPE_SINT64, int),
        ("fixed32", "Fixed32List", 19, _TYPE_FIXED32, int),
        ("fixed64", "Fixed64List", 21, _TYPE_FIXED64, int),
        ("sfixed32", "Sfixed32List", 23, _TYPE_SFIXED32, int),
        ("sfixed64", "Sfixed64List", 25, _TYPE_SFIXED64, int),
        ("bool", "BoolList", 27, _TYPE_BOOL, bool),
        ("string", "StringList", 29, _TYPE_STRING, str),
        ("bytes", "BytesList", 31, _TYPE_BYTES, bytes),
    )
)

#: Attribute value kinds: short name ("int64", "bool_list", ...) -> python element type.
#: A scalar kind ``k`` is the oneof field ``k_val``; a list kind is the field ``k`` itself.
ATTR_VALUE_KINDS: dict[str, type] = {}
for _k in _KINDS:
    ATTR_VALUE_KINDS[_k.kind] = _k.python_type
    ATTR_VALUE_KINDS[_k.list_field] = _k.python_type

#: Inclusive integer ranges of the integer kinds (two's complement / unsigned widths).
INT_RANGES: dict[str, tuple[int, int]] = {
    **{k: (-(2**31), 2**31 - 1) for k in ("int32", "sint32", "sfixed32")},
    **{k: (-(2**63), 2**63 - 1) for k in ("int64", "sint64", "sfixed64")},
    **{k: (0, 2**32 - 1) for k in ("uint32", "fixed32")},
    **{k: (0, 2**64 - 1) for k in ("uint64", "fixed64")},
}


def oneof_field(kind: str) -> str:
    """The ``AttributeProto`` field that holds a value of ``kind`` ("int64" -> "int64_val")."""
    return kind if kind.endswith("_list") else f"{kind}_val"


def _file_descriptor_proto(descriptor_pb2: Any) -> Any:
    """The ``FileDescriptorProto`` of et_def.proto (released fields only, see module doc)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="chakra/et_def.proto", package=PACKAGE, syntax="proto3"
    )

    def message(name: str) -> Any:
        msg = fdp.message_type.add()
        msg.name = name
        return msg

    def field(msg: Any, name: str, number: int, ftype: int, *, repeated: bool = False,
              type_name: str | None = None, oneof_index: int | None = None) -> None:
        f = msg.field.add()
        f.name = name
        f.number = number
        f.type = ftype
        f.label = _LABEL_REPEATED if repeated else _LABEL_OPTIONAL
        f.json_name = "".join(p if i == 0 else p.capitalize() for i, p in enumerate(name.split("_")))
        if type_name is not None:
            f.type_name = f".{PACKAGE}.{type_name}"
        if oneof_index is not None:
            f.oneof_index = oneof_index

    attr = message("AttributeProto")
    field(attr, "name", 1, _TYPE_STRING)
    field(attr, "doc_string", 2, _TYPE_STRING)
    attr.oneof_decl.add().name = "value"
    for k in _KINDS:
        field(attr, k.scalar_field, k.number, k.proto_type, oneof_index=0)
        field(attr, k.list_field, k.number + 1, _TYPE_MESSAGE, type_name=k.list_message,
              oneof_index=0)

    for k in _KINDS:
        field(message(k.list_message), "values", 1, k.proto_type, repeated=True)

    meta = message("GlobalMetadata")
    field(meta, "version", 1, _TYPE_STRING)
    field(meta, "attr", 2, _TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_COMM_TYPES)):
        enum = fdp.enum_type.add()
        enum.name = enum_name
        for value_name, number in values.items():
            enum.value.add(name=value_name, number=number)

    node = message("Node")
    field(node, "id", 1, _TYPE_UINT64)
    field(node, "name", 2, _TYPE_STRING)
    field(node, "type", 3, _TYPE_ENUM, type_name="NodeType")
    field(node, "ctrl_deps", 4, _TYPE_UINT64, repeated=True)
    field(node, "data_deps", 5, _TYPE_UINT64, repeated=True)
    field(node, "start_time_micros", 6, _TYPE_UINT64)
    field(node, "duration_micros", 7, _TYPE_UINT64)
    field(node, "inputs", 8, _TYPE_MESSAGE, type_name="IOInfo")
    field(node, "outputs", 9, _TYPE_MESSAGE, type_name="IOInfo")
    field(node, "attr", 10, _TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    io = message("IOInfo")
    field(io, "values", 1, _TYPE_STRING)
    field(io, "shapes", 2, _TYPE_STRING)
    field(io, "types", 3, _TYPE_STRING)

    tensor = message("Tensor")
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), 1):
        field(tensor, name, number, _TYPE_UINT64)
    field(tensor, "device", 6, _TYPE_STRING)
    return fdp


@dataclass(frozen=True)
class ChakraMessages:
    """The generated message classes (``ChakraProtoMsg.*``) and the protobuf error type."""

    GlobalMetadata: type
    Node: type
    AttributeProto: type
    IOInfo: type
    Tensor: type
    lists: dict[str, type]  # "Int64List" -> class
    DecodeError: type


@functools.cache
def messages() -> ChakraMessages:
    """Build (once) and return the Chakra message classes.

    Raises :class:`~dessim.errors.DessimError` if the ``protobuf`` package is not installed.
    """
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from google.protobuf.message import DecodeError
    except ImportError as exc:  # pragma: no cover - exercised only without protobuf
        raise DessimError(
            "reading or writing Chakra execution traces needs the 'protobuf' package: "
            + install_hint("chakra")
        ) from exc

    pool = descriptor_pool.DescriptorPool()
    file_desc = pool.Add(_file_descriptor_proto(descriptor_pb2))
    if file_desc is None:  # older runtimes return None from Add(); look the file up instead
        file_desc = pool.FindFileByName("chakra/et_def.proto")

    def cls(name: str) -> type:
        desc = file_desc.message_types_by_name[name]
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(desc)
        return message_factory.MessageFactory(pool).GetPrototype(desc)  # protobuf < 4.22

    return ChakraMessages(
        GlobalMetadata=cls("GlobalMetadata"),
        Node=cls("Node"),
        AttributeProto=cls("AttributeProto"),
        IOInfo=cls("IOInfo"),
        Tensor=cls("Tensor"),
        lists={k.list_message: cls(k.list_message) for k in _KINDS},
        DecodeError=DecodeError,
    )
