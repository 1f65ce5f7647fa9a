"""Offloaded bytes must fit in the host/CXL memory nodes they are sent to."""

from __future__ import annotations

import pytest

from dessim.errors import MemoryFitError
from dessim.workload import simulate_workload

OFFLOAD = {"memory": {"offload_optimizer": "cxl"}}


def test_offload_beyond_the_expander_capacity_is_refused_with_the_shortfall():
    # gpt3-1.3b, dp=8: 12 bytes/param of Adam states = 15.8 GB per GPU; two GPUs per expander
    with pytest.raises(MemoryFitError, match=r"offloading puts .* from 2 GPUs on 'cxl0', which "
                                             r"holds 14.9GiB \(.* too much\)"):
        simulate_workload("gpt3-1.3b", "cxl:gpu=h100,expanders=4,capacity=16GB", overrides=OFFLOAD)


def test_offload_that_fits_runs_and_moves_bytes_over_the_cxl_links():
    res = simulate_workload("gpt3-1.3b", "cxl:gpu=h100,expanders=4,capacity=512GB",
                            overrides=OFFLOAD)
    links = res.simulation.link_table()
    cxl = links[links["dst"].str.startswith("cxl") | links["src"].str.startswith("cxl")]
    assert cxl["bytes"].sum() > 0
    assert res.summary()["iteration_s"] > 0
