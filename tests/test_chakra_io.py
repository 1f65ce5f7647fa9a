"""Chakra ET files: reading Chakra's own traces, rejecting malformed ones, writing them back.

Fixtures in tests/data/chakra/ were made by Chakra's own generator and Python bindings
(github.com/mlcommons/chakra); their README.txt lists what each holds.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.errors import DessimError, TraceError
from dessim.trace import chakra_schema as schema
from dessim.trace.chakra_io import (
    ChakraNode,
    ChakraTrace,
    IOInfo,
    RankTrace,
    decode_rank,
    default_attr_kind,
    encode_rank,
    process_groups,
    read_chakra,
    validate_for_replay,
    write_chakra,
)

DATA = Path(__file__).parent / "data" / "chakra"
GEN = DATA / "chakra_generator_8npu"
ALL_PREFIXES = sorted({str(p)[: -len(".0.et")] for p in DATA.glob("*/*.0.et")})
MiB = 1 << 20


def only_node(prefix: Path | str, rank: int = 0) -> ChakraNode:
    (node,) = read_chakra(prefix).ranks[rank].nodes.values()
    return node


# --------------------------------------------------------------------------------------------
# Reading Chakra's fixtures
# --------------------------------------------------------------------------------------------


def test_fixture_set_is_complete():
    names = {str(Path(p).relative_to(DATA)) for p in ALL_PREFIXES}
    assert len(names) == 21
    assert "ring_sendrecv_1MiB_8npu/ring_sendrecv" in names


@pytest.mark.parametrize("prefix", ALL_PREFIXES, ids=lambda p: str(Path(p).relative_to(DATA)))
def test_every_fixture_reads_with_all_ranks_and_version(prefix):
    trace = read_chakra(prefix)
    expected_ranks = 32 if "32npu" in prefix else 8
    assert trace.num_ranks == expected_ranks
    assert [r.rank for r in trace.ranks] == list(range(expected_ranks))
    for rank_trace in trace.ranks:
        assert rank_trace.version == "1.0.0"
        assert rank_trace.nodes, rank_trace.path
        assert rank_trace.path.endswith(f".{rank_trace.rank}.et")
        assert list(rank_trace.nodes) == sorted(rank_trace.nodes)


@pytest.mark.parametrize(
    "prefix, comm_type, size",
    [
        ("ALL_REDUCE", "ALL_REDUCE", MiB),
        ("ALL_GATHER", "ALL_GATHER", MiB),  # per-rank contribution
        ("REDUCE_SCATTER", "REDUCE_SCATTER", MiB),  # whole buffer
        ("ALL_TO_ALL", "ALL_TO_ALL", MiB),
        ("BROADCAST", "BROADCAST", MiB),
        ("BARRIER", "BARRIER", 0),
    ],
)
def test_generator_collectives(prefix, comm_type, size):
    trace = read_chakra(GEN / prefix)
    for rank_trace in trace.ranks:
        (node,) = rank_trace.nodes.values()
        assert node.type == "COMM_COLL_NODE"
        assert node.comm_type == comm_type
        assert node.comm_size == size
        assert node.is_cpu_op is False
        assert node.attr_kinds == {}  # comm_type / comm_size are int64, is_cpu_op bool: defaults
        assert node.pg_name is None and node.involved_dim is None
    validate_for_replay(trace)


@pytest.mark.parametrize("directory, size", [("allreduce_1MiB_8npu", MiB), ("allreduce_64MiB_8npu", 64 * MiB),
                                             ("allreduce_1GiB_8npu", 1 << 30)])
def test_allreduce_sizes(directory, size):
    node = only_node(DATA / directory / "ALL_REDUCE", rank=5)
    assert (node.type, node.comm_type, node.comm_size) == ("COMM_COLL_NODE", "ALL_REDUCE", size)


def test_compute_nodes_and_their_dependencies():
    node = only_node(GEN / "one_comp_node")
    assert (node.type, node.duration_micros, node.deps) == ("COMP_NODE", 5, ())
    assert node.duration_s == pytest.approx(5e-6)

    independent = read_chakra(GEN / "two_comp_nodes_independent").ranks[0].nodes
    assert len(independent) == 2 and all(n.deps == () for n in independent.values())

    for rank_trace in read_chakra(GEN / "two_comp_nodes_dependent").ranks:
        parent, child = rank_trace.nodes.values()
        assert child.data_deps == (parent.id,) and child.ctrl_deps == ()
        assert parent.deps == ()
        assert rank_trace.topological_order() == [parent.id, child.id]
    # ids come from the generator's global counter: not 0-based, legal
    assert list(read_chakra(GEN / "two_comp_nodes_dependent").ranks[0].nodes) == [48, 49]


@pytest.mark.parametrize("prefix, node_type", [("one_remote_mem_load_node", "MEM_LOAD_NODE"),
                                               ("one_remote_mem_store_node", "MEM_STORE_NODE")])
def test_memory_nodes(prefix, node_type):
    node = only_node(GEN / prefix)
    assert (node.type, node.tensor_size, node.attr_kinds) == (node_type, 1024, {})  # uint64 default


def test_ring_sendrecv_peers_tag_and_size():
    trace = read_chakra(DATA / "ring_sendrecv_1MiB_8npu" / "ring_sendrecv")
    for rank_trace in trace.ranks:
        r = rank_trace.rank
        send, recv = rank_trace.nodes.values()
        assert (send.type, send.comm_src, send.comm_dst) == ("COMM_SEND_NODE", r, (r + 1) % 8)
        assert (recv.type, recv.comm_src, recv.comm_dst) == ("COMM_RECV_NODE", (r - 1) % 8, r)
        for node in (send, recv):
            assert (node.comm_tag, node.comm_size, node.attr_kinds) == (7, MiB, {})
    validate_for_replay(trace)


def test_dp_overlap_structure_and_durations():
    trace = read_chakra(DATA / "dp_overlap_8npu" / "dp_overlap")
    for rank_trace in trace.ranks:
        by_name = {n.name: n for n in rank_trace.nodes.values()}
        ids = {name: n.id for name, n in by_name.items()}
        deps = {name: sorted(rank_trace.nodes[d].name for d in n.data_deps) for name, n in by_name.items()}
        assert deps == {
            "fwd": [],
            "bwd_L2": ["fwd"],
            "AR_grad_L2": ["bwd_L2"],
            "bwd_L1": ["bwd_L2"],
            "AR_grad_L1": ["bwd_L1"],
            "optimizer": ["AR_grad_L1", "AR_grad_L2"],
        }
        assert all(n.ctrl_deps == () for n in by_name.values())
        durations = {name: n.duration_micros for name, n in by_name.items() if n.type == "COMP_NODE"}
        assert durations == {"fwd": 100, "bwd_L2": 50, "bwd_L1": 50, "optimizer": 10}
        for name in ("AR_grad_L1", "AR_grad_L2"):
            assert (by_name[name].comm_type, by_name[name].comm_size) == ("ALL_REDUCE", 64 * MiB)
        order = rank_trace.topological_order()
        assert order.index(ids["fwd"]) < order.index(ids["bwd_L2"]) < order.index(ids["optimizer"])
    validate_for_replay(trace)


def test_ctrl_chain_orders_allreduce_after_compute_by_ctrl_dep():
    for rank_trace in read_chakra(DATA / "ctrl_chain_8npu" / "ctrl_chain").ranks:
        compute, ar = rank_trace.nodes.values()
        assert (compute.type, compute.duration_micros) == ("COMP_NODE", 20)
        assert (ar.ctrl_deps, ar.data_deps, ar.deps) == ((compute.id,), (), (compute.id,))
        assert (ar.comm_type, ar.comm_size) == ("ALL_REDUCE", MiB)


def test_ar_dim0_only_involved_dim():
    trace = read_chakra(DATA / "ar_dim0_only_32npu" / "ar_dim0_only")
    assert trace.num_ranks == 32
    for rank_trace in trace.ranks:
        (node,) = rank_trace.nodes.values()
        assert node.involved_dim == (True, False)
        assert (node.comm_type, node.comm_size) == ("ALL_REDUCE", 64 * MiB)
    validate_for_replay(trace)


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_metadata_node_every_value_type_decoded():
    node = only_node(GEN / "one_metadata_node_all_types", rank=3)
    assert node.type == "METADATA_NODE"
    a = node.attrs
    assert a["double"] == 1.2345 and a["double_list"] == (1.2345, 2.3456)
    assert a["float"] == _f32(1.2345) and a["float_list"] == (_f32(1.2345), _f32(2.3456))
    for kind in ("int32", "uint32", "fixed32"):
        assert a[kind] == 12345 and a[f"{kind}_list"] == (12345, 23456)
    for kind in ("int64", "uint64", "fixed64"):
        assert a[kind] == 9876543210 and a[f"{kind}_list"] == (9876543210, 1234567890)
    for kind in ("sint32", "sfixed32"):
        assert a[kind] == -12345 and a[f"{kind}_list"] == (12345, -23456)
    for kind in ("sint64", "sfixed64"):
        assert a[kind] == -9876543210 and a[f"{kind}_list"] == (9876543210, -1234567890)
    assert a["bool"] is True and a["bool_list"] == (True, False) * 5
    assert a["string"] == "12345" and a["string_list"] == tuple(str(12345 + i) for i in range(10))
    assert a["bytes"] == b"12345" and a["bytes_list"] == tuple(str(12345 + i).encode() for i in range(10))
    assert all(type(v) is int for k, v in a.items() if "int" in k and "list" not in k)
    # every protobuf value type is remembered (defaults omitted) so writing reproduces it
    for name in a:
        assert node.attr_kinds.get(name, default_attr_kind(name, a[name])) == name
    assert node.attr_docs == {k: k for k in ("double", "float", "int32", "int64", "uint32", "uint64",
                                             "sint32", "sint64", "bool", "string")}
    assert len(a) == 30


# --------------------------------------------------------------------------------------------
# Replay validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix, message", [
    ("one_comm_send_node", r"one_comm_send_node\.0\.et: node 112 \('COMM_SEND_NODE', COMM_SEND_NODE\): "
                           r"COMM_SEND_NODE without comm_dst"),
    ("one_comm_recv_node", r"one_comm_recv_node\.0\.et: node 120 .*COMM_RECV_NODE without comm_src"),
])
def test_lone_send_and_recv_fixtures_read_but_are_rejected_for_replay(prefix, message):
    trace = read_chakra(GEN / prefix)  # reading is fine
    with pytest.raises(TraceError, match=message):
        validate_for_replay(trace)


def comm(nid, node_type, **attrs):
    return ChakraNode(nid, name=f"n{nid}", type=node_type, attrs={"is_cpu_op": False, **attrs})


def trace_of(*per_rank_nodes):
    return ChakraTrace([RankTrace(r, nodes={n.id: n for n in nodes}) for r, nodes in enumerate(per_rank_nodes)])


def test_replay_rejects_unmatched_send():
    trace = trace_of([comm(0, "COMM_SEND_NODE", comm_dst=1, comm_size=64, comm_tag=3)], [])
    with pytest.raises(TraceError, match=r"1 send\(s\) but 0 receive\(s\) from rank 0 to rank 1 with tag 3 "
                                         r"and 64 bytes \(sends: rank 0 node 0"):
        validate_for_replay(trace)


def test_replay_accepts_matched_send_recv_and_rejects_peer_out_of_range():
    good = trace_of([comm(0, "COMM_SEND_NODE", comm_dst=1, comm_size=64)],
                    [comm(0, "COMM_RECV_NODE", comm_src=0, comm_size=64)])
    validate_for_replay(good)
    bad = trace_of([comm(0, "COMM_SEND_NODE", comm_dst=2, comm_size=64)], [])
    with pytest.raises(TraceError, match="rank 0: node 0 .*comm_dst 2 is not a rank of this 2-rank trace"):
        validate_for_replay(bad)


@pytest.mark.parametrize("attrs, message", [
    ({"comm_size": 8}, "COMM_COLL_NODE without comm_type"),
    ({"comm_type": 42, "comm_size": 8}, "unknown comm_type 42"),
    ({"comm_type": 0}, "ALL_REDUCE without comm_size"),
    ({"comm_type": 0, "comm_size": "8"}, "attribute 'comm_size' must be an integer, got '8'"),
    ({"comm_type": 0, "comm_size": 8, "involved_dim": (1, 0)}, "'involved_dim' must be a list of booleans"),
    ({"comm_type": 0, "comm_size": 8, "pg_name": "7"}, "pg_name '7' is not declared"),
])
def test_replay_rejects_bad_collectives(attrs, message):
    trace = trace_of([comm(3, "COMM_COLL_NODE", **attrs)])
    with pytest.raises(TraceError, match=rf"rank 0: node 3 \('n3', COMM_COLL_NODE\): .*{message}"):
        validate_for_replay(trace)


def pg_metadata(nid, groups):
    # As Chakra's PyTorch converter stores the "## process_group:init ##" input: str(list).
    return ChakraNode(nid, name="## process_group:init ##", type="METADATA_NODE",
                      inputs=IOInfo(values=str([json.dumps(groups)])))


def test_process_groups_from_metadata_nodes():
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
              {"pg_name": "1", "pg_desc": "dp", "ranks": [2, 0]},
              {"pg_name": "2", "pg_desc": "all", "ranks": [], "pg_size": 4}]
    ranks = [[pg_metadata(0, groups)] for _ in range(4)]
    ranks[3].append(ChakraNode(1, type="METADATA_NODE", inputs=IOInfo(values=json.dumps(groups[1]))))
    trace = trace_of(*ranks)
    assert process_groups(trace) == {"0": (0, 1, 2, 3), "1": (0, 2), "2": (0, 1, 2, 3)}

    ar = dict(comm_type=0, comm_size=8, pg_name="1")
    for r in (0, 2):
        ranks[r].append(comm(5, "COMM_COLL_NODE", **ar))
    validate_for_replay(trace_of(*ranks))

    ranks[1].append(comm(5, "COMM_COLL_NODE", **ar))
    with pytest.raises(TraceError, match=r"rank 1: node 5 .*rank 1 is not a member of process group '1' "
                                         r"\(ranks 0, 2\)"):
        validate_for_replay(trace_of(*ranks))


def test_process_group_conflict_and_collective_count_mismatch():
    trace = trace_of([pg_metadata(0, [{"pg_name": "1", "ranks": [0, 1]}])],
                     [pg_metadata(0, [{"pg_name": "1", "ranks": [1, 2]}])])
    with pytest.raises(TraceError, match=r"process group '1' has ranks \[1, 2\], but rank 0: node 0 .* "
                                         r"declares \[0, 1\]"):
        process_groups(trace)

    ar = comm(1, "COMM_COLL_NODE", comm_type=0, comm_size=8)
    with pytest.raises(TraceError, match=r"process group '' \(ranks 0-1\): rank 1 issues \{\} but rank 0 "
                                         r"issues \{'ALL_REDUCE': 1\}"):
        validate_for_replay(trace_of([ar], []))


# --------------------------------------------------------------------------------------------
# Malformed files
# --------------------------------------------------------------------------------------------


def frame(*messages) -> bytes:
    out = b""
    for m in messages:
        payload = m if isinstance(m, bytes) else m.SerializeToString()
        out += schema_varint(len(payload)) + payload
    return out


def schema_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(out + bytes([n]))


def unframe(data: bytes) -> list:
    """GlobalMetadata + Nodes, framed with protobuf's internal varint32 reader."""
    from google.protobuf.internal.decoder import _DecodeVarint32

    msgs, out, pos = schema.messages(), [], 0
    while pos < len(data):
        size, pos = _DecodeVarint32(data, pos)
        msg = (msgs.Node if out else msgs.GlobalMetadata)()
        msg.ParseFromString(data[pos:pos + size])
        out.append(msg)
        pos += size
    return out


def pb_node(nid, node_type=4, **fields):
    return schema.messages().Node(id=nid, name=f"n{nid}", type=node_type, **fields)


def meta():
    return schema.messages().GlobalMetadata(version="1.0.0")


def write_ranks(tmp_path, *blobs, prefix="t"):
    for r, blob in enumerate(blobs):
        (tmp_path / f"{prefix}.{r}.et").write_bytes(blob)
    return tmp_path / prefix


@pytest.mark.parametrize("blob, message", [
    (b"", r"t\.0\.et: empty file"),
    (frame(meta(), pb_node(0))[:-1], r"t\.0\.et: truncated file: the message at byte 8 declares 6 bytes but only 5 remain"),
    (frame(meta()) + b"\x85", r"t\.0\.et: truncated file: the length prefix at byte 8 runs past the end"),
    (frame(meta(), b"\xff\xff\xff"), r"t\.0\.et: byte 8: cannot parse the Node \(message 1\)"),
    (frame(meta(), pb_node(0).SerializeToString() + b"\x58\x01"),
     r"t\.0\.et: byte 8: the Node \(message 1\) has fields unknown to Chakra's et_def\.proto"),
    (frame(schema.messages().Node(id=5, type=4)),
     r"t\.0\.et: byte 0: the GlobalMetadata \(first message\) has fields unknown"),
    (frame(meta()) + b"\x00", r"t\.0\.et: byte 8: zero-length message"),
    (frame(meta(), pb_node(0), pb_node(1, data_deps=[7])),
     r"t\.0\.et: node 1 \('n1', COMP_NODE\): data_deps names node 7, which is not in this rank's file"),
    (frame(meta(), pb_node(0, ctrl_deps=[3])), r"ctrl_deps names node 3, which is not"),
    (frame(meta(), pb_node(0), pb_node(0)), r"t\.0\.et: duplicate node id 0: messages 1 \('n0'\) and 2"),
    (frame(meta(), pb_node(4, node_type=99)), r"t\.0\.et: node 4 \('n4'\): unknown node type 99 \(known: 0=INVALID"),
    (frame(meta(), pb_node(4, node_type=0)), r"t\.0\.et: node 4 \('n4'\): node type is INVALID_NODE"),
    (frame(meta(), pb_node(0, data_deps=[2]), pb_node(1, data_deps=[0]), pb_node(2, ctrl_deps=[1])),
     r"t\.0\.et: dependency cycle: node 0 \('n0'\) -> node 1 \('n1'\) -> node 2 \('n2'\) -> node 0"),
    (frame(meta(), pb_node(0, data_deps=[0])), r"dependency cycle: node 0 \('n0'\) -> node 0"),
], ids=["empty", "truncated-message", "truncated-prefix", "unparsable", "unknown-field", "node-first",
        "zero-length", "missing-data-dep", "missing-ctrl-dep", "duplicate-id", "unknown-type", "invalid-type",
        "cycle", "self-dep"])
def test_malformed_file_rejected(tmp_path, blob, message):
    with pytest.raises(TraceError, match=message):
        read_chakra(write_ranks(tmp_path, blob))


def test_duplicate_attribute_and_attribute_without_value(tmp_path):
    msgs = schema.messages()
    node = pb_node(2)
    node.attr.add(name="comm_size", int64_val=1)
    node.attr.add(name="comm_size", int64_val=2)
    with pytest.raises(TraceError, match=r"node 2 \('n2'\): attribute 'comm_size' appears twice"):
        read_chakra(write_ranks(tmp_path, frame(meta(), node)))
    node = pb_node(2, attr=[msgs.AttributeProto(name="x")])
    with pytest.raises(TraceError, match=r"node 2 \('n2'\): attribute 'x' has no value"):
        read_chakra(write_ranks(tmp_path, frame(meta(), node)))


def test_rank_files_missing_gap_and_count(tmp_path):
    src = DATA / "ring_sendrecv_1MiB_8npu"
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "ring_sendrecv.3.et").unlink()
    with pytest.raises(TraceError, match=r"missing rank file\(s\) .*ring_sendrecv\.3\.et \(found ranks 0-2, 4-7; "
                                         r"expected 0\.\.7\)"):
        read_chakra(tmp_path / "ring_sendrecv")
    shutil.copy(src / "ring_sendrecv.3.et", tmp_path)
    assert read_chakra(tmp_path / "ring_sendrecv", ranks=8).num_ranks == 8
    with pytest.raises(TraceError, match=r"missing rank file\(s\) .*ring_sendrecv\.8\.et"):
        read_chakra(tmp_path / "ring_sendrecv", ranks=9)
    with pytest.raises(TraceError, match=r"ranks=4 but there are files for ranks 0-7"):
        read_chakra(tmp_path / "ring_sendrecv", ranks=4)
    with pytest.raises(TraceError, match=r"ranks=0: expected a positive number of ranks"):
        read_chakra(tmp_path / "ring_sendrecv", ranks=0)


def test_gzip_rank_files_are_read_like_chakra_does(tmp_path):
    src = DATA / "dp_overlap_8npu"
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(gzip.compress(f.read_bytes(), mtime=0))
    assert read_chakra(tmp_path / "dp_overlap") == read_chakra(src / "dp_overlap")
    (tmp_path / "dp_overlap.2.et").write_bytes(gzip.compress(b"abc")[:-3])
    with pytest.raises(TraceError, match=r"dp_overlap\.2\.et: cannot read: "):
        read_chakra(tmp_path / "dp_overlap")


def test_prefix_forms(tmp_path):
    with pytest.raises(TraceError, match="empty Chakra trace prefix"):
        read_chakra("")
    with pytest.raises(TraceError, match=r"no files .*nothing\.<rank>\.et"):
        read_chakra(tmp_path / "nothing")
    with pytest.raises(TraceError, match="does not exist"):
        read_chakra(tmp_path / "no_dir" / "x")
    with pytest.raises(TraceError, match=r"holds several Chakra traces \(ALL_GATHER, ALL_REDUCE, .*pass '.*/<prefix>'"):
        read_chakra(GEN)
    by_dir = read_chakra(DATA / "ctrl_chain_8npu")
    by_file = read_chakra(DATA / "ctrl_chain_8npu" / "ctrl_chain.4.et")
    assert by_dir == by_file == read_chakra(DATA / "ctrl_chain_8npu" / "ctrl_chain")
    assert by_dir.num_ranks == 8


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ALL_PREFIXES, ids=lambda p: str(Path(p).relative_to(DATA)))
def test_round_trip_reproduces_fixture_dataclasses_and_bytes(tmp_path, prefix):
    trace = read_chakra(prefix)
    paths = write_chakra(trace, tmp_path / "out")
    assert [p.name for p in paths] == [f"out.{r}.et" for r in range(trace.num_ranks)]
    assert read_chakra(tmp_path / "out") == trace
    # Chakra's generator wrote these files; writing what we read gives its exact bytes back.
    for r, path in enumerate(paths):
        assert path.read_bytes() == Path(f"{prefix}.{r}.et").read_bytes()


def test_repeated_writes_are_byte_identical_and_attrs_default_to_chakra_types(tmp_path):
    node = ChakraNode(7, name="ar", type="COMM_COLL_NODE",
                      attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": 1 << 40, "comm_src": 1,
                             "comm_dst": 2, "comm_tag": 9, "pg_name": "0", "involved_dim": [True, False],
                             "num_ops": 5, "tensor_size": 2**64 - 1, "label": "x", "ratio": 0.5})
    trace = trace_of([node, ChakraNode(3, duration_micros=12)], [ChakraNode(0)])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_chakra(trace, tmp_path / "a" / "t")
    write_chakra(trace, tmp_path / "b" / "t")
    for r in (0, 1):
        assert (tmp_path / "a" / f"t.{r}.et").read_bytes() == (tmp_path / "b" / f"t.{r}.et").read_bytes()
    back = read_chakra(tmp_path / "a" / "t")
    assert back == trace
    assert back.ranks[0].nodes[7].involved_dim == (True, False)
    # Decode with protobuf's own varint reader, independently of dessim's framing.
    meta, first, second = unframe((tmp_path / "a" / "t.0.et").read_bytes())
    assert meta.version == "1.0.0"
    assert (first.id, second.id) == (3, 7)  # nodes sorted by id
    # the value types ASTRA-sim's feeder reads (et_feeder_node.cpp)
    kinds = {a.name: a.WhichOneof("value") for a in second.attr}
    assert kinds == {"is_cpu_op": "bool_val", "comm_type": "int64_val", "comm_size": "int64_val",
                     "comm_src": "int32_val", "comm_dst": "int32_val", "comm_tag": "int32_val",
                     "pg_name": "string_val", "involved_dim": "bool_list", "num_ops": "int64_val",
                     "tensor_size": "uint64_val", "label": "string_val", "ratio": "double_val"}


@pytest.mark.parametrize("node, message", [
    (ChakraNode(1, attrs={"comm_src": "x"}), r"node 1 .*attribute 'comm_src' of kind int32 cannot hold 'x'"),
    (ChakraNode(1, attrs={"comm_dst": 2**31}), r"attribute 'comm_dst' value 2147483648 is outside the int32"),
    (ChakraNode(1, attrs={"v": [1, "a"]}), r"attribute 'v': a list must hold values of one type"),
    (ChakraNode(1, attrs={"v": 1}, attr_kinds={"v": "int128"}), r"attribute 'v' has unknown kind 'int128'"),
    (ChakraNode(1, attrs={"v": 1}, attr_kinds={"w": "int32"}), r"attr_kinds names 'w', which is not an attribute"),
    (ChakraNode(1, type="BATCH_NODE"), r"node 1 .*unknown node type 'BATCH_NODE'"),
    (ChakraNode(1, data_deps=[2]), r"data_deps names node 2"),
    (ChakraNode(1, duration_micros=-1), r"duration_micros must be an integer in 0\.\.2\*\*64-1, got -1"),
])
def test_write_rejects_invalid_nodes(tmp_path, node, message):
    with pytest.raises(TraceError, match=message):
        write_chakra(trace_of([node]), tmp_path / "t")
    assert not list(tmp_path.iterdir())  # nothing written


def test_write_refuses_stale_rank_files_and_misnumbered_ranks(tmp_path):
    write_chakra(trace_of([ChakraNode(0)], [ChakraNode(0)], [ChakraNode(0)]), tmp_path / "t")
    with pytest.raises(TraceError, match=r"already holds t\.2\.et beyond the 2 ranks"):
        write_chakra(trace_of([ChakraNode(0)], [ChakraNode(0)]), tmp_path / "t")
    with pytest.raises(TraceError, match=r"ranks\[0\] is rank 1"):
        write_chakra(ChakraTrace([RankTrace(1)]), tmp_path / "u")
    with pytest.raises(TraceError, match="GlobalMetadata.version is empty"):
        write_chakra(ChakraTrace([RankTrace(0, version="")]), tmp_path / "u")


# --------------------------------------------------------------------------------------------
# Property: random valid traces survive write -> read
# --------------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=8)
_finite = st.floats(allow_nan=False)


def _value_for(kind: str) -> st.SearchStrategy:
    scalar = kind.removesuffix("_list")
    if scalar in schema.INT_RANGES:
        lo, hi = schema.INT_RANGES[scalar]
        base = st.integers(lo, hi)
    else:
        base = {"double": _finite, "float": st.floats(allow_nan=False, width=32), "bool": st.booleans(),
                "string": _text, "bytes": st.binary(max_size=8)}[scalar]
    return st.lists(base, max_size=4).map(tuple) if kind.endswith("_list") else base


@st.composite
def _attrs(draw):
    names = draw(st.lists(_text, max_size=5, unique=True))
    attrs, kinds, docs = {}, {}, {}
    for name in names:
        kind = draw(st.sampled_from(sorted(schema.ATTR_VALUE_KINDS)))
        attrs[name] = draw(_value_for(kind))
        kinds[name] = kind
        if draw(st.booleans()):
            docs[name] = draw(_text.filter(bool))
    return attrs, kinds, docs


@st.composite
def _rank(draw, rank):
    ids = sorted(draw(st.sets(st.integers(0, 2**64 - 1), max_size=6)))
    nodes = {}
    for i, nid in enumerate(ids):
        earlier = ids[:i]
        attrs, kinds, docs = draw(_attrs())
        pick = st.lists(st.sampled_from(earlier), max_size=3) if earlier else st.just([])
        nodes[nid] = ChakraNode(
            nid, name=draw(_text),
            type=draw(st.sampled_from([t for t in schema.NODE_TYPES if t != "INVALID_NODE"])),
            ctrl_deps=draw(pick), data_deps=draw(pick),
            start_time_micros=draw(st.integers(0, 2**64 - 1)), duration_micros=draw(st.integers(0, 2**64 - 1)),
            inputs=IOInfo(draw(_text), draw(_text), draw(_text)), outputs=IOInfo(values=draw(_text)),
            attrs=attrs, attr_kinds=kinds, attr_docs=docs,
        )
    meta_attrs, meta_kinds, meta_docs = draw(_attrs())
    return RankTrace(rank, version=draw(_text.filter(bool)), nodes=nodes, metadata_attrs=meta_attrs,
                     metadata_attr_kinds=meta_kinds, metadata_attr_docs=meta_docs)


@st.composite
def _traces(draw):
    return ChakraTrace([draw(_rank(r)) for r in range(draw(st.integers(1, 3)))])


_EXAMPLE = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=_traces())
def test_random_valid_traces_survive_write_read(tmp_path, trace):
    blobs = [encode_rank(r) for r in trace.ranks]
    assert blobs == [encode_rank(r) for r in trace.ranks]  # deterministic
    back = ChakraTrace([decode_rank(b, r, f"mem.{r}.et") for r, b in enumerate(blobs)])
    assert back == trace
    prefix = tmp_path / f"p{next(_EXAMPLE)}"  # a fresh prefix per example
    write_chakra(trace, prefix)
    assert read_chakra(prefix) == trace


# --------------------------------------------------------------------------------------------
# Optional dependency
# --------------------------------------------------------------------------------------------


def test_missing_protobuf_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    with pytest.raises(DessimError, match=r"pip install .*\[chakra\]"):
        schema.messages.__wrapped__()


def test_import_dessim_trace_does_not_import_protobuf():
    code = ("import sys, dessim, dessim.trace, dessim.trace.chakra_io; "
            "print('google.protobuf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
