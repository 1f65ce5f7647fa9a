"""DGX presets can swap the scale-out technology and port speed (for bandwidth sweeps)."""

from __future__ import annotations

import pytest

from dessim.catalog.links import get_link_tech
from dessim.errors import DessimError
from dessim.topology import load_topology


def test_nic_bw_changes_only_the_scale_out_links():
    base = load_topology("dgx-h100:nodes=2")
    slow = load_topology("dgx-h100:nodes=2,nic_bw=200Gb/s")
    link = slow.link("n0.nic0", "leaf.su0.r0")
    assert link.bw == 25e9 and link.efficiency == get_link_tech("ib_ndr").efficiency
    assert slow.link("n0.gpu0", "n0.nvsw") == base.link("n0.gpu0", "n0.nvsw")
    # leaf uplinks are sized from the NIC speed (non-blocking by default)
    assert slow.link("leaf.su0.r0", "spine0").bw == pytest.approx(
        base.link("leaf.su0.r0", "spine0").bw / 2)


def test_nic_picks_a_catalog_technology():
    t = load_topology("dgx-a100:nodes=2,nic=eth400")
    assert t.link("n1.nic3", "leaf.su0.r3").type == "ethernet"


@pytest.mark.parametrize("spec,message", [
    ("dgx-a100:nodes=2,nic=pcie4", "not a scale-out"),
    ("dgx-a100:nodes=2,nic=ib_hdx", "unknown link technology 'ib_hdx'"),
    ("dgx-h100:nodes=2,nic_bw=fast", "nic_bw"),
])
def test_bad_nic_options(spec, message):
    with pytest.raises(DessimError, match=message):
        load_topology(spec)
