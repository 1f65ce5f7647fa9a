"""A corpus of bad inputs across every entry point of the ``dessim`` command.

Each :class:`Case` is a command line, the files it needs (written into a fresh directory
``{d}``), and the words its error message must contain: the file or flag at fault and the
key or value that is wrong. ``tests/bad_inputs/test_bad_inputs.py`` runs every case and
asserts a non-zero exit, no traceback, and those words in the message.

Cases are built from small tables (inline specs, mutations of valid documents, flags) so
that each entry point gets many; a case id says what it tries.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = b"name: x\nmodel: {layers: \xff\xfe}\n"
MISSING_DIR = "/nonexistent-dessim-dir/sub"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]                       #: ``{d}`` stands for the case's directory
    expect: tuple[str, ...]                     #: words the message must contain
    files: dict[str, bytes | str] = field(default_factory=dict)


CASES: list[Case] = []


def case(id: str, args: list[str], expect: list[str], files: dict[str, Any] | None = None) -> None:
    if any(c.id == id for c in CASES):          # same command line, other file content
        id = f"{id} #{sum(c.id.startswith(id) for c in CASES) + 1}"
    CASES.append(Case(id, tuple(args), tuple(expect), dict(files or {})))


def _yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def _get(doc: Any, path: str) -> Any:
    """The value at dotted ``path`` of ``doc`` (``""``: the document; None where absent)."""
    for part in filter(None, path.split(".")):
        doc = doc[int(part)] if isinstance(doc, list) else (doc or {}).get(part)
    return doc


def _set(doc: dict, path: str, value: Any) -> dict:
    """``doc`` with dotted ``path`` set to ``value`` (``~`` deletes it)."""
    out = copy.deepcopy(doc)
    *head, last = path.split(".")
    d = out
    for part in head:
        d = d[int(part)] if isinstance(d, list) else d.setdefault(part, {})
    if value == "~":
        del d[last]
    elif isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value
    return out


# ---------------------------------------------------------------- inline topology specs
INLINE = [
    ("torus:4", ["torus"]), ("rung:8", ["rung"]), ("ring", ["ring"]), ("ring:1", ["n"]),
    ("ring:0", ["n"]), ("ring:-3", ["n"]), ("ring:abc", ["abc"]), ("ring:8,bw=50", ["bw", "unit"]),
    ("ring:8,bw=fast", ["bw", "fast"]), ("ring:8,bw=-5GB/s", ["bw", "negative"]),
    ("ring:8,bw=0GB/s", ["bw"]), ("ring:8,bw=50GB", ["bw", "/s"]),
    ("ring:8,lat=5", ["lat", "unit"]), ("ring:8,lat=-1us", ["lat", "negative"]),
    ("ring:8,lat=5parsecs", ["lat", "parsecs"]), ("ring:8,lat=10s", ["lat", "implausible"]),
    ("ring:8,bw=100B/s", ["bw", "implausible"]), ("ring:8,bogus=1", ["bogus"]),
    ("ring:8,device=Z80", ["Z80"]), ("ring:8,type=warp", ["warp"]),
    ("ring:8,tech=nvlink99", ["nvlink99"]), ("ring:100000000000", ["limit", "DESSIM_MAX_TOPOLOGY_NODES"]),
    ("fc:100000", ["limit", "DESSIM_MAX_TOPOLOGY_NODES"]),
    ("torus2d:100000x100000", ["limit"]), ("torus2d:0x4", ["x"]), ("torus3d:2x2", ["torus3d"]),
    ("mesh2d:axb", ["mesh2d"]), ("switch:0", ["n"]), ("leafspine:hosts=16,leaves=3", ["leaves"]),
    ("leafspine:hosts=16", ["leaves"]), ("leafspine:16,4,oversub=0", ["oversub"]),
    ("dgx-h100:nodes=0", ["nodes"]), ("dgx-h100:nodes=1.5", ["nodes"]),
    ("dgx-h100:gpu=Z80", ["Z80"]), ("dgx-h100:nodes=2,nic_bw=400", ["nic_bw", "unit"]),
    ("dgx-a100:nodes=2,nics=0", ["nics"]), ("dgx-h100:nodes=1000000", ["limit"]),
    ("pcie:gen=9", ["gen"]), ("cxl:attach=usb", ["attach"]), ("multidim:ring(4)xbogus(2)", ["bogus"]),
    ("ring:8,efficiency=2", ["efficiency"]), ("dgx-h100:nodes=2,oversub=-1", ["oversub"]),
    ("ring:1e3x", ["1e3x"]), ("ring:8,lat=1e400ns", ["lat"]), ("ring:8,bw=nanGB/s", ["bw"]),
]
for spec, words in INLINE:
    case(f"topology-show {spec}", ["topology", "show", spec], [spec.split(",")[0].split(":")[0], *words])
for spec, words in INLINE[:12]:
    case(f"collective -t {spec}", ["collective", "allreduce", "--size", "1MiB", "-t", spec], words)


# ---------------------------------------------------------------- topology files
TOPO = {"name": "t", "nodes": [{"name": "g0", "kind": "gpu"}, {"name": "g1", "kind": "gpu"}],
        "links": [{"a": "g0", "b": "g1", "bw": "50GB/s", "lat": "1us"}]}
TOPO_MUTATIONS = [
    ("nodes.0.kind", "quantum", ["kind", "quantum"]), ("nodes.0.name", "~", ["name"]),
    ("nodes.1.name", "g0", ["g0"]), ("links.0.b", "g7", ["g7"]), ("links.0.bw", "50", ["bw", "unit"]),
    ("links.0.lat", 5, ["lat", "implausible"]), ("links.0.bw", 50, ["bw", "implausible"]),
    ("links.0.efficiency", 2, ["efficiency"]), ("links.0.bw", "~", ["bw"]),
    ("links.0.colour", "red", ["colour"]), ("nodez", [], ["nodez"]), ("links.0.tech", "warp9", ["warp9"]),
    ("nodes.0.rank", -1, ["rank"]), ("nodes.0.device", "Z80", ["Z80"]), ("links.0.lat", "fast", ["lat"]),
    ("links", "all", ["links"]), ("nodes", 5, ["nodes"]), ("dims", [3], ["dims"]),
    ("builder", {"kind": "torus"}, ["torus"]), ("links.0.type", "warp", ["warp"]),
]
for path, value, words in TOPO_MUTATIONS:
    case(f"topology file {path}={value!r}", ["topology", "show", "{d}/t.yaml"], ["t.yaml", *words],
         {"t.yaml": _yaml(_set(TOPO, path, value))})
for name, content, words in [
        ("not-utf8", NOT_UTF8, ["UTF-8"]), ("invalid-yaml", "a: [b\n", ["YAML"]),
        ("a-list", "[1, 2]\n", ["t.yaml"]), ("empty", "", ["t.yaml"]),
        ("bad-timestamp", "name: 2024-13-45\n", ["t.yaml"]),
        ("builder-ring-0", _yaml({"builder": {"kind": "ring", "n": 0}}), ["n"])]:
    case(f"topology file {name}", ["topology", "show", "{d}/t.yaml"], ["t.yaml", *words],
         {"t.yaml": content})
case("topology show a directory", ["topology", "show", "{d}/sub"], ["sub", "directory"],
     {"sub/keep": ""})
case("simulate -t a non-UTF-8 file", ["simulate", "gpt3-1.3b", "-t", "{d}/t.yaml"],
     ["t.yaml", "UTF-8"], {"t.yaml": NOT_UTF8})


# ---------------------------------------------------------------- workload files
GPT = yaml.safe_load((ROOT / "workloads/gpt3-1.3b.yaml").read_text())
WORKLOAD_MUTATIONS = [
    ("model.layers", 0, ["layers"]), ("model.layers", -1, ["layers"]), ("model.layers", "abc", ["layers"]),
    ("model.layers", 1.5, ["layers"]), ("model.hidden", "big", ["hidden"]), ("model.heads", 0, ["heads"]),
    ("model.bogus", 1, ["bogus"]), ("model.precision", "fp7", ["fp7"]),
    ("model.activation", "swish9", ["swish9"]), ("model.seq_len", [], ["seq_len"]),
    ("training.micro_batch", 0, ["micro_batch"]), ("training.schedule", "zigzag", ["zigzag"]),
    ("training.recompute", "some", ["some"]), ("training.attention", "flash9", ["flash9"]),
    ("training.zero_stage", 5, ["zero"]), ("training.bucket_size", "25MiBs", ["bucket_size"]),
    ("training.offload.optimizer", "disk", ["disk"]), ("training.device", "Z80", ["Z80"]),
    ("bogus", 1, ["bogus"]), ("parallelism.dp", 4, ["dp"]), ("parallelism.tp", 3, ["tp"]),
    ("parallelism.sp", "yes", ["sp"]), ("training.global_batch", 7, ["global_batch"]),
    ("model", [1, 2], ["model"]), ("training.bucket_size", "1e30GB", ["bucket_size", "EiB"]),
    ("model.vocab", 1e400, ["vocab"]), ("parallelism.pp", 5, ["pp"]),
    ("training.virtual_stages", 0, ["virtual_stages"]),
]
for path, value, words in WORKLOAD_MUTATIONS:
    case(f"workload file {path}={value!r}",
         ["simulate", "{d}/w.yaml", "-t", "dgx-h100:nodes=1"], ["w.yaml", *words],
         {"w.yaml": _yaml(_set(GPT, path, value))})
DLRM = yaml.safe_load((ROOT / "workloads/dlrm-small.yaml").read_text())
CNN = yaml.safe_load((ROOT / "workloads/resnet50.yaml").read_text())
for doc, name, path, value, words in [
        (DLRM, "dlrm", "model.tables", "many", ["tables"]),
        (DLRM, "dlrm", "model.precision", [1], ["precision"]),
        (DLRM, "dlrm", "model.pooling", "nan", ["pooling"]),
        (DLRM, "dlrm", "embeddings.sharding", "row_wize", ["row_wize"]),
        (DLRM, "dlrm", "model.bottom_mlp", [], ["bottom_mlp"]),
        (CNN, "cnn", "model.arch", "resnet9000", ["resnet9000"]),
        (CNN, "cnn", "model.arch", ["resnet50"], ["arch"]),
        (CNN, "cnn", "model.image_size", 0, ["image_size"]),
        (CNN, "cnn", "kind", "gan", ["gan"]),
        (CNN, "cnn", "training.global_batch", -8, ["global_batch"])]:
    case(f"{name} file {path}={value!r}", ["simulate", "{d}/w.yaml", "-t", "dgx-h100:nodes=1"],
         ["w.yaml", *words], {"w.yaml": _yaml(_set(doc, path, value))})
MIXTRAL = yaml.safe_load((ROOT / "workloads/mixtral-8x7b.yaml").read_text())
for name, counts, file, words in [       # model.routing.counts files, named relative to w.yaml
        ("missing", "c.txt", None, ["c.txt", "does not exist"]),
        ("not a number", "c.txt", "8\nabc\n", ["c.txt, line 2", "'abc' is not a number"]),
        ("negative", "c.txt", "# per expert\n8\n-3\n", ["c.txt, line 3", "'-3' must be >= 0"]),
        ("not UTF-8", "c.txt", b"\xff\xfe\n", ["c.txt", "cannot read"]),
        ("too few", "c.txt", "1\n2\n3\n", ["3 counts given for 8 experts"])]:
    case(f"moe routing counts file {name}", ["simulate", "{d}/w.yaml", "-t", "dgx-h100:nodes=1"],
         ["w.yaml", "routing", *words],
         {"w.yaml": _yaml(_set(MIXTRAL, "model.routing", {"distribution": "counts", "counts": counts})),
          **({counts: file} if file is not None else {})})
case("workload file not UTF-8", ["simulate", "{d}/w.yaml"], ["w.yaml", "UTF-8"], {"w.yaml": NOT_UTF8})
case("workload file invalid YAML", ["simulate", "{d}/w.yaml"], ["w.yaml", "YAML"], {"w.yaml": "model: [\n"})
case("unknown workload lists every kind", ["simulate", "nosuch-model"],
     ["nosuch-model", "resnet50", "dlrm-small"])


# ---------------------------------------------------------------- simulate flags
SIM_FLAGS = [
    (["--tp", "0"], ["--tp"]), (["--tp", "3"], ["tp"]), (["--pp", "5"], ["pp"]),
    (["--bucket-size", "12parsecs"], ["--bucket-size", "parsecs"]), (["--hbm", "-1GB"], ["--hbm"]),
    (["--hbm", "lots"], ["--hbm", "lots"]), (["--global-batch", "7"], ["global_batch"]),
    (["--hbm", "40"], ["--hbm", "'40' has no unit", "40 bytes"]),
    (["--micro-batch", "0"], ["--micro-batch"]), (["--schedule", "zigzag"], ["--schedule"]),
    (["--zero", "7"], ["--zero"]), (["--attention", "flash9"], ["--attention"]),
    (["--recompute", "x"], ["--recompute"]), (["--interleave", "0"], ["--interleave"]),
    (["--pp", "4", "--schedule", "interleaved"], ["interleaved", "--interleave V"]),
    (["--ep", "3"], ["ep=3 does not divide", "--ep"]),
    (["--slowdown", "3"], ["--slowdown", "RANK=FACTOR"]), (["--slowdown", "x=1"], ["--slowdown"]),
    (["--straggler-sigma", "-1"], ["--straggler-sigma"]), (["--reduction-bw", "200"], ["reduction_bw", "unit"]),
    (["--reduction-bw", "fast"], ["reduction_bw", "fast"]), (["--device", "Z80"], ["Z80"]),
    (["--algo", "bogus"], ["bogus", "algorithm"]), (["--protocol", "LL256"], ["--protocol"]),
    (["--chunks", "0"], ["--chunks"]), (["--channels", "0"], ["--channels"]),
    (["--calibration", "{d}/nosuch.yaml"], ["nosuch.yaml"]),
    (["--timeline", f"{MISSING_DIR}/x.json"], ["--timeline", "does not exist"]),
    (["--gantt", "{d}/x.pdf"], ["--gantt", ".pdf"]), (["--spans", "{d}/x.xlsx"], ["--spans", ".xlsx"]),
    (["--timeline", "{d}/x.png"], ["--timeline", "'.png'", ".json.gz", "--gantt x.png"]),
    (["--timeline", "{d}/x.gz"], ["--timeline", "'.gz'", ".json.gz"]),
    (["--gantt", "{d}/x.json"], ["--gantt", "'.json'", "--timeline x.json"]),
    (["--save-graph", "{d}/g.txt"], ["--save-graph", "'.txt'", ".json"]),
    (["--save-graph", f"{MISSING_DIR}/g.json"], ["--save-graph", "does not exist"]),
    (["--export-chakra", f"{MISSING_DIR}/p"], ["--export-chakra", "does not exist"]),
    (["--export-chakra", "{d}/"], ["--export-chakra", "prefix"]),
    # an existing directory without the slash: the files went beside it as DIR.<rank>.et
    (["--export-chakra", "{d}"], ["--export-chakra", "is a directory", "{d}/trace"]),
    (["--export-chakra", "{d}/gpt3.0.et"], ["--export-chakra", "ends in .et", "gpt3.0.et.0.et", "/gpt3'"]),
    (["--network", "bogus"], ["--network"]), (["-t", "torus:4"], ["torus"]),
    (["--exact", "--fold"], ["--exact"]), (["--timeline", "{d}"], ["--timeline", "directory"]),
    (["--gradient-sync", "allreduce"], ["--gradient-sync", "data-parallel workloads only"]),
    (["--parameter-servers", "2"], ["--parameter-servers", "data-parallel workloads only"]),
    (["--gantt", "{d}/f/x.png"], ["--gantt", "not a directory"]),
    (["--granularity", "atom"], ["--granularity"]), (["--ep", "2"], ["ep"]),
    (["--cp", "3"], ["cp"]), (["--seed", "x"], ["--seed"]),
    # the default topology (dgx-h100) names every GPU: an A100 would apply to no rank
    (["--device", "A100"], ["--device", "'A100'", "no rank", "H100"]),
]
for flags, words in SIM_FLAGS:
    case(f"simulate {' '.join(flags)}", ["simulate", "gpt3-1.3b", *flags], words, {"f": "x"})
case("simulate calibration not UTF-8", ["simulate", "--calibration", "{d}/c.yaml"],
     ["c.yaml", "UTF-8"], {"c.yaml": NOT_UTF8})
case("simulate calibration bad key", ["simulate", "--calibration", "{d}/c.yaml"],
     ["c.yaml", "bogus"], {"c.yaml": "version: 1\nname: x\nbogus: 1\n"})


# ---------------------------------------------------------------- collective / compare
COLL = ["collective", "allreduce", "-t", "ring:4"]
for flags, words in [
        (["--size", ""], ["size"]), (["--size", "1e30GB"], ["size", "EiB"]),
        (["--size", "1.5e-6"], ["size", "0 bytes"]), (["--size", "-1"], ["size", "negative"]),
        (["--size", "1MiBs"], ["size", "MiBs"]), (["--size", "abc"], ["size", "abc"]),
        (["--size", "1MiB", "--ranks", "0-9"], ["rank", "9"]), (["--size", "1MiB", "--ranks", "a-b"], ["a-b"]),
        (["--size", "1MiB", "--ranks", "3-1"], ["3-1"]), (["--size", "1MiB", "--root", "9"], ["root"]),
        (["--size", "1MiB", "--algo", "bogus"], ["bogus"]), (["--size", "1MiB", "--links", "-1"], ["--links"]),
        (["--size", "1MiB", "--timeline", f"{MISSING_DIR}/x.json"], ["--timeline", "does not exist"]),
        (["--size", "1MiB", "--timeline", "{d}/x.svg"], ["--timeline", "'.svg'", ".json.gz"]),
        (["--size", "1MiB", "--gpus-per-process", "0"], ["--gpus-per-process"]),
        (["--size", "1MiB", "--reduction-bw", "1"], ["reduction_bw", "unit"]),
        (["--size", "1MiB", "--algo", "hierarchical", "--inner", "bogus"], ["bogus"])]:
    case(f"collective {' '.join(flags)}", [*COLL, *flags], words)
case("collective unknown op", ["collective", "allscatter", "--size", "1MiB", "-t", "ring:4"], ["allscatter"])
case("collective missing --size", ["collective", "allreduce", "-t", "ring:4"], ["--size"])
CMP = ["compare", "allreduce", "-t", "ring:4"]
for flags, words in [
        (["--algos", "ring,bogus", "--sizes", "1MiB"], ["bogus"]),
        (["--algos", "ring", "--sizes", "1MiB,abc"], ["abc"]),
        (["--algos", "ring", "--sizes", ""], ["sizes"]),
        (["--algos", "", "--sizes", "1MiB"], ["algos"]),
        (["--algos", "ring", "--sizes", "1MiB", "--csv", f"{MISSING_DIR}/x.csv"], ["--csv", "does not exist"]),
        (["--algos", "ring", "--sizes", "1MiB", "--csv", "{d}/x.txt"], ["--csv", ".txt"]),
        (["--algos", "ring", "--sizes", "1MiB", "--plot", "{d}/x.jpg"], ["--plot", ".jpg"]),
        (["--algos", "ring", "--sizes", "1e30GB"], ["1e30GB", "EiB"]),
        (["--algos", "ring,pairwise", "--sizes", "1MiB"], ["pairwise", "can run: ring"]),
        (["--algos", "nvls", "--sizes", "1MiB"], ["nvls", "NVSwitch"])]:
    case(f"compare {' '.join(flags)}", [*CMP, *flags], words)


# ---------------------------------------------------------------- task graphs (run)
GRAPH = {"format": "dessim-taskgraph", "version": 1, "name": "g", "tasks": [
    {"id": "a", "rank": 0, "kind": "compute", "duration": 1e-5},
    {"id": "b", "rank": 1, "kind": "compute", "duration": 1e-5, "deps": []}]}
try:    # the format tag and version the writer uses
    from dessim.taskgraph.io import FORMAT as _FORMAT, VERSION as _VERSION
    GRAPH["format"], GRAPH["version"] = _FORMAT, _VERSION
except ImportError:  # pragma: no cover
    pass
for path, value, words in [
        ("tasks", 5, ["tasks"]), ("bogus", 1, ["bogus"]), ("tasks.0.id", "~", ["id"]),
        ("tasks.0.kind", "quantum", ["quantum"]), ("tasks.1.deps", ["zz"], ["zz"]),
        ("tasks.1.deps", ["b"], ["b"]), ("tasks.1.id", "a", ["a"]), ("tasks.0.duration", -1, ["duration"]),
        ("tasks.0.rank", 99, ["99"]), ("tasks.0.duration", "1e30GB", ["duration"]),
        ("meta", 5, ["meta"]), ("version", 99, ["version"]), ("format", "other", ["format"]),
        ("tasks.0.colour", "red", ["colour"]), ("tasks.1.deps", "a", ["deps"])]:
    case(f"run graph {path}={value!r}", ["run", "{d}/g.json", "-t", "ring:4"], ["g.json", *words],
         {"g.json": json.dumps(_set(GRAPH, path, value))})
for name, content, words in [("not JSON", "{tasks: [}", ["JSON"]), ("not UTF-8", b"{\"tasks\": \"\xff\"}", ["UTF-8"]),
                             ("a list", "[]", ["object"]), ("huge int", "{\"tasks\": [" + "1" * 5000 + "]}", ["g.json"]),
                             ("deep nesting", "[" * 100000, ["g.json"])]:
    case(f"run graph {name}", ["run", "{d}/g.json", "-t", "ring:4"], ["g.json", *words], {"g.json": content})
case("run a missing graph", ["run", "{d}/nosuch.json", "-t", "ring:4"], ["nosuch.json"])
# a workload file given to run: the error says what run takes and where the file belongs
case("run a workload file", ["run", "workloads/gpt3-1.3b.yaml", "-t", "ring:8"],
     ["gpt3-1.3b.yaml", "not valid JSON", "--save-graph", "dessim simulate"])
case("run --timeline x.html", ["run", "{d}/g.json", "-t", "ring:4", "--timeline", "{d}/x.html"],
     ["--timeline", "'.html'", ".json.gz"], {"g.json": json.dumps(GRAPH)})


# ---------------------------------------------------------------- Chakra traces (replay)
TRACE = str(ROOT / "tests/data/chakra/allreduce_1MiB_8npu/ALL_REDUCE")
for name, content, words in [("garbage", b"\x07garbage\x00\xff" * 3, ["t.0.et"]), ("empty", b"", ["t.0.et"]),
                             ("text", b"hello world\n", ["t.0.et"]), ("truncated varint", b"\xff\xff\xff", ["t.0.et"])]:
    case(f"replay {name} trace", ["replay", "{d}/t", "-t", "ring:4"], [*words], {"t.0.et": content})
case("replay a missing prefix", ["replay", "{d}/nosuch", "-t", "ring:4"], ["nosuch"])
case("replay missing rank 1", ["replay", "{d}/t", "-t", "ring:4"], ["t.1.et"],
     {"t.0.et": (ROOT / "tests/data/chakra/allreduce_1MiB_8npu/ALL_REDUCE.0.et").read_bytes(),
      "t.2.et": (ROOT / "tests/data/chakra/allreduce_1MiB_8npu/ALL_REDUCE.2.et").read_bytes()})
for flags, words in [(["--rank-map", "0:x"], ["0:x"]), (["--rank-map", "0:9"], ["9"]),
                     (["--rank-map", "0:1"], ["rank"]), (["--rank-map", "{d}/m.yaml"], ["m.yaml", "UTF-8"]),
                     (["--rank-map", "{d}/n.yaml"], ["n.yaml", "1.5"]), (["--mem-node", "bogus"], ["bogus"])]:
    case(f"replay {' '.join(flags)}", ["replay", TRACE, "-t", "ring:8", *flags], words,
         {"m.yaml": NOT_UTF8, "n.yaml": "0: 1.5\n"})
case("replay trace on too few GPUs", ["replay", TRACE, "-t", "ring:4"], ["8", "4"])


# ---------------------------------------------------------------- sweep specs
SWEEP = {"name": "s", "kind": "collective",
         "base": {"topology": "ring:4", "collective": {"op": "allreduce", "size": "1MiB"}},
         "axes": {"engine.collectives.algo": ["ring", "tree"]}}
SWEEP_MUTATIONS = [
    ("kind", "~", ["kind"]), ("kind", "bogus", ["bogus"]), ("base", "~", ["base"]),
    ("base.collective.op", "allscatter", ["allscatter"]), ("base.collective.size", "abc", ["abc"]),
    ("base.collective.size", "1e30GB", ["EiB"]), ("axes", [1], ["axes"]),
    ("axes", {"bogus.key": [1]}, ["bogus"]), ("axes", {"engine.collectives.algo": ["ring", "bogus"]}, ["bogus"]),
    ("axes", {"topology.n": [0]}, ["n"]), ("analysis", {"metric": "time_ss"}, ["metric", "time_ss"]),
    ("analysis", {"group_by": ["algoo"]}, ["group_by", "algoo"]), ("mode", "random", ["random"]),
    ("base.topology", "torus:4", ["torus"]), ("axes.parallelism", "manual", ["parallelism"]),
    ("cost", {"bogus": 1}, ["bogus"]), ("base.colour", "red", ["colour"]),
    ("axes", {"collective.size": ["1MiB", "1e30GB"]}, ["EiB"]), ("name", "", ["name"]),
    ("axes", {"collective.size": {"from": "1MiB", "to": "1GiB", "factor": 1}}, ["factor"]),
("axes", {"collective.op": ["allscatter"]}, ["allscatter"]),
    ("base.engine", {"network": "quantum"}, ["quantum"]),
    ("axes", {"engine.collectives.algo": ["ring", "ring"]}, ["algo[1]", "repeats item [0]"]),
    ("axes", {"collective.size": ["1MiB", 1048576]}, ["size[1]", "repeats item [0] ('1MiB')"]),
]
for path, value, words in SWEEP_MUTATIONS:
    case(f"sweep spec {path}={value!r}", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"],
         ["s.yaml", *words], {"s.yaml": _yaml(_set(SWEEP, path, value))})
case("sweep spec zip rows repeated", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"],
     ["s.yaml", "mode zip", "point 1 repeats point 0"],
     {"s.yaml": _yaml({**_set(SWEEP, "axes", {"engine.collectives.algo": ["ring", "ring"],
                                             "collective.size": ["1MiB", "1MiB"]}), "mode": "zip"})})
WSWEEP = {"name": "w", "kind": "workload", "base": {"workload": "nosuch.yaml", "topology": "dgx-h100:nodes=1"},
          "axes": {"engine.collectives.algo": ["ring", "tree"]}}
case("sweep missing workload file", ["sweep", "{d}/w.yaml", "--no-progress", "--out", "{d}/r.csv"],
     ["w.yaml", "nosuch.yaml", "nothing was run"], {"w.yaml": _yaml(WSWEEP)})
case("sweep workload file not UTF-8", ["sweep", "{d}/w.yaml", "--no-progress", "--out", "{d}/r.csv"],
     ["bad.yaml", "UTF-8"], {"w.yaml": _yaml(_set(WSWEEP, "base.workload", "bad.yaml")), "bad.yaml": NOT_UTF8})
for workload, path, words in [
        ("gpt3-1.3b", "workload.model.precison", ["'precison'", "model section", "did you mean 'precision'"]),
        ("gpt3-1.3b", "workload.training.schedul", ["'schedul'", "training section", "did you mean 'schedule'"]),
        # deeper keys and the other kinds: before, every point ran and failed the same way
        ("mixtral-8x7b", "workload.model.routing.distrbution",
         ["'distrbution'", "model.routing section", "did you mean 'distribution'"]),
        ("gpt3-1.3b", "workload.training.offload.optimzer",
         ["'optimzer'", "training.offload section", "did you mean 'optimizer'"]),
        ("dlrm-small", "workload.model.embeding_dim", ["'embeding_dim'", "model section", "did you mean 'embedding_dim'"]),
        ("dlrm-small", "workload.embeddings.shardng", ["'shardng'", "embeddings section", "did you mean 'sharding'"]),
        ("resnet50", "workload.model.image_sise", ["'image_sise'", "model section", "did you mean 'image_size'"]),
        ("resnet50", "workload.training.global_bach", ["'global_bach'", "training section", "did you mean 'global_batch'"])]:
    case(f"sweep workload axis {path} of {workload}", ["sweep", "{d}/w.yaml", "--no-progress", "--out", "{d}/r.csv"],
         ["w.yaml", f"axes.{path}", workload, *words],
         {"w.yaml": _yaml({**_set(WSWEEP, "base.workload", workload), "axes": {path: ["bf16"]}})})
# the same typo in the base's overrides: before, every point ran and failed the same way
for workload, path in [("gpt3-1.3b", "model.precison"), ("mixtral-8x7b", "model.routing.distrbution"),
                       ("dlrm-small", "embeddings.shardng")]:
    case(f"sweep base overrides.{path} of {workload}", ["sweep", "{d}/w.yaml", "--no-progress", "--out", "{d}/r.csv"],
         ["w.yaml", f"overrides.{path}", workload, "nothing was run", f"'{path.rsplit('.', 1)[1]}'"],
         {"w.yaml": _yaml(_set(_set(WSWEEP, "base.workload", workload), f"base.overrides.{path}", "x"))})
SWEEP_YAML = _yaml(SWEEP)
for flags, words in [(["--out", f"{MISSING_DIR}/r.csv"], ["--out", "does not exist"]),
                     (["--out", "{d}/r.xlsx"], ["--out", ".xlsx"]), (["--plots", "{d}/f"], ["--plots", "not a directory"]),
                     (["--metric", "time_ss"], ["metric", "time_ss"]), (["-g", "algoo"], ["algoo"]),
                     (["--workers", "0"], ["--workers"]), (["--backend", "slurm"], ["--backend"]),
                     (["--calibration", "{d}/nosuch.yaml"], ["nosuch.yaml"]),
                     (["--max-points", "-1"], ["--max-points"])]:
    case(f"sweep {' '.join(flags)}", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv", *flags],
         words, {"s.yaml": SWEEP_YAML, "f": "x"})
case("sweep ranks that do not parse", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"],
     ["0-x", "ranks", "points failed"],
     {"s.yaml": _yaml(_set(SWEEP, "axes", {"collective.ranks": ["0-3", "0-x"]}))})
for name, content, words in [("not UTF-8", NOT_UTF8, ["UTF-8"]), ("a list", "[1]\n", ["s.yaml"]),
                             ("empty", "", ["s.yaml"]), ("invalid YAML", "axes: {\n", ["YAML"])]:
    case(f"sweep spec {name}", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"],
         ["s.yaml", *words], {"s.yaml": content})
case("sweep with failed points exits 1",
     ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"], ["1 of 2 points failed", "reason"],
     {"s.yaml": _yaml(_set(SWEEP, "axes", {"engine.collectives.algo": ["ring", "nvls"]}))})
case("sweep ranks beyond the topology", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"],
     ["0-7", "ranks", "points failed"],
     {"s.yaml": _yaml(_set(SWEEP, "axes", {"collective.ranks": ["0-3", "0-7"]}))})


# ---------------------------------------------------------------- cluster files
CLUSTER = yaml.safe_load((ROOT / "workloads/cluster-two-jobs.yaml").read_text())
for path, value, words in [
        ("jobs", "~", ["jobs"]), ("jobs.1.gpus", [0, 1, 2, 3, 4, 5, 6, 7], ["0"]),
        ("jobs.0.gpus", [0, 99], ["99"]), ("jobs.0.workload", "nosuch", ["nosuch"]),
        ("bogus", 1, ["bogus"]), ("topology", "torus:4", ["torus"]), ("jobs.0.colour", "red", ["colour"]),
        ("engine", {"collectives": {"algo": "bogus"}}, ["bogus"]), ("jobs", "all", ["jobs"]),
        ("jobs.0.overrides", {"training": {"global_batch": 0}}, ["global_batch"])]:
    case(f"cluster {path}={value!r}", ["cluster", "{d}/c.yaml"], ["c.yaml", *words],
         {"c.yaml": _yaml(_set(CLUSTER, path, value))})
case("cluster not UTF-8", ["cluster", "{d}/c.yaml"], ["c.yaml", "UTF-8"], {"c.yaml": NOT_UTF8})
case("cluster --timeline x.png", ["cluster", "workloads/cluster-two-jobs.yaml", "--timeline", "{d}/x.png"],
     ["--timeline", "'.png'", ".json.gz"])
case("cluster --table x.json", ["cluster", "workloads/cluster-two-jobs.yaml", "--table", "{d}/x.json"],
     ["--table", "'.json'", ".csv"])
case("cluster --gantt into a missing directory", ["cluster", "workloads/cluster-two-jobs.yaml", "--gantt",
                                                  f"{MISSING_DIR}/g.png"], ["--gantt", "does not exist"])


# ---------------------------------------------------------------- calibration inputs
KERNELS = str(ROOT / "tests/data/calibration/kernel_times_h100_published.csv")
for flags, words, files in [
        (["--nccl-tests", "{d}/n.txt", "-t", "dgx-h100:nodes=1"], ["n.txt"], {"n.txt": "garbage\n"}),
        (["--nccl-tests", "{d}/n.txt"], ["--topology"], {"n.txt": "x"}),
        (["--nccl-tests", "{d}/n.txt", "-t", "dgx-h100:nodes=1"], ["n.txt", "UTF-8"], {"n.txt": NOT_UTF8}),
        (["--kernels", "{d}/k.csv"], ["k.csv"], {"k.csv": "kernel,shape\nmatmul,1x2\n"}),
        (["--kernels", "{d}/k.csv"], ["k.csv", "UTF-8"], {"k.csv": NOT_UTF8}),
        (["--kernels", "{d}/k.csv"], ["k.csv", "time_us"], {"k.csv": "kernel,shape,dtype,time_us\nmatmul,1x2x3,bf16,-5\n"}),
        (["--kineto", "{d}/k.json"], ["k.json"], {"k.json": "{\"traceEvents\": 5}"}),
        (["--kineto", "{d}/k.json"], ["k.json", "JSON"], {"k.json": "{"}),
        (["--kernels", KERNELS, "--out", "{d}/c.json"], ["--out", ".json"], {}),
        (["--kernels", KERNELS, "--out", f"{MISSING_DIR}/c.yaml"], ["--out", "does not exist"], {}),
        (["--kernels", KERNELS, "--algo", "bogus"], ["bogus"], {}),
        (["--kernels", KERNELS, "--base", "{d}/nosuch.yaml"], ["nosuch.yaml"], {}),
        (["--kernels", KERNELS, "--gpu", "Z80"], ["Z80"], {}),
        (["--kernels", "{d}/nosuch.csv"], ["nosuch.csv"], {}),
        ([], ["--nccl-tests", "--kernels"], {})]:
    args = ["calibrate", *flags]
    if "--out" not in flags:
        args += ["--out", "{d}/c.yaml"]
    case(f"calibrate {' '.join(flags)}", args, words, files)


# ---------------------------------------------------------------- explore / workload show
for flags, words in [(["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--hbm", "lots"], ["--hbm", "lots"]),
                     (["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--expansion", "-1GB"], ["--expansion", "negative"]),
                     (["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--hbm", "80"], ["--hbm", "has no unit"]),
                     (["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--expansion", "256"], ["--expansion", "has no unit"]),
                     (["nosuch-model", "-t", "dgx-h100:nodes=1"], ["nosuch-model"]),
                     (["gpt3-1.3b", "-t", "torus:4"], ["torus"]),
                     (["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--out", "{d}/r.xlsx"], ["--out", ".xlsx"]),
                     (["gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--expansion-bw", "25"], ["--expansion-bw", "unit"])]:
    case(f"explore {' '.join(flags)}", ["explore", *flags, "--no-progress", "--workers", "1"], words)
for flags, words in [(["nosuch-model"], ["nosuch-model"]), (["gpt3-1.3b", "--gpus", "0"], ["--gpus"]),
                     (["gpt3-1.3b", "--tp", "3"], ["tp"]), (["gpt3-1.3b", "--topology", "torus:4"], ["torus"]),
                     (["gpt3-1.3b", "--topology", "ring:8", "--gpus", "8"], ["--topology", "--gpus"]),
                     (["dlrm-small"], ["dlrm-small", "dlrm"]), (["gpt3-1.3b", "--gpus", "12"], ["12"])]:
    case(f"workload show {' '.join(flags)}", ["workload", "show", *flags], words)


# ---------------------------------------------------------------- train / megatron / schedules
for flags, words in [(["--tokens", "abc"], ["tokens", "abc"]), (["--tokens", "-5T"], ["tokens"]),
                     (["--tokens", "1T", "--plots", f"{MISSING_DIR}/p"], ["--plots", "does not exist"]),
                     (["--tokens", "1T", "--pue", "0.5"], ["pue"]),
                     (["--tokens", "1T", "--checkpoint-interval", "often"], ["checkpoint", "often"]),
                     (["--tokens", "1T", "-t", "torus:4"], ["torus"]),
                     # each names the flag, not the train: key or the class field behind it
                     (["--tokens", "1T", "--checkpoint-size", "big"], ["--checkpoint-size", "big"]),
                     (["--tokens", "1T", "--host-power", "-5"], ["--host-power", ">= 0"]),
                     (["--tokens", "1T", "--pue", "-1"], ["--pue", ">= 1"]),
                     (["--tokens", "1T", "--usd-per-kwh", "-1"], ["--usd-per-kwh"]),
                     (["--tokens", "1T", "--capex-per-gpu", "9000"], ["--capex-per-gpu", "--amortisation"]),
                     (["--tokens", "1T", "--steps", "5"], ["--tokens", "--steps"]),
                     (["--tokens", "1T", "--mtbf", "gpu=soon"], ["--mtbf gpu", "soon"]),
                     (["--tokens", "1T", "--gpu-power", "turbo=9"], ["--gpu-power", "'turbo'"]),
                     (["--tokens", "1T", "--restart", "-1s"], ["--restart", "negative"]),
                     (["--tokens", "1T", "--storage-bw", "fast"], ["--storage-bw", "fast"]),
                     # before: 'checkpoint time must be a finite number > 0 (seconds), got 0.0'
                     # after the iteration was simulated, and the topology's link check
                     # 'storage (pfs) bw/lat: ... write the unit' for a bandwidth that had one
                     (["--tokens", "1T", "--checkpoint-size", "0"], ["--checkpoint-size", "zero"]),
                     (["--tokens", "1T", "--storage-bw", "1KB/s"], ["--storage-bw", "1KB/s", "below"]),
                     # 100B tokens: B is not a count suffix; the error says which are
                     (["--tokens", "100B"], ["--tokens", "'100B'", "100G"])]:
    case(f"train {' '.join(flags)}", ["train", "gpt3-1.3b", *flags], words)
for flags, words in [(["--num-layers", "x"], ["--num-layers", "x"]),
                     (["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                       "--seq-length", "128", "--micro-batch-size", "1", "--frobnicate"], ["--frobnicate"]),
                     (["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "3",
                       "--seq-length", "128", "--micro-batch-size", "1",
                       "--tensor-model-parallel-size", "2", "--vocab-size", "1000"], ["3"])]:
    case(f"megatron {' '.join(flags)}", ["megatron", "-t", "dgx-h100:nodes=1", "--", *flags], words)
for flags, words in [(["gpt3-1.3b", "--pipeline-layers", "1,2"], ["pipeline_layers"]),
                     (["gpt3-1.3b", "--pipeline-layers", "x"], ["pipeline", "x"]),
                     (["gpt3-1.3b", "--schedule", "zb-h9"], ["zb-h9"])]:
    case(f"simulate {' '.join(flags)}", ["simulate", *flags, "-t", "dgx-h100:nodes=1"], words)


# ---------------------------------------------------------------- misspelled keys: did you mean
for name, args, file, doc, path, words in [
        ("topology", ["topology", "show", "{d}/t.yaml"], "t.yaml", TOPO, "nodes.0.kindd", ["nodes[0]"]),
        ("topology builder", ["topology", "show", "{d}/t.yaml"], "t.yaml",
         {"builder": {"kind": "ring", "n": 4}}, "builder.latency", ["builder (ring)"]),
        ("workload", ["simulate", "{d}/w.yaml", "-t", "dgx-h100:nodes=1"], "w.yaml", GPT, "training.micro_batchs",
         ["training"]),
        ("dlrm workload", ["simulate", "{d}/w.yaml", "-t", "dgx-h100:nodes=1"], "w.yaml", DLRM,
         "embeddings.shardng", ["embeddings"]),
        ("sweep", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"], "s.yaml", SWEEP, "axis",
         []),
        ("sweep base", ["sweep", "{d}/s.yaml", "--no-progress", "--out", "{d}/r.csv"], "s.yaml", SWEEP,
         "base.collective.sizes", ["base.collective"]),
        ("cluster", ["cluster", "{d}/c.yaml"], "c.yaml", CLUSTER, "jobs.0.gpu", ["jobs[0]"])]:
    key = path.rsplit(".", 1)[-1]
    right = {"kindd": "kind", "latency": "lat", "micro_batchs": "micro_batch", "shardng": "sharding",
             "axis": "axes", "sizes": "size", "gpu": "gpus"}[key]
    parent, _, _ = path.rpartition(".")
    mutated = _set(doc, path, _get(doc, f"{parent}.{right}" if parent else right))
    if right in _get(mutated, parent):
        del _get(mutated, parent)[right]
    case(f"{name} file misspells {right!r}", args,
         [file, *words, f"unknown key {key!r} (did you mean {right!r}?)"], {file: _yaml(mutated)})
case("schema of an unknown spec type", ["schema", "workloads"], ["workloads", "did you mean 'workload'?"])
case("schema --output .txt", ["schema", "sweep", "--output", "{d}/s.txt"], ["--output", ".txt"])
