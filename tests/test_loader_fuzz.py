"""Every loader, fed anything, gives a valid result or a clear :class:`DessimError`.

Three kinds of input per loader: arbitrary bytes (encoding, garbage), byte-level mutations
of a valid file (truncation, a flipped byte) and value-level mutations of a valid document
(one leaf or key replaced by a hostile value: negative, huge, NaN, wrong type, ...). A
``UnicodeDecodeError``, ``KeyError``, ``TypeError``, ... escaping a loader is a failure.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.catalog.calibration import read_calibration
from dessim.errors import DessimError
from dessim.sweep.spec import load_sweep
from dessim.taskgraph import Task, TaskGraph, load_taskgraph, save_taskgraph
from dessim.topology import load_topology
from dessim.trace import parse_rank_map, read_chakra, read_kernel_csv, read_kineto, read_nccl_tests
from dessim.workload.kinds import load_any_workload
from dessim.workload.multijob import load_cluster

ROOT = Path(__file__).resolve().parents[1]
#: Examples per test: few in CI (the suite's time budget); DESSIM_FUZZ_EXAMPLES=500 for a
#: longer hunt.
FUZZ = settings(max_examples=int(os.environ.get("DESSIM_FUZZ_EXAMPLES", "15")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

#: Hostile scalar values a document's leaf may be replaced by.
HOSTILE = st.sampled_from([None, True, 0, -1, 1.5e-6, 10**30, 1e308, math.nan, math.inf, "",
                           "5", "abc", "-3GB", "1e30GB", "ring:0", [], {}, [1, 2], {"x": 1},
                           "\x00", "é" * 3, 2**64, -(2**63)])


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node of a parsed document."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _replace(doc: Any, path: tuple, value: Any, rename: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == head:
                key = (str(k) + "_typo") if rename and not rest else k
                out[key] = _replace(v, rest, value, rename)
            else:
                out[k] = v
        return out
    out_list = list(doc)
    out_list[head] = _replace(doc[head], rest, value, rename)
    return out_list


@st.composite
def value_mutations(draw, doc: Any) -> Any:
    """``doc`` with one node replaced by a hostile value (or its key misspelt)."""
    paths = _paths(doc)
    if not paths:
        return draw(HOSTILE)
    path = draw(st.sampled_from(paths))
    return _replace(doc, path, draw(HOSTILE), draw(st.booleans()))


@st.composite
def byte_mutations(draw, data: bytes) -> bytes:
    """``data`` truncated, with a byte replaced, or with bytes inserted."""
    how = draw(st.sampled_from(["truncate", "flip", "insert"]))
    i = draw(st.integers(0, max(0, len(data) - 1)))
    if how == "truncate":
        return data[:i]
    if how == "flip":
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]


def _dump(doc: Any, suffix: str) -> bytes:
    if suffix == ".json":
        return json.dumps(doc, allow_nan=True).encode()
    return yaml.safe_dump(doc, allow_unicode=True).encode("utf-8")


def _check(loader: Callable[[Path], Any], path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        loader(path)
    except DessimError as exc:
        assert str(exc).strip(), "an error without a message"


def _chakra(path: Path) -> Any:
    return read_chakra(path.with_name("t"))


def _rank_map(path: Path) -> Any:
    return parse_rank_map(str(path), 4, 4)


#: (loader, a valid example file, file name written for the loader)
LOADERS: dict[str, tuple[Callable[[Path], Any], Path | None, str]] = {
    "topology": (load_topology, ROOT / "topologies/ring8-x-switch4.yaml", "t.yaml"),
    "topology-nic": (load_topology, ROOT / "topologies/dgx-a100.yaml", "t.yaml"),
    "workload": (load_any_workload, ROOT / "workloads/gpt3-1.3b.yaml", "w.yaml"),
    "workload-dlrm": (load_any_workload, ROOT / "workloads/dlrm-small.yaml", "w.yaml"),
    "workload-cnn": (load_any_workload, ROOT / "workloads/resnet50.yaml", "w.yaml"),
    "cluster": (load_cluster, ROOT / "workloads/cluster-two-jobs.yaml", "c.yaml"),
    "sweep": (load_sweep, ROOT / "examples/comet/sweep.yaml", "s.yaml"),
    "calibration": (read_calibration, ROOT / "calibration/default.yaml", "cal.yaml"),
    "taskgraph": (load_taskgraph, None, "g.json"),
    "rank-map": (_rank_map, None, "m.yaml"),
    "chakra": (_chakra, None, "t.0.et"),
    "nccl-tests": (read_nccl_tests,
                   ROOT / "tests/data/calibration/nccl_tests_allreduce_16xH100_a3mega.txt",
                   "allreduce.txt"),
    "kernel-csv": (read_kernel_csv,
                   ROOT / "tests/data/calibration/kernel_times_h100_published.csv", "k.csv"),
    "kineto": (read_kineto,
               ROOT / "tests/data/calibration/kineto_gemm_backward_a100_hta.json", "k.json"),
}


def _valid_bytes(name: str, tmp: Path) -> bytes:
    """The bytes of a valid input of loader ``name``."""
    loader, example, fname = LOADERS[name]
    if example is not None:
        return example.read_bytes()
    if name == "taskgraph":
        save_taskgraph(_small_graph(), tmp / "valid.json")
        return (tmp / "valid.json").read_bytes()
    if name == "rank-map":
        return b"0: 3\n1: 2\n2: 1\n3: 0\n"
    from dessim.trace import export_chakra

    export_chakra(_small_graph(), tmp / "valid")
    return (tmp / "valid.0.et").read_bytes()


def _small_graph() -> TaskGraph:
    """Compute, a collective, a send/recv pair and a delay on two ranks."""
    g = TaskGraph("small")
    for r in range(2):
        g.add(Task(f"r{r}.fwd", r, "compute", duration=1e-5, flops=1e9))
        g.add(Task(f"r{r}.ar", r, "collective", op="allreduce", size=1e6, group=(0, 1),
                   coll_id="grad"), [f"r{r}.fwd"])
    g.add(Task("r0.send", 0, "send", peer=1, size=4096, tag=1), ["r0.ar"])
    g.add(Task("r1.recv", 1, "recv", peer=1 - 1, size=4096, tag=1), ["r1.ar"])
    g.add(Task("r1.wait", 1, "delay", duration=2e-6), ["r1.recv"])
    return g


def test_every_valid_example_loads(tmp_path):
    for name, (loader, _example, fname) in LOADERS.items():
        path = tmp_path / fname
        path.write_bytes(_valid_bytes(name, tmp_path))
        assert loader(path) is not None, name


@pytest.mark.parametrize("name", list(LOADERS))
@FUZZ
@given(data=st.binary(max_size=300))
def test_any_bytes_give_a_result_or_a_clear_error(name, data, tmp_path_factory):
    loader, _example, fname = LOADERS[name]
    _check(loader, tmp_path_factory.mktemp(name) / fname, data)


@pytest.mark.parametrize("name", list(LOADERS))
@FUZZ
@given(data=st.data())
def test_a_damaged_valid_file_gives_a_result_or_a_clear_error(name, data, tmp_path_factory):
    loader, _example, fname = LOADERS[name]
    tmp = tmp_path_factory.mktemp(name)
    valid = _valid_bytes(name, tmp)
    _check(loader, tmp / fname, data.draw(byte_mutations(valid)))


STRUCTURED = [n for n in LOADERS if LOADERS[n][2].endswith((".yaml", ".json"))]


@pytest.mark.parametrize("name", STRUCTURED)
@FUZZ
@given(data=st.data())
def test_a_hostile_value_in_a_valid_document_gives_a_result_or_a_clear_error(
        name, data, tmp_path_factory):
    loader, _example, fname = LOADERS[name]
    tmp = tmp_path_factory.mktemp(name)
    valid = _valid_bytes(name, tmp)
    suffix = Path(fname).suffix
    doc = json.loads(valid) if suffix == ".json" else yaml.safe_load(valid)
    _check(loader, tmp / fname, _dump(data.draw(value_mutations(doc)), suffix))


@FUZZ
@given(text=st.text(max_size=60) | st.from_regex(
    r"(ring|fc|switch|torus2d|torus3d|mesh2d|leafspine|multidim|dgx-h100|dgx-a100):[-0-9a-z=,.x/]{0,30}",
    fullmatch=True))
def test_any_inline_topology_spec_gives_a_topology_or_a_clear_error(text):
    try:
        load_topology(text)
    except DessimError as exc:
        assert str(exc).strip()
