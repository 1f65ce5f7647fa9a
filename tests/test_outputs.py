"""Exporters: the Chrome trace passes a schema check; Gantt PNG/HTML and span tables are written."""

from __future__ import annotations

import json
from collections import defaultdict

import pandas as pd
import pytest

from dessim.engine import simulate
from dessim.errors import DessimError
from dessim.outputs import chrome_trace, write_chrome_trace, write_gantt, write_spans
from dessim.taskgraph import Task, TaskGraph
from engine_helpers import line


def sample_result():
    g = TaskGraph("sample")
    for r in range(3):
        deps = []
        if r:
            g.add(Task(f"r{r}.recv", r, "recv", peer=r - 1, size=2e6, category="pp"))
            deps = [f"r{r}.recv"]
        g.add(Task(f"r{r}.fwd", r, "compute", duration=1e-3, category="fwd"), deps)
        g.add(Task(f"r{r}.aux", r, "compute", duration=5e-4, stream="aux"))
        if r < 2:
            g.add(Task(f"r{r}.send", r, "send", peer=r + 1, size=2e6, category="pp"), [f"r{r}.fwd"])
    return simulate(g, line(3))


def check_chrome_trace(trace: dict) -> None:
    """Schema check of a Chrome trace-event document (what Perfetto needs to load it)."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    tracks: dict[tuple, list] = defaultdict(list)
    counters: dict[tuple, list] = defaultdict(list)
    flows: dict[int, list[str]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        assert {"ph", "pid", "name"} <= ev.keys(), ev
        assert isinstance(ev["pid"], int)
        if ev["ph"] == "M":
            assert "args" in ev and "tid" in ev
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert ev["dur"] >= 0 and "tid" in ev and "cat" in ev
            tracks[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
            counters[(ev["pid"], ev["name"])].append(ev["ts"])
        elif ev["ph"] in ("s", "f"):
            flows[ev["id"]].append(ev["ph"])
        else:
            pytest.fail(f"unexpected phase {ev['ph']!r}")
    for track, spans in tracks.items():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-9, f"overlapping spans on track {track}"
    for name, times in counters.items():
        assert times == sorted(times), f"counter {name} not monotone"
    for fid, phases in flows.items():
        assert sorted(phases) == ["f", "s"], f"flow {fid} not paired: {phases}"


def test_chrome_trace_passes_the_schema_check(tmp_path):
    res = sample_result()
    path = write_chrome_trace(res, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    check_chrome_trace(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"compute", "comm", "aux"} <= names
    assert any(e["ph"] == "C" for e in trace["traceEvents"])          # link counters
    assert sum(e["ph"] == "s" for e in trace["traceEvents"]) >= 2     # send -> recv arrows
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(x) == len(res.span_records)


def test_chrome_trace_is_deterministic(tmp_path):
    a = write_chrome_trace(sample_result(), tmp_path / "a.json").read_bytes()
    b = write_chrome_trace(sample_result(), tmp_path / "b.json").read_bytes()
    assert a == b


def test_trace_times_are_microseconds():
    res = sample_result()
    fwd = [e for e in chrome_trace(res)["traceEvents"] if e.get("name") == "r0.fwd"][0]
    assert fwd["ts"] == 0 and fwd["dur"] == pytest.approx(1000.0)


def test_gantt_png_and_html_are_written(tmp_path):
    res = sample_result()
    png = write_gantt(res, tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    html = write_gantt(res, tmp_path / "g.html")
    text = html.read_text()
    assert "<html>" in text[:100] and "<svg" in text and "sample · on line3 · iteration" in text
    with pytest.raises(DessimError, match="unknown format '.svgz'"):
        write_gantt(res, tmp_path / "g.svgz")


def test_span_tables_csv_and_parquet(tmp_path):
    res = sample_result()
    csv = pd.read_csv(write_spans(res, tmp_path / "s.csv"))
    pq = pd.read_parquet(write_spans(res, tmp_path / "s.parquet"))
    assert list(csv.columns)[:8] == ["rank", "stream", "task", "name", "kind", "category",
                                     "start_s", "active_s"]
    assert len(csv) == len(pq) == len(res.span_records)
    assert (pq["end_s"] >= pq["active_s"]).all() and (pq["active_s"] >= pq["start_s"]).all()
    # what a task does not have is null, not -1 or ""
    compute = pq[pq["kind"] == "compute"]
    assert compute["peer"].isna().all() and compute["op"].isna().all()
    assert str(pq["peer"].dtype) == "Int64" and set(pq.loc[pq["kind"] == "send", "peer"]) == {1, 2}
    assert pq.loc[pq["task"] == "r0.aux", "category"].isna().all()
    import pyarrow.parquet as pa_pq

    schema = pa_pq.read_schema(tmp_path / "s.parquet")
    assert schema.field("start_s").metadata == {b"unit": b"s"}
    assert schema.field("bytes").metadata == {b"unit": b"B"}
    meta = json.loads(schema.metadata[b"dessim"])
    assert meta["graph"] == "sample" and meta["makespan_s"] == res.makespan_s


def test_collective_timeline_passes_the_schema_check(tmp_path):
    from click.testing import CliRunner

    from dessim.cli.main import cli

    path = tmp_path / "coll.json"
    res = CliRunner().invoke(cli, ["collective", "allreduce", "--algo", "ring", "--size", "8MiB",
                                   "-t", "ring:4,bw=10GB/s,lat=1us", "--channels", "2",
                                   "--protocol", "raw",
                                   "--timeline", str(path)])
    assert res.exit_code == 0, res.output
    trace = json.loads(path.read_text())
    check_chrome_trace(trace)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * 2 * (4 - 1) * 4     # channels x 2(p-1) steps x p senders
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(
        2 * 3 * (1.0 + 8 * 2**20 / 2 / 4 / 10e9 * 1e6), rel=1e-9)  # us: 2(p-1)(a + n/(C p B))


def test_timeline_file_is_the_trace_and_json_gz_the_same_json_compressed(tmp_path):
    """The file is json.dumps of chrome_trace (events written one at a time), and .json.gz
    holds the same bytes compressed, deterministically (no time or name in the gzip header)."""
    import gzip

    res = sample_result()
    plain = write_chrome_trace(res, tmp_path / "t.json").read_bytes()
    assert plain == json.dumps(chrome_trace(res), separators=(",", ":")).encode()
    packed = write_chrome_trace(res, tmp_path / "t.JSON.GZ").read_bytes()
    assert gzip.decompress(packed) == plain
    assert packed[:2] == b"\x1f\x8b" and packed[4:8] == b"\0\0\0\0"     # magic, mtime 0
    assert packed[3] & 0x08 == 0                                      # FNAME flag: no name
    assert write_chrome_trace(sample_result(), tmp_path / "u.json.gz").read_bytes() == packed


def test_timeline_refuses_a_suffix_that_is_not_json():
    res = sample_result()
    for name in ("t.png", "t.gz", "t.html", "t"):
        with pytest.raises(DessimError, match=r"unknown format .*use \.json, \.json\.gz; .*--gantt x\.png"):
            write_chrome_trace(res, name)


def test_link_counter_times_are_nanoseconds_and_monotone_per_link():
    """Counter times are µs rounded to the ns Perfetto keeps; a link's events stay in order."""
    from dessim.engine import EngineOptions

    g = TaskGraph("two")
    for k, size in enumerate((3e6, 5e6)):
        g.add(Task(f"s{k}", 0, "send", peer=1, size=size, category="pp"))
        g.add(Task(f"r{k}", 1, "recv", peer=0, size=size, category="pp"))
    res = simulate(g, line(2), EngineOptions(record_links=True))
    counters = [e for e in chrome_trace(res)["traceEvents"] if e["ph"] == "C"]
    assert counters and all(round(e["ts"], 3) == e["ts"] for e in counters)
    exact = sorted({t * 1e6 for t, _, _ in res.link_series})
    assert sorted({e["ts"] for e in counters}) == [round(t, 3) for t in exact]


def test_link_counters_keep_one_value_per_link_and_nanosecond_the_last_one(tmp_path):
    """Several rate changes of a link within one nanosecond (solves at one instant) are one
    counter event with the last value; the file holds exactly the bytes of the trace's dict,
    counters included (they are formatted directly, not encoded as dicts)."""
    from dataclasses import replace

    from dessim.engine import EngineOptions

    g = TaskGraph("two")
    for k, size in enumerate((3e6, 5e6)):
        g.add(Task(f"s{k}", 0, "send", peer=1, size=size, category="pp"))
        g.add(Task(f"r{k}", 1, "recv", peer=0, size=size, category="pp"))
    res = simulate(g, line(2), EngineOptions(record_links=True))
    link = ("gpu0", "gpu1")
    t0 = next(t for t, ln, _ in res.link_series if ln == link)
    # the first change of the link, then two more inside the same nanosecond
    extra = [(t0 + 2e-13, link, 0.25), (t0 + 4e-13, link, 0.75)]
    i = next(k for k, (t, ln, _) in enumerate(res.link_series) if ln == link)
    res = replace(res, link_series=res.link_series[:i + 1] + extra + res.link_series[i + 1:])
    trace = chrome_trace(res)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "gpu0->gpu1"]
    stamps = [e["ts"] for e in counters]
    assert len(stamps) == len(set(stamps))                    # one event per nanosecond
    first = next(e for e in counters if e["ts"] == round(t0 * 1e6, 3))
    assert first["args"]["utilisation"] == 0.75               # the nanosecond's last value
    path = write_chrome_trace(res, tmp_path / "t.json")
    assert path.read_bytes() == json.dumps(trace, separators=(",", ":")).encode()


def test_a_counter_formatted_directly_is_its_dict_encoded():
    """The writer formats link counters with repr (what json writes for finite floats) and
    falls back to json for NaN/inf: the same bytes as encoding the event's dict."""
    from hypothesis import given, settings, strategies as st

    from dessim.outputs.chrome_trace import _counter_event, _counter_json

    encode = json.JSONEncoder(separators=(",", ":")).encode
    name = 'n0.gpu0->n0."nvsw"'                   # a name that needs escaping
    head = f',{{"ph":"C","name":{encode(name)},"pid":0,"tid":0,"ts":'
    floats = st.floats(allow_nan=True, allow_infinity=True)

    @settings(max_examples=300, deadline=None)
    @given(floats, st.none() | floats, floats)
    def check(ts, gbps, util):
        assert _counter_json(head, name, ts, gbps, util, encode) == "," + encode(_counter_event(name, ts, gbps, util))
    check()
