"""Spec schemas: the one way every spec document (topology, workload, sweep, cluster and
calibration files) is checked against its pydantic model.

Each spec type has one pydantic model at the layer of the code that loads it (extra keys
forbidden, a description naming the unit of every field). Its loader calls
:func:`validate` before any work: a bad document raises a :class:`~dessim.errors.SpecError`
(or the subclass the loader asks for) whose message names the file, the key path and the
bad value, with "did you mean 'x'?" for a misspelled key. :func:`schema_json` exports the
model as JSON Schema for editors (``dessim schema KIND``).

Quantities with units (``"50GB/s"``, ``"25MiB"``, ``"1us"``, counts like ``"1k"``) stay
strings in the schema (with a pattern and examples); :mod:`dessim.units` parses them, in the
validators the annotated types below attach (:data:`Size`, :data:`Bandwidth`, :data:`Time`,
:func:`count`), so a validated model holds SI values: bytes, bytes/second, seconds.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Callable, Literal, Mapping, TypeVar, Union, get_args, get_origin

from pydantic import (BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError,
                      ValidationInfo, WithJsonSchema)

from dessim.errors import DessimError, SpecError
from dessim.units import MAX_COUNT, parse_bandwidth, parse_count, parse_size, parse_time

__all__ = ["SpecModel", "validate", "readable", "got", "did_you_mean", "unknown_key", "schema_of", "schema_json", "inline_schema", "tagged", "count",
           "choice", "converted", "described", "Size", "Bandwidth", "Time", "Count", "PositiveCount", "Flag", "Text",
           "Number", "SIZE_SCHEMA", "BANDWIDTH_SCHEMA", "TIME_SCHEMA"]

M = TypeVar("M")


class SpecModel(BaseModel):
    """Base of every spec model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


# ---------------------------------------------------------------- validated value types
class _Raised(ValueError):
    """A :class:`DessimError` that is not a ValueError, carried through pydantic."""

    def __init__(self, error: DessimError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class _LazyJsonSchema:
    """An annotation whose JSON Schema ``make()`` builds when a schema is exported."""

    make: Callable[[], dict[str, Any]]

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return self.make()


def described(tp: Any, make: Callable[[], dict[str, Any]]) -> Any:
    """``tp`` whose JSON Schema is ``make()``, built only when a schema is exported (a
    schema made of many models, kept out of import time)."""
    return Annotated[tp, _LazyJsonSchema(make)]


def converted(parse: Callable[[Any, str], Any], schema: Mapping[str, Any],
              python: Any = Any) -> Any:
    """An annotated type whose values go through ``parse(value, key)`` (a :mod:`dessim.units`
    parser or a domain converter raising a ValueError subclass) and whose JSON Schema is
    ``schema``: human forms stay strings for editors, the model holds the parsed value."""

    def run(value: Any, info: ValidationInfo) -> Any:
        try:
            return parse(value, info.field_name or "value")
        except ValueError:
            raise
        except DessimError as exc:      # e.g. a WorkloadError: reported with the key path
            raise _Raised(exc) from None

    return Annotated[python, BeforeValidator(run), WithJsonSchema(dict(schema))]


_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*"
#: JSON Schema of a size in bytes (:data:`Size`).
SIZE_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 0},
                         {"type": "string", "pattern": _NUMBER + r"(([kKMGTPE]i?)?[bB]?|bytes?)\s*$"}],
               "description": "bytes: a number, or a string with a unit (25MiB, 1.5GB, 4096B)",
               "examples": ["25MiB", "1GB"]}
#: JSON Schema of a bandwidth in bytes/second (:data:`Bandwidth`).
BANDWIDTH_SCHEMA = {"anyOf": [{"type": "string", "pattern": _NUMBER + r"([kKMGTPE]i?)?[bB]?(/s|ps)\s*$"},
                              {"type": "number", "exclusiveMinimum": 0}],
                    "description": "bytes/second: write the unit, 50GB/s (bytes) or 400Gb/s (bits); "
                                   "a bare number is bytes/second",
                    "examples": ["50GB/s", "400Gb/s"]}
#: JSON Schema of a time in seconds (:data:`Time`).
TIME_SCHEMA = {"anyOf": [{"type": "string", "pattern": _NUMBER + r"(ps|ns|us|µs|ms|s|sec|min|h)\s*$"},
                         {"type": "number", "minimum": 0}],
               "description": "seconds: write the unit, 500ns, 1.5us, 2ms; a bare number is seconds",
               "examples": ["500ns", "1us"]}

#: Bytes (int): ``4096`` or ``"25MiB"``.
Size = converted(lambda v, k: parse_size(v, k), SIZE_SCHEMA, int)
#: Bytes/second (float): ``"50GB/s"``, ``"400Gb/s"``.
Bandwidth = converted(lambda v, k: parse_bandwidth(v, k), BANDWIDTH_SCHEMA, float)
#: Seconds (float): ``"500ns"``, ``"1.5us"``.
Time = converted(lambda v, k: parse_time(v, k), TIME_SCHEMA, float)


def count(minimum: int = 0) -> Any:
    """A whole number >= ``minimum``: ``8``, ``"8"`` or ``"1k"`` (decimal multipliers)."""
    return converted(lambda v, k: parse_count(v, k, minimum=minimum, maximum=MAX_COUNT),
                     {"anyOf": [{"type": "integer", "minimum": minimum, "maximum": MAX_COUNT},
                                {"type": "string", "pattern": _NUMBER + r"[kMGTP]?\s*$"}],
                      "description": f"a whole number >= {minimum} (8, or '1k' = 1000)"}, int)


Count = count(0)
PositiveCount = count(1)


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


#: true or false (not "yes", not 1).
Flag = converted(_flag, {"type": "boolean"}, bool)
#: A string (not a number that YAML read from an unquoted value).
Text = converted(_text, {"type": "string"}, str)
#: A finite number (int or float, not a bool or a string).
Number = converted(_number, {"type": "number"}, float)


def choice(names: Any) -> Any:
    """One of ``names`` (a registry's keys): a ``Literal`` of them, so the schema lists them."""
    return Literal[tuple(names)]  # type: ignore[valid-type]


# ---------------------------------------------------------------- validation
def validate(model: type[M] | Any, data: Any, where: str, error: type[Exception] | None = SpecError,
             context: Mapping[str, Any] | None = None, at: str = "") -> M:
    """``data`` validated by ``model`` (a :class:`SpecModel` or any type pydantic validates);
    ``error`` (default :class:`SpecError`; None: the class the value parsers raised, see
    :func:`readable`) at ``where`` (the file) naming every problem by its key path (``at``:
    the path of ``data`` itself in its file, e.g. ``base``)."""
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data, context=dict(context or {}))
        return TypeAdapter(model).validate_python(data, context=dict(context or {}))
    except ValidationError as exc:
        raise readable(exc, where, model, error, at) from None


def _loc(parts: tuple) -> str:
    """``model.routing.counts`` / ``jobs[0].gpus`` from a pydantic location."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def did_you_mean(word: str, names: Any) -> str:
    """`` (did you mean 'x'?)`` for the name of ``names`` closest to ``word`` (ignoring case),
    or "" when none is close."""
    by_lower = {str(n).lower(): str(n) for n in names}
    hint = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[hint[0]]!r}?)" if hint else ""


def got(value: Any, top: bool = False) -> str:
    """What a document held where something else was expected, for a message: ``None`` (an
    empty file, or a key with nothing after its colon) in words rather than Python's."""
    if value is None:
        return "nothing (the file is empty)" if top else "nothing (an empty value)"
    return repr(value)


def readable(exc: ValidationError, where: str, root: Any, error: type[Exception] | None = SpecError,
             at: str = "") -> Exception:
    """One line per problem of ``exc``, naming the key path and the bad value, with a "did you
    mean" and the valid keys for an unknown key (``root``: the validated model). Raised as
    ``error``; with ``error=None`` as the :class:`DessimError` subclass the value parsers
    raised (a :class:`~dessim.errors.UnitError` for a bad ``"50GB"`` bandwidth) when every
    problem is one, else as a :class:`SpecError`."""
    lines, raised = [], set()
    for err in exc.errors():
        cause = err.get("ctx", {}).get("error")
        cause = cause.error if isinstance(cause, _Raised) else cause
        raised.add(type(cause) if isinstance(cause, DessimError) else SpecError)
        loc, _ = _walk(root, tuple(err["loc"]))
        path = _loc((at, *loc) if at else loc) or "top level"
        kind = err["type"]
        parent = _loc((at, *loc[:-1]) if at else loc[:-1])
        head = f"{parent}: " if parent else ""
        if kind == "extra_forbidden":
            key = str(loc[-1])
            valid = _fields(_walk(root, tuple(err["loc"])[:-1])[1])
            lines.append(f"{head}unknown key {key!r}" + did_you_mean(key, valid)
                         + (f"; valid keys: {', '.join(valid)}" if valid else ""))
        elif kind == "missing":
            model = _model_of(_walk(root, tuple(err["loc"])[:-1])[1])
            info = model.model_fields.get(str(loc[-1])) if model is not None else None
            what = info.description if info is not None and info.description else "required"
            lines.append(f"{head}lacks {loc[-1]} ({what})")
        elif kind == "literal_error":
            lines.append(f"{path}: {err['input']!r} is unknown; valid: {err['ctx']['expected']}")
        elif kind == "value_error":
            msg = str(err.get("ctx", {}).get("error", err["msg"].removeprefix("Value error, ")))
            name = str(loc[-1]) if loc else ""
            lines.append(f"{path}: {msg.removeprefix(f'{name}: ') if name else msg}")
        elif kind in ("model_type", "dict_type"):
            valid = _fields(_walk(root, tuple(err["loc"]))[1])
            lines.append(f"{path}: expected a mapping" + (f" with keys {', '.join(valid)}" if valid else "")
                         + f", got {got(err['input'], top=not loc)}")
        else:
            lines.append(f"{path}: {err['msg'][:1].lower()}{err['msg'][1:]}, got {err['input']!r}")
    # the parsers' own error class (UnitError, TopologyError, ...) when they all agree
    kind = error or (raised.pop() if len(raised) == 1 else SpecError)
    return kind(f"{where}: " + "; ".join(dict.fromkeys(lines)))


def tagged(members: Mapping[str, Any], pick: Callable[[Any], str | None], what: str) -> Any:
    """A union of ``members`` (tag → model) of which ``pick(document)`` chooses one (its tag;
    None: none fits, an error naming ``what``), so that a document is validated by that model
    alone; the JSON Schema is ``oneOf`` the members."""
    from pydantic import Discriminator, Tag

    return Annotated[Union[tuple(Annotated[m, Tag(t)] for t, m in members.items())],  # type: ignore[misc]
                     Discriminator(pick, custom_error_type="no_member",
                                   custom_error_message=f"not {what}")]


def _members(tp: Any) -> list[tuple[Any, str | None]]:
    """The members of a union (``tp`` without ``Annotated``) but None, with their tag, if any."""
    out = []
    for member in get_args(tp):
        if member is type(None):
            continue
        tag = None
        if get_origin(member) is Annotated:
            tag = next((m.tag for m in get_args(member)[1:] if hasattr(m, "tag")), None)
        out.append((member, tag))
    return out


def _unannotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _walk(root: Any, loc: tuple) -> tuple[tuple, Any]:
    """(the key path of a pydantic location ``loc`` in a document of ``root``, the type
    there). Guided by the types, so that the labels pydantic puts into the locations of
    union members (a :func:`tagged` union's tag, ``str``, ``list[str]``) are dropped and
    every other part, whatever its spelling, is kept as a key."""
    keys: list[Any] = []
    tp: Any = root
    parts = list(loc)
    while parts:
        tp = _unannotated(tp)
        if get_origin(tp) in (Union, UnionType):
            members = _members(tp)
            if len(members) == 1:                   # X | None: no label
                tp = members[0][0]
                continue
            label = parts.pop(0)                    # several members: pydantic names the one
            tp = next((m for m, tag in members if tag is not None and tag == label), Any)
            continue
        part = parts.pop(0)
        keys.append(part)
        origin = get_origin(tp)
        if origin is dict or origin is Mapping:
            tp = get_args(tp)[1]
        elif origin in (list, tuple):
            tp = get_args(tp)[0]
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            info = tp.model_fields.get(str(part))
            tp = info.annotation if info is not None else Any
        else:
            tp = Any
    return tuple(keys), tp


def _model_of(tp: Any) -> type[BaseModel] | None:
    """The model ``tp`` holds (through ``Annotated`` and ``| None``), or None."""
    tp = _unannotated(tp)
    if get_origin(tp) in (Union, UnionType):
        members = _members(tp)
        tp = _unannotated(members[0][0]) if len(members) == 1 else None
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _fields(tp: Any) -> list[str]:
    """The valid keys of a mapping of type ``tp`` (none if it is not a model)."""
    model = _model_of(tp)
    return list(model.model_fields) if model is not None else []


def unknown_key(model: type[BaseModel], path: Any) -> tuple[tuple[str, ...], str, list[str]] | None:
    """The first key of the dotted key path ``path`` (a sequence of keys from the top of a
    ``model`` document) that is not a field where it stands: (the section keys before it, the
    key, the valid keys there). None when every key is a field, or the path leaves the models
    (a list, a mapping of free keys, a value) before a key is missing."""
    tp: Any = model
    for i, key in enumerate(path):
        section = _model_of(tp)
        if section is None:
            return None
        info = section.model_fields.get(key)
        if info is None:
            return tuple(path[:i]), key, list(section.model_fields)
        tp = info.annotation
    return None


# ---------------------------------------------------------------- export
def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema with its ``$defs`` substituted where they are used: a schema
    that can be embedded in another one (``WithJsonSchema``, ``json_schema_extra``)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/") and len(node) == 1:
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def schema_of(model: Any, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``model``, as a dict."""
    schema = (model.model_json_schema() if isinstance(model, type) and issubclass(model, BaseModel)
              else TypeAdapter(model).json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    if title:
        schema["title"] = title
    return schema


def schema_json(model: Any, title: str | None = None) -> str:
    """:func:`schema_of` as JSON text: keys sorted, two-space indent, a final newline — the
    same bytes on every run."""
    return json.dumps(schema_of(model, title), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
