"""The hardware catalog: devices and link technologies carry sourced, self-consistent figures."""

import pytest

from dessim.catalog import (DEVICES, LINK_TECHS, LINK_TYPES, PRECISIONS, check_link_type,
                            get_device, get_link_tech)
from dessim.errors import DessimError, SpecError

REQUIRED_DEVICES = ["V100", "A100-40GB", "A100-80GB", "H100", "H800", "H200", "B200", "GB200",
                    "MI300X"]
REQUIRED_TECHS = ["nvlink2", "nvlink3", "nvlink4", "nvlink5", "pcie3", "pcie4", "pcie5", "pcie6",
                  "cxl2", "cxl3", "ib_hdr", "ib_ndr", "ib_xdr", "eth100", "eth200", "eth400",
                  "eth800", "ddr4", "ddr5"]


@pytest.mark.parametrize("name", REQUIRED_DEVICES)
def test_every_required_device_has_sourced_figures(name):
    d = DEVICES[name]
    assert d.hbm_capacity > 1e9 and d.hbm_bw > 1e11 and d.scaleup_bw > 1e10
    assert set(d.flops) <= set(PRECISIONS) and {"fp32", "fp16"} <= set(d.flops)
    for key in ("hbm_capacity", "hbm_bw", "scaleup_bw", *d.flops):
        assert d.sources.get(key), f"{name}.{key} has no source"
    assert d.scaleup_link in LINK_TECHS and d.host_link in LINK_TECHS


def test_reference_figures():
    # glennklockwood A100 / H100 in docs/references.md (dense, per direction)
    assert get_device("H100").flops["bf16"] == pytest.approx(989.4e12)
    assert get_device("H100").flops["fp8"] == pytest.approx(1978.9e12)
    assert get_device("A100-80GB").flops["bf16"] == pytest.approx(312e12)
    assert get_device("A100-80GB").hbm_bw == pytest.approx(2039e9)
    assert get_device("H200").hbm_capacity == 143771 * 2**20   # Driver-reported HBM totals
    assert get_device("B200").scaleup_bw == pytest.approx(900e9)
    assert get_device("MI300X").scaleup_bw == pytest.approx(448e9)


def test_a100_has_no_fp8_and_volta_no_bf16():
    assert "fp8" not in get_device("a100").flops
    assert "bf16" not in get_device("v100").flops
    with pytest.raises(SpecError, match="no 'fp8' peak"):
        get_device("a100").peak_flops("fp8")


def test_device_scaleup_matches_its_link_technology():
    for d in DEVICES.values():
        tech = LINK_TECHS[d.scaleup_link]
        per_gpu = tech.bw if tech.type == "nvlink" else tech.bw * 7  # MI300X: 7 peers
        assert per_gpu == pytest.approx(d.scaleup_bw), d.name


@pytest.mark.parametrize("alias,canonical", [("h100", "H100"), ("H100-SXM", "H100"),
                                             ("a100-80gb", "A100-80GB"), ("A100", "A100-80GB"),
                                             ("a100_40gb", "A100-40GB"), ("mi300x", "MI300X")])
def test_device_aliases_are_case_insensitive(alias, canonical):
    assert get_device(alias).name == canonical


def test_unknown_device_lists_valid_names():
    with pytest.raises(DessimError) as err:
        get_device("h1000")
    msg = str(err.value)
    assert "'h1000'" in msg and all(n in msg for n in REQUIRED_DEVICES)


@pytest.mark.parametrize("name", REQUIRED_TECHS)
def test_link_techs_are_sourced_and_valid(name):
    t = LINK_TECHS[name]
    assert t.type in LINK_TYPES
    assert t.bw > 0 and t.lat > 0 and 0 < t.efficiency <= 1
    assert t.bw_source and t.lat_source and t.efficiency_source


def test_efficiencies_follow_nccl_measurements():
    # nccl-tests#149, #212, #160, #290: measured busbw / raw per-direction bandwidth
    assert get_link_tech("nvlink3").capacity == pytest.approx(230e9)
    assert get_link_tech("nvlink4").capacity == pytest.approx(370e9)
    assert get_link_tech("ib_hdr").capacity == pytest.approx(24e9)
    assert get_link_tech("ib_ndr").capacity == pytest.approx(47e9)
    # no measurement: ideal
    assert get_link_tech("pcie5").efficiency == 1.0
    assert "no NCCL measurement" in get_link_tech("pcie5").efficiency_source


def test_link_bandwidths_per_direction():
    assert get_link_tech("pcie4").bw == pytest.approx(31.5e9)
    assert get_link_tech("pcie5").bw == pytest.approx(63e9)
    assert get_link_tech("eth400").bw == pytest.approx(50e9)
    assert get_link_tech("ib_ndr").bw == pytest.approx(50e9)
    assert get_link_tech("ddr").name == "ddr5" and not get_link_tech("ddr").duplex


def test_link_type_and_tech_errors_list_valid_values():
    assert check_link_type("nvlink") == "nvlink"
    with pytest.raises(SpecError, match="valid types: nvlink, pcie"):
        check_link_type("nvlnk")
    with pytest.raises(SpecError, match="unknown link technology 'nvlink9'.*nvlink4"):
        get_link_tech("nvlink9")
    assert set(LINK_TYPES) == {"nvlink", "pcie", "cxl", "ib", "ethernet", "infinity_fabric",
                               "ddr", "storage", "custom"}


#: Driver-reported HBM totals (docs/references.md): nvidia-smi's Total in MiB, rocm-smi's bytes.
DRIVER_TOTALS = {"V100": 32768 * 2**20, "A100-40GB": 40960 * 2**20, "A100-80GB": 81920 * 2**20,
                 "H100": 81559 * 2**20, "H800": 81559 * 2**20, "H200": 143771 * 2**20,
                 "B200": 183359 * 2**20, "MI300X": 206141652992}


@pytest.mark.parametrize("name", sorted(DRIVER_TOTALS))
def test_hbm_capacity_is_the_total_the_driver_reports(name):
    """Not the marketed "80GB" read as 80e9 B, which left an H100 6.5 % short of the memory
    nvidia-smi shows (81,559 MiB = 85.5e9 B) and refused layouts that fit real GPUs."""
    d = DEVICES[name]
    assert d.hbm_capacity == DRIVER_TOTALS[name]
    label = d.sources["hbm_capacity"][:3]
    assert label == ("[D]" if name == "H800" else "[C]")   # H800: H100's, same GH100 and HBM3
    assert "Driver-reported HBM totals" in d.sources["hbm_capacity"]


def test_h100_no_longer_understated_and_gb200_says_its_figure_is_unconfirmed():
    assert get_device("H100").hbm_capacity / 80e9 == pytest.approx(1.0690, abs=1e-4)
    gb200 = get_device("GB200").sources["hbm_capacity"]
    assert gb200.startswith("[U]") and "no public driver-reported total" in gb200


def test_a_layout_between_the_marketed_and_the_reported_capacity_now_fits_an_h100():
    """llama3-8b, tp1-pp1-dp8, 16 sequences, bf16 gradients: 79.16 GiB per GPU, above
    80e9 B = 74.51 GiB, below the H100's 79.65 GiB."""
    from dessim.errors import MemoryFitError
    from dessim.workload import plan_workload
    overrides = {"parallelism": {"tp": 1, "pp": 1, "dp": 8},
                 "training": {"global_batch": 16, "grad_precision": "bf16"}}
    plan, _ = plan_workload("llama3-8b", "dgx-h100:nodes=1", overrides=overrides)
    assert plan.capacity_bytes == 81559 * 2**20
    with pytest.raises(MemoryFitError, match="79.16GiB per GPU"):
        plan_workload("llama3-8b", "dgx-h100:nodes=1",
                      overrides={**overrides, "hbm_capacity": "80GB"})
