"""``--precision`` and ``--moe-dispatch`` (simulate, workload show, train): the workload file's
``model.precision`` and ``training.moe_dispatch`` from the command line, shown in the
reports; ``--moe-dispatch`` on a dense model is an error, not a silent no-op."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from dessim.cli.main import cli
from moe_helpers import moe_doc

TOPO = ["-t", "dgx-h100:nodes=1"]


def _run(args: list[str]) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture
def moe(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(moe_doc({"distribution": "zipf", "exponent": 1.0}, "nccl", ranks=8)))
    return str(path)


def test_precision_flag_is_the_files_precision():
    base = ["simulate", "gpt3-1.3b", *TOPO, "--global-batch", "32", "--json"]
    bf16, fp8 = (json.loads(_run([*base, *extra])) for extra in ([], ["--precision", "fp8"]))
    assert (bf16["precision"], fp8["precision"]) == ("bf16", "fp8")
    assert fp8["iteration_s"] < bf16["iteration_s"]      # the H100's FP8 tensor cores
    text = _run(["simulate", "gpt3-1.3b", *TOPO, "--global-batch", "32", "--precision", "fp8"])
    assert "precision fp8 (fp32 gradients), calibration" in text


def test_grad_precision_flag_is_the_files_training_grad_precision():
    """--grad-precision bf16 (Megatron's --grad-reduce-in-bf16): the bf16 recipe's fp32
    gradients become bf16 — half the gradient memory (ZeRO-1: unsharded), shown in the reports;
    on fp16 weights it is refused with one error line naming the key."""
    base = ["simulate", "gpt3-1.3b", *TOPO, "--global-batch", "32", "--json"]
    fp32, bf16 = (json.loads(_run([*base, *extra])) for extra in ([], ["--grad-precision", "bf16"]))
    assert (fp32["grad_precision"], bf16["grad_precision"]) == ("fp32", "bf16")
    grads = [r["memory_per_gpu_bytes"]["gradients"] for r in (fp32, bf16)]
    assert grads[0] == 2 * grads[1] > 0
    text = _run(["workload", "show", "gpt3-1.3b", "--grad-precision", "bf16"])
    assert "precision   bf16 (bf16 gradients)" in text
    res = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", *TOPO, "--precision", "fp16", "--grad-precision", "bf16"])
    assert res.exit_code == 2 and res.output.startswith("error: ") and "training.grad_precision" in res.output


def test_precision_flag_is_checked_against_the_gpu():
    res = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", "-t", "dgx-a100:nodes=1", "--precision", "fp8"])
    assert res.exit_code == 2 and res.output.startswith("error: ") and "fp8" in res.output


def test_moe_dispatch_flag_changes_the_all_to_all(moe):
    base = ["simulate", moe, *TOPO, "--json"]
    nccl, deepep = (json.loads(_run([*base, "--moe-dispatch", d])) for d in ("nccl", "deepep"))
    assert nccl["exposed_comm_s"]["ep"] != deepep["exposed_comm_s"]["ep"]
    shown = _run(["workload", "show", moe, *TOPO, "--moe-dispatch", "deepep", "--precision", "fp8"])
    assert "  precision   fp8 (fp32 gradients), MoE all-to-all deepep" in shown


def test_moe_dispatch_on_a_dense_model_is_an_error():
    res = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", *TOPO, "--moe-dispatch", "deepep"])
    assert res.exit_code == 2
    assert res.output.splitlines() == [
        "error: workload 'gpt3-1.3b' is a dense model (experts=1): moe_dispatch (--moe-dispatch) "
        "applies to mixture-of-experts models only (e.g. mixtral-8x7b, deepseek-v3)"]


def test_workload_show_reports_the_routing_load_and_dropped_tokens(tmp_path):
    """A capacity factor drops token copies, which skip their experts and are not in the model
    FLOPs; ``workload show`` says how many (and the hottest EP rank's load), so a lower MFU or
    a faster iteration is not read as a property of the hardware. 64 experts on 8 EP ranks,
    capacity factor 0.5 with uniform routing: half of the copies dropped, every rank at half
    its balanced load."""
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(moe_doc({"distribution": "uniform", "capacity_factor": 0.5},
                                           "nccl", ranks=8)))
    doc = json.loads(_run(["workload", "show", str(path), "--json"]))
    assert doc["moe_routing"] == {"distribution": "uniform", "capacity_factor": 0.5,
                                  "load_factor": 0.5, "dropped_fraction": 0.5}
    text = _run(["workload", "show", str(path)])
    assert ("routing     uniform, capacity factor 0.5: the most loaded EP rank's experts process "
            "0.5 x top_k·T token copies (balanced: 1), 50% of token copies dropped") in text
    path.write_text(yaml.safe_dump(moe_doc({"distribution": "uniform"}, "nccl", ranks=8)))
    assert "routing " not in _run(["workload", "show", str(path)])    # balanced: nothing to say
    assert json.loads(_run(["workload", "show", str(path), "--json"]))["moe_routing"]["dropped_fraction"] == 0


def test_workload_show_says_a_precision_the_gpu_cannot_run():
    """``simulate`` refuses FP8 on an A100 (no FP8 tensor cores); ``workload show`` printed
    its FLOPs and memory with 'fits' and no word of it. It now says why it would not run."""
    doc = json.loads(_run(["workload", "show", "gpt3-1.3b", "--gpus", "8", "--device", "A100",
                           "--precision", "fp8", "--json"]))
    assert doc["precision_error"].startswith("precision 'fp8' needs fp8 tensor cores, which A100-80GB")
    text = _run(["workload", "show", "gpt3-1.3b", "--gpus", "8", "--device", "A100", "--precision", "fp8"])
    assert "  not runnable: precision 'fp8' needs fp8 tensor cores" in text
    h100 = json.loads(_run(["workload", "show", "gpt3-1.3b", "--gpus", "8", "--device", "H100",
                            "--precision", "fp8", "--json"]))
    assert h100["precision_error"] is None
