"""What NCCL launches per call (NCCL 2.30.7 ``topoGetAlgoInfo`` / ``calcCollChunking``):
channels, threads and ring chunks, as reported with every ``auto`` choice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import get_op
from dessim.collectives.auto import choose
from dessim.collectives.nccl import nccl_system
from dessim.collectives.nccl.launch import launch
from dessim.topology import load_topology

MiB = 1 << 20


@pytest.fixture(scope="module")
def a100():
    return nccl_system(tuple(range(8)), load_topology("dgx-a100:nodes=1"))


@pytest.fixture(scope="module")
def h100():
    return nccl_system(tuple(range(8)), load_topology("dgx-h100:nodes=1"))


def test_a_tiny_ring_ll_call_runs_one_channel_of_three_warps(a100):
    # 1 KiB < 1 x 64 threads x (8 B x 8 ranks): 24 -> 1 channel, 512 -> 64 threads, floor 3 warps
    got = launch("allreduce", "ring", "LL", 1024, a100)
    assert (got.channels, got.max_channels, got.threads) == (1, 24, 96)
    assert got.chunk_bytes == 32 * 1024 and got.loops == 1     # 512 KiB / 8 steps / 2


@settings(max_examples=40, deadline=None)
@given(nbytes=st.integers(1, 64 * MiB))
def test_ring_ll_on_8_ranks_drops_a_channel_per_32_kib(a100, nbytes):
    # topoGetAlgoInfo (NCCL 2.30.7): 8 ranks, Ring LL, 512 threads, threshold 8 x 8 -> nc x 32 KiB
    got = launch("allreduce", "ring", "LL", nbytes, a100)
    assert got.channels == max(1, min(24, nbytes // (32 * 1024)))


@pytest.mark.parametrize("size", [4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB])
@pytest.mark.parametrize("proto,threads", [("LL128", 640), ("Simple", 512 + 32)])
def test_mid_sizes_on_8_a100s_run_every_channel(a100, size, proto, threads):
    # the A100 knee region (4-128 MiB): no runtime channel or thread reduction applies
    got = launch("allreduce", "ring", proto, size, a100)
    assert (got.channels, got.threads) == (24, threads)
    assert got.loops == -(-size // (24 * 8 * got.chunk_bytes))   # Simple: 384 MiB per loop


def test_simple_ring_loops_cover_channels_ranks_and_2_mib_chunks(a100):
    got = launch("allreduce", "ring", "Simple", 1 << 30, a100)
    assert got.chunk_bytes == 2 * MiB                      # 4 MiB / 8 steps x 4 chunk steps
    assert got.loops == 3                                  # ceil(1 GiB / (24 x 8 x 2 MiB))


def test_nvls_tree_and_slow_rings_follow_their_own_rules(a100, h100):
    assert launch("allreduce", "nvls", "Simple", 1024, h100).channels == 16
    assert launch("allreduce", "nvls", "Simple", 1024, h100).threads == 640
    assert launch("allreduce", "tree", "LL", 1024, a100).threads == 640
    pcie = replace(a100, bw_intra=1.0, channels=2)          # bwIntra x nChannels <= PCI_BW
    assert launch("allreduce", "ring", "Simple", 1 << 30, pcie).threads == 256 + 32


@settings(max_examples=40, deadline=None)
@given(small=st.integers(1, 1 << 28), factor=st.integers(1, 64),
       algo_proto=st.sampled_from([("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"),
                                   ("tree", "LL"), ("tree", "Simple")]))
def test_more_bytes_never_run_on_fewer_channels(a100, small, factor, algo_proto):
    algo, proto = algo_proto
    lo = launch("allreduce", algo, proto, small, a100)
    hi = launch("allreduce", algo, proto, small * factor, a100)
    assert 1 <= lo.channels <= hi.channels <= hi.max_channels
    for got in (lo, hi):
        assert got.threads % 32 == 0 and 96 <= got.threads <= 640


def test_auto_reports_the_launch():
    topo = load_topology("dgx-a100:nodes=1")
    choice = choose(get_op("allreduce"), tuple(range(8)), 64 * MiB, topo)
    assert choice.launch is not None and choice.launch.channels == 24
    assert "NCCL launches 24 of 24 channels x 544 threads" in choice.explanation()
