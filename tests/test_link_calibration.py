"""Link calibration: a calibration file's per-technology efficiency and latency reach the links
of every simulating path (engine, collectives, workloads), and the built-in file's ``links``
section cannot drift from the catalog it repeats."""

from __future__ import annotations

import networkx as nx
import pytest

from dessim.catalog.calibration import (Calibration, LinkCalibration, default_calibration,
                                        load_calibration, parse_calibration, read_calibration)
from dessim.catalog.links import LINK_TECHS
from dessim.collectives import run_collective
from dessim.engine import EngineOptions, simulate
from dessim.errors import SpecError
from dessim.taskgraph import Task, TaskGraph
from dessim.topology import load_topology
from dessim.topology.calibrate import calibrated_topology, link_tech
from dessim.topology.graph import Topology
from dessim.workload import plan_workload

MB = 1e6


def _write(tmp_path, text: str, name: str = "cal.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _two_gpus(tech: str = "ib_ndr", bw: float = 10e9, lat: float = 1e-6) -> Topology:
    g = nx.Graph()
    g.add_node("a", kind="gpu", device="H100")
    g.add_node("b", kind="gpu", device="H100")
    g.add_edge("a", "b", type="ib", bw=bw, lat=lat, tech=tech)
    return Topology(g, "pair")


def test_builtin_links_repeat_the_catalog():
    # the built-in file writes each catalog efficiency to 4 decimals; nothing else differs
    links = default_calibration().links
    assert links, "the built-in calibration has a links section"
    for tech, link in links.items():
        assert link.efficiency == round(LINK_TECHS[tech].efficiency, 4), tech
        if link.latency is not None:
            assert link.latency == LINK_TECHS[tech].lat, tech


def test_unknown_technology_is_an_error_listing_the_known_ones(tmp_path):
    path = _write(tmp_path, "links:\n  ib_nrd: {efficiency: 0.8}\n")
    with pytest.raises(SpecError) as err:
        load_calibration(path)
    message = str(err.value)
    assert "ib_nrd" in message and "ib_ndr" in message and "nvlink4" in message
    assert path in message


def test_technology_aliases_resolve_and_clash():
    assert set(parse_calibration({"links": {"NDR": {"efficiency": 0.8}}}).links) == {"ib_ndr"}
    with pytest.raises(SpecError, match="both name link technology 'ib_ndr'"):
        parse_calibration({"links": {"ndr": {"efficiency": 0.8}, "ib_ndr": {"latency": "1us"}}})


def test_calibrated_topology_changes_only_the_calibrated_technology():
    topo = load_topology("dgx-h100:nodes=2")
    cal = Calibration(links={"ib_ndr": LinkCalibration(efficiency=0.5, latency="2us")})
    out = calibrated_topology(topo, cal)
    assert out is not topo and out.name == topo.name and out.num_gpus == topo.num_gpus
    changed = 0
    for (a, b, before), (_, _, after) in zip(topo.graph.edges(data=True), out.graph.edges(data=True)):
        if link_tech(before) == "ib_ndr":
            changed += 1
            assert (after["efficiency"], after["lat"]) == (0.5, 2e-6)
            assert after["bw"] == before["bw"]
        else:
            assert after == before, (a, b)
    assert changed == 32
    # the input is untouched, a second application is free and the copy is shared
    assert all(d["efficiency"] == LINK_TECHS["ib_ndr"].efficiency
               for _, _, d in topo.graph.edges(data=True) if link_tech(d) == "ib_ndr")
    assert calibrated_topology(out, cal) is out
    assert calibrated_topology(topo, cal) is out


def test_calibrated_topology_leaves_topologies_it_cannot_apply_to():
    topo = load_topology("ring:4,bw=50GB/s,lat=1us")        # generic links name no technology
    cal = Calibration(links={"nvlink4": LinkCalibration(efficiency=0.5)})
    assert calibrated_topology(topo, cal) is topo
    assert calibrated_topology(topo, None) is topo
    assert calibrated_topology(topo, Calibration()) is topo


def test_a_nic_of_another_port_speed_is_its_technology():
    topo = _two_gpus(tech="ib_ndr@200Gb/s")
    out = calibrated_topology(topo, {"ib_ndr": LinkCalibration(efficiency=0.25)})
    assert out.link("a", "b").efficiency == 0.25


def test_engine_runs_on_the_calibrated_links(tmp_path):
    g = TaskGraph("p2p")
    g.add(Task("s", 0, "send", peer=1, size=MB))
    g.add(Task("r", 1, "recv", peer=0, size=MB))
    topo = _two_gpus(bw=10e9, lat=1e-6)
    path = _write(tmp_path, "name: slow\nlinks:\n  ib_ndr: {efficiency: 0.5, latency: 3us}\n")
    options = EngineOptions(calibration=path)          # a file name is read at once
    assert isinstance(options.calibration, Calibration)
    base = simulate(g, topo)
    slow = simulate(g, topo, options)
    assert base.makespan_s == pytest.approx(1e-6 + MB / 10e9, rel=1e-12)
    assert slow.makespan_s == pytest.approx(3e-6 + MB / (0.5 * 10e9), rel=1e-12)
    assert slow.meta["collectives"]["calibration"].startswith("slow@")


def test_engine_options_reject_a_missing_calibration_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        EngineOptions(calibration=str(tmp_path / "nope.yaml"))


def test_run_collective_applies_the_users_links(tmp_path):
    path = _write(tmp_path, "links:\n  ib_ndr: {efficiency: 0.47}\n")
    base = run_collective("allreduce", "1GiB", "dgx-h100:nodes=2", algo="ring")
    slow = run_collective("allreduce", "1GiB", "dgx-h100:nodes=2", algo="ring", calibration=path)
    # a two-node ring is bound by its NICs: half the efficiency, nearly twice the time
    assert slow.time_s / base.time_s == pytest.approx(2.0, rel=0.05)
    assert read_calibration(path).links["ib_ndr"].efficiency == 0.47


def test_workload_plan_sees_the_calibrated_topology(tmp_path):
    path = _write(tmp_path, "links:\n  nvlink4: {efficiency: 0.6}\n")
    _, topo = plan_workload("gpt3-1.3b", "dgx-h100:nodes=1",
                            engine=EngineOptions(calibration=path, record_links=False))
    assert {d["efficiency"] for _, _, d in topo.graph.edges(data=True)
            if link_tech(d) == "nvlink4"} == {0.6}
