"""Gantt charts at scale: activities, exact and binned rows, the 2 MB HTML bound, the title,
a browser rendering (when a headless Chromium is installed), and the timeline's GB/s counters."""

from __future__ import annotations

import json
from pathlib import Path
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.engine import simulate
from dessim.engine.result import SPAN_COLUMNS, SimulationResult
from dessim.errors import DessimError
from dessim.outputs import chrome_trace
from dessim.outputs.activity import (ACTIVITIES, Segment, classify, gantt_rows, rank_lanes)
from dessim.outputs.gantt import GanttLabels, GanttOptions, build_gantt, gantt_html, write_gantt
from dessim.taskgraph import Task, TaskGraph
from engine_helpers import BW, line

COL = {c: i for i, c in enumerate(SPAN_COLUMNS)}
IDX = {a.name: i for i, a in enumerate(ACTIVITIES)}


def span(rank, start, end, kind="compute", category="fwd", name="t", stream="compute", active=None):
    active = start if active is None else active
    return (rank, stream, f"{rank}.{start}", name, kind, category, start, active, end, 0.0, 0.0, "", -1)


def result_of(records, makespan=None, **meta):
    end = max(r[COL["end_s"]] for r in records)
    return SimulationResult(makespan_s=makespan or end, ranks=[], span_records=records,
                            link_bytes={}, link_capacity={}, link_series=[], events=0, wall_s=0.0,
                            network="flow", meta={"graph": "g", "topology": "topo", **meta})


# ------------------------------------------------------------------ activities
@pytest.mark.parametrize("kind, category, name, expected", [
    ("compute", "fwd", "fwd L0 attn.qkv mb0", "forward"),
    ("compute", "bwd", "bwd L0 attn.qkv.dgrad mb0", "backward"),
    ("compute", "bwd", "bwd L3 mlp.up.wgrad mb1", "weight-gradient"),
    ("compute", "bwd", "bwd L3 mlp.norm.bwd..attn.proj.wgrad mb1", "backward"),   # merged range
    ("compute", "recompute", "recompute L0 x mb0", "recompute"),
    ("compute", "optimizer", "adam", "optimizer"),
    ("compute", "", "kernel", "other compute"),
    ("collective", "tp", "tp L0 ar", "tp"),
    ("delay", "tp", "tp tail", "tp"),               # closed-form TP is communication
    ("send", "pp", "pp send", "pp"),
    ("collective", "dp", "grad ar", "dp"),
    ("memcpy", "offload", "act.offload", "offload"),
    ("collective", "comm.pg3", "all_reduce", "other comm"),
])
def test_spans_are_classified_into_activities(kind, category, name, expected):
    assert classify(kind, category, name) == expected


def test_a_rank_lane_is_flattened_by_priority_with_idle_gaps():
    recs = [span(0, 0.0, 1.0, category="fwd", name="f"),
            span(0, 2.0, 3.0, category="bwd", name="b1"), span(0, 3.0, 4.0, category="bwd", name="b2"),
            span(0, 0.5, 2.5, "collective", "dp", stream="dp"),
            span(0, 1.0, 2.0, "collective", "tp", stream="tp")]
    lanes = rank_lanes(recs, 5.0, COL)[0]
    assert [(s.start_s, s.end_s, ACTIVITIES[s.activity].name) for s in lanes["compute"]] == [
        (0.0, 1.0, "forward"), (1.0, 2.0, "idle"), (2.0, 4.0, "backward"), (4.0, 5.0, "idle")]
    assert lanes["compute"][0].label == "f" and lanes["compute"][2].label == ""   # two tasks merged
    assert [(s.start_s, s.end_s, ACTIVITIES[s.activity].name) for s in lanes["comm"]] == [
        (0.5, 1.0, "dp"), (1.0, 2.0, "tp"), (2.0, 2.5, "dp")]                  # tp before dp


def test_waiting_for_peers_is_not_drawn_as_communication():
    recs = [span(0, 0.0, 4.0, "recv", "pp", stream="pp.recv", active=3.0)]
    (seg,) = rank_lanes(recs, 4.0, COL)[0]["comm"]
    assert (seg.start_s, seg.end_s) == (3.0, 4.0)


# ------------------------------------------------------------------ binning
segments = st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3), st.sampled_from(
    ["forward", "backward", "tp", "dp", "pp"])), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ranks=st.lists(segments, min_size=1, max_size=5), bins=st.integers(1, 50))
def test_binned_rows_stay_within_bins_and_cover_the_run(ranks, bins):
    recs = []
    for r, spans in enumerate(ranks):
        for start, dur, act in spans:
            cat = {"forward": "fwd", "backward": "bwd"}.get(act, act)
            kind = "compute" if act in ("forward", "backward") else "collective"
            recs.append(span(r, start, start + dur + 1e-3, kind, cat, stream=f"s{act}"))
    if not recs:
        return
    makespan = max(x[COL["end_s"]] for x in recs)
    lanes = rank_lanes(recs, makespan, COL)
    rows = gantt_rows(lanes, [("all", tuple(range(len(ranks))))], makespan, bins)
    for lane in rows:
        assert len(lane.segments) <= bins
        ends = [(s.start_s, s.end_s) for s in lane.segments]
        assert ends == sorted(ends) and all(e > s for s, e in ends)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(ends, ends[1:]))     # no overlap
        assert all(0 < s.share <= 1 for s in lane.segments)
    compute = next(lane for lane in rows if lane.lane == "compute")
    # the compute lane (work or idle) covers the whole run, exact or binned
    assert sum(s.end_s - s.start_s for s in compute.segments) == pytest.approx(makespan)


def test_majority_per_bin_and_comm_share():
    # rank 0: forward 0..0.6 then idle; rank 1: backward 0..0.3; one bin of 1 s
    recs = [span(0, 0.0, 0.6), span(1, 0.0, 0.3, category="bwd"),
            span(0, 0.0, 0.2, "collective", "tp", stream="tp"), span(1, 0.9, 1.0, "collective", "tp", stream="tp")]
    lanes = rank_lanes(recs, 1.0, COL)
    compute, comm = gantt_rows(lanes, [("both", (0, 1))], 1.0, bins=1)
    # rank-seconds: forward 0.6, backward 0.3, idle 0.4 + 0.7 = 1.1 -> idle wins
    assert [ACTIVITIES[s.activity].name for s in compute.segments] == ["idle"] and compute.binned
    # tp covers 0.3 of 2 rank-seconds = 15% -> drawn at the first quarter level
    (seg,) = comm.segments
    assert ACTIVITIES[seg.activity].name == "tp" and seg.share == 0.25


def test_a_single_rank_row_is_exact_while_it_fits():
    recs = [span(0, 0.0, 1e-6, name="tiny"), span(0, 1.0, 2.0, category="bwd")]
    lanes = rank_lanes(recs, 2.0, COL)
    compute = gantt_rows(lanes, [("rank 0", (0,))], 2.0, bins=10)[0]
    assert not compute.binned and compute.segments[0] == Segment(0.0, 1e-6, IDX["forward"], "tiny")


# ------------------------------------------------------------------ rows and title
def many_ranks(n, passes=40):
    """n ranks, 4 pipeline stages, each rank alternating forward/backward with TP between."""
    recs = []
    for r in range(n):
        t = (r // (n // 4)) * 0.01
        for p in range(passes):
            cat = "fwd" if p % 2 == 0 else "bwd"
            recs.append(span(r, t, t + 0.01, category=cat, name=f"{cat} L0 x mb{p}"))
            recs.append(span(r, t + 0.01, t + 0.011, "collective", "tp", stream="tp"))
            t += 0.0115
    return recs


def stages_of(n):
    return tuple((f"stage {s}", tuple(range(s * n // 4, (s + 1) * n // 4))) for s in range(4))


def test_rows_follow_the_mode():
    res = result_of(many_ranks(16))
    labels = GanttLabels("gpt", "tp=4 pp=4", "dgx", stages_of(16))
    assert len({lane.row for lane in build_gantt(res, labels).lanes}) == 4          # auto: stages
    by_rank = build_gantt(res, labels, GanttOptions(rows="rank"))
    assert [lane.row for lane in by_rank.lanes][::2] == [f"rank {r}" for r in range(16)]
    blocks = build_gantt(res, labels, GanttOptions(rows="rank", max_rows=5))
    assert [lane.row for lane in blocks.lanes][::2] == ["ranks 0-3", "ranks 4-7", "ranks 8-11", "ranks 12-15"]
    assert "one row per 4 consecutive ranks" in blocks.subtitle
    assert "one row per rank" in build_gantt(res).subtitle                          # no stages given
    with pytest.raises(DessimError, match="no pipeline stages"):
        build_gantt(res, options=GanttOptions(rows="stage"))
    with pytest.raises(DessimError, match="Gantt rows 'stages'"):
        GanttOptions(rows="stages")


def test_title_names_workload_layout_topology_and_iteration_time():
    res = result_of(many_ranks(8))
    chart = build_gantt(res, GanttLabels("gpt3-1.3b", "tp=2 pp=4 dp=1", "dgx-h100:nodes=1", stages_of(8)))
    assert chart.title == (f"gpt3-1.3b · tp=2 pp=4 dp=1 · on dgx-h100:nodes=1 · iteration "
                           f"{res.makespan_s * 1e3:.4g} ms")
    assert build_gantt(res).title.startswith("g · on topo · iteration")           # from meta


def test_html_of_1024_ranks_stays_under_the_byte_bound(tmp_path):
    res = result_of(many_ranks(1024, passes=8))
    labels = GanttLabels("w", "l", "t", stages_of(1024))
    for options in (GanttOptions(rows="rank"), GanttOptions(rows="rank", max_rows=1024)):
        path = write_gantt(res, tmp_path / "g.html", labels, options)
        assert path.stat().st_size <= 2_000_000
    small = write_gantt(res, tmp_path / "s.html", labels, GanttOptions(rows="rank", max_bytes=100_000))
    assert small.stat().st_size <= 100_000       # bins halved until it fits
    with pytest.raises(DessimError, match="1024 rows need .* bytes even at one time bin"):
        write_gantt(res, tmp_path / "s.html", labels, GanttOptions(rows="rank", max_rows=1024,
                                                                  max_bytes=100_000))


def test_html_is_well_formed_and_deterministic(tmp_path):
    res = result_of(many_ranks(8))
    labels = GanttLabels("w", "l", "t", stages_of(8))
    a = write_gantt(res, tmp_path / "a.html", labels).read_bytes()
    assert a == write_gantt(res, tmp_path / "b.html", labels).read_bytes()
    text = a.decode()
    svg = ET.fromstring(text[text.index("<svg"):text.index("</svg>") + 6])
    paths = svg.findall("{http://www.w3.org/2000/svg}path")
    colors = {p.get("stroke") for p in paths}
    assert {ACTIVITIES[IDX[n]].color for n in ("forward", "backward", "tp")} <= colors
    assert "<script src" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    res = result_of(many_ranks(8))
    png = write_gantt(res, tmp_path / "g.png", GanttLabels("w", "l", "t", stages_of(8)))
    from matplotlib.image import imread

    img = imread(png)
    assert img.shape[1] == 1400 and len({tuple(p) for p in img.reshape(-1, img.shape[2])[::97]}) > 5


def test_simulated_run_shows_its_phases():
    g = TaskGraph("pipe")
    g.add(Task("f0", 0, "compute", duration=1e-3, category="fwd"))
    g.add(Task("s0", 0, "send", peer=1, size=1e6, category="pp"), ["f0"])
    g.add(Task("r1", 1, "recv", peer=0, size=1e6, category="pp"))
    g.add(Task("f1", 1, "compute", duration=1e-3, category="fwd"), ["r1"])
    g.add(Task("b1", 1, "compute", duration=2e-3, category="bwd", name="bwd L0 x.wgrad"), ["f1"])
    chart = build_gantt(simulate(g, line(2)))
    names = [[ACTIVITIES[s.activity].name for s in lane.segments] for lane in chart.lanes]
    assert names == [["forward", "idle"], ["pp"], ["idle", "forward", "weight-gradient"], ["pp"]]


BROWSER = next((b for b in ("chromium-headless-shell", "chromium", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_the_html_renders_in_a_headless_browser(tmp_path):
    from PIL import Image

    res = result_of(many_ranks(64))
    html = write_gantt(res, tmp_path / "g.html", GanttLabels("w", "l", "t", stages_of(64)),
                       GanttOptions(rows="rank"))
    shot = tmp_path / "shot.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,1800", f"--screenshot={shot}", html.as_uri()],
                   check=True, capture_output=True, timeout=120)
    img = Image.open(shot).convert("RGB")
    colors = {c for _, c in img.getcolors(1 << 20)}
    for name in ("forward", "backward", "idle"):
        hexa = ACTIVITIES[IDX[name]].color
        assert tuple(int(hexa[i:i + 2], 16) for i in (1, 3, 5)) in colors, name
    # 64 rank rows: forward pixels reach the lower part of the page
    fwd = ACTIVITIES[IDX["forward"]].color
    rgb = tuple(int(fwd[i:i + 2], 16) for i in (1, 3, 5))
    lowest = max(y for y in range(0, img.height, 4) for x in range(200, 1300, 50)
                 if img.getpixel((x, y)) == rgb)
    assert lowest > 64 * 20


# ------------------------------------------------------------------ timeline counters
def test_timeline_link_counters_in_gb_per_s_and_utilisation():
    g = TaskGraph("one")
    g.add(Task("s", 0, "send", peer=1, size=4e6, category="pp"))
    g.add(Task("r", 1, "recv", peer=0, size=4e6, category="pp"))
    from dessim.engine import EngineOptions

    res = simulate(g, line(2), EngineOptions(record_links=True))
    events = [e for e in chrome_trace(res)["traceEvents"] if e["ph"] == "C"]
    # one counter per link, both values in each event: Perfetto names a counter track
    # "<name> <arg key>", so these are the tracks "gpu0->gpu1 GB/s" and "gpu0->gpu1 utilisation"
    link = [e["args"] for e in events if e["name"] == "gpu0->gpu1"]
    assert link and all(list(a) == ["GB/s", "utilisation"] for a in link)
    rate = [a["GB/s"] for a in link]
    util = [a["utilisation"] for a in link]
    assert max(rate) == pytest.approx(BW / 1e9) and max(util) == pytest.approx(1.0)
    assert rate[-1] == 0
    json.dumps(events, allow_nan=False)             # no NaN in the trace


# ------------------------------------------------------------------ command line
def test_cli_gantt_rows_and_max_rows(tmp_path):
    from click.testing import CliRunner

    from dessim.cli.main import cli

    prefix = str(Path(__file__).parent / "data" / "chakra" / "dp_overlap_8npu" / "dp_overlap")
    out = tmp_path / "g.html"
    res = CliRunner().invoke(cli, ["replay", prefix, "-t", "ring:8,bw=50GB/s,lat=500ns",
                                   "--gantt", str(out), "--gantt-rows", "rank", "--gantt-max-rows", "4"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert all(f">ranks {a}-{a + 1}<" in text for a in (0, 2, 4, 6))
    assert "one row per 2 consecutive ranks" in text
    res = CliRunner().invoke(cli, ["replay", prefix, "-t", "ring:8,bw=50GB/s,lat=500ns",
                                   "--gantt", str(out), "--gantt-rows", "stage"])
    assert res.exit_code == 2 and "no pipeline stages" in res.output and "Traceback" not in res.output


def test_a_transformer_run_gets_stage_rows_and_its_layout_in_the_title():
    from dessim.outputs.gantt import workload_labels
    from dessim.workload import simulate_workload

    small = {"model": {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096},
             "training": {"seq_len": 512, "micro_batch": 1, "global_batch": 4},
             "tp": 2, "pp": 2, "granularity": "kernel", "fold": False}
    result = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides=small)
    labels = workload_labels(result, "dgx-h100:nodes=1")
    assert labels.stages == (("stage 0", (0, 1, 2, 3)), ("stage 1", (4, 5, 6, 7)))   # pp outermost
    chart = build_gantt(result.simulation, labels)
    assert [lane.row for lane in chart.lanes] == ["stage 0"] * 2 + ["stage 1"] * 2
    assert chart.title.startswith("gpt3-1.3b · tp=2 pp=2 dp=2 (8 GPUs)")
    assert "on dgx-h100:nodes=1 · iteration" in chart.title
    used = {ACTIVITIES[s.activity].name for lane in chart.lanes for s in lane.segments}
    assert {"forward", "backward", "weight-gradient", "tp", "pp", "dp"} <= used, used


def test_a_gantt_chart_keeps_the_shortcuts_of_the_run_without_it(tmp_path):
    # the chart draws task spans only; asking for it used to record link utilisation too,
    # which turned the collective memo off (llama3-8b on 64 H100: 9 s instead of 0.9 s)
    from click.testing import CliRunner

    from dessim.cli.main import cli

    base = ["simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=2"]
    plain = CliRunner().invoke(cli, base)
    drawn = CliRunner().invoke(cli, base + ["--gantt", str(tmp_path / "g.html")])
    assert plain.exit_code == drawn.exit_code == 0, drawn.output

    def line(out: str, word: str) -> str:
        return next(l for l in out.splitlines() if l.strip().startswith(word))

    assert "exclusive collectives simulated once" in line(plain.output, "shortcuts")
    assert line(drawn.output, "shortcuts") == line(plain.output, "shortcuts")
    assert line(drawn.output, "iteration") == line(plain.output, "iteration")
    assert (tmp_path / "g.html").stat().st_size > 0
