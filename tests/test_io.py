"""Input pipeline: a storage tier in the topology, sample reads, host-memory caching, and an
I/O-bound job whose iteration time is the read time."""

from __future__ import annotations

import pytest

from dessim.errors import SpecError, TopologyError, WorkloadError
from dessim.topology import load_topology
from dessim.topology.storage import attach_storage, default_attach_points
from dessim.workload import simulate_workload
from dessim.workload.dataparallel.io import parse_input

SAMPLE = 10e6            # bytes per sample
PFS_BW = 1e9             # bytes/s, shared by every reader


def resnet(input_section=None, **training):
    doc = {"kind": "cnn", "name": "r50", "model": {"arch": "resnet50"},
           "training": {"global_batch": 8, "device": "H100", **training}}
    if input_section:
        doc["input"] = input_section
    return doc


def run(doc, topo):
    from dessim.workload.kinds import WORKLOAD_KINDS
    spec = WORKLOAD_KINDS["cnn"].parse(doc, "<test>", "r50")
    return simulate_workload(spec, topo)


def cluster():
    topo = load_topology("switch:4,bw=100GB/s,lat=0,device=H100")
    return attach_storage(topo, "pfs", PFS_BW, lat=0)


def test_io_bound_iteration_equals_the_read_time():
    # 4 GPUs each read 2 samples of 10 MB through one 1 GB/s file system: max-min gives each
    # reader 0.25 GB/s, so every read takes 20 MB / 0.25 GB/s = 80 ms — far longer than the
    # ResNet-50 step on 2 images; with prefetching the iteration is exactly the read.
    res = run(resnet({"sample_bytes": SAMPLE}), cluster())
    read = 4 * 2 * SAMPLE / PFS_BW
    assert res.iteration_s == pytest.approx(read, rel=1e-9)
    s = res.summary()
    assert s["gpu_busy_fraction"] < 0.25                     # GPUs idle, waiting for data
    assert s["exposed_comm_s"]["io"] > 0.75 * read
    reads = [t for t in res.taskgraph if t.category == "io"]
    assert {t.size for t in reads} == {2 * SAMPLE} and {t.mem_node for t in reads} == {"pfs"}


def test_without_prefetch_the_read_comes_before_the_compute():
    no_input = run(resnet(), cluster()).iteration_s
    res = run(resnet({"sample_bytes": SAMPLE, "prefetch": False}), cluster())
    assert res.iteration_s == pytest.approx(4 * 2 * SAMPLE / PFS_BW + no_input, rel=1e-9)


def test_host_cache_serves_its_share_of_the_reads():
    topo = attach_storage(load_topology("pcie:4,gpu=H100"), "pfs", PFS_BW)
    res = run(resnet({"sample_bytes": SAMPLE, "cache": "host", "hit_ratio": 0.75}), topo)
    got = {(t.mem_node[:3], t.size) for t in res.taskgraph if t.category == "io" and t.rank == 0}
    assert got == {("pfs", 0.25 * 2 * SAMPLE), ("mem", 0.75 * 2 * SAMPLE)}


def test_cached_after_the_first_epoch_up_to_the_cache_capacity():
    topo = load_topology("pcie:4,gpu=H100")                  # 2 x 512 GB of host memory
    base = {"sample_bytes": "110KB", "cache": "host", "cached_after_first_epoch": True, "dataset_bytes": "2TB"}
    assert parse_input(base, "in").effective_hit_ratio(topo) == 0.0          # epoch 0 reads storage
    assert parse_input({**base, "epoch": 1}, "in").effective_hit_ratio(topo) == pytest.approx(0.512)
    assert parse_input({**base, "epoch": 1, "dataset_bytes": "140GB"}, "in").effective_hit_ratio(topo) == 1.0


def test_storage_tier_attachment_points():
    ls = load_topology("leafspine:hosts=8,leaves=2,bw=25GB/s")
    assert default_attach_points(ls, "pfs") == ["spine0", "spine1", "spine2", "spine3"]
    pfs = attach_storage(ls, "pfs", "20GB/s")
    assert pfs.nodes_of_kind("storage") == ["pfs"] and pfs.link("pfs", "pfs.sw").bw == 20e9
    assert pfs.num_gpus == 8 and pfs.meta["storage"][0]["attach"] == default_attach_points(ls, "pfs")
    nvme = attach_storage(load_topology("switch:4"), "nvme", "7GB/s")
    assert sorted(nvme.nodes_of_kind("storage")) == ["nvme0", "nvme1", "nvme2", "nvme3"]
    assert nvme.link("nvme2", "gpu2").bw == 7e9
    dgx = attach_storage(load_topology("dgx-h100:nodes=1"), "nvme", "12GB/s")
    assert sorted(dgx.graph.adj["nvme0"]) == ["n0.cpu0"]
    with pytest.raises(TopologyError, match="matches no node"):
        attach_storage(ls, "pfs", "1GB/s", attach="core*")


def test_io_needs_a_storage_node_and_valid_sections():
    with pytest.raises(WorkloadError, match="needs a storage node"):
        run(resnet({"sample_bytes": SAMPLE}), load_topology("switch:4,device=H100"))
    with pytest.raises(SpecError, match="need cache: host"):
        parse_input({"sample_bytes": 1, "hit_ratio": 0.5}, "in")
    with pytest.raises(SpecError, match="lacks sample_bytes"):
        parse_input({"cache": "host"}, "in")


def test_io_bound_preset_attaches_its_file_system():
    s = simulate_workload("resnet50-io-bound", "switch:8,bw=100GB/s,device=H100").summary()
    read = 2048 * 110e3 / 2e9
    assert s["iteration_s"] == pytest.approx(read, rel=0.01) and s["gpu_busy_fraction"] < 0.9
