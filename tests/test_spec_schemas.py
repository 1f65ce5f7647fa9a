"""Spec schemas (dessim.schema, ``dessim schema KIND``): every exported schema is valid JSON
Schema and deterministic, every spec file shipped in the repository validates against its
model *and* against the exported schema, and a misspelled key gets a "did you mean"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.cli.main import cli
from dessim.cli.schema_cmd import SPEC_TYPES, spec_model
from dessim.errors import SpecError
from dessim.schema import schema_json, schema_of, validate

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]


def _type_of(path: Path, doc: dict) -> str | None:
    """The spec type of a shipped YAML file (None: not a spec file, e.g. a validation table)."""
    if path.parent.name == "calibration":
        return "calibration"
    if path.parent.name == "topologies":
        return "topology"
    if "axes" in doc:
        return "sweep"
    if doc.get("kind") == "cluster":
        return "cluster"
    if "model" in doc:
        return "workload"
    return None


def _shipped() -> list[tuple[Path, str]]:
    files = [*ROOT.glob("topologies/*.yaml"), *ROOT.glob("workloads/*.yaml"),
             *ROOT.glob("calibration/*.yaml"), *ROOT.glob("examples/**/*.yaml")]
    out = []
    for path in sorted(files):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        kind = _type_of(path, doc)
        if kind is not None:
            out.append((path, kind))
    return out


SHIPPED = _shipped()


def test_every_spec_type_is_shipped_at_least_once():
    assert {kind for _, kind in SHIPPED} == set(SPEC_TYPES)
    assert len(SHIPPED) >= 35


@pytest.mark.parametrize("kind", sorted(SPEC_TYPES))
def test_the_exported_schema_is_valid_json_schema_sorted_and_deterministic(kind, tmp_path):
    res = CliRunner().invoke(cli, ["schema", kind])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == f"dessim {kind} file"
    assert res.output == json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert CliRunner().invoke(cli, ["schema", kind]).output == res.output
    out = tmp_path / "s.json"
    written = CliRunner().invoke(cli, ["schema", kind, "--output", str(out)])
    assert written.exit_code == 0 and out.read_text(encoding="utf-8") == res.output


@pytest.mark.parametrize("path, kind", SHIPPED, ids=[f"{p.relative_to(ROOT)}" for p, _ in SHIPPED])
def test_every_shipped_spec_file_validates_against_its_model_and_its_schema(path, kind):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    validate(spec_model(kind), doc, str(path))
    errors = list(jsonschema.Draft202012Validator(_SCHEMAS[kind]).iter_errors(doc))
    assert not errors, [e.message[:300] for e in errors]


_SCHEMAS = {kind: schema_of(spec_model(kind)) for kind in SPEC_TYPES}


def test_the_schema_describes_units_and_keeps_them_strings():
    workload = schema_json(spec_model("workload"))
    assert '"25MiB"' in workload and "bytes" in workload
    topo = _SCHEMAS["topology"]["$defs"]["LinkSection"]["properties"]
    bw = topo["bw"]["anyOf"][0]         # (the other: null, the key is optional)
    assert any(a.get("type") == "string" and "/s" in a["pattern"] for a in bw["anyOf"])
    assert bw["examples"] == ["50GB/s", "400Gb/s"] and "bytes/second" in bw["description"]
    assert "bytes/s" in topo["bw"]["description"] and "seconds" in topo["lat"]["description"]


def test_an_unknown_spec_type_is_a_clean_error():
    res = CliRunner().invoke(cli, ["schema", "topolgy"])
    assert res.exit_code == 2 and res.exception is None or isinstance(res.exception, SystemExit)
    assert "unknown spec type 'topolgy' (did you mean 'topology'?)" in res.output
    bad = CliRunner().invoke(cli, ["schema", "sweep", "--output", "x.txt"])
    assert bad.exit_code == 2 and ".txt" in bad.output


# The documents a typo goes into, one per spec type, and the mapping (a key path) it lands in.
_DOCS = {
    "topology": ({"nodes": [{"name": "g0", "kind": "gpu"}], "links": []}, ("nodes", 0)),
    "workload": (yaml.safe_load((ROOT / "workloads/gpt3-1.3b.yaml").read_text()), ("training",)),
    "sweep": ({"kind": "collective", "base": {"topology": "ring:4"}, "axes": {}}, ()),
    "cluster": (yaml.safe_load((ROOT / "workloads/cluster-two-jobs.yaml").read_text()), ("jobs", 0)),
}


def _section_keys(kind: str) -> list[tuple[str, str]]:
    model = {"topology": "NodeSection", "workload": "TrainingSection", "sweep": None,
             "cluster": "ClusterJob"}[kind]
    schema = _SCHEMAS[kind]
    fields = (schema if model is None else schema["$defs"][model])["properties"]
    return [(kind, key) for key in fields if len(key) >= 4]


_TYPOS = [pair for kind in _DOCS for pair in _section_keys(kind)]


@settings(max_examples=60, deadline=None)
@given(pair=st.sampled_from(_TYPOS), position=st.integers(min_value=0))
def test_a_key_with_one_letter_doubled_is_named_with_a_suggestion(pair, position):
    """A typo (one letter doubled) anywhere in any key of a section: the message names the
    file, the section, the misspelled key and suggests the right one."""
    kind, key = pair
    i = position % len(key)
    typo = key[:i + 1] + key[i] + key[i + 1:]
    doc, at = _DOCS[kind]
    doc = json.loads(json.dumps(doc))
    section = doc
    for part in at:
        section = section[part]
    section[typo] = section.pop(key, 1)
    with pytest.raises(SpecError) as info:
        validate(spec_model(kind), doc, "f.yaml")
    message = str(info.value)
    assert message.startswith("f.yaml: ")
    assert f"unknown key {typo!r} (did you mean {key!r}?)" in message


@pytest.mark.parametrize("key", ["t[aining", "@training", "str", "list[str]", "function-before[x]"])
def test_any_spelling_of_a_key_is_named_as_written(key):
    """Key paths come from walking the models, not from the spelling of a location's parts:
    a key that looks like one of pydantic's union labels is still named."""
    doc = yaml.safe_load((ROOT / "workloads/gpt3-1.3b.yaml").read_text())
    doc[key] = doc.pop("training")
    with pytest.raises(SpecError, match="unknown key") as info:
        validate(spec_model("workload"), doc, "f.yaml")
    assert f"f.yaml: unknown key {key!r}" in str(info.value)
