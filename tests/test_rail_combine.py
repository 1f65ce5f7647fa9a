"""The rail all-to-all's DeepEP options (:mod:`dessim.collectives.algorithms.rail`):
``nvlink_share`` (a token crosses NVLink once per target GPU) and ``nvlink_first`` (the
combine: NVLink reduction on the forwarding GPU, then the network), with and without
``pipeline_chunks``."""

from __future__ import annotations

import pytest

from dessim.collectives.algorithms import build_schedule
from dessim.errors import DessimError
from dessim.topology import load_topology

TOPO2 = load_topology("dgx-h100:nodes=2")
GROUP = tuple(range(16))            # 2 hosts x 8 GPUs: H = 2, n = 8, p = 16
SIZE = 16e6                         # bytes per rank: S/p = 1 MB to each rank


def _phases(sched):
    """(network transfers, NVLink transfers) of a schedule, by index."""
    net = [i for i, t in enumerate(sched.transfers) if t.src // 8 != t.dst // 8]
    nvl = [i for i, t in enumerate(sched.transfers) if t.src // 8 == t.dst // 8]
    return net, nvl


def _ancestors(sched, i):
    seen, todo = set(), list(sched.transfers[i].deps)
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(sched.transfers[j].deps)
    return seen


@pytest.mark.parametrize("first", [False, True])
def test_bytes_per_phase_and_link_match_the_hand_count(first):
    """Network: rank (h, i) to (h', i), n·S/p = 8 MB × network_share 0.5 = 4 MB, 2·8 flows;
    NVLink: H·S/p = 2 MB × nvlink_share 0.75 = 1.5 MB between each ordered pair of a host,
    2·8·7 flows — the same for dispatch (network first) and combine (NVLink first)."""
    sched = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, network_share=0.5,
                           nvlink_share=0.75, nvlink_first=first)
    net, nvl = _phases(sched)
    assert len(net) == 16 and len(nvl) == 2 * 8 * 7
    assert all(sched.transfers[i].src % 8 == sched.transfers[i].dst % 8 for i in net)
    assert [sched.transfers[i].nbytes for i in net] == pytest.approx([4e6] * 16)
    assert [sched.transfers[i].nbytes for i in nvl] == pytest.approx([1.5e6] * 112)
    assert {(sched.transfers[i].src, sched.transfers[i].dst) for i in nvl} == \
        {(a, b) for a in GROUP for b in GROUP if a // 8 == b // 8 and a != b}


def test_dispatch_runs_network_first_and_combine_nvlink_first():
    """Each rank's second phase waits for its first: the dispatch's NVLink sends for the
    network sends into their source, the combine's network sends for the NVLink sends (the
    reduction onto the forwarding GPU) into their source."""
    dispatch = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2)
    combine = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, nvlink_first=True)
    for sched, (early, late) in ((dispatch, _phases(dispatch)), (combine, _phases(combine)[::-1])):
        assert all(not sched.transfers[i].deps for i in early)
        for i in late:
            before = _ancestors(sched, i)
            assert before and before <= set(early)
            src = sched.transfers[i].src
            assert any(sched.transfers[j].dst == src for j in before)    # it forwards what it got


@pytest.mark.parametrize("first", [False, True])
def test_pipeline_chunks_still_pipeline_both_orders(first):
    """K = 4 chunks: the same bytes on the same connections; a chunk's transfers wait only for
    its own earlier phase and (FIFO) for the previous chunk's message on the same connection,
    so chunk c + 1's first phase can run beside chunk c's second (timed: K = 4 beats K = 1,
    and stays above the slower phase alone)."""
    from dessim.collectives.api import run_collective

    opts = {"network_share": 0.6, "nvlink_share": 0.8, "nvlink_first": first}
    one = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, **opts)
    four = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, pipeline_chunks=4, **opts)
    assert len(four.transfers) == 4 * len(one.transfers)
    for cross in (0, 1):
        assert sum(four.transfers[i].nbytes for i in _phases(four)[cross]) == \
            pytest.approx(sum(one.transfers[i].nbytes for i in _phases(one)[cross]))
    per_chunk = len(one.transfers)
    for i, t in enumerate(four.transfers):
        for j in t.deps:
            u = four.transfers[j]
            assert j // per_chunk == i // per_chunk or \
                (j // per_chunk == i // per_chunk - 1 and (u.src, u.dst) == (t.src, t.dst))

    def time(ranks, **more):
        return run_collective("alltoall", 256e6, TOPO2, algo="rail", ranks=list(ranks), **opts, **more).time_s

    net, nvl = time([0, 8]), time(range(8))
    serial, piped = time(GROUP), time(GROUP, pipeline_chunks=4)
    assert serial == pytest.approx(net + nvl, rel=0.02)
    assert max(net, nvl) <= piped < serial


def test_nvlink_share_scales_only_the_nvlink_phase():
    full = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, network_share=0.5)
    half = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, network_share=0.5,
                          nvlink_share=0.5)
    net_f, nvl_f = _phases(full)
    net_h, nvl_h = _phases(half)
    assert sum(half.transfers[i].nbytes for i in net_h) == sum(full.transfers[i].nbytes for i in net_f)
    assert sum(half.transfers[i].nbytes for i in nvl_h) == pytest.approx(
        sum(full.transfers[i].nbytes for i in nvl_f) / 2)


@pytest.mark.parametrize("options, message", [
    ({"nvlink_share": 0}, "nvlink_share=0 must be a number in \\(0, 1\\]"),
    ({"nvlink_share": True}, "nvlink_share=True"),
    ({"nvlink_first": "yes"}, "nvlink_first='yes' must be true or false")])
def test_bad_rail_options_are_refused_naming_them(options, message):
    with pytest.raises(DessimError, match=message):
        build_schedule("alltoall", "rail", GROUP, 1e6, topology=TOPO2, **options)


def test_nvlink_efficiency_scales_the_nvlink_bytes_only():
    """``nvlink_efficiency`` e: the NVLink phase sends its bytes / e (a wire factor, DeepEP's
    copies at e of the link rate); the network phase is unchanged; e outside (0, 1] is one
    clear error."""
    plain = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, nvlink_share=0.75)
    slow = build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, nvlink_share=0.75,
                          nvlink_efficiency=0.8)
    net, nvl = _phases(plain)
    assert [slow.transfers[i].nbytes for i in net] == [plain.transfers[i].nbytes for i in net]
    assert [slow.transfers[i].nbytes for i in nvl] == pytest.approx([1.5e6 / 0.8] * 112, rel=1e-12)
    for bad in (0, 1.2, True):
        with pytest.raises(DessimError, match="nvlink_efficiency="):
            build_schedule("alltoall", "rail", GROUP, SIZE, topology=TOPO2, nvlink_efficiency=bad)
