"""One run configuration gives one result, whichever entry point runs it.

The same inputs — a workload file, a topology, layout and generator overrides, engine options —
go through

* the command line: ``dessim simulate --json --spans``, then ``dessim run`` of the task graph it
  saved (``dessim replay`` for a Chakra trace),
* the Python API: :func:`dessim.workload.simulate_workload` (:func:`dessim.trace.replay_chakra`),
* ``dessim cluster --json --spans`` with the job alone in the cluster, all its GPUs,
* ``dessim sweep`` with one point,

and every figure must be the same float, bit for bit (``==``): the iteration time, the whole
summary, the per-rank table and the span of every task. Where an entry point reports less, the
test says what and why (:data:`SWEEP_DROPS`, :func:`cluster_job_figures`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.engine import EngineOptions
from dessim.sweep.points import flatten
from dessim.trace import replay_chakra
from dessim.workload import simulate_workload

CHAKRA = Path(__file__).parent / "data" / "chakra"

#: A small GPT: 4 layers, TP × PP × DP = 2 × 2 × 2 on one 8-GPU node.
TINY_GPT = {
    "name": "tiny-gpt",
    "model": {"layers": 4, "hidden": 256, "heads": 8, "ffn_hidden": 1024, "vocab": 1024,
              "seq_len": 256},
    "parallelism": {"tp": 2, "pp": 2},
    "training": {"global_batch": 8, "micro_batch": 1, "zero_stage": 1, "recompute": "selective",
                 "bucket_size": "1MiB", "attention": "flash2"},
}

#: A measured calibration unlike the built-in one (slower NVLink, a larger NCCL call overhead).
LAB_CALIBRATION = {"name": "lab", "nccl": {"call_overhead": "31us"},
                   "links": {"nvlink4": {"efficiency": 0.7}}}


@dataclass(frozen=True)
class Case:
    """One run configuration, in the words of the Python API."""

    id: str
    workload: str                                       #: preset name or key of WORKLOAD_FILES
    topology: str
    overrides: Mapping[str, Any] = field(default_factory=dict)   #: simulate_workload overrides
    engine: Mapping[str, Any] = field(default_factory=dict)      #: EngineOptions, nested parts
    calibration: bool = False                           #: run with LAB_CALIBRATION


WORKLOAD_FILES: dict[str, Mapping[str, Any]] = {"tiny-gpt": TINY_GPT}

CASES = [
    Case("gpt-layer-ring", "tiny-gpt", "dgx-h100:nodes=1",
         {"granularity": "layer", "fold": False},
         {"collectives": {"algo": "ring", "reduction_bw": "200GB/s"}}),
    Case("gpt-stage-fold-analytical", "tiny-gpt", "dgx-h100:nodes=1",
         {"granularity": "stage", "fold": True, "micro_batch": 2}, {"network": "analytical"}),
    Case("gpt-tp8-closed-form", "tiny-gpt", "dgx-h100:nodes=1",
         {"tp": 8, "pp": 1, "granularity": "stage"},
         {"network": "analytical", "collectives": {"algo": "ring", "chunks": 2}}),
    Case("gpt-auto-straggler", "tiny-gpt", "dgx-h100:nodes=1",
         {"hbm_capacity": "40GB"}, {"noise": {"slowdown": {3: 1.25}, "straggler_sigma": 0.05, "seed": 7}}),
    Case("gpt-unfused-calibrated-2-nodes", "tiny-gpt", "dgx-h100:nodes=2",
         {"attention": "unfused", "tp": 4, "granularity": "stage"},
         {"collectives": {"protocol": "Simple", "chunks": 2}},
         calibration=True),
    Case("dlrm", "dlrm-small", "dgx-h100:nodes=1", {}, {"collectives": {"algo": "tree"}}),
    Case("cnn-calibrated-straggler", "resnet50", "dgx-h100:nodes=1",
         {"training": {"global_batch": 64}}, {"noise": {"straggler_sigma": 0.1, "seed": 1}},
         calibration=True),
]


# ---------------------------------------------------------------- the inputs, as each entry point takes them
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The workload files and the calibration file, written once."""
    root = tmp_path_factory.mktemp("inputs")
    out = {}
    for name, doc in WORKLOAD_FILES.items():
        out[name] = str(root / f"{name}.yaml")
        Path(out[name]).write_text(yaml.safe_dump(dict(doc)))
    out["calibration"] = str(root / "lab.yaml")
    Path(out["calibration"]).write_text(yaml.safe_dump(LAB_CALIBRATION))
    return out


def workload_of(case: Case, files: Mapping[str, str]) -> str:
    return files.get(case.workload, case.workload)


def engine_of(case: Case, files: Mapping[str, str]) -> dict[str, Any]:
    return {**case.engine, **({"calibration": files["calibration"]} if case.calibration else {})}


#: simulate_workload override → ``dessim simulate`` flag.
_FLAGS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "micro_batch": "--micro-batch",
          "global_batch": "--global-batch", "attention": "--attention", "granularity": "--granularity",
          "network": "--network", "algo": "--algo", "protocol": "--protocol", "chunks": "--chunks",
          "channels": "--channels", "straggler_sigma": "--straggler-sigma", "seed": "--seed",
          "calibration": "--calibration", "reduction_bw": "--reduction-bw", "hbm_capacity": "--hbm"}


def flat_engine(engine: Mapping[str, Any]) -> dict[str, Any]:
    """Engine options by their last name (the flag's): ``{"collectives": {"algo": "ring"}}`` →
    ``{"algo": "ring"}``."""
    out: dict[str, Any] = {}
    for key, value in engine.items():
        out.update(value if key in ("collectives", "noise", "shortcuts") else {key: value})
    return out


def cli_flags(overrides: Mapping[str, Any], engine: Mapping[str, Any]) -> list[str]:
    """The command-line spelling of overrides and engine options."""
    args: list[str] = []
    for key, value in {**overrides, **flat_engine(engine)}.items():
        if key == "fold":
            args.append("--fold" if value else "--no-fold")
        elif key == "slowdown":
            args += [f"--slowdown={rank}={factor}" for rank, factor in value.items()]
        elif key == "training":      # a section override: only global_batch has a flag
            args += [f"--global-batch={value['global_batch']}"]
        else:
            args.append(f"{_FLAGS[key]}={value}")
    return args


def invoke(args: list[str]) -> str:
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


# ---------------------------------------------------------------- each entry point
@dataclass
class Outcome:
    summary: dict[str, Any]
    spans: pd.DataFrame


def as_json(obj: Any) -> Any:
    """``obj`` as the command line prints it (``--json``): JSON floats round-trip exactly."""
    return json.loads(json.dumps(obj, default=float))


def run_api(case: Case, files: Mapping[str, str], shortcuts: Mapping[str, bool] | None = None,
            **overrides: Any) -> tuple[Outcome, pd.DataFrame]:
    engine = engine_of(case, files)
    if shortcuts:
        engine = {**engine, "shortcuts": {**engine.get("shortcuts", {}), **shortcuts}}
    result = simulate_workload(workload_of(case, files), case.topology,
                               overrides={**case.overrides, **overrides},
                               options=EngineOptions.of(engine, record_links=False))
    return Outcome(as_json(result.summary()), result.simulation.spans()), result.simulation.rank_table()


def run_api_unfolded(case: Case, files: Mapping[str, str], api: Outcome) -> Outcome:
    """What a cluster replays: every rank. Folding is exact here, so the iteration time is
    that of ``api``; means over ranks (exposed communication, compute) are sums over other
    ranks and may differ in the last bit.

    Both runs may replay collectives alone on their own links from the memo (the unfolded
    run those of several member tasks, one per rank): equal to their simulation up to the
    float rounding of a replayed start time (tests/test_link_memo.py). Folding itself stays
    bit-exact: without that shortcut the folded run equals the unfolded one."""
    if api.summary.get("fold") is None:     # not folded (fell back, or a kind that never folds)
        return api
    unfolded = run_api(case, files, fold=False)[0]

    def replayed(run: Outcome) -> bool:
        return bool(((run.summary.get("shortcuts") or {}).get("collective_memo") or {})
                    .get("replayed_on_links"))
    if replayed(api) or replayed(unfolded):
        folded = run_api(case, files, shortcuts={"link_memo": False})[0]
        plain = (run_api(case, files, shortcuts={"link_memo": False}, fold=False)[0]
                 if replayed(unfolded) else unfolded)
        assert plain.summary["iteration_s"] == folded.summary["iteration_s"]
        for run in (api, unfolded):
            assert run.summary["iteration_s"] == pytest.approx(folded.summary["iteration_s"], rel=1e-12)
    else:
        assert unfolded.summary["iteration_s"] == api.summary["iteration_s"]
    return unfolded


def run_cli(case: Case, files: Mapping[str, str], tmp: Path) -> tuple[Outcome, Outcome]:
    """``dessim simulate``, and ``dessim run`` of the task graph it saved (same engine flags)."""
    spans, graph = tmp / "cli-spans.parquet", tmp / "graph.json"
    out = invoke(["simulate", workload_of(case, files), "--topology", case.topology, "--json",
                  "--spans", str(spans), "--save-graph", str(graph),
                  *cli_flags(case.overrides, engine_of(case, files))])
    run_spans = tmp / "run-spans.parquet"
    run = invoke(["run", str(graph), "--topology", case.topology, "--json", "--spans", str(run_spans),
                  *cli_flags({}, engine_of(case, files))])
    return Outcome(json.loads(out), pd.read_parquet(spans)), Outcome(json.loads(run), pd.read_parquet(run_spans))


def run_cluster(case: Case, files: Mapping[str, str], tmp: Path, gpus: int) -> Outcome:
    """The job alone in a cluster of its own GPUs: the engine options in the file's ``engine:``
    section, the calibration by ``--calibration`` (as a user would write them). Replica
    folding is left to the cluster, which merges jobs rank by rank and so never folds."""
    spec = tmp / "cluster.yaml"
    spec.write_text(yaml.safe_dump({
        "kind": "cluster", "topology": case.topology, "engine": dict(case.engine),
        "jobs": [{"name": "solo", "workload": workload_of(case, files), "gpus": gpus,
                  "overrides": without(case.overrides, "fold")}]}))
    spans = tmp / "cluster-spans.parquet"
    out = invoke(["cluster", str(spec), "--json", "--spans", str(spans)]
                 + (["--calibration", files["calibration"]] if case.calibration else []))
    table = pd.read_parquet(spans)
    table["task"] = table["task"].str.removeprefix("solo/")   # the merged graph's job prefix
    return Outcome(json.loads(out), table)


def run_sweep(case: Case, files: Mapping[str, str], tmp: Path) -> dict[str, Any]:
    """A one-point sweep: the engine options in its base, but one — the collective algorithm
    if the case forces one, else the per-rank slowdown if it has one, else the seed — given as
    an axis of one value, by its dotted path in the options (``engine.collectives.algo``)."""
    parts = {k: dict(v) if isinstance(v, Mapping) else v for k, v in case.engine.items()}
    part, name = next(((p, n) for p, n in (("collectives", "algo"), ("noise", "slowdown"))
                       if n in parts.get(p, {})), ("noise", "seed"))
    value = parts.get(part, {}).pop(name, 0)
    spec = tmp / "sweep.yaml"
    spec.write_text(yaml.safe_dump({
        "kind": "workload",
        "base": {"workload": workload_of(case, files), "topology": case.topology,
                 "engine": parts, "overrides": dict(case.overrides)},
        "axes": {f"engine.{part}.{name}": [value]}}))
    out = tmp / "sweep.parquet"
    invoke(["sweep", str(spec), "--out", str(out), "--no-progress"]
           + (["--calibration", files["calibration"]] if case.calibration else []))
    table = pd.read_parquet(out)
    assert list(table["status"]) == ["ok"], list(table["reason"])
    return table.iloc[0].to_dict()


#: What a sweep row leaves out of the summary, and why: host time is not a result of the
#: configuration, and rank lists do not fit a table cell (dessim.sweep.points).
SWEEP_DROPS = ("wall_s", "groups")


def without(summary: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in keys}


def nonzero(exposed: Mapping[str, float]) -> dict[str, float]:
    """Exposed communication without the categories at 0: a transformer's summary lists every
    category it knows, a cluster's job the categories the engine accounted on its ranks."""
    return {k: v for k, v in exposed.items() if v}


def cluster_job_figures(job: Mapping[str, Any], calibration: str) -> dict[str, Any]:
    """What ``dessim cluster`` reports of a job in the terms of a workload summary: the
    iteration time (alone and shared: alone in the cluster they are the same run), the exposed
    communication per category, the calibration."""
    assert job["alone_s"] == job["shared_s"] and job["exposed_comm_alone_s"] == job["exposed_comm_shared_s"]
    return {"iteration_s": job["shared_s"], "exposed_comm_s": nonzero(job["exposed_comm_shared_s"]),
            "calibration": calibration}


# ---------------------------------------------------------------- the agreement
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_entry_point_gives_the_same_result(case: Case, files: dict[str, str], tmp_path: Path) -> None:
    api, ranks = run_api(case, files)
    cli_run, replayed = run_cli(case, files, tmp_path)
    cluster = run_cluster(case, files, tmp_path, api.summary["gpus"])
    row = run_sweep(case, files, tmp_path)

    # the command line: the same summary (but host time and the files it wrote), the same spans
    assert without(cli_run.summary, "wall_s", "files") == without(api.summary, "wall_s")
    pd.testing.assert_frame_equal(cli_run.spans, api.spans, check_exact=True)
    # ... and ``dessim run`` of the graph it saved: the same spans and per-rank table
    pd.testing.assert_frame_equal(replayed.spans, api.spans, check_exact=True)
    assert replayed.summary["per_rank"] == as_json(ranks.to_dict(orient="records"))
    assert replayed.summary["makespan_s"] == api.summary["iteration_s"]

    # the cluster, the job alone on all its GPUs: the same iteration, per-category exposed
    # communication and spans of every task on every rank as the API's run of every rank
    unfolded = run_api_unfolded(case, files, api)
    assert cluster_job_figures(cluster.summary["jobs"][0], cluster.summary["calibration"]) == {
        "iteration_s": unfolded.summary["iteration_s"],
        "exposed_comm_s": nonzero(unfolded.summary["exposed_comm_s"]),
        "calibration": unfolded.summary["calibration"]}
    assert cluster.summary["makespan_s"] == unfolded.summary["iteration_s"]   # api's (above)
    pd.testing.assert_frame_equal(cluster.spans, unfolded.spans, check_exact=True)

    # the sweep: every summary figure in its row, flattened with dots
    expected = flatten(without(api.summary, *SWEEP_DROPS))
    assert {k: row[k] for k in expected} == expected

    # and the per-rank table is that of the spans (every rank ends when its last task does)
    assert list(ranks["end_s"]) == list(api.spans.groupby("rank")["end_s"].max())
    assert api.summary["iteration_s"] == max(ranks["end_s"])


def test_a_chakra_trace_replays_the_same_from_the_command_line_and_the_api(files: dict[str, str],
                                                                            tmp_path: Path) -> None:
    prefix = str(CHAKRA / "dp_overlap_8npu" / "dp_overlap")
    topology = "ring:8,bw=50GB/s,lat=500ns"
    engine = {"collectives": {"algo": "ring"}, "noise": {"slowdown": {2: 1.5}},
              "calibration": files["calibration"]}
    api = replay_chakra(prefix, topology, EngineOptions.of(engine, record_links=False))
    spans = tmp_path / "replay-spans.parquet"
    out = json.loads(invoke(["replay", prefix, "--topology", topology, "--json", "--spans", str(spans),
                             *cli_flags({}, engine)]))
    assert without(out, "wall_s", "files", "trace", "per_rank") == without(as_json(api.summary()), "wall_s")
    assert out["per_rank"] == as_json(api.rank_table().to_dict(orient="records"))
    pd.testing.assert_frame_equal(pd.read_parquet(spans), api.spans(), check_exact=True)
    assert api.makespan_s > 0.0


def test_a_chakra_trace_is_a_workload_every_entry_point_takes(files: dict[str, str],
                                                              tmp_path: Path) -> None:
    """``kind: chakra`` workload files replay their trace through the one workload pipeline:
    ``dessim simulate FILE``, the Python API, a cluster job and a sweep point all give what
    ``dessim replay`` gives (the forced algorithm applied per collective, as replay does)."""
    prefix = CHAKRA / "dp_overlap_8npu" / "dp_overlap"
    topology = "ring:8,bw=50GB/s,lat=500ns"
    engine = {"collectives": {"algo": "ring"}, "noise": {"slowdown": {2: 1.5}}}
    wl = tmp_path / "trace.yaml"
    wl.write_text(yaml.safe_dump({"kind": "chakra", "name": "dp", "trace": str(prefix)}))
    replay = replay_chakra(str(prefix), topology, EngineOptions.of(engine, record_links=False))

    api = simulate_workload(str(wl), topology, options=EngineOptions.of(engine, record_links=False))
    assert api.summary()["kind"] == "chakra" and api.iteration_s == replay.makespan_s
    assert without(api.simulation.summary(), "wall_s") == without(replay.summary(), "wall_s")

    out = json.loads(invoke(["simulate", str(wl), "--topology", topology, "--json",
                             *cli_flags({}, engine)]))
    assert without(out, "wall_s", "files", "per_rank", "workload", "kind") == \
        without(as_json(replay.summary()), "wall_s")
    assert out["per_rank"] == as_json(replay.rank_table().to_dict(orient="records"))

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"kind": "cluster", "topology": topology, "engine": engine,
                                       "jobs": [{"name": "solo", "workload": str(wl), "gpus": 8}]}))
    job = json.loads(invoke(["cluster", str(cluster), "--json"]))["jobs"][0]
    assert job["alone_s"] == job["shared_s"] == replay.makespan_s

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "kind": "workload", "base": {"workload": str(wl), "topology": topology,
                                     "engine": {"noise": engine["noise"]}},
        "axes": {"engine.collectives.algo": ["ring"]}}))
    table = tmp_path / "sweep.parquet"
    invoke(["sweep", str(sweep), "--out", str(table), "--no-progress"])
    row = pd.read_parquet(table).iloc[0]
    assert row["status"] == "ok" and row["iteration_s"] == replay.makespan_s


@pytest.mark.parametrize("doc, match", [
    ({"kind": "chakra"}, "lacks trace"),
    ({"kind": "chakra", "trace": "t", "ranks": 8}, "unknown key 'ranks'"),
    ({"kind": "chakra", "trace": "t", "cost_compute": "yes"}, "cost_compute: expected true or false"),
])
def test_a_bad_chakra_workload_file_is_refused_before_any_work(doc, match, tmp_path: Path) -> None:
    from dessim.errors import SpecError
    from dessim.workload.kinds import load_any_workload
    wl = tmp_path / "bad.yaml"
    wl.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=match):
        load_any_workload(str(wl))


def test_a_trace_replay_takes_no_model_options(tmp_path: Path) -> None:
    from dessim.errors import SpecError
    wl = tmp_path / "trace.yaml"
    wl.write_text(yaml.safe_dump({"kind": "chakra",
                                  "trace": str(CHAKRA / "dp_overlap_8npu" / "dp_overlap")}))
    with pytest.raises(SpecError, match="takes no option granularity='stage'"):
        simulate_workload(str(wl), "ring:8,bw=50GB/s,lat=500ns", overrides={"granularity": "stage"})
