"""Ring broadcast and reduce as NCCL runs them: a chain pipelined in small chunks.

NCCL's broadcast and reduce kernels (``src/device/broadcast.h``, ``reduce.h``) move the
data along the ring's chain in chunks through every hop at once, and NCCL's own model
(``ncclTopoTuneModel``) times them at the full bus bandwidth plus ``nRanks - 1`` hops of
latency. Under NCCL's protocols dessim runs the chain the same way (a fluid pipeline); the
textbook store-and-forward chain ``(p-2+k)(α + S/k·β)`` stays for ``protocol="raw"`` and an
explicit ``chunks`` K > 1 (tests/test_collective_sim.py).

Before: a 1 GiB broadcast on one DGX H100 (``auto``: ring, Simple) took 20.3 ms, busbw
52.8 GB/s = NVLink / 7 — the whole buffer stored and forwarded hop by hop — against the
3.0 ms NCCL's model (printed beside it) predicts.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import plan_collective, run_collective
from dessim.collectives.schedule import FluidSchedule
from dessim.topology.builders import switch

BW = 50e9
LAT = 500e-9


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_large_rooted_ring_runs_at_nccls_modelled_bandwidth_on_dgx_h100(op):
    res = run_collective(op, 2**30, "dgx-h100:nodes=1")       # auto: ring, Simple
    assert (res.algorithm, res.protocol) == ("ring", "Simple")
    nccl = next(e.time_s for e in res.auto.estimates
                if (e.algorithm, e.protocol) == ("ring", "Simple"))
    assert res.time_s == pytest.approx(nccl, rel=0.05)


@pytest.mark.parametrize("protocol", ["Simple", "LL128", "LL"])
def test_pipelined_chain_is_bandwidth_bound_not_store_and_forward(protocol):
    p, size = 8, float(2**30)
    pipelined = run_collective("broadcast", size, switch(p, BW, LAT), algo="ring",
                               protocol=protocol).time_s
    raw = run_collective("broadcast", size, switch(p, BW, LAT), algo="ring",
                         protocol="raw").time_s
    assert raw == pytest.approx((p - 1) * (2 * LAT + size / BW), rel=1e-3)   # textbook
    # one pass of the buffer through the chain at the protocol's wire rate (LL: 2x bytes)
    wire = {"Simple": 1.0, "LL128": 1.0, "LL": 2.0}[protocol]
    assert size / BW <= pipelined < raw / 3
    assert pipelined < 1.1 * wire * size / BW


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 8), log_size=st.integers(10, 30), root=st.integers(0, 7),
       op=st.sampled_from(["broadcast", "reduce"]))
def test_pipelined_chain_moves_the_buffer_once_per_hop_from_or_to_the_root(p, log_size, root, op):
    root %= p
    plan = plan_collective(op, tuple(range(p)), float(2**log_size), switch(p, BW, LAT),
                           {"algo": "ring", "protocol": "Simple"}, root=root)
    sched = plan.schedule
    assert isinstance(sched, FluidSchedule)
    assert len(sched.flows) == p - 1 and len(sched.critical) == p - 1
    assert all(f.nbytes == 2**log_size for f in sched.flows)
    ends = [f.src for f in sched.flows] if op == "broadcast" else [f.dst for f in sched.flows]
    assert (ends[0] if op == "broadcast" else ends[-1]) == root
    sched.validate()
    # an explicit chunk count keeps the store-and-forward chain
    chunked = plan_collective(op, tuple(range(p)), float(2**log_size), switch(p, BW, LAT),
                              {"algo": "ring", "protocol": "Simple", "chunks": 2}, root=root)
    assert not isinstance(chunked.schedule, FluidSchedule)


def test_pipelined_chain_across_nodes_uses_every_rail():
    res = run_collective("broadcast", 2**30, "dgx-h100:nodes=2", algo="ring")
    into_node1 = [ln for ln in res.link_util if ln["link"].startswith("leaf") and "->n1.nic" in ln["link"]]
    assert len(into_node1) == 8                  # one lane per rail, each entering node 1 once
    assert all(ln["bytes"] == pytest.approx(2**30 / 8) for ln in into_node1)
    assert res.busbw_GBps <= 8 * 47.0 * (1 + 1e-9)  # 8 NDR NICs at 47 GB/s payload
