"""ZionEX memory tiers and reduced-precision embedding communication (issue 22, part 4;
dessim/workload/recsys/tiers.py, qcomm.py; docs/zionex-tiers.md).

* quantised all-to-all / row-wise exchange: wire bytes scale by d/e, quantise and
  dequantise kernels with their bytes, nothing for the tables' own format;
* tiers: placement invariants (property test), rows moved from the nearest node of each
  tier, an SSD tier as a storage node with its bandwidth, prefetch;
* the worked example of docs/zionex-tiers.md (golden values, ZionEX's direction);
* options in sweeps and the summary; bad values name the key.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.errors import SpecError
from dessim.topology import load_topology
from dessim.workload import simulate_workload
from dessim.workload.recsys.dlrm import generate_dlrm, parse_dlrm
from dessim.workload.recsys.dlrm_model import Shard
from dessim.workload.recsys.qcomm import CommPrecision, parse_comm_precision
from dessim.workload.recsys.tiers import parse_spill, parse_spill_budget, place_tiers

SWITCH4 = "switch:4,bw=50GB/s,lat=0,device=H100"


def tiny(sharding="table_wise", tables=(1000, 2000, 3000, 4000), **emb):
    return parse_dlrm({
        "kind": "dlrm", "name": "tiny",
        "model": {"dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1], "embedding_dim": 8,
                  "pooling": 1, "tables": list(tables), "precision": "bf16"},
        "embeddings": {"sharding": sharding, "sharder": "round_robin", "element_bytes": 4, **emb},
        "training": {"global_batch": 64}}, "<test>", "tiny")


def _tasks(gen, kind, prefix=""):
    return [t for t in gen.graph if t.kind == kind and t.name.startswith(prefix)]


# ---------------------------------------------------------------- quantised exchange
@pytest.mark.parametrize("fmt,wire", [("fp16", 2), ("bf16", 2), ("fp8", 1)])
def test_quantised_alltoall_sends_d_over_e_of_the_bytes_and_pays_the_casts(fmt, wire):
    topo = load_topology(SWITCH4)
    full = generate_dlrm(tiny(), topo)
    q = generate_dlrm(tiny(comm_precision=fmt), topo)
    for phase in ("fwd", "bwd"):
        assert {t.size for t in _tasks(q, "send", f"a2a {phase}")} == {512.0 * wire / 4}
        assert {t.size for t in _tasks(full, "send", f"a2a {phase}")} == {512.0}
        quant = _tasks(q, "compute", f"quantise a2a {phase}")
        dequant = _tasks(q, "compute", f"dequantise a2a {phase}")
        assert len(quant) == len(dequant) == 4
        # each rank sends 3 × 16 samples × 8 fp32 = 1536 B of table format and receives as much
        amax = 1536.0 if fmt == "fp8" else 0.0
        assert {t.bytes for t in quant} == {1536.0 + amax + 1536.0 * wire / 4}
        assert {t.bytes for t in dequant} == {1536.0 * wire / 4 + 1536.0}
        assert {t.stream for t in dequant} == {"a2a.codec"}
    assert not _tasks(full, "compute", "quantise")


def test_mixed_precision_per_direction_and_row_wise_exchange():
    gen = generate_dlrm(tiny("row_wise", comm_precision={"forward": "fp16", "backward": "fp32"}),
                        load_topology(SWITCH4))
    rs = [t for t in gen.graph if t.kind == "collective" and t.op == "reducescatter"]
    ag = [t for t in gen.graph if t.kind == "collective" and t.op == "allgather"]
    assert {t.size for t in rs} == {4 * 64 * 8 * 2.0}      # fp16 forward
    assert {t.size for t in ag} == {4 * 64 * 8 * 4.0}      # fp32 backward: the tables' own
    assert _tasks(gen, "compute", "quantise a2a fwd") and not _tasks(gen, "compute", "quantise a2a bwd")


def test_comm_precision_errors_name_the_key():
    with pytest.raises(SpecError, match="comm_precision.forward: 'int4' is unknown"):
        tiny(comm_precision={"forward": "int4"})
    with pytest.raises(SpecError, match="unknown key 'fwd'"):
        parse_comm_precision({"fwd": "fp16"}, "embeddings.comm_precision")
    assert CommPrecision("fp16", None).ratio("forward", 4) == 0.5
    assert CommPrecision("fp16", None).ratio("backward", 4) == 1.0


# ---------------------------------------------------------------- tiers
def _shards(sizes, rank=0):
    return [Shard(f"t{i}", rank, rows, 8, 1.0 + i % 3, "table_wise", 1) for i, rows in enumerate(sizes)]


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=12),
       hbm=st.integers(0, 200_000), host=st.integers(0, 200_000))
def test_every_shard_lands_in_exactly_one_tier_within_its_budget(sizes, hbm, host):
    shards = _shards(sizes)
    placed = place_tiers(shards, hbm, ("host", "ssd"), {"host": host}, 4, 64)
    assert sorted(s.table for t in placed.values() for s in t) == sorted(s.table for s in shards)
    assert not placed["overflow"]
    assert sum(s.bytes(4) for s in placed["hbm"]) <= hbm
    assert sum(s.bytes(4) for s in placed["host"]) <= host
    only_hbm = place_tiers(shards, hbm, (), {}, 4, 64)
    assert [s.table for s in only_hbm["hbm"]] == [s.table for s in placed["hbm"]]


def test_spill_and_budget_errors():
    assert parse_spill("none", "w") == () and parse_spill("host", "w") == ("host",)
    with pytest.raises(SpecError, match="tier 'nvme' is unknown"):
        parse_spill(["host", "nvme"], "w")
    with pytest.raises(SpecError, match="listed twice"):
        parse_spill(["host", "host"], "w")
    with pytest.raises(SpecError, match="budget"):
        parse_spill_budget({}, ("host", "ssd"), "w")
    with pytest.raises(SpecError, match="not a spill tier before the last"):
        parse_spill_budget({"ssd": "1GB"}, ("host", "ssd"), "w")


def test_ssd_tier_is_a_storage_node_with_its_bandwidth():
    topo = load_topology("pcie:4,gpu=H100")
    with pytest.raises(SpecError, match="embeddings.storage"):
        generate_dlrm(tiny(hbm_budget="100kB", spill="ssd"), topo)
    # only GPU 3's 128 kB table exceeds 100 kB of HBM; the host tier (1 kB) cannot hold it,
    # so it goes to the SSD
    spec = tiny(hbm_budget="100kB", spill=["host", "ssd"], spill_budget={"host": "1kB"},
                storage={"bw": "1GB/s", "lat": "80us"})
    gen = generate_dlrm(spec, topo)
    moves = _tasks(gen, "memcpy")
    assert {t.rank for t in moves} == {3}
    assert {(t.direction, t.size) for t in moves} == {("to_hbm", 2048.0), ("from_hbm", 2048.0)}
    node = moves[0].mem_node
    assert gen.topology.graph.nodes[node]["kind"] == "storage"
    (edge,) = [d for _, _, d in gen.topology.graph.edges(node, data=True)]
    assert edge["bw"] == 1e9 and edge["lat"] == 80e-6


def test_prefetch_lets_the_lookup_run_before_the_far_rows_arrive():
    topo = load_topology("pcie:4,gpu=H100")
    for prefetch in (False, True):
        gen = generate_dlrm(tiny(hbm_budget="100kB", spill="host", prefetch=prefetch), topo)
        (fetch,) = [t for t in _tasks(gen, "memcpy") if t.direction == "to_hbm"]
        (lookup,) = [t for t in _tasks(gen, "compute", "fwd embeddings") if t.rank == 3]
        assert (fetch.id in gen.graph.deps(lookup.id)) is (not prefetch)


# ---------------------------------------------------------------- worked example (golden)
#: docs/zionex-tiers.md, "Reduced-precision communication": dlrm-large on two DGX H100
#: (iteration_s, exposed a2a s, exposed dp s, compute s).
GOLDEN_QCOMM = [     # the MLP gradients are fp32 (PyTorch DDP under autocast; precision.py)
    ("fp32", None, (0.0019342491638720525, 0.0012903854066955785, 0.00019498904661653047,
                    0.0005952340451683333)),
    ({"forward": "fp16", "backward": "bf16"}, None,
     (0.0013457888453871079, 0.0005771202235566309, 0.00018184345163688338, 0.0007020800271900429)),
    ("fp8", None, (0.000992227908429416, 0.00022438006509283294, 9.187976636886914e-05,
                   0.0007167819759688765)),
    ("fp8", {"method": "cast", "dtype": "fp8"},
     (0.0009891333233346528, 0.00021216272808813802, 7.032643016614235e-05, 0.0007296679242388898)),
]


def test_worked_example_quantised_comms_follow_zionex():
    got = []
    for fmt, comp, golden in GOLDEN_QCOMM:
        ov = {"embeddings": {"comm_precision": fmt}}
        if comp:
            ov["compression"] = comp
        s = simulate_workload("dlrm-large", "dgx-h100:nodes=2", overrides=ov).summary()
        row = (s["iteration_s"], s["exposed_comm_s"]["a2a"], s["exposed_comm_s"]["dp"], s["compute_s"])
        assert row == pytest.approx(golden, rel=1e-9)
        got.append(row)
    fp32, half, fp8, _ = got
    # ZionEX's direction: narrower embedding exchange → less exposed all-to-all, faster
    # iterations, at the price of (de)quantisation kernels (more compute)
    assert half[1] < 0.5 * fp32[1] and fp8[1] < half[1]
    assert fp8[0] < half[0] < fp32[0]
    assert half[3] > fp32[3]


#: docs/zionex-tiers.md, "Memory tiers": dlrm-large on one DGX H100, column-wise shards,
#: 2 GB of HBM for embeddings (iteration_s without / with prefetch).
GOLDEN_TIERS = {
    "host": (0.00283007278803687, 0.002030057740417822),
    "host+ssd": (0.021100813867401945, 0.011165428280100361),
    "ssd": (0.030152984407084492, 0.01569151354994163),
}


def test_worked_example_tiers_and_prefetch():
    base = {"sharding": "column_wise", "column_shards": 4, "hbm_budget": "2GB",
            "storage": {"kind": "nvme", "bw": "7GB/s", "lat": "80us"}}
    spills = {"host": {"spill": "host"}, "host+ssd": {"spill": ["host", "ssd"], "spill_budget": {"host": "4GB"}},
              "ssd": {"spill": "ssd"}}
    got = {}
    for name, extra in spills.items():
        got[name] = tuple(simulate_workload("dlrm-large", "dgx-h100:nodes=1", overrides={
            "embeddings": {**base, **extra, "prefetch": pf}}).summary()["iteration_s"] for pf in (False, True))
    assert got == {k: pytest.approx(v, rel=1e-9) for k, v in GOLDEN_TIERS.items()}
    assert got["host"][0] < got["host+ssd"][0] < got["ssd"][0]
    assert all(on < off for off, on in got.values())


def test_sweep_axis_and_summary(tmp_path):
    from dessim.sweep import run_sweep

    spec = tmp_path / "s.yaml"
    spec.write_text("kind: workload\nbase:\n  workload: dlrm-large\n  topology: dgx-h100:nodes=1\n"
                    "axes:\n  workload.embeddings.comm_precision: [fp32, bf16]\n")
    table = run_sweep(spec, workers=1, out=tmp_path / "r.parquet").table
    assert list(table["details.comm_precision.forward"]) == ["fp32", "bf16"]
    assert table["exposed_comm_s.a2a"].iloc[1] < table["exposed_comm_s.a2a"].iloc[0]



def test_spilled_shards_must_fit_their_tier_node():
    from dessim.errors import MemoryFitError

    topo = load_topology("pcie:4,gpu=H100")
    mems = topo.nodes_of_kind("host_mem")
    assert mems
    for n in mems:
        topo.graph.nodes[n]["capacity"] = 100e3        # GPU 3's 128 kB table does not fit
    with pytest.raises(MemoryFitError, match="spilled to .mem1. need 125KiB but it holds 97.66KiB"):
        generate_dlrm(tiny(hbm_budget="100kB", spill="host"), topo)
    for n in mems:
        topo.graph.nodes[n]["capacity"] = 200e3
    assert _tasks(generate_dlrm(tiny(hbm_budget="100kB", spill="host"), topo), "memcpy")
