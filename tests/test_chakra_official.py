"""dessim and the official Chakra package (PyPI ``mlc-chakra``, extra ``dessim[chakra-tools]``):
its reader decodes dessim's exports node for node, and traces its generator writes now replay
as the stored ones do. Skipped when the package is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

protolib = pytest.importorskip("chakra.src.third_party.utils.protolib",
                               reason="the official Chakra package (pip install mlc-chakra) is not installed")
et_def = pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
generator = pytest.importorskip("chakra.src.generator.generator")

from dessim.errors import TraceError  # noqa: E402
from dessim.trace import export_chakra, read_chakra, replay_chakra  # noqa: E402
from test_chakra_export import hand_graph  # noqa: E402
from test_chakra_replay import gpus_with_own_memory  # noqa: E402

DATA = Path(__file__).parent / "data" / "chakra"
RING8 = "ring:8,bw=50GB/s,lat=500ns"


def official_read(path: Path):
    """(GlobalMetadata, [Node]) of one rank file, decoded by Chakra's own protolib."""
    fh = protolib.openFileRd(str(path))
    try:
        meta = et_def.GlobalMetadata()
        assert protolib.decodeMessage(fh, meta)
        nodes = []
        while True:
            node = et_def.Node()
            if not protolib.decodeMessage(fh, node):
                return meta, nodes
            nodes.append(node)
    finally:
        fh.close()


@pytest.mark.parametrize("source", ["hand", "dp_overlap"])
def test_the_official_reader_decodes_dessims_export(tmp_path, source):
    if source == "hand":
        graph = hand_graph()
    else:  # a real trace replayed, then written back by dessim
        from dessim.trace import chakra_to_taskgraph
        graph = chakra_to_taskgraph(read_chakra(DATA / "dp_overlap_8npu" / "dp_overlap"))
    paths = export_chakra(graph, tmp_path / "x")
    ours = read_chakra(tmp_path / "x")
    assert len(paths) == ours.num_ranks
    for rank, path in enumerate(paths):
        meta, nodes = official_read(path)
        assert meta.version == ours.ranks[rank].version
        mine = ours.ranks[rank].nodes
        assert [n.id for n in nodes] == sorted(mine)
        for node in nodes:
            other = mine[node.id]
            assert node.name == other.name
            assert et_def.NodeType.Name(node.type) == other.type
            assert list(node.data_deps) == list(other.data_deps)
            assert list(node.ctrl_deps) == list(other.ctrl_deps)
            attrs = {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}
            assert set(attrs) == set(other.attrs)
            if other.type == "COMM_COLL_NODE":
                assert et_def.CollectiveCommType.Name(attrs["comm_type"]) == other.comm_type
                assert attrs["comm_size"] == other.comm_size
            elif other.type in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
                assert (attrs["comm_src"], attrs["comm_dst"]) == (other.comm_src, other.comm_dst)


GENERATED = ["one_comp_node", "two_comp_nodes_dependent", "two_comp_nodes_independent",
             "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "BROADCAST", "BARRIER",
             "one_remote_mem_load_node", "one_remote_mem_store_node", "one_metadata_node_all_types"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The official generator's traces, written now (its defaults but 8 NPUs and the stored
    fixtures' sizes: chakra_generator --num_npus 8 --default_comm_size 1048576)."""
    import os

    out = tmp_path_factory.mktemp("chakra_generator")
    cwd = os.getcwd()
    os.chdir(out)                      # the generator writes into the working directory
    try:
        g = generator
        for make, arg in ((g.one_metadata_node_all_types, ()), (g.one_remote_mem_load_node, (1024,)),
                          (g.one_remote_mem_store_node, (1024,)), (g.one_comp_node, (5,)),
                          (g.two_comp_nodes_independent, (5,)), (g.two_comp_nodes_dependent, (5,)),
                          (g.one_comm_coll_node_allreduce, (1 << 20,)),
                          (g.one_comm_coll_node_alltoall, (1 << 20,)),
                          (g.one_comm_coll_node_allgather, (1 << 20,)),
                          (g.one_comm_coll_node_reducescatter, (1 << 20,)),
                          (g.one_comm_coll_node_broadcast, (1 << 20,)), (g.one_comm_coll_node_barrier, ()),
                          (g.one_comm_send_node, (1024,)), (g.one_comm_recv_node, (1024,))):
            make(8, *arg)
    finally:
        os.chdir(cwd)
    return out


@pytest.mark.parametrize("name", GENERATED)
def test_traces_the_official_generator_writes_now_replay_like_the_stored_ones(generated, name):
    topology = gpus_with_own_memory() if "mem" in name else RING8
    fresh = replay_chakra(str(generated / name), topology)
    stored = replay_chakra(str(DATA / "chakra_generator_8npu" / name), topology)
    assert fresh.makespan_s == stored.makespan_s
    assert len(fresh.span_records) == len(stored.span_records)


@pytest.mark.parametrize("name", ["one_comm_send_node", "one_comm_recv_node"])
def test_lone_sends_and_recvs_from_the_generator_are_rejected(generated, name):
    with pytest.raises(TraceError, match="without comm_"):
        replay_chakra(str(generated / name), RING8)
