"""ResNet-50 and ViT layer lists, data-parallel graphs with DDP buckets, the kind registry."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.engine import simulate
from dessim.errors import SpecError, WorkloadError
from dessim.topology import load_topology
from dessim.workload import shipped_workloads, simulate_workload
from dessim.workload.vision.cnn import generate_cnn, parse_cnn
from dessim.workload.vision.cnn_models import ARCHS, macs, total_params
from dessim.workload.common.gradsync import fill_buckets
from dessim.workload.common.precision import PRECISIONS

BF16 = PRECISIONS["bf16"]


def spec(arch="resnet50", **training):
    return parse_cnn({"kind": "cnn", "name": arch, "model": {"arch": arch},
                      "training": {"global_batch": 8, "device": "H100", **training}}, "<test>", arch)


def test_resnet50_matches_torchvision_parameters_and_flops():
    layers = ARCHS["resnet50"](1, BF16)
    assert total_params(layers) == 25_557_032                 # torchvision model card
    assert macs(layers) == pytest.approx(4.09e9, rel=0.01)   # "4.09 GFLOPS" (multiply-adds)


@pytest.mark.parametrize("arch, params, gmacs", [("vit-b16", 86_567_656, 17.6), ("vit-l16", 304_326_632, 61.6)])
def test_vit_matches_published_parameters_and_flops(arch, params, gmacs):
    layers = ARCHS[arch](1, BF16)
    assert total_params(layers) == params
    assert macs(layers) == pytest.approx(gmacs * 1e9, rel=0.01)


def test_flops_scale_with_the_micro_batch():
    one, four = ARCHS["resnet50"](1, BF16), ARCHS["resnet50"](4, BF16)
    assert macs(four) == pytest.approx(4 * macs(one))


def test_gradients_go_in_ddp_buckets_that_overlap_the_backward():
    topo = load_topology("switch:2,bw=50GB/s,lat=1us,device=H100")
    gen = generate_cnn(spec(bucket_size="25MiB"), topo)
    layers = ARCHS["resnet50"](4, BF16)
    # fp32 gradients: PyTorch DDP under autocast keeps fp32 parameters (precision.py)
    expected = fill_buckets(((l.name, {"dp": BF16.grad_bytes * l.params}) for l in reversed(layers)), 25 * 2**20)
    ars = [t for t in gen.graph if t.rank == 0 and t.kind == "collective"]
    assert [t.size for t in ars] == [b.nbytes for b in expected]
    assert sum(t.size for t in ars) == 4 * 25_557_032          # every fp32 gradient once
    # 102.2 MB of gradients, 26.2 MB buckets: three full buckets, then the remainder
    assert len(ars) == 4 and all(t.op == "allreduce" and t.group == (0, 1) for t in ars)
    spans = simulate(gen.graph, gen.topology).spans()
    r0 = spans[spans["rank"] == 0]
    last_bwd = r0[r0["category"] == "bwd"]["end_s"].max()
    first_ar = r0[r0["kind"] == "collective"]["start_s"].min()
    assert first_ar < last_bwd                                  # reduction overlaps the backward


def test_micro_batches_accumulate_and_reduce_once():
    topo = load_topology("switch:2,device=H100")
    gen = generate_cnn(spec(micro_batch=2, bucket_size=0), topo)
    fwd = [t for t in gen.graph if t.rank == 0 and t.category == "fwd"]
    assert len(fwd) == 2 * len(ARCHS["resnet50"](2, BF16))    # 4 images per GPU, 2 steps
    assert [t.size for t in gen.graph if t.rank == 0 and t.kind == "collective"] == [4 * 25_557_032]
    with pytest.raises(WorkloadError, match="not divisible by micro_batch 3"):
        generate_cnn(spec(micro_batch=3), topo)


def test_simulate_and_cli_accept_cnn_files_and_list_still_shows_transformers():
    s = simulate_workload("vit-b16", "switch:2,device=H100", overrides={"global_batch": 4}).summary()
    assert s["kind"] == "cnn" and s["tokens_per_s"] == pytest.approx(197 * s["samples_per_s"])
    assert 0 < s["mfu"] < 1
    res = CliRunner().invoke(cli, ["simulate", "resnet50", "-t", "switch:2,device=H100", "--global-batch", "4",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["layout"]["micro_batch"] == 2
    assert "resnet50" not in shipped_workloads() and "resnet50" in shipped_workloads("cnn")
    bad = CliRunner().invoke(cli, ["simulate", "resnet50", "-t", "switch:2,device=H100", "--tp", "2"])
    assert bad.exit_code == 2 and "'tp'" in bad.output


def test_bad_cnn_files_name_the_problem():
    with pytest.raises(SpecError, match="model.arch: 'vgg' is unknown"):
        parse_cnn({"kind": "cnn", "model": {"arch": "vgg"}, "training": {"global_batch": 8}}, "f.yaml", "x")
    with pytest.raises(SpecError, match="unknown key 'epochs'"):
        parse_cnn({"kind": "cnn", "model": {"arch": "resnet50"}, "training": {"global_batch": 8, "epochs": 3}},
                  "f.yaml", "x")
