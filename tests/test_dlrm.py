"""DLRM: sharding, all-to-all volumes, load balancing, spill to far memory, presets."""

from __future__ import annotations

import pytest

from dessim.errors import MemoryFitError, SpecError
from dessim.topology import load_topology
from dessim.workload import simulate_workload
from dessim.workload.recsys.dlrm import generate_dlrm, parse_dlrm
from dessim.workload.recsys.dlrm_model import EmbeddingTable, shard_tables
from dessim.workload.kinds import load_any_workload

SWITCH4 = "switch:4,bw=50GB/s,lat=0,device=H100"


def tiny(sharding="table_wise", sharder="round_robin", pooling=1, tables=(1000, 2000, 3000, 4000), **emb):
    return parse_dlrm({
        "kind": "dlrm", "name": "tiny",
        "model": {"dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1], "embedding_dim": 8,
                  "pooling": pooling, "tables": list(tables), "precision": "bf16"},
        "embeddings": {"sharding": sharding, "sharder": sharder, "element_bytes": 4, **emb},
        "training": {"global_batch": 64}}, "<test>", "tiny")


def sends(graph, phase):
    out = {}
    for t in graph:
        if t.kind == "send" and t.name.startswith(f"a2a {phase}"):
            out[t.rank] = out.get(t.rank, 0.0) + t.size
    return out


def test_table_wise_alltoall_volume_is_local_batch_times_dim_per_peer():
    # 4 GPUs, B=64 -> b=16 samples per GPU; each GPU owns one 8-wide fp32 table and sends
    # every other GPU its 16 samples' pooled vectors: 16*8*4 = 512 B per peer, 3 peers.
    gen = generate_dlrm(tiny(), load_topology(SWITCH4))
    assert sends(gen.graph, "fwd") == {r: 3 * 512.0 for r in range(4)}
    assert sends(gen.graph, "bwd") == {r: 3 * 512.0 for r in range(4)}   # gradients come back
    per_pair = {t.size for t in gen.graph if t.kind == "send"}
    assert per_pair == {512.0}


def test_column_wise_doubles_the_shards_not_the_bytes():
    # 2 column shards of 4 columns per table: 8 shards, 2 per GPU (round robin) -> 2*16*4*4
    gen = generate_dlrm(tiny("column_wise", column_shards=2), load_topology(SWITCH4))
    assert sends(gen.graph, "fwd") == {r: 3 * 512.0 for r in range(4)}


def test_row_wise_is_a_reduce_scatter_of_the_global_batch():
    gen = generate_dlrm(tiny("row_wise"), load_topology(SWITCH4))
    rs = [t for t in gen.graph if t.kind == "collective" and t.op == "reducescatter"]
    ag = [t for t in gen.graph if t.kind == "collective" and t.op == "allgather"]
    # one fused reduce-scatter per iteration: 4 tables * B(64) * dim(8) * 4 B
    assert len(rs) == 4 and {t.size for t in rs} == {4 * 64 * 8 * 4.0}
    assert len(ag) == 4 and {t.size for t in ag} == {4 * 64 * 8 * 4.0}
    assert not [t for t in gen.graph if t.kind == "send"]
    shards = shard_tables(tiny("row_wise").tables, 3, "row_wise")
    assert sorted(s.rows for s in shards if s.table == "t0") == [333, 333, 334]


def test_greedy_sharder_balances_lookup_cost_better_than_round_robin():
    # cost per sample (pooling + 1) * dim: 40, 24, 24, 16, 16 on 2 GPUs.
    tables = [EmbeddingTable(f"t{i}", 100, 8, p) for i, p in enumerate((4, 2, 2, 1, 1))]
    def loads(sharder):
        out = [0.0, 0.0]
        for s in shard_tables(tables, 2, "table_wise", sharder):
            out[s.rank] += s.cost
        return out
    assert loads("round_robin") == [80.0, 40.0]
    assert loads("greedy") == [56.0, 64.0]          # LPT: 40 | 24+24 | +16 | +16


def test_tables_over_the_hbm_budget_spill_to_host_with_their_lookups_moved():
    topo = load_topology("pcie:4,gpu=H100")
    # round robin: GPU r owns table r of (r+1)*1000 rows * 8 * 4 B = 32, 64, 96, 128 kB;
    # with 100 kB of HBM for embeddings only GPU 3's table spills
    gen = generate_dlrm(tiny(hbm_budget="100kB", spill="host"), topo)
    moves = [t for t in gen.graph if t.kind == "memcpy"]
    assert {t.rank for t in moves} == {3}
    # rows read per iteration: B * pooling = 64 lookups of 8 fp32 -> 2048 B each way
    assert {(t.direction, t.size) for t in moves} == {("to_hbm", 2048.0), ("from_hbm", 2048.0)}
    assert all(t.mem_node.startswith("mem") for t in moves)
    with pytest.raises(MemoryFitError, match="spill them"):
        generate_dlrm(tiny(hbm_budget="100kB"), topo)


def test_presets_match_the_reference_shapes():
    small, large = load_any_workload("dlrm-small"), load_any_workload("dlrm-large")
    assert len(small.tables) == len(large.tables) == 26
    assert small.interaction_width() == 367 and large.interaction_width() == 479
    assert sum(t.rows for t in large.tables) == 187_767_399
    assert large.embeddings.spill == ("host",)


def test_simulate_workload_runs_a_dlrm_file(tmp_path):
    res = simulate_workload("dlrm-small", "dgx-h100:nodes=1")
    s = res.summary()
    assert s["kind"] == "dlrm" and s["gpus"] == 8 and s["iteration_s"] > 0
    assert s["details"]["interaction_width"] == 367
    # 26 tables over 8 GPUs, 16-wide fp32, 2048 samples per GPU
    assert sum(s["details"]["alltoall_sent_bytes_per_gpu"]) == 26 * 7 * 2048 * 16 * 4


def test_bad_dlrm_files_name_the_problem():
    with pytest.raises(SpecError, match="embedding_dim"):
        parse_dlrm({"kind": "dlrm", "model": {"bottom_mlp": [8, 4], "top_mlp": [1], "embedding_dim": 8,
                                              "tables": [10]}, "training": {"global_batch": 8}}, "f.yaml", "x")
    with pytest.raises(SpecError, match="sharding: 'diagonal' is unknown"):
        tiny("diagonal")
