"""Sweep specs: axis expansion (lists, ranges, units, grid, zip), validation messages, keys."""

from __future__ import annotations

import pytest

from dessim.errors import SpecError
from dessim.sweep.points import EVALUATORS
from dessim.sweep.axes import expand_axis
from dessim.sweep.spec import parse_sweep
from dessim.topology import load_topology
from dessim.units import parse_bandwidth, parse_size


def collective_spec(**axes):
    return {"kind": "collective",
            "base": {"topology": "ring:4,bw=50GB/s,lat=500ns",
                     "collective": {"op": "allreduce", "size": "1MiB"}},
            "axes": axes}


# ---------------------------------------------------------------- axis values
def test_list_values_with_units_become_si_numbers():
    assert expand_axis(["64KiB", "1MiB", 4096], "a") == [65536, 2**20, 4096]
    assert expand_axis(["2us", "1ms"], "a") == [2e-6, 1e-3]
    assert expand_axis(["ring", "tree", "4x4", "H100"], "a") == ["ring", "tree", "4x4", "H100"]


def test_arithmetic_range_includes_stop_and_keeps_integers():
    assert expand_axis({"start": 1, "stop": 4, "step": 1}, "a") == [1, 2, 3, 4]
    assert expand_axis({"start": 0.5, "stop": 1.6, "step": 0.5}, "a") == [0.5, 1.0, 1.5]
    assert expand_axis({"start": "1GB", "stop": "3GB", "step": "1GB"}, "a") == [
        parse_size("1GB"), parse_size("2GB"), parse_size("3GB")]


def test_geometric_range_of_bandwidths():
    values = expand_axis({"from": "100GB/s", "to": "800GB/s", "factor": 2}, "a")
    assert values == [parse_bandwidth(v) for v in ("100GB/s", "200GB/s", "400GB/s", "800GB/s")]


def test_values_form_and_single_value():
    assert expand_axis({"values": [1, "2KiB"]}, "a") == [1, 2048]
    assert expand_axis("flow", "a") == ["flow"]


@pytest.mark.parametrize("raw, message", [
    ({"start": 1, "stop": 4}, "valid forms"),
    ({"from": "100GB/s", "to": "80GB", "factor": 2}, "mix units"),
    ({"from": 1, "to": 8, "factor": 1}, "factor: expected a number > 1"),
    ({"start": 4, "stop": 1, "step": 1}, "stop >= start"),
    ([], "non-empty list"),
    ({"start": "fast", "stop": 2, "step": 1}, "cannot read 'fast'"),
])
def test_bad_ranges_are_named(raw, message):
    with pytest.raises(SpecError, match=message) as err:
        expand_axis(raw, "sweep.yaml: axes.x")
    assert "axes.x" in str(err.value)


# ---------------------------------------------------------------- grid and zip
def test_grid_is_the_cartesian_product_first_axis_slowest():
    spec = parse_sweep(collective_spec(**{"topology.n": [2, 4], "engine.collectives.algo": ["ring", "tree"],
                                          "collective.size": ["1KiB", "2KiB", "4KiB"]}))
    points = spec.points()
    assert len(points) == 2 * 2 * 3
    assert [p.index for p in points] == list(range(12))
    assert points[0].params == {"topology.n": 2, "engine.collectives.algo": "ring", "collective.size": 1024}
    assert points[1].params["collective.size"] == 2048
    assert points[3].params["engine.collectives.algo"] == "tree"
    assert points[6].params["topology.n"] == 4


def test_zip_pairs_values_and_needs_equal_lengths():
    spec = parse_sweep({**collective_spec(**{"topology.n": [2, 4], "topology.bw": ["25GB/s", "50GB/s"]}),
                        "mode": "zip"})
    assert [dict(p.params) for p in spec.points()] == [
        {"topology.n": 2, "topology.bw": 25e9}, {"topology.n": 4, "topology.bw": 50e9}]
    with pytest.raises(SpecError, match=r"mode zip needs axes of equal length, got topology.n: 2, "
                                        r"topology.bw: 3"):
        parse_sweep({**collective_spec(**{"topology.n": [2, 4],
                                          "topology.bw": ["1GB/s", "2GB/s", "3GB/s"]}),
                     "mode": "zip"})


# ---------------------------------------------------------------- composition into configs
def test_topology_axes_compose_into_the_builder_of_an_inline_spec():
    spec = parse_sweep({"kind": "collective",
                        "base": {"topology": "dgx-a100:nodes=1,ideal",
                                 "collective": {"op": "allgather", "size": "1MiB"}},
                        "axes": {"topology.nodes": [1, 2], "topology.oversub": [2]}})
    evaluator = EVALUATORS["collective"]
    configs = [evaluator.config(spec.base, p.params) for p in spec.points()]
    assert configs[1]["topology"] == {"builder": {"kind": "dgx-a100", "nodes": 2, "ideal": True,
                                                  "oversub": 2}}
    assert [load_topology(c["topology"]).num_gpus for c in configs] == [8, 16]
    assert configs[0]["collective"] == {"op": "allgather", "size": "1MiB"}  # as written
    assert configs[0]["engine"] == {}  # the evaluator's default: EngineOptions' (NCCL's choice)


def test_engine_and_collective_axes_land_in_their_sections():
    spec = parse_sweep(collective_spec(**{"engine.collectives.algo": ["tree"], "engine.collectives.chunks": [4],
                                          "collective.op": ["allgather"]}))
    cfg = EVALUATORS["collective"].config(spec.base, spec.points()[0].params)
    assert cfg["engine"] == {"collectives": {"algo": "tree", "chunks": 4}}
    assert cfg["collective"] == {"op": "allgather", "size": "1MiB"}


# ---------------------------------------------------------------- validation messages
@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(axes_typo={}), r"unknown key 'axes_typo' \(did you mean 'axes'\?\); valid keys: name, "
                                       r"description, kind, base, mode, axes, analysis, cost"),
    (lambda d: d.update(kind="training"), r"unknown sweep kind 'training'; valid kinds: workload, "
                                          r"collective"),
    (lambda d: d["base"].update(network="flow"), r"base: unknown key 'network'; valid keys: "
                                                 r"topology, collective, engine"),
    (lambda d: d["base"]["collective"].update(algo="ring"), r"base.collective: unknown key 'algo'; "
                                                            r"valid keys: op, size, ranks, root"),
    (lambda d: d["axes"].update({"nic.bw": [1]}), r"axes.nic.bw: unknown axis 'nic.bw' for kind "
                                                  r"'collective'; valid axes: topology.KEY"),
    (lambda d: d["axes"].update({"topology.nic_bw": ["100GB/s"]}),
     r"axes.topology.nic_bw: ring has no key 'nic_bw'; valid keys: n, bw, lat"),
    (lambda d: d["axes"].update({"topology.n": [4, 1]}), r"axes.topology.n\[1\].*'1' must be >= 2|"
                                                         r"axes.topology.n\[1\].*1 must be >= 2"),
    (lambda d: d["axes"].update({"topology.bw": ["100GB"]}), r"axes.topology.bw\[0\].*lacks '/s'"),
    (lambda d: d["axes"].update({"engine.chunk": [2]}), r"axes.engine.chunk: unknown engine option "
                                                        r"'chunk'; valid: network, collectives.algo, "),
    (lambda d: d["axes"].update(parallelism="auto"), r"axes.parallelism: 'auto' is not available "
                                                     r"for kind 'collective'"),
    (lambda d: d.update(mode="random"), r"mode: 'random' is unknown; valid: 'grid' or 'zip'"),
    (lambda d: d.update(analysis={"metrik": "x"}), r"analysis: unknown key 'metrik' \(did you mean 'metric'\?\); valid keys: "
                                                   r"metric, minimize, group_by, heatmap, vs"),
    (lambda d: d.update(cost={"gpus": {"prize": 3}}), r"cost.gpus: unknown key 'prize' \(did you mean 'price'\?\); valid keys: "
                                                      r"price, per, times"),
    (lambda d: d["base"]["collective"].pop("op"), r"'collective.op' is not set: give it under base: "
                                                  r"or as an axis"),
])
def test_spec_errors_name_the_place_and_the_valid_choices(mutate, message):
    data = collective_spec(**{"topology.n": [2, 4]})
    mutate(data)
    with pytest.raises(SpecError, match=message) as err:
        parse_sweep(data, "my-sweep.yaml")
    assert str(err.value).startswith("my-sweep.yaml")


def test_a_required_value_may_come_from_an_axis():
    data = collective_spec(**{"collective.op": ["allreduce", "allgather"]})
    data["base"]["collective"].pop("op")
    assert len(parse_sweep(data).points()) == 2


def test_topology_axes_need_a_builder_topology():
    data = collective_spec(**{"topology.n": [2]})
    data["base"]["topology"] = {"nodes": [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "gpu"}],
                                "links": [{"a": "a", "b": "b", "bw": "1GB/s", "lat": 0}]}
    with pytest.raises(SpecError, match="topology axes need a topology built by a builder"):
        parse_sweep(data)


# ---------------------------------------------------------------- point keys
def test_point_keys_are_stable_and_depend_on_everything_that_matters(tmp_path):
    data = collective_spec(**{"topology.n": [2, 4]})
    keys = [p.key for p in parse_sweep(data).points()]
    assert keys == [p.key for p in parse_sweep(data).points()]
    assert len(set(keys)) == 2 and all(len(k) == 16 for k in keys)
    data["base"]["collective"]["size"] = "2MiB"
    assert not set(keys) & {p.key for p in parse_sweep(data).points()}


def test_point_keys_follow_the_content_of_files_named_in_the_base(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text("builder: {kind: ring, n: 4}\n")
    data = collective_spec(**{"topology.n": [2]})
    data["base"]["topology"] = str(topo)
    before = parse_sweep(data).points()[0].key
    topo.write_text("builder: {kind: ring, n: 4, bw: 10GB/s}\n")
    assert parse_sweep(data).points()[0].key != before


def test_relative_files_resolve_next_to_the_sweep_file(tmp_path):
    from dessim.sweep.spec import load_sweep

    (tmp_path / "t.yaml").write_text("builder: {kind: ring, n: 4}\n")
    (tmp_path / "s.yaml").write_text(
        "kind: collective\nbase: {topology: t.yaml, collective: {op: allreduce, size: 1KiB}}\n"
        "axes: {topology.n: [2, 3]}\n")
    spec = load_sweep(tmp_path / "s.yaml")
    assert spec.name == "s" and spec.base["topology"] == str(tmp_path / "t.yaml")
    cfg = EVALUATORS["collective"].config(spec.base, spec.points()[1].params)
    assert load_topology(cfg["topology"]).num_gpus == 3


def test_layers_below_get_values_as_written_so_a_wrong_unit_is_caught():
    """The table holds SI numbers; the evaluator gets "64KiB" (or, from a range, the SI number
    with its unit), so the layer below parses it with its own rules."""
    spec = parse_sweep(collective_spec(**{"collective.size": ["64KiB"],
                                          "topology.bw": {"from": "25GB/s", "to": "50GB/s",
                                                          "factor": 2}}))
    point = spec.points()[1]
    assert point.params == {"collective.size": 65536, "topology.bw": 50e9}
    assert point.inputs == {"collective.size": "64KiB", "topology.bw": "50000000000B/s"}
    assert parse_bandwidth(point.inputs["topology.bw"]) == 50e9


def test_topology_paths_reach_into_a_dimension_of_a_multidim_network():
    """Scale-out bandwidth of a two-level network: the second dimension's bw."""
    data = collective_spec(**{"topology.dims.1.bw": ["25GB/s", "100GB/s"]})
    data["base"]["topology"] = {"kind": "multidim", "dims": [
        {"shape": "switch", "size": 4, "bw": "300GB/s"}, {"shape": "switch", "size": 2, "bw": "50GB/s"}]}
    spec = parse_sweep(data)
    cfgs = [EVALUATORS["collective"].config(spec.base, p.config_params) for p in spec.points()]
    assert [c["topology"]["builder"]["dims"][1]["bw"] for c in cfgs] == ["25GB/s", "100GB/s"]
    assert data["base"]["topology"]["dims"][1]["bw"] == "50GB/s"   # the base is not modified
    assert [load_topology(c["topology"]).num_gpus for c in cfgs] == [8, 8]
    data["axes"] = {"topology.dims.2.bw": ["1GB/s"]}
    with pytest.raises(SpecError, match=r"'dims.2': '2' is not an index 0..1"):
        parse_sweep(data)
