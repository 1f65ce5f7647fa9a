"""Calibration: the measured constants of dessim's models, as one validated file.

A calibration file (YAML) holds every constant that comes from a measurement rather than a
datasheet: how fast kernels run on each GPU (:mod:`dessim.engine.kernels`), how much of a
link's rate NCCL achieves and with what latency, and NCCL's per-call overhead. The built-in
defaults are such a file, ``calibration/default.yaml``, with a public source for every
value (docs/calibration.md); ``dessim calibrate`` writes one from a user's own measurements,
and every simulating command takes ``--calibration FILE``: its values replace the defaults
one by one (a file may hold only what it calibrated).

Units: times are strings with units (``"20us"``), efficiencies plain fractions; inside dessim
everything is SI. Unknown keys are errors ("did you mean"), so a typo never silently falls
back to a default. ``dessim schema calibration`` exports the schema for editors.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Mapping, get_args

from pydantic import BaseModel, BeforeValidator, Field, ValidationInfo, WithJsonSchema

from dessim.errors import SpecError, UnitError
from dessim.resources import find_data_file, read_yaml
from dessim.schema import TIME_SCHEMA, SpecModel, got, validate
from dessim.units import parse_time

__all__ = ["Calibration", "NcclCalibration", "LinkCalibration", "DeviceCalibration",
           "GemmCalibration", "AttentionTable", "default_calibration", "load_calibration",
           "read_calibration", "parse_calibration", "CALIBRATION_VERSION"]

CALIBRATION_VERSION = 1


def _time(value: object, info: ValidationInfo) -> float:
    """A time with units (``"20us"``) in seconds; bare numbers are refused (say the unit) —
    except when re-validating values already in seconds (:meth:`Calibration.over`)."""
    if (info.context or {}).get("seconds") and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"give a time with its unit, e.g. '20us' or '1.5ms' (got {value!r})")
    try:
        return parse_time(value)
    except UnitError as exc:
        raise ValueError(str(exc)) from None


def _fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    if not 0 < float(value) <= 1:
        raise ValueError(f"must be in (0, 1], got {value!r}")
    return float(value)


def _link_techs(value: object) -> object:
    """Keys of ``links`` as catalog technology names (aliases resolved: ``ndr`` -> ``ib_ndr``);
    an unknown name is an error listing the known ones."""
    from dessim.catalog.links import get_link_tech

    if not isinstance(value, Mapping):
        return value
    out: dict[object, object] = {}
    given: dict[str, object] = {}
    for key, link in value.items():
        try:
            name = get_link_tech(key).name
        except SpecError as exc:
            raise ValueError(str(exc).removeprefix("link technology: ")) from None
        if name in out:
            raise ValueError(f"{given[name]!r} and {key!r} both name link technology {name!r}")
        out[name], given[name] = link, key
    return out


Seconds = Annotated[float, BeforeValidator(_time), WithJsonSchema(TIME_SCHEMA)]
Fraction = Annotated[float, BeforeValidator(_fraction)]


class NcclCalibration(SpecModel):
    """Constants of the collective model beyond NCCL's own tuning tables."""

    #: Fixed cost of one collective call beyond NCCL's latency model, seconds, for calls
    #: whose ranks are all on one host.
    call_overhead: Seconds | None = None
    #: The same for calls whose ranks span hosts (None: ``call_overhead``), seconds.
    net_call_overhead: Seconds | None = None
    #: Host seconds one thread spends per GPU issuing one call when it drives several
    #: (:attr:`CollectiveSettings.gpus_per_process`, nccl-tests ``-g``): an isolated call's
    #: kernels start this far apart, so it pays ``(gpus_per_process − 1)`` times this;
    #: nccl-tests' loop issues a call every ``gpus_per_process`` times this
    #: (:mod:`dessim.collectives.loop`).
    host_overhead: Seconds | None = None
    source: str = ""


class LinkCalibration(SpecModel):
    """Achieved fraction of a link technology's rate, and its one-way latency."""

    efficiency: Fraction | None = None
    latency: Seconds | None = None
    source: str = ""


class GemmCalibration(SpecModel):
    """Parameters of the GEMM model of one GPU (:mod:`dessim.engine.kernels`)."""

    #: fraction of dense peak a large, well-shaped GEMM reaches (the ceiling)
    peak_efficiency: Fraction | None = None
    #: k at which the main loop reaches half its efficiency (tile prologue/epilogue)
    k_half: float | None = Field(default=None, gt=0)
    #: fixed time per GEMM kernel beyond launch (tail, epilogue), seconds
    fixed: Seconds | None = None
    #: the largest fraction of dense peak any shape reaches (a brute-force shape search)
    ceiling: Fraction | None = None
    source: str = ""


class AttentionTable(SpecModel):
    """Measured attention throughput of one implementation: TFLOP/s (forward + backward,
    FlashAttention's FLOP convention) by head dim, causal flag and sequence length."""

    #: keys "d<head_dim>" or "d<head_dim>-causal"; values map sequence length -> TFLOP/s
    tflops: dict[str, dict[int, float]]
    source: str = ""


class DeviceCalibration(SpecModel):
    """Kernel-model constants of one GPU."""

    gemm: GemmCalibration | None = None
    #: the GEMM model of FP8 GEMMs (fp8 tensor cores, 1-byte operands) when measured on their
    #: own; absent: ``gemm`` against the FP8 peak
    gemm_fp8: GemmCalibration | None = None
    attention: dict[str, AttentionTable] = Field(default_factory=dict)
    #: achieved fraction of HBM bandwidth of memory-bound kernels
    memory_efficiency: Fraction | None = None
    #: per-kernel launch and scheduling gap, seconds
    launch_overhead: Seconds | None = None
    source: str = ""


class Calibration(SpecModel):
    """A calibration file (see the module docstring)."""

    version: int = CALIBRATION_VERSION
    name: str = "calibration"
    description: str = ""
    nccl: NcclCalibration = NcclCalibration()
    #: by catalog technology name (dessim.catalog.links; aliases are resolved)
    links: Annotated[dict[str, LinkCalibration], BeforeValidator(_link_techs)] = \
        Field(default_factory=dict)
    devices: dict[str, DeviceCalibration] = Field(default_factory=dict)

    # ------------------------------------------------------------------ merging
    def over(self, base: "Calibration") -> "Calibration":
        """This calibration's values where given, ``base``'s elsewhere (field by field)."""
        merged = _merge(base.model_dump(exclude_none=True), self.model_dump(exclude_none=True,
                                                                            exclude_defaults=True))
        merged["name"] = self.name
        return Calibration.model_validate(merged, context={"seconds": True})

    def fingerprint(self) -> str:
        """A short hash of the values (shown in summaries and sweep tables)."""
        text = json.dumps(self.model_dump(exclude={"description"}), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def label(self) -> str:
        """``name@fingerprint`` for outputs."""
        return f"{self.name}@{self.fingerprint()}"

    # ------------------------------------------------------------------ lookups
    def device(self, name: str) -> DeviceCalibration:
        """The constants of GPU ``name`` (empty if the file has none)."""
        return self.devices.get(name, DeviceCalibration())

    def link(self, tech: str) -> LinkCalibration:
        return self.links.get(tech, LinkCalibration())

    # ------------------------------------------------------------------ writing
    def to_document(self) -> dict[str, Any]:
        """The file form of this calibration: what :func:`parse_calibration` reads back into an
        equal calibration, with times as strings with units (``"20us"``) and unset values left
        out."""
        return _document(self)


def _is_time(info: Any) -> bool:
    """Whether a field holds :data:`Seconds` (optionally ``| None``)."""
    return info.annotation == Seconds or Seconds in get_args(info.annotation)


def _time_text(seconds: float) -> str:
    """Seconds as microseconds with 9 significant digits (parse_time reads it back)."""
    return f"{seconds * 1e6:.9g}us"


def _document(model: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if value is None or value == "" or value == {}:
            continue
        if isinstance(value, BaseModel):
            value = _document(value)
            if not value:
                continue
        elif isinstance(value, dict):
            value = {k: _document(v) if isinstance(v, BaseModel) else v for k, v in value.items()}
        elif _is_time(info):
            value = _time_text(value)
        out[name] = value
    return out


def _merge(base: dict, top: Mapping) -> dict:
    """``top``'s values over ``base``'s, key by key. A section that ``top`` changes without
    giving its own ``source`` loses ``base``'s: that text described the values replaced."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
            if "source" not in v and "source" in out[k] and any(
                    x != "source" and not isinstance(y, Mapping) for x, y in v.items()):
                out[k]["source"] = ""
        else:
            out[k] = v
    return out


def parse_calibration(doc: object, where: str = "calibration") -> Calibration:
    """A :class:`Calibration` from a parsed document; :class:`SpecError` naming the keys."""
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(Calibration.model_fields)}, "
                        f"got {got(doc, top=True) if doc is None else type(doc).__name__}")
    version = doc.get("version", CALIBRATION_VERSION)
    if version != CALIBRATION_VERSION:
        raise SpecError(f"{where}: version {version!r} is not supported (this dessim reads "
                        f"version {CALIBRATION_VERSION})")
    return validate(Calibration, dict(doc), where)


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The built-in calibration (``calibration/default.yaml``), read once."""
    path = find_data_file("calibration", "default")
    if path is None:
        raise SpecError("the built-in calibration file calibration/default.yaml is missing "
                        "from this installation")
    return parse_calibration(read_yaml(path, "calibration file"), str(path))


def read_calibration(source: "str | Path | Calibration") -> Calibration:
    """A user's calibration as it stands (a file path, or a :class:`Calibration` as is), not
    merged with the built-in one: what ``--calibration FILE`` names. :class:`SpecError` for a
    missing file or a bad value."""
    if isinstance(source, Calibration):
        return source
    path = Path(source)
    if path.is_dir() or not path.exists():
        raise SpecError(f"calibration file {str(path)!r} "
                        + ("is a directory" if path.is_dir() else "does not exist"))
    return parse_calibration(read_yaml(path, "calibration file"), str(path))


def load_calibration(source: "str | Path | Calibration | None" = None) -> Calibration:
    """The calibration to run with: the built-in defaults, overridden by ``source`` (a file
    path or a :class:`Calibration`) where it gives values."""
    base = default_calibration()
    if source is None:
        return base
    return read_calibration(source).over(base)
