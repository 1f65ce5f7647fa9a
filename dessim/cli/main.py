"""The ``dessim`` command.

Each sub-command lives in its own module of this package and is registered in
:data:`COMMAND_MODULES`; the module exposes a click command or group named ``command``.
User errors (:class:`~dessim.errors.DessimError`) are printed as one ``error:`` line and
exit with status 2 — never as a traceback.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import click

from dessim.cli.common import check_outputs
from dessim.errors import DessimError

#: Sub-command modules, each defining ``command`` (a click command or group).
COMMAND_MODULES: tuple[str, ...] = (
    "dessim.cli.simulate_cmd",
    "dessim.cli.megatron_cmd",
    "dessim.cli.train_cmd",
    "dessim.cli.workload_cmd",
    "dessim.cli.topology_cmd",
    "dessim.cli.collective_cmd",
    "dessim.cli.compare_cmd",
    "dessim.cli.run_cmd",
    "dessim.cli.replay_cmd",
    "dessim.cli.sweep_cmd",
    "dessim.cli.explore_cmd",
    "dessim.cli.cluster_cmd",
    "dessim.cli.calibrate_cmd",
    "dessim.cli.schema_cmd",
)


class DessimGroup(click.Group):
    """A click group that turns DessimErrors and click's usage errors (a bad flag value, an
    unknown option, a missing argument) into one clean ``error:`` line, exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:     # dessim's own options (dessim --bogus)
            _usage_error(exc, ctx)
            raise                           # pragma: no cover - _usage_error exits

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except DessimError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except click.UsageError as exc:
            _usage_error(exc, ctx)


def _usage_error(exc: click.UsageError, ctx: click.Context) -> None:
    """Print click's usage error as one ``error:`` line with where to find help; exit 2. A
    group called bare keeps click's answer: its help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc
    where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
    click.echo(f"error: {exc.format_message()} (see '{where} --help')", err=True)
    ctx.exit(exc.exit_code)


@click.group("dessim", cls=DessimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dessim")
def cli() -> None:
    """dessim: discrete-event simulator of deep-learning training clusters.

    Units: sizes in bytes (4096, 64KiB, 1.5MB, 1GiB), bandwidths per direction
    (50GB/s, 400Gb/s), times (500ns, 1.5us, 2ms). GB = 1e9 bytes, GiB = 2^30 bytes.
    """


def _guarded(command: click.Command) -> click.Command:
    """``command`` (each command of a group) checking its outputs before it runs: none
    overwrites an input or another output, each can be written in a format it knows
    (:func:`~dessim.cli.common.check_outputs`)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _guarded(sub)
        return command
    callback = command.callback
    if callback is not None:
        @functools.wraps(callback)
        def checked(*args: Any, **kw: Any) -> Any:
            check_outputs(click.get_current_context())
            return callback(*args, **kw)
        command.callback = checked
    return command


def _register() -> None:
    for name in COMMAND_MODULES:
        cli.add_command(_guarded(importlib.import_module(name).command))


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dessim`` console script."""
    try:
        cli.main(args=argv, prog_name="dessim", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
