"""``dessim schema KIND``: the JSON Schema of a spec file type, for editors (YAML language
servers, JSON Schema validators).

Each spec type has one pydantic model at the layer that loads it (:mod:`dessim.schema`);
:data:`SPEC_TYPES` names it. The output is deterministic: keys sorted, the same bytes on
every run.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from dessim.cli.common import output_file, write_file
from dessim.errors import SpecError
from dessim.schema import schema_json

__all__ = ["SpecType", "SPEC_TYPES", "spec_model", "command"]


@dataclass(frozen=True)
class SpecType:
    """A kind of spec file: where its model lives and what it describes."""

    module: str
    model: str
    help: str

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.model)


#: Spec file types by the name ``dessim schema`` takes.
SPEC_TYPES: dict[str, SpecType] = {
    "topology": SpecType("dessim.topology.spec", "TopologyFile", "topology files (topologies/*.yaml)"),
    "workload": SpecType("dessim.workload.kinds", "WorkloadFile", "workload files of every kind "
                         "(workloads/*.yaml)"),
    "sweep": SpecType("dessim.sweep.spec", "SweepFile", "sweep specs (dessim sweep)"),
    "cluster": SpecType("dessim.workload.jobtrace", "ClusterDocument", "cluster files: static jobs or "
                        "a job trace (dessim cluster)"),
    "calibration": SpecType("dessim.catalog.calibration", "Calibration", "calibration files "
                            "(--calibration, dessim calibrate)"),
}


def spec_model(kind: str) -> Any:
    """The model of spec type ``kind``; a :class:`SpecError` listing the types otherwise."""
    spec = SPEC_TYPES.get(kind)
    if spec is None:
        hint = difflib.get_close_matches(kind, SPEC_TYPES, n=1)
        raise SpecError(f"schema: unknown spec type {kind!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                        + f"; valid: {', '.join(SPEC_TYPES)}")
    return spec.load()


@click.command("schema", epilog="Example: dessim schema workload -o workload.schema.json")
@click.argument("kind", metavar="KIND")
@click.option("--output", "-o", type=output_file("schema"), default=None,
              help="Write the schema to this .json file instead of printing it.")
def command(kind: str, output: Any) -> None:
    """Print the JSON Schema (draft 2020-12) of a spec file type KIND: topology, workload,
    sweep, cluster or calibration. Quantities with units are strings in the schema
    ("50GB/s", "25MiB", "1us"): sizes in bytes, bandwidths in bytes/second, times in seconds."""
    text = schema_json(spec_model(kind), f"dessim {kind} file")
    if output is None:
        click.echo(text, nl=False)
        return
    write_file(output, "--output", lambda p: Path(p).write_text(text, encoding="utf-8"))
    click.echo(f"wrote {output}")
