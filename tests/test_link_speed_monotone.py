"""Faster links and collective time (docs/collectives.md, "Faster links, slower collective").

With a fixed algorithm, protocol and lane count, NCCL is not slower on faster links. dessim's
models without link sharing between a collective's own flows (the analytical network) and its
pipelined rings (streamed rings) keep that property; the step-by-step replay on the flow
network does not always: its per-step blocks of several lanes share NVLinks max-min fairly,
and a faster NIC changes which blocks overlap (a scheduling anomaly, not a physical effect).
These tests pin both facts: the exact property where it holds, and the bound the sweep of
2026-11-29 found where it does not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.collectives import run_collective
from dessim.topology import load_topology

#: benchmarks/sweep_link_speeds.py: its ``faster`` copies a topology with one link class faster
_SPEC = importlib.util.spec_from_file_location(
    "sweep_link_speeds",
    Path(__file__).resolve().parent.parent / "benchmarks" / "sweep_link_speeds.py")
_SWEEP = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_SWEEP)


def _ratio(op: str, size: int, algo: str, protocol: str, link_class: str, **kw) -> float:
    """Time on 2 x DGX H100 with ``link_class`` 1.5 x faster over the time on the preset."""
    base = load_topology("dgx-h100:nodes=2")
    fast = _SWEEP.faster(base, link_class, 1.5)
    t0 = run_collective(op, size, base, algo=algo, protocol=protocol, **kw)
    t1 = run_collective(op, size, fast, algo=algo, protocol=protocol, **kw)
    assert t1.channels == t0.channels
    return t1.time_s / t0.time_s


#: Cases where the step replay on the flow network is slower on faster NICs (the sweep of
#: 2026-11-29: ring all-gather / all-reduce across two DGX H100 nodes, 4-16 MiB).
_ANOMALIES = [("allgather", 16 << 20, "ll128"), ("allreduce", 16 << 20, "simple"),
              ("allreduce", 4 << 20, "ll128")]


@pytest.mark.parametrize("op,size,protocol", _ANOMALIES)
@pytest.mark.parametrize("link_class", ["nic", "nvlink"])
def test_without_shared_blocks_faster_links_are_never_slower(op, size, protocol, link_class):
    """Analytical network (no sharing) and streamed rings (NCCL's pipelined ring): exact."""
    assert _ratio(op, size, "ring", protocol, link_class, network="analytical") <= 1.0
    assert _ratio(op, size, "ring", protocol, link_class, stream_rings=True) <= 1.0


@pytest.mark.parametrize("op,size,protocol", _ANOMALIES)
def test_the_step_replay_anomaly_stays_within_its_documented_bound(op, size, protocol):
    """The flow network's step replay: at most 5 % slower with 1.5 x faster NICs (the largest
    the sweep found is +4.6 %, all-gather LL128 16 MiB); a larger figure means the anomaly
    grew and docs/collectives.md must be revisited."""
    assert _ratio(op, size, "ring", protocol, "nic") <= 1.05


def test_algorithms_without_step_blocks_get_faster_with_faster_nics():
    """NCCL's Tree across nodes and the direct all-to-all run as fluid flows: monotone."""
    assert _ratio("allreduce", 16 << 20, "dbtree", "simple", "nic") <= 1.0
    assert _ratio("alltoall", 16 << 20, "direct", "simple", "nic") < 1.0


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(op_algo=st.sampled_from([("allreduce", "ring"), ("allreduce", "dbtree"),
                                ("allgather", "ring"), ("reducescatter", "ring"),
                                ("alltoall", "direct")]),
       protocol=st.sampled_from(["ll", "ll128", "simple"]),
       size=st.integers(min_value=8, max_value=64 << 20),
       link_class=st.sampled_from(["nic", "nvlink"]),
       factor=st.floats(min_value=1.01, max_value=3.0))
def test_the_analytical_network_is_monotone_in_every_link_speed(op_algo, protocol, size,
                                                                link_class, factor):
    """Without sharing every transfer ends at ``max(its dependencies) + latency + bytes / its
    route's bottleneck``: non-decreasing in every input, so no faster link can slow it."""
    op, algo = op_algo
    base = load_topology("dgx-h100:nodes=2")
    fast = _SWEEP.faster(base, link_class, factor)
    t0 = run_collective(op, size, base, algo=algo, protocol=protocol, network="analytical")
    t1 = run_collective(op, size, fast, algo=algo, protocol=protocol, network="analytical")
    assert t1.time_s <= t0.time_s * (1 + 1e-12)
