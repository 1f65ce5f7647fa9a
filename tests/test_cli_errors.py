"""Bad command lines a new user types, each refused before any work with one ``error:`` line
that names the flag and the file, exit status 2, and nothing written or destroyed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
GRAPH = {"format": "dessim.taskgraph", "version": 1, "name": "g", "tasks": [
    {"id": "a", "rank": 0, "kind": "compute", "duration": 1e-5},
    {"id": "b", "rank": 1, "kind": "compute", "duration": 1e-5, "deps": ["a"]}]}


def _refused(args: list[str], *words: str) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.output
    for word in words:
        assert word in errors[0], res.output
    return errors[0]


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    return path


def test_an_output_onto_the_input_graph_is_refused_and_the_graph_kept(graph):
    before = graph.read_bytes()
    _refused(["run", str(graph), "-t", "ring:4", "--timeline", str(graph)],
             "--timeline", "input GRAPH", "g.json")
    assert graph.read_bytes() == before


def test_an_output_onto_an_input_by_another_spelling_of_its_path_is_refused(graph, monkeypatch):
    monkeypatch.chdir(graph.parent)
    (graph.parent / "sub").mkdir()
    _refused(["run", "g.json", "-t", "ring:4", "--timeline", "./sub/../g.json"], "--timeline", "GRAPH")
    assert json.loads(graph.read_text()) == GRAPH


def test_an_output_onto_the_workload_topology_or_calibration_file_is_refused(tmp_path):
    workload = tmp_path / "w.yaml"
    shutil.copy(ROOT / "workloads/gpt3-1.3b.yaml", workload)
    topology = tmp_path / "t.yaml"
    shutil.copy(ROOT / "topologies/ring8.yaml", topology)
    _refused(["simulate", str(workload), "--timeline", str(workload)], "--timeline", "WORKLOAD")
    _refused(["simulate", "gpt3-1.3b", "-t", str(topology), "--save-graph", str(topology)],
             "--save-graph", "--topology")
    _refused(["collective", "allreduce", "--size", "1MiB", "-t", str(topology), "--timeline",
              str(topology)], "--timeline", "--topology")
    assert (tmp_path / "w.yaml").read_bytes() == (ROOT / "workloads/gpt3-1.3b.yaml").read_bytes()
    assert topology.read_bytes() == (ROOT / "topologies/ring8.yaml").read_bytes()


def test_calibrate_refuses_to_write_over_its_base_file(tmp_path):
    base = tmp_path / "c.yaml"
    base.write_text("version: 1\nname: c\n")
    _refused(["calibrate", "--kernels", str(ROOT / "tests/data/calibration/kernel_times_h100_published.csv"),
              "--base", str(base), "-o", str(base)], "--out", "--base")
    assert base.read_text() == "version: 1\nname: c\n"


def test_two_outputs_of_one_run_into_the_same_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(["simulate", "gpt3-1.3b", "--timeline", "x.json", "--save-graph", "./x.json"],
             "--save-graph", "--timeline")
    assert not (tmp_path / "x.json").exists()


def test_a_chakra_prefix_named_like_an_input_writes_beside_it_and_is_allowed(tmp_path):
    """``--export-chakra w`` writes w.<rank>.et: the prefix is no file, nothing to destroy."""
    workload = tmp_path / "w.yaml"
    shutil.copy(ROOT / "workloads/gpt3-1.3b.yaml", workload)
    res = CliRunner().invoke(cli, ["simulate", str(workload), "--tp", "8", "--dp", "1", "--global-batch", "8",
                                   "--export-chakra", str(workload)])
    assert res.exit_code == 0, res.output
    assert workload.read_bytes() == (ROOT / "workloads/gpt3-1.3b.yaml").read_bytes()
    assert (tmp_path / "w.yaml.0.et").is_file()


@pytest.mark.parametrize("args,words", [
    (["simulate", "--tp", "0"], ["--tp", "0 is not in the range", "dessim simulate --help"]),
    (["simulate", "--tp", "x"], ["--tp", "'x'"]),
    (["simulate", "--bogus"], ["--bogus"]),
    (["simulate", "gpt3-1.3b", "extra"], ["extra"]),
    (["compare", "allreduce", "-t", "ring:4"], ["--sizes"]),
    (["topology", "shw"], ["shw", "Did you mean 'show'"]),
    (["nosuch"], ["nosuch", "dessim --help"]),
    (["--bogus"], ["--bogus"]),
    (["run", "/nonexistent-dessim/g.json", "-t", "ring:4"], ["GRAPH", "does not exist"]),
])
def test_a_usage_error_is_one_error_line_with_where_to_find_help(args, words):
    res = CliRunner().invoke(cli, args)
    assert "Usage:" not in res.output and "Try '" not in res.output, res.output
    _refused(args, *words)


def test_a_bare_group_still_prints_its_help():
    res = CliRunner().invoke(cli, ["topology"])
    assert res.exit_code == 2 and "Commands:" in res.output and "error:" not in res.output


# ---------------------------------------------------------------- writing outputs
def test_a_failed_write_keeps_the_existing_file_and_leaves_no_partial_file(tmp_path):
    from dessim.cli.common import write_file
    from dessim.errors import OutputError

    results = tmp_path / "results.csv"
    results.write_text("the results of yesterday\n")

    def dies_half_way(path: str) -> None:
        Path(path).write_text("half a ta")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"--csv '.*results.csv': cannot write it \(No space left on device\)"):
        write_file(str(results), "--csv", dies_half_way)
    assert results.read_text() == "the results of yesterday\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_a_write_that_completes_replaces_the_file_whole(tmp_path):
    from dessim.cli.common import write_file

    results = tmp_path / "results.csv"
    results.write_text("old\n")
    assert write_file(str(results), "--csv", lambda p: Path(p).write_text("new\n")) == str(results)
    assert results.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_error_line_naming_the_flag_not_a_traceback():
    _refused(["collective", "allreduce", "--size", "1MiB", "-t", "ring:4", "--timeline", "/dev/full"],
             "--timeline", "/dev/full", "No space left on device")


def test_dev_null_takes_outputs_and_stays_a_device(tmp_path):
    null = Path("/dev/null")
    if not null.exists() or null.is_file():
        pytest.skip("needs a /dev/null device")
    res = CliRunner().invoke(cli, ["collective", "allreduce", "--size", "1MiB", "-t", "ring:4",
                                   "--timeline", "/dev/null"])
    assert res.exit_code == 0, res.output
    assert null.exists() and not null.is_file()


@pytest.mark.parametrize("flags,named,not_named", [
    (["--extrapolate"], ["drop --extrapolate,"], ["--granularity", "--fold"]),
    (["--fold", "--granularity", "stage"], ["drop --granularity stage and --fold,"], ["--extrapolate"]),
    (["--granularity", "kernel"], ["drop --granularity kernel,"], ["--fold", "--extrapolate"]),
])
def test_exact_names_only_the_flags_given_that_clash_with_it(flags, named, not_named):
    line = _refused(["simulate", "gpt3-1.3b", "--exact", *flags], "--exact turns every shortcut off", *named)
    assert not any(word in line for word in not_named), line


# ---------------------------------------------------------------- malformed files
def test_a_truncated_config_json_is_reported_as_json_on_one_line(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 4096\n')
    res = CliRunner().invoke(cli, ["simulate", str(config)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"error: workload file '{config}': invalid JSON (line 2, column 1: Expecting ',' delimiter)"]


@pytest.mark.parametrize("text,where", [("model: [\n", "line 2, column 1"),
                                        ("a: b\n  c: d\n", "line 2, column 4")])
def test_malformed_yaml_is_one_line_with_its_line_and_column(tmp_path, text, where):
    spec = tmp_path / "w.yaml"
    spec.write_text(text)
    res = CliRunner().invoke(cli, ["simulate", str(spec)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: workload file '{spec}': invalid YAML ({where}: ")


@pytest.mark.parametrize("args", [["simulate", "{f}"], ["cluster", "{f}"], ["topology", "show", "{f}"],
                                  ["simulate", "--calibration", "{f}"]])
def test_an_empty_spec_file_is_called_empty(tmp_path, args):
    empty = tmp_path / "spec.yaml"
    empty.write_text("")
    _refused([a.replace("{f}", str(empty)) for a in args], "spec.yaml", "got nothing (the file is empty)")


def test_a_key_with_nothing_after_its_colon_is_called_empty(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text("name: x\nmodel:\n")
    _refused(["simulate", str(spec)], "model: expected a mapping", "got nothing (an empty value)")


@pytest.mark.parametrize("key,value", [("seq_len", 10 ** 100), ("hidden", "1e30"), ("layers", 2 ** 60)])
def test_a_model_dimension_beyond_exact_counting_is_refused_not_simulated(tmp_path, key, value):
    """``seq_len: 1e100`` ran to 'throughput 0 tokens/s' with --no-memory-check."""
    import yaml

    doc = yaml.safe_load((ROOT / "workloads/gpt3-1.3b.yaml").read_text())
    doc["model"][key] = value
    spec = tmp_path / "w.yaml"
    spec.write_text(yaml.safe_dump(doc))
    _refused(["simulate", str(spec), "--no-memory-check"], "w.yaml", f"model.{key}",
             "is above 9,007,199,254,740,992")


# ---------------------------------------------------------------- honest summaries
def test_run_of_a_saved_folded_graph_says_its_ranks_are_folded(tmp_path):
    """``simulate --save-graph`` writes the replica-folded graph; replaying it printed
    '... tasks on 1 ranks' for an 8-GPU job without a word about folding."""
    graph = tmp_path / "g.json"
    res = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", "--global-batch", "64", "--save-graph", str(graph)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["run", str(graph), "-t", "ring:8"])
    assert res.exit_code == 0, res.output
    assert "(replica-folded: 1 simulated rank(s) stand for all 8, 8 lanes each;" in res.output
    res = CliRunner().invoke(cli, ["run", str(graph), "-t", "ring:8", "--json"])
    assert json.loads(res.output)["fold_lanes"] == 8
    # on another number of GPUs: the rank counts, plainly (it named the fold's permutations)
    for topo, gpus in (("dgx-h100:nodes=2", 16), ("ring:4", 4)):
        _refused(["run", str(graph), "-t", topo],
                 f"task graph '{graph}' on topology '{topo}': the graph has 8 ranks but the topology "
                 f"has {gpus} GPUs (the graph is replica-folded: it replays on exactly 8 GPUs; save it "
                 "again for this topology, or unfolded with 'dessim simulate --exact')")


def test_replay_refuses_a_timeline_onto_one_of_the_trace_rank_files(tmp_path):
    for f in (ROOT / "tests/data/chakra/allreduce_1MiB_8npu").glob("ALL_REDUCE.*.et"):
        shutil.copy(f, tmp_path / f.name)
    rank3 = tmp_path / "ALL_REDUCE.3.et"
    before = rank3.read_bytes()
    _refused(["replay", str(tmp_path / "ALL_REDUCE"), "-t", "ring:8", "--timeline", str(rank3)],
             "--timeline", "is the rank file", "would destroy the trace")
    assert rank3.read_bytes() == before


@pytest.mark.parametrize("args,hint", [
    (["simulate", "gpt3-1.3bb"], "unknown workload 'gpt3-1.3bb' (did you mean 'gpt3-1.3b'?)"),
    (["simulate", "GPT3-1.3B"], "(did you mean 'gpt3-1.3b'?)"),
    (["topology", "show", "dgx-h1000:nodes=2"], "unknown topology spec 'dgx-h1000:nodes=2' (did you mean 'dgx-h100'?)"),
    (["simulate", "-t", "dgx-h100-4nod"], "(did you mean 'dgx-h100-4node'?)"),
])
def test_a_misspelt_preset_or_topology_name_gets_a_did_you_mean(args, hint):
    _refused(args, hint)


def test_a_name_close_to_nothing_gets_no_hint():
    assert "did you mean" not in _refused(["simulate", "zzzz"], "unknown workload 'zzzz'")


def test_the_sweep_best_table_keeps_six_significant_digits_of_a_microsecond_time(tmp_path):
    """pandas printed a 74 us time_s as 0.000074: two figures, and equal for 74.0 and 74.4 us."""
    import yaml

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "s", "kind": "collective",
        "base": {"topology": "ring:4", "collective": {"op": "allreduce", "size": "1MiB"}},
        "axes": {"engine.collectives.algo": ["ring", "tree"]}}))
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--no-progress", "--out", str(tmp_path / "r.csv"), "--json"])
    best = json.loads(res.output)["best"][0]["time_s"]
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--no-progress", "--out", str(tmp_path / "r.csv")])
    assert res.exit_code == 0, res.output
    assert f"{best:.6g}" in res.output and best < 1e-3


def test_workload_list_keeps_its_columns_aligned_for_the_longest_preset_name():
    res = CliRunner().invoke(cli, ["workload", "list"])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if " GPUs " in line]
    assert any(line.startswith("llama3-405b-cp16 ") for line in rows)
    assert len({line.index("B ") for line in rows}) == 1, res.output   # the size column


@pytest.mark.parametrize("args,what", [
    (["simulate", "gpt3-1.3b", "--save-graph", "workloads/gpt3-1.3b.yaml"], "workload"),
    (["collective", "allreduce", "--size", "1MiB", "-t", "ring8", "--timeline", "topologies/ring8.yaml"], "topology"),
])
def test_an_output_onto_a_shipped_preset_file_is_refused(args, what, monkeypatch):
    """A preset is an input given by name: 'simulate gpt3-1.3b --save-graph
    workloads/gpt3-1.3b.yaml' in a checkout would have replaced the preset with a task graph."""
    monkeypatch.chdir(ROOT)
    target = ROOT / args[args.index("--save-graph" if "--save-graph" in args else "--timeline") + 1]
    before = target.read_bytes()
    _refused(args, f"is a {what} file shipped with dessim")
    assert target.read_bytes() == before


@pytest.mark.parametrize("algos,sizes,words", [
    ("ring,ring", "1MiB", ["--algos", "'ring' repeats 'ring'"]),
    ("ring", "1MiB,1048576", ["--sizes", "'1048576' repeats '1MiB'"]),
])
def test_compare_refuses_an_algorithm_or_size_given_twice(algos, sizes, words):
    """It printed the row twice and 'winners: 1MiB ring, 1MiB ring'."""
    _refused(["compare", "allreduce", "--algos", algos, "--sizes", sizes, "-t", "ring:4"], *words)


def test_a_rank_map_file_that_does_not_exist_is_called_missing_not_unparsable():
    trace = str(ROOT / "tests/data/chakra/allreduce_1MiB_8npu/ALL_REDUCE")
    _refused(["replay", trace, "-t", "ring:8", "--rank-map", "/nonexistent-dessim/map.yaml"],
             "--rank-map", "file '/nonexistent-dessim/map.yaml' does not exist")


def test_an_output_through_a_symlink_replaces_the_file_it_points_at(tmp_path):
    from dessim.cli.common import write_file

    real = tmp_path / "run-42.csv"
    real.write_text("old\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(real)
    write_file(str(link), "--csv", lambda p: Path(p).write_text("new\n"))
    assert link.is_symlink() and real.read_text() == "new\n"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_sweep_default_out_that_cannot_be_written_names_the_flag(monkeypatch):
    """Without --out the results go to SPEC-results.parquet in the current directory; when
    that directory takes no files, the error says it was --out's default and how to move it."""
    monkeypatch.chdir("/proc")
    _refused(["sweep", str(ROOT / "examples" / "comet" / "sweep.yaml"), "--max-points", "1"],
             "sweep-results.parquet", "the default of --out", "give --out")


@pytest.mark.parametrize("args,words", [
    (["simulate", "gpt3-1.3b", "--timeline", "x.png"],
     ["--timeline", "'.png'", ".json, .json.gz", "Chrome/Perfetto trace", "--gantt x.png"]),
    (["run", "GRAPH", "-t", "ring:4", "--timeline", "x.txt"], ["--timeline", "'.txt'", ".json.gz"]),
    (["collective", "allreduce", "--size", "1MiB", "-t", "ring:4", "--timeline", "x.gz"],
     ["--timeline", "'.gz'", ".json.gz"]),
    (["cluster", "workloads/cluster-two-jobs.yaml", "--timeline", "x.html"], ["--timeline", "'.html'"]),
    (["simulate", "gpt3-1.3b", "--gantt", "x.json"], ["--gantt", "'.json'", "--timeline x.json"]),
    (["simulate", "gpt3-1.3b", "--spans", "x.json"], ["--spans", ".csv, .parquet"]),
    (["simulate", "gpt3-1.3b", "--save-graph", "g.yaml"], ["--save-graph", "'.yaml'", "use .json"]),
    (["compare", "allreduce", "--algos", "ring", "--sizes", "1MiB", "-t", "ring:4", "--csv", "x.parquet"],
     ["--csv", "'.parquet'"]),
    (["compare", "allreduce", "--algos", "ring", "--sizes", "1MiB", "-t", "ring:4", "--plot", "x.html"],
     ["--plot", "'.html'", ".png, .svg, .pdf"]),
    (["cluster", "workloads/cluster-two-jobs.yaml", "--table", "x.json"], ["--table", "'.json'"]),
    (["schema", "workload", "-o", "w.yaml"], ["--output", "'.yaml'", "use .json"]),
])
def test_an_output_of_a_format_the_flag_does_not_write_is_refused_before_any_work(
        args, words, graph, monkeypatch):
    """'--timeline x.png' wrote a Chrome trace's JSON into a .png file: every output flag
    takes only the suffixes of the formats it writes (OUTPUT_KINDS), checked before any
    work, and says what it writes."""
    monkeypatch.chdir(graph.parent)
    shutil.copytree(ROOT / "workloads", graph.parent / "workloads")
    _refused([str(graph) if a == "GRAPH" else a for a in args], *words)
    assert sorted(p.name for p in graph.parent.iterdir()) == ["g.json", "workloads"]


def test_every_output_flag_of_every_command_names_the_formats_it_writes():
    """No output flag takes any suffix: each file output's check knows its formats (one
    table, OUTPUT_KINDS); a prefix (--export-chakra) or a results table checked with its
    journal (sweep, explore --out), a directory (sweep --plots) has its own check."""
    import functools

    from dessim.cli.common import OUTPUT_KINDS, OutputPath
    from dessim.resources import check_output

    seen = set()
    for name, command in cli.commands.items():
        for param in command.params:
            if not isinstance(param.type, OutputPath):
                continue
            check = param.type.check
            if isinstance(check, functools.partial) and check.func is check_output:
                assert check.keywords["formats"], (name, param.name)
                seen.add(check.keywords["what"])
            else:
                # a prefix of several files, a directory (sweep --plots), a results table
                assert (not param.type.names_a_file or (name, param.name) in
                        {("sweep", "out"), ("explore", "out"), ("sweep", "plots")}), (name, param.name)
    assert seen == {k.what for k in OUTPUT_KINDS.values()}


#: A bad value of every value flag of dessim train, and words its one error line must hold.
TRAIN_BAD = [
    (["--tokens", "abc"], ["--tokens", "abc"]), (["--tokens", "0"], ["--tokens", ">= 1"]),
    (["--steps", "1.5"], ["--steps", "whole number"]),
    (["--tokens", "1T", "--steps", "3"], ["--tokens", "--steps", "exactly one"]),
    (["--checkpoint-interval", "often"], ["--checkpoint-interval", "often"]),
    (["--checkpoint-size", "big"], ["--checkpoint-size", "big"]),
    (["--storage-bw", "0"], ["--storage-bw", "zero"]),
    (["--restart", "soon"], ["--restart", "soon"]), (["--rewarm", "-1min"], ["--rewarm", "negative"]),
    (["--mtbf", "gpu=xyz"], ["--mtbf gpu", "xyz"]), (["--mtbf", "cpu=1h"], ["--mtbf", "'cpu'"]),
    (["--gpu-power", "foo=3"], ["--gpu-power", "'foo'", "busy"]),
    (["--gpu-power", "idle=-5"], ["--gpu-power idle", ">= 0"]),
    (["--host-power", "-5"], ["--host-power", ">= 0"]), (["--nic-power", "-1"], ["--nic-power", ">= 0"]),
    (["--switch-power", "-1"], ["--switch-power", ">= 0"]), (["--pue", "0.5"], ["--pue", ">= 1"]),
    (["--usd-per-kwh", "-1"], ["--usd-per-kwh", ">= 0"]),
    (["--usd-per-gpu-hour", "-1"], ["--usd-per-gpu-hour", ">= 0"]),
    (["--capex-per-gpu", "-1"], ["--capex-per-gpu", ">= 0"]),
    (["--capex-per-gpu", "30000"], ["--capex-per-gpu", "--amortisation"]),
    (["--amortisation", "0s"], ["--amortisation", "zero"]),
    (["--samples", "-1"], ["--samples", ">= 0"]), (["--mc-seed", "x"], ["--mc-seed", "'x'"]),
    (["--health-states", "x"], ["--health-states", "'x'"]),
    (["--health-states", "2"], ["--health-states", "--straggler-sigma"]),
    (["--attribute", "-1"], ["--attribute", ">= 0"]),
]


@pytest.mark.parametrize("flags,words", TRAIN_BAD, ids=[" ".join(f) for f, _ in TRAIN_BAD])
def test_train_errors_name_the_flag_the_user_typed(flags, words):
    """dessim train said 'dessim train.checkpoint_bytes: ...' or 'power host_w: ...' (keys of
    the train: mapping and of its classes) for --checkpoint-size, --host-power: each message
    names the flag, as simulate's do."""
    args = ["train", "gpt3-1.3b", "-t", "ring:8,bw=50GB/s,lat=1us", "--samples", "0", *flags]
    if "--steps" not in flags and "--tokens" not in flags:
        args += ["--tokens", "1T"]
    line = _refused(args, *words)
    for spelling in ("train.", "_s:", "_w:", "host_w", "checkpoint_bytes", ": cost ", ": power "):
        # a key's spelling only after the flag (a message that gives both, for files too)
        assert spelling not in line or line.index(words[0]) < line.index(spelling), line


def test_every_train_flag_with_a_value_has_a_bad_value_case():
    from dessim.cli.train_cmd import FLAG_NAMES

    tried = {f for flags, _ in TRAIN_BAD for f in flags if f.startswith("--")}
    assert set(FLAG_NAMES.values()) <= tried, set(FLAG_NAMES.values()) - tried


def test_a_large_json_timeline_suggests_json_gz_on_stderr_only(tmp_path, monkeypatch):
    """A natural '--timeline trace.json' of a large run is tens of MB of link counters: the
    command says that .json.gz writes the same trace compressed, on standard error, so that
    --json output stays one JSON object; a .json.gz timeline gets no tip."""
    from dessim.cli import common

    monkeypatch.setattr(common, "LARGE_TIMELINE_BYTES", 100)
    args = ["collective", "allreduce", "--size", "1MiB", "-t", "ring:4", "--json", "--timeline"]
    res = CliRunner().invoke(cli, [*args, str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["timeline"] == str(tmp_path / "t.json")
    assert f"--timeline {tmp_path / 't.json'}.gz writes the same trace compressed" in res.stderr
    res = CliRunner().invoke(cli, [*args, str(tmp_path / "t.json.gz")])
    assert res.exit_code == 0 and "tip:" not in res.stderr
