"""Generic builders: node/link counts, rank order, dims, degrees and argument checking."""

import pytest

from dessim.errors import DessimError, TopologyError, UnitError
from dessim.topology.builders import (DimSpec, fully_connected, leafspine, mesh2d, multidim, ring,
                                      switch, torus2d, torus3d)


def degrees(topo):
    return sorted(topo.graph.degree(g) for g in topo.gpus)


def test_ring_links_neighbours_in_rank_order():
    t = ring(8, "50GB/s", "500ns", link_type="nvlink", device="h100")
    assert t.num_gpus == 8 and t.graph.number_of_edges() == 8 and t.dims == (8,)
    assert t.gpus == tuple(f"gpu{i}" for i in range(8))
    assert t.graph.has_edge("gpu7", "gpu0") and t.graph.has_edge("gpu3", "gpu4")
    link = t.link("gpu0", "gpu1")
    assert (link.bw, link.lat, link.type, link.duplex) == (50e9, 5e-7, "nvlink", True)
    assert t.device(0) == "H100"
    assert degrees(t) == [2] * 8
    assert t.meta["builder"] == "ring" and t.meta["params"]["n"] == 8


def test_ring_of_two_has_a_single_link():
    t = ring(2, 1e9, 0)
    assert t.graph.number_of_edges() == 1


def test_fully_connected_and_switch():
    fc = fully_connected(5, 1e9, 1e-6)
    assert fc.graph.number_of_edges() == 10 and degrees(fc) == [4] * 5
    sw = switch(16, 1e9, 1e-6)
    assert sw.graph.number_of_nodes() == 17 and sw.graph.number_of_edges() == 16
    assert sw.kind("sw0") == "switch" and degrees(sw) == [1] * 16


def test_torus2d_ranks_dims_and_wraparound():
    t = torus2d(4, 3, 1e9, 0)
    assert t.dims == (4, 3) and t.num_gpus == 12
    assert t.graph.number_of_edges() == 2 * 12
    assert degrees(t) == [4] * 12
    assert t.graph.has_edge("gpu0", "gpu1") and t.graph.has_edge("gpu0", "gpu4")
    assert t.graph.has_edge("gpu3", "gpu0")   # wrap in x
    assert t.graph.has_edge("gpu8", "gpu0")   # wrap in y
    assert t.coords(9) == (1, 2)


def test_size_two_torus_dimension_has_no_duplicate_link():
    t = torus2d(2, 4, 1e9, 0)
    assert t.graph.number_of_edges() == 4 * 1 + 2 * 4
    assert degrees(t) == [3] * 8


def test_torus3d_and_mesh2d():
    t = torus3d(4, 4, 4, 1e9, 0)
    assert t.dims == (4, 4, 4) and t.graph.number_of_edges() == 3 * 64 and degrees(t) == [6] * 64
    assert t.graph.has_edge("gpu0", "gpu16") and t.graph.has_edge("gpu48", "gpu0")
    m = mesh2d(4, 4, 1e9, 0)
    assert m.graph.number_of_edges() == 2 * 4 * 3
    assert not m.graph.has_edge("gpu3", "gpu0")
    assert degrees(m).count(2) == 4 and degrees(m).count(4) == 4


def test_leafspine_oversubscription_and_default_spines():
    t = leafspine(64, 8, "50GB/s", "1us", oversub=2)
    assert t.dims == (8, 8)
    assert len(t.nodes_of_kind("switch")) == 8 + 4      # 4 spines = ceil(8 / 2)
    assert t.graph.has_edge("gpu9", "leaf1")
    up = [t.link(f"leaf{leaf}", f"spine{s}") for leaf in range(8) for s in range(4)]
    assert all(link.bw == pytest.approx(8 * 50e9 / 2 / 4) for link in up)
    assert t.graph.number_of_edges() == 64 + 8 * 4


def test_leafspine_explicit_spines_and_uplink_bw():
    t = leafspine(16, 4, 1e9, 0, spines=2)
    assert t.link("leaf0", "spine1").bw == pytest.approx(4e9 / 2)
    u = leafspine(16, 4, 1e9, 0, spines=2, uplink_bw="1GB/s")
    assert u.meta["params"]["oversub"] == pytest.approx(2.0)
    with pytest.raises(TopologyError, match="either oversub or uplink_bw"):
        leafspine(16, 4, 1e9, 0, oversub=2, uplink_bw=1e9)


def test_leafspine_hosts_must_divide():
    with pytest.raises(TopologyError, match="hosts=10 is not divisible by leaves=4"):
        leafspine(10, 4, 1e9, 0)


def test_multidim_ring_by_switch():
    t = multidim([("ring", 8, "300GB/s", "250ns", "nvlink"), ("switch", 4, "50GB/s", "1us", "ib")])
    assert t.dims == (8, 4) and t.num_gpus == 32
    assert t.counts() == {"nodes": {"gpu": 32, "switch": 8}, "links": {"ib": 32, "nvlink": 32}}
    # dim 0 ring: rank 8 -- 15 wraps; dim 1 switch: ranks 3, 11, 19, 27 share sw1.3
    assert t.graph.has_edge("gpu8", "gpu15")
    assert {n for n in t.graph.adj["sw1.3"]} == {"gpu3", "gpu11", "gpu19", "gpu27"}


def test_multidim_accepts_mappings_and_dimspecs():
    t = multidim([{"shape": "fc", "size": 4, "bw": 1e9, "lat": 0}, DimSpec("ring", 2, 1e9, 0)])
    assert t.graph.number_of_edges() == 2 * 6 + 4


@pytest.mark.parametrize("call,match", [
    (lambda: ring(1, 1e9, 0), "ring n: 1 must be >= 2"),
    (lambda: ring(4, "fast", 0), "ring bw: cannot parse 'fast'"),
    (lambda: ring(4, 0, 0), "ring bw: 0 is zero"),
    (lambda: ring(4, -1e9, 0), "negative"),
    (lambda: ring(4, 1e9, 0, link_type="wire"), "unknown link type 'wire'"),
    (lambda: ring(4, 1e9, 0, efficiency=1.5), r"efficiency 1.5 must be in \(0, 1\]"),
    (lambda: ring(4, 1e9, 0, device="tpu"), "ring device: unknown GPU 'tpu'"),
    (lambda: multidim([("cube", 2, 1, 0)]), "unknown shape 'cube'"),
    (lambda: multidim([]), "at least one dimension"),
    (lambda: multidim([("ring", 2)]), r"expected \(shape, size, bw, lat"),
])
def test_bad_arguments_are_user_errors(call, match):
    with pytest.raises(DessimError, match=match):
        call()


def test_unit_errors_are_unit_errors():
    with pytest.raises(UnitError):
        torus2d(4, 4, 1e9, "soon")
