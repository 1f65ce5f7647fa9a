"""``dessim calibrate``: fit a calibration file to measurements from the user's own cluster."""

from __future__ import annotations

import json

import click

from dessim.cli.common import TOPOLOGY_HELP, output_file, write_file


def _print_schema(ctx: click.Context) -> None:
    """What ``dessim schema calibration`` prints."""
    from dessim.cli.schema_cmd import spec_model
    from dessim.schema import schema_json

    click.echo(schema_json(spec_model("calibration"), "dessim calibration file"), nl=False)
    ctx.exit(0)


@click.command("calibrate", epilog="Example: dessim calibrate --nccl-tests ar_1node.txt "
               "--nccl-tests ar_2nodes.txt --topology dgx-h100:nodes=2 --kernels gemms.csv "
               "-o mycluster.yaml")
@click.option("--schema", is_flag=True, is_eager=True, expose_value=False,
              callback=lambda ctx, _p, v: _print_schema(ctx) if v else None,
              help="Print the JSON Schema of calibration files (for editors) and exit.")
@click.option("--nccl-tests", "nccl_tests", multiple=True, type=click.Path(dir_okay=False),
              help="nccl-tests output (all_reduce_perf and friends, as printed, or its -J JSON); "
                   "repeatable. Fits link efficiencies, NCCL's call overhead and, with a "
                   "single-host and a multi-host log, the scale-out link latency.")
@click.option("--kernels", multiple=True, type=click.Path(dir_okay=False),
              help="CSV of measured kernel times (kernel, shape, dtype, time_us, ...; "
                   "docs/calibration.md); repeatable. Fits GEMM, attention and memory constants "
                   "per GPU.")
@click.option("--kineto", multiple=True, type=click.Path(dir_okay=False),
              help="PyTorch profiler (Kineto) trace JSON; repeatable. Its GEMM, attention and "
                   "memory kernels of known shape count as measured kernels.")
@click.option("--topology", "-t", default=None,
              help=TOPOLOGY_HELP + " Where the nccl-tests logs ran: each log runs on its first "
                   "N GPUs (N = its ranks). Needed with --nccl-tests.")
@click.option("--gpu", default=None, help="GPU of the kernel measurements that name none "
                                          "(H100, A100, ...).")
@click.option("--base", default=None, type=click.Path(dir_okay=False),
              help="Calibration file to start from; its values stay in the output where "
                   "nothing replaces them (default: start from the built-in one).")
@click.option("--algo", default="auto", show_default=True,
              help="Algorithm the nccl-tests logs ran with (NCCL_ALGO; auto: NCCL's choice).")
@click.option("--protocol", type=click.Choice(["auto", "LL", "LL128", "Simple"],
                                              case_sensitive=False),
              default="auto", show_default=True,
              help="Protocol the nccl-tests logs ran with (NCCL_PROTO).")
@click.option("--nccl-ranks", type=click.IntRange(min=2), default=None,
              help="Rank count of nccl-tests logs that do not show it (no '#  Rank' lines).")
@click.option("--name", default=None, help="Name of the calibration (default: OUT's stem); "
                                           "outputs show NAME@fingerprint.")
@click.option("--out", "-o", required=True,
              type=output_file("calibration"),
              help="The calibration YAML to write (read it back with --calibration).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the fitted constants, notes and residuals as one JSON object.")
def command(nccl_tests: tuple[str, ...], kernels: tuple[str, ...], kineto: tuple[str, ...],
            topology: str | None, gpu: str | None, base: str | None, algo: str, protocol: str,
            nccl_ranks: int | None, name: str | None, out: str, as_json: bool) -> None:
    """Fit dessim's measured constants to your own cluster and write a calibration file.

    Reads nccl-tests logs, kernel-time CSVs and Kineto traces (every input is checked before
    anything is fitted), simulates each nccl-tests log on --topology, fits link efficiencies
    and latencies, NCCL's per-call overhead and per-GPU GEMM, attention and memory constants,
    prints every input point with its measured and model time and residual, and writes OUT:
    a calibration file that every simulating command accepts with --calibration OUT.
    """
    from pathlib import Path

    from dessim.calibrate import calibrate, read_inputs
    from dessim.catalog.calibration import load_calibration
    from dessim.collectives import CollectiveSettings

    CollectiveSettings(algo=algo, protocol=protocol)        # a bad --algo fails before any work
    if not (nccl_tests or kernels or kineto):
        raise click.UsageError("give at least one input: --nccl-tests, --kernels or --kineto")
    if nccl_tests and topology is None:
        raise click.UsageError("--nccl-tests needs --topology (where the logs ran, e.g. "
                               "dgx-h100:nodes=2)")
    inputs = read_inputs(nccl_tests, kernels, kineto, nccl_ranks=nccl_ranks)
    result = calibrate(inputs, topology, base, gpu=gpu, algo=algo, protocol=protocol,
                       name=name or Path(out).stem)
    path = Path(write_file(out, "--out", result.write))
    label = load_calibration(path).label()     # as every run with --calibration OUT shows it
    if as_json:
        click.echo(json.dumps({
            "calibration": label, "file": str(path),
            "fitted": [vars(f) for f in result.fitted], "notes": result.notes,
            "residuals": [{**vars(r), "residual": r.residual} for r in result.residuals]},
            indent=2))
        return
    click.echo(result.report())
    click.echo(f"wrote {path} (calibration {label}); use it with --calibration {path}")
