"""User-facing errors.

Every error that a bad input can cause (a typo in a spec, a disconnected topology,
an impossible parallel layout) is raised as a subclass of :class:`DessimError` with a
message that names the offending value and where it came from. The CLI prints the
message and exits with status 2; it never shows a traceback for these.

Bugs inside dessim are *not* DessimErrors: they surface as ordinary exceptions.
"""

from __future__ import annotations

__all__ = [
    "DessimError",
    "UnitError",
    "SpecError",
    "TopologyError",
    "NetworkError",
    "CollectiveError",
    "TaskGraphError",
    "WorkloadError",
    "MemoryFitError",
    "TraceError",
    "SweepError",
    "CalibrationError",
    "OutputError",
    "LimitError",
]


class DessimError(Exception):
    """Base class of every error caused by user input."""


class UnitError(DessimError, ValueError):
    """A quantity with units (size, bandwidth, time) could not be parsed or is out of range."""


class SpecError(DessimError, ValueError):
    """A specification (inline spec string, YAML or JSON file) is malformed."""


class TopologyError(DessimError):
    """A topology is invalid: unknown node, disconnected GPU, bad link figures, ..."""


class NetworkError(DessimError):
    """A transfer cannot be simulated: unknown endpoint, no route, negative size, ..."""


class CollectiveError(DessimError):
    """A collective cannot run: unknown operation/algorithm, bad group, bad size."""


class TaskGraphError(DessimError):
    """A task graph is invalid: cycle, unmatched send/recv, inconsistent collective."""


class WorkloadError(DessimError):
    """A model or parallel layout is invalid (e.g. TP does not divide the head count)."""


class MemoryFitError(WorkloadError):
    """A parallel layout does not fit in the device memory."""


class TraceError(DessimError):
    """An execution trace (e.g. Chakra ET) is malformed."""


class SweepError(DessimError):
    """A sweep specification is invalid."""


class CalibrationError(DessimError):
    """Measurements cannot calibrate the model: too few GPUs, no technology to fit, ..."""


class OutputError(DessimError):
    """An output cannot be written: its directory is missing or read-only, its format is
    unknown, or the optional package that writes it is not installed. Raised before any
    simulation work, so a bad output path never costs a run."""


class LimitError(DessimError):
    """An input asks for more than a documented resource limit (e.g. a topology with more
    nodes than :data:`dessim.resources.LIMITS` allows); the message says how to raise it."""
