"""Inline specs, YAML files/dicts, shipped files and load_topology dispatch."""

from pathlib import Path

import pytest
import yaml

from dessim.errors import DessimError, SpecError, TopologyError, UnitError
from dessim.resources import data_dir, shipped_topologies
from dessim.topology import Topology, load_topology
from dessim.topology.builders import ring
from dessim.topology.spec import DEFAULT_BW, DEFAULT_LAT, KINDS


# ------------------------------------------------------------------ inline specs
@pytest.mark.parametrize("spec,gpus,dims,edges", [
    ("ring:8,bw=50GB/s,lat=500ns", 8, (8,), 8),
    ("fc:8", 8, (8,), 28),
    ("fully_connected:4", 4, (4,), 6),
    ("switch:16,bw=25GB/s", 16, (16,), 16),
    ("torus2d:4x4", 16, (4, 4), 32),
    ("torus3d:4x4x4", 64, (4, 4, 4), 192),
    ("mesh2d:4x4", 16, (4, 4), 24),
    ("leafspine:hosts=64,leaves=8,oversub=2,bw=50GB/s", 64, (8, 8), 64 + 8 * 4),
    ("leafspine:16,4", 16, (4, 4), 16 + 4 * 4),
    ("multidim:ring(8,bw=300GB/s,lat=250ns)xswitch(4,bw=50GB/s,lat=1us)", 32, (8, 4), 64),
    ("multidim: ring(4, tech=nvlink4) x fc(2, tech=ndr), device=h100", 8, (4, 2), 8 + 4),
    ("dgx-a100:nodes=2", 16, (8, 2), None),
    ("dgx-h100:4,ideal", 32, (8, 4), None),
    ("DGX_H100", 8, (8, 1), None),
    ("pcie:8,gen=5", 8, (8,), 15),
    ("cxl:gpu=h100,expanders=4,capacity=512GB", 8, (8,), None),
])
def test_inline_specs_build(spec, gpus, dims, edges):
    t = load_topology(spec)
    assert t.num_gpus == gpus and t.dims == dims
    if edges is not None:
        assert t.graph.number_of_edges() == edges


def test_inline_defaults_and_tech():
    t = load_topology("ring:4")
    link = t.link("gpu0", "gpu1")
    assert (link.bw, link.lat, link.type, link.efficiency) == (50e9, 5e-7, "custom", 1.0)
    assert (DEFAULT_BW, DEFAULT_LAT) == ("50GB/s", "500ns")
    nv = load_topology("fc:4,tech=nvlink4").link("gpu0", "gpu3")
    assert (nv.bw, nv.type) == (450e9, "nvlink") and nv.capacity == pytest.approx(370e9)
    mixed = load_topology("ring:4,tech=nvlink4,bw=100GB/s,efficiency=1").link("gpu0", "gpu1")
    assert (mixed.bw, mixed.type, mixed.efficiency) == (100e9, "nvlink", 1.0)


def test_inline_flags_and_booleans():
    assert {l.efficiency for l in load_topology("dgx-h100:ideal=true").links()} == {1.0}
    assert load_topology("dgx-h100:ideal=no").link("n0.gpu0", "n0.nvsw").efficiency < 1


@pytest.mark.parametrize("spec,error,message", [
    ("ring:8,bw=fast", UnitError, "ring spec 'ring:8,bw=fast': bw: cannot parse 'fast'"),
    ("ring:8,lat=-1us", UnitError, "ring spec 'ring:8,lat=-1us': lat: '-1us' is negative"),
    ("ring:8,foo=1", SpecError, "unknown key 'foo'; valid keys: n, bw, lat"),
    ("ring", SpecError, "ring spec 'ring': lacks n \\(GPUs\\)"),
    ("ring:8,n=4", SpecError, "'n' given both positionally and as n="),
    ("ring:8,bw=1GB/s,bw=2GB/s", SpecError, "key 'bw' given twice"),
    ("ring:8,,bw=1", SpecError, "empty item"),
    ("ring:8,type=nvlnk", SpecError, "unknown link type 'nvlnk'; valid types: nvlink"),
    ("ring:8,tech=nvlink9", SpecError, "unknown link technology 'nvlink9'"),
    ("ring:8,device=tpu", SpecError, "unknown GPU 'tpu'; valid names: V100"),
    ("ring:1", UnitError, "n: '1' must be >= 2"),
    ("hypercube:8", SpecError, "unknown topology spec 'hypercube:8'.*ring, fc, switch"),
    ("torus2d:4", SpecError, "expected one positional shape XxY"),
    ("dgx-h100:4,idael", SpecError, "unknown flag 'idael'.*flags: ideal"),
    ("dgx-h100:nodes=two", UnitError, "nodes: cannot parse 'two'"),
    ("dgx-h100:ideal=maybe", SpecError, "cannot parse 'maybe' as a boolean"),
    ("leafspine:hosts=60,leaves=8", TopologyError, "hosts=60 is not divisible by leaves=8"),
    ("multidim:ring8xswitch4", SpecError, "dimension 0 'ring8' is not SHAPE"),
    ("multidim:ring(8)xcube(4)", TopologyError, "unknown shape 'cube'"),
    ("multidim:ring(8,foo=1)", SpecError, "dimension 0 \\(ring\\): unknown key 'foo'"),
    ("pcie:4,gen=9", SpecError, "unknown link technology 'pcie9'"),
    ("cxl:capacity=0", UnitError, "cxl spec 'cxl:capacity=0': capacity: '0' is zero"),
])
def test_inline_errors_name_value_and_place(spec, error, message):
    with pytest.raises(error, match=message):
        load_topology(spec)


def test_every_kind_is_documented():
    for kind in KINDS.values():
        assert kind.help and all(p.help for p in kind.params), kind.name


# ------------------------------------------------------------------ YAML and dicts
def write(tmp_path: Path, data, name="t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


PAIR = {"name": "pair",
        "nodes": [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "gpu", "device": "h100"},
                  {"name": "m", "kind": "cxl_mem", "capacity": "64GiB"}],
        "links": [{"a": "a", "b": "b", "bw": "100GB/s", "lat": "1us", "type": "nvlink"},
                  {"a": "b", "b": "m", "tech": "cxl2"}]}


def test_yaml_explicit_nodes_and_links(tmp_path):
    t = load_topology(str(write(tmp_path, PAIR)))
    assert t.name == "pair" and t.gpus == ("a", "b") and t.device(1) == "H100"
    assert t.link("a", "b").bw == 100e9 and t.link("b", "m").type == "cxl"
    assert t.graph.nodes["m"]["capacity"] == 64 * 2**30
    assert t.meta["source"].endswith("t.yaml")
    assert load_topology(PAIR).name == "pair"          # the same as a dict
    assert load_topology(write(tmp_path, PAIR)).name == "pair"   # a Path


def test_yaml_builder_plus_extra_nodes(tmp_path):
    data = {"builder": {"kind": "switch", "n": 4, "bw": "10GB/s"},
            "nodes": [{"name": "disk", "kind": "storage"}],
            "links": [{"a": "disk", "b": "sw0", "bw": "5GB/s", "lat": "10us", "type": "storage"}]}
    t = load_topology(data)
    assert t.num_gpus == 4 and t.link("disk", "sw0").bw == 5e9 and t.meta["builder"] == "switch"


def test_yaml_multidim_builder():
    data = {"builder": {"kind": "multidim", "dims": [{"shape": "ring", "size": 4, "bw": 1e9},
                                                     {"shape": "switch", "size": 2, "bw": 1e9}]}}
    assert load_topology(data).dims == (4, 2)


@pytest.mark.parametrize("mutate,error,message", [
    (lambda d: d.update(color="red"), SpecError, r"t.yaml: unknown key 'color'; valid keys: name"),
    (lambda d: d["nodes"][1].update(colour=1), SpecError, r"t.yaml: nodes\[1\]: unknown key 'colour'"),
    (lambda d: d["links"][0].update(speed=1), SpecError, r"t.yaml: links\[0\]: unknown key 'speed'.*bw"),
    (lambda d: d["nodes"].append({"name": "a", "kind": "gpu"}), SpecError,
     r"nodes\[3\]: duplicate node name 'a'"),
    (lambda d: d["links"].append({"a": "b", "b": "a", "bw": 1, "lat": 0}), SpecError,
     r"links\[2\]: duplicate link b -- a"),
    (lambda d: d["links"].append({"a": "a", "b": "zz", "bw": 1, "lat": 0}), SpecError,
     r"links\[2\]: b: unknown node 'zz'"),
    (lambda d: d["links"][0].update(bw="0GB/s"), UnitError, r"t.yaml: links\[0\]\.bw: '0GB/s' is zero"),
    (lambda d: d["links"][0].update(bw=-5), UnitError, r"t.yaml: links\[0\]\.bw: -5 is negative"),
    (lambda d: d["links"][0].pop("lat"), SpecError, r"links\[0\] \(a -- b\): missing 'lat' \(give bw and lat, or tech\)"),
    (lambda d: d["nodes"][0].update(kind="tpu"), SpecError, r"t.yaml: nodes\[0\]\.kind: 'tpu' is unknown; valid: 'gpu'"),
    (lambda d: d["nodes"].append({"name": "c", "kind": "gpu"}), TopologyError,
     r"t.yaml: .*'c' \(rank 2\) cannot be reached"),
    (lambda d: d.update(dims=[3]), TopologyError, r"t.yaml: .*dims \[3\] do not multiply"),
    (lambda d: d.update(builder={"n": 4}), SpecError, r"builder: missing 'kind'"),
    (lambda d: d.update(builder={"kind": "ring", "n": 4, "size": 2}), SpecError,
     r"t.yaml: builder \(ring\): unknown key 'size'; valid keys: n, bw"),
])
def test_yaml_errors_name_file_place_and_valid_keys(tmp_path, mutate, error, message):
    import copy
    data = copy.deepcopy(PAIR)
    mutate(data)
    with pytest.raises(error, match=message):
        load_topology(str(write(tmp_path, data)))


def test_yaml_syntax_error_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="invalid YAML"):
        load_topology(str(write(tmp_path, "nodes: [a, b")))
    with pytest.raises(SpecError, match="does not exist"):
        load_topology(str(tmp_path / "nope.yaml"))
    with pytest.raises(SpecError, match="top level: expected a mapping"):
        load_topology(str(write(tmp_path, "- 1\n- 2\n")))


# ------------------------------------------------------------------ dispatch and shipped files
def test_topology_is_returned_as_is():
    t = ring(4, 1e9, 0)
    assert load_topology(t) is t


def test_bad_spec_types():
    with pytest.raises(DessimError):
        load_topology(42)  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        load_topology("   ")


REQUIRED_SHIPPED = {"ring8", "switch16", "torus-4x4", "leafspine-64-2to1", "dgx-a100",
                    "dgx-h100-4node", "pcie-server", "cxl-node", "ring8-x-switch4"}


def test_shipped_files_are_found_in_the_checkout():
    assert data_dir("topologies") is not None
    assert REQUIRED_SHIPPED <= set(shipped_topologies())


@pytest.mark.parametrize("name", sorted(REQUIRED_SHIPPED))
def test_every_shipped_file_loads_and_is_documented(name):
    t = load_topology(name)
    assert isinstance(t, Topology) and t.name == name
    text = shipped_topologies()[name].read_text()
    assert text.startswith("#") and "docs/topologies.md" in text
    assert load_topology(name + ".yaml").num_gpus == t.num_gpus


def test_shipped_topology_facts():
    assert load_topology("dgx-h100-4node").dims == (8, 4)
    assert load_topology("torus-4x4").dims == (4, 4)
    assert load_topology("ring8").graph.number_of_edges() == 8
    assert len(load_topology("cxl-node").nodes_of_kind("cxl_mem")) == 4


def test_installed_wheel_layout_is_preferred(tmp_path, monkeypatch):
    import dessim.resources as resources
    pkg = tmp_path / "site" / "dessim"
    (pkg / "_data" / "topologies").mkdir(parents=True)
    (pkg / "_data" / "topologies" / "tiny.yaml").write_text("builder: {kind: ring, n: 2}\n")
    monkeypatch.setattr(resources, "_PACKAGE", pkg)
    assert resources.data_dir("topologies") == pkg / "_data" / "topologies"
    assert list(resources.shipped_topologies()) == ["tiny"]
    assert load_topology("tiny").num_gpus == 2
    assert resources.data_dir("nothing-here") is None and resources.data_files("nothing-here") == {}


def test_inline_to_raw_gives_the_yaml_builder_mapping():
    from dessim.topology.spec import inline_to_raw, is_inline_spec
    kind, raw = inline_to_raw("dgx-a100:4,ideal,oversub=2")
    assert kind.name == "dgx-a100" and raw == {"nodes": "4", "ideal": True, "oversub": "2"}
    assert load_topology({"builder": {"kind": kind.name, **raw}}).num_gpus == 32
    assert is_inline_spec("torus2d:4x4") and not is_inline_spec("my/file.yaml")
