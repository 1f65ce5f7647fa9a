"""InfiniBand fabrics route by destination, D-mod-K (OpenSM's fat-tree engine): every flow
to one NIC takes one path whatever its key, NICs under one leaf come down different spines,
and so every shift permutation between scalable units is contention-free on the
non-blocking rail fabric of the DGX presets."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from dessim.errors import SpecError, TopologyError
from dessim.topology import load_topology
from dessim.topology.routing import Router


def _fabric_loads(topo_spec: str, shift: int, rail: int = 0) -> tuple[Counter, dict, float]:
    """Flows per directed fabric link when node k sends to node k + shift on ``rail``."""
    topo = load_topology(topo_spec)
    router = Router(topo)
    nodes = topo.meta["params"]["nodes"]
    loads: Counter = Counter()
    for k in range(nodes):
        path = router.path(f"n{k}.nic{rail}", f"n{(k + shift) % nodes}.nic{rail}")
        loads.update(zip(path, path[1:]))
    caps = {(a, b): topo.graph.edges[a, b]["bw"] for a, b in loads}
    return loads, caps, topo.graph.edges["n0.nic0", "leaf.su0.r0"]["bw"]


def test_the_dgx_presets_route_infiniband_by_destination_and_ethernet_by_flow():
    assert load_topology("dgx-h100:nodes=64").meta["routing"] == "dmodk"
    assert load_topology("dgx-a100:nodes=64").meta["routing"] == "dmodk"
    assert load_topology("gb200-nvl72:racks=2").meta["routing"] == "dmodk"
    assert load_topology("dgx-h100:nodes=4,nic=eth400").meta["routing"] == "ecmp"
    assert load_topology("dgx-h100:nodes=64,routing=ecmp").meta["routing"] == "ecmp"
    with pytest.raises(SpecError, match="not a routing; valid: ecmp"):
        load_topology("dgx-h100:nodes=4,routing=adaptive")


def test_a_flow_to_one_destination_takes_one_path_whatever_its_key():
    router = Router(load_topology("dgx-h100:nodes=64"))
    for dst in ("n40.gpu3", "n33.gpu0", "n63.gpu7"):
        paths = {router.path("n0.gpu3", dst, key) for key in range(40)}
        assert len(paths) == 1 and router.key_independent("n0.gpu3", dst)
    # the spine is the destination's port on its leaf, mod the spines: n32+p comes down spine p mod 8
    for p in range(32):
        path = router.path("n0.nic2", f"n{32 + p}.nic2")
        assert path[2] in {f"spine{s}" for s in range(8)}
    spines = [router.path("n0.nic2", f"n{32 + p}.nic2")[2] for p in range(8)]
    assert len(set(spines)) == 8


@settings(max_examples=25, deadline=None)
@given(nodes=st.sampled_from([64, 96, 128]), shift=st.integers(1, 127), rail=st.integers(0, 7))
def test_shift_permutations_load_every_fabric_link_within_its_capacity(nodes, shift, rail):
    """Zahavi et al. (2010): D-mod-K routing makes shifts contention-free on a full fat tree.
    Where the spine count divides the ports per leaf (64 and 128 nodes: 8 and 16 spines) no
    link carries more flows than its capacity in NIC ports; with 12 spines (96 nodes, links
    of 2.67 ports) a shift that straddles two leaves can put 4 flows on one link."""
    shift %= nodes
    if shift == 0:
        return
    loads, caps, nic = _fabric_loads(f"dgx-h100:nodes={nodes}", shift, rail)
    for link, flows in loads.items():
        ports = caps[link] / nic
        limit = ports if float(ports).is_integer() else math.ceil(ports) + 1
        assert flows <= limit + 1e-9, (link, flows, ports)


def test_per_flow_hashing_collides_where_dmodk_does_not():
    """The same shift with ECMP hashing piles flows onto some spines."""
    loads, caps, nic = _fabric_loads("dgx-h100:nodes=64,routing=ecmp", 32)
    assert max(flows / (caps[link] / nic) for link, flows in loads.items()) > 1
    loads, caps, nic = _fabric_loads("dgx-h100:nodes=64", 32)
    assert max(flows / (caps[link] / nic) for link, flows in loads.items()) == 1


def test_an_unknown_routing_in_a_topology_is_a_clear_error():
    topo = load_topology("dgx-h100:nodes=2")
    topo.meta["routing"] = "spray"
    with pytest.raises(TopologyError, match="routing 'spray' is not known"):
        Router(topo)


def test_a_topology_file_declares_its_routing(tmp_path):
    from dessim.topology.spec import topology_from_dict

    leafspine = {"builder": {"kind": "leafspine", "hosts": 16, "leaves": 4}}
    assert topology_from_dict(leafspine).meta.get("routing", "ecmp") == "ecmp"
    topo = topology_from_dict({**leafspine, "routing": "dmodk"})
    router = Router(topo)
    assert topo.meta["routing"] == "dmodk" and router.key_independent("gpu0", "gpu5")
    # GPUs 4..7 under leaf1 come down four different spines
    assert len({router.path("gpu0", f"gpu{g}")[2] for g in range(4, 8)}) == 4
    with pytest.raises(SpecError, match="routing"):
        topology_from_dict({**leafspine, "routing": "spray"})
