"""The executor's memo of protocol software latencies (``_Charges``): shared by every run on
one network, it must give exactly what a recomputation gives, and a lane family's refusal
must never be memoised."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import CollectiveSettings, plan_collective
from dessim.collectives.executor import _Charges
from dessim.collectives.protocols import make_protocol
from dessim.network import make_network
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.topology import load_topology

SPECS = ("dgx-h100:nodes=2", "dgx-a100:nodes=2", "dgx-h100:nodes=4,gpu=H800")
_TOPOS = {spec: load_topology(spec) for spec in SPECS}
_NETS = {spec: make_network("flow", simpy.Environment(), topo) for spec, topo in _TOPOS.items()}


def _schedule(topo, algo: str, op: str = "allreduce"):
    group = tuple(range(topo.num_gpus))
    return plan_collective(op, group, 2.0**20, topo,
                           CollectiveSettings(algo=algo, protocol="Simple")).schedule


_SCHEDULES = {(spec, algo): _schedule(_TOPOS[spec], algo)
              for spec in SPECS for algo in ("ring", "dbtree")}


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(SPECS), algo=st.sampled_from(("ring", "dbtree")),
       proto=st.sampled_from(("LL", "LL128", "Simple")),
       pairs=st.lists(st.tuples(st.integers(0, 31), st.integers(0, 31)), min_size=1, max_size=12),
       names=st.booleans())
def test_memoised_software_latency_equals_its_recomputation(spec, algo, proto, pairs, names):
    topo, net = _TOPOS[spec], _NETS[spec]
    sched = _SCHEDULES[(spec, algo)]
    protocol = make_protocol(proto, 1e-6)
    first = _Charges(net, protocol, sched)
    for a, b in pairs:
        a, b = a % topo.num_gpus, b % topo.num_gpus
        src, dst = (topo.node_of(a), b) if names else (a, b)
        fresh = _Charges(net, protocol, sched)      # a later run: answers from the shared memo
        for charges in (first, fresh, first):
            assert charges.extra(src, dst) == charges._step_extra(src, dst)
        assert fresh.hop_latency(src, dst) == (
            (0.0 if a == b else net.route(topo.node_of(a), topo.node_of(b)).latency)
            + first._step_extra(src, dst))


def test_runs_share_the_memo_per_protocol_algorithm_and_overhead():
    spec = "dgx-h100:nodes=2"
    topo, net = _TOPOS[spec], _NETS[spec]
    ll, simple = make_protocol("LL", 0.0), make_protocol("Simple", 0.0)
    a = _Charges(net, ll, _SCHEDULES[(spec, "ring")])
    b = _Charges(net, ll, _SCHEDULES[(spec, "ring")])
    c = _Charges(net, simple, _SCHEDULES[(spec, "ring")])
    d = _Charges(net, ll, _SCHEDULES[(spec, "dbtree")])
    assert a._extra is b._extra                      # same network, protocol, algorithm
    assert a._extra is not c._extra and a._extra is not d._extra
    assert a.overhead > 0 and d.overhead == 0        # a ring across nodes pays the proxy floor
    # the floor makes an NVLink step of the ring dearer than the same step of the tree
    assert a.extra(0, 1) > d.extra(0, 1) >= 0
    other = make_network("flow", simpy.Environment(), topo)
    assert _Charges(other, ll, _SCHEDULES[(spec, "ring")])._extra is not a._extra


def test_a_family_refusal_is_raised_on_every_call_and_never_memoised():
    spec = "dgx-h100:nodes=2"
    topo, net = _TOPOS[spec], _NETS[spec]
    sched = _SCHEDULES[(spec, "dbtree")]
    perm = np.arange(topo.num_gpus)
    perm[[1, 8]] = perm[[8, 1]]                      # image of 0 -> 1 (NVLink) is 0 -> 8 (network)
    family = LaneFamily((perm,), (0,))
    ll = make_protocol("LL", 0.0)
    for _ in range(2):
        charges = _Charges(net, ll, sched, family)
        for _ in range(2):
            with pytest.raises(QuotientBroken, match="another software latency"):
                charges.extra(0, 1)
        assert (0, 1) not in charges._extra
    plain = _Charges(net, ll, sched)
    assert plain.extra(0, 1) == plain._step_extra(0, 1)
    assert plain.extra(0, 8) == plain._step_extra(0, 8) != plain.extra(0, 1)
    # a pair whose image pays the same latency is accepted and kept in the family's table
    ok = _Charges(net, ll, sched, family)
    assert ok.extra(2, 3) == plain.extra(2, 3) and (2, 3) in ok._extra
