"""Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing).

Layout of the trace:

* one *process* per GPU rank (``pid = rank + 1``, named ``rank R (node)``), one *thread*
  (track) per stream of that rank; every task is a complete event (``ph: "X"``) on its
  stream's track — a stream runs one task at a time, so events on a track never overlap;
  ``args`` carry the task's kind, category, bytes, FLOPs and the time it waited for peers;
* flow arrows (``ph: "s"`` / ``"f"``) for every dependency that crosses ranks and from each
  send to its matching recv;
* a ``links`` process (``pid = 0``) with one counter ``A->B`` per directed link that
  carried traffic, an event at each change of its rate carrying two values, which Perfetto
  shows as two tracks: ``A->B GB/s`` (the rate it carries, utilisation × capacity, in GB/s
  = 1e9 bytes/s) and ``A->B utilisation`` (0..1), both step functions over time.

Times are microseconds (``ts``/``dur``), as the format requires; the simulation's seconds
are multiplied by 1e6. Counter times are rounded to the nanosecond (3 decimals), the
resolution Perfetto stores times at: link counters are most of a large trace's events
(one per change of a link's rate), and the digits below a nanosecond were a tenth of their
bytes. A link whose rate changes several times within one nanosecond (rate solves at one
instant) gets one event there, with the last value: the earlier ones would be zero-width
steps (an eighth of the counter events of ``simulate llama3-8b --topology dgx-h100:nodes=8``).

The file is JSON (``.json``) or gzip-compressed JSON (``.json.gz``, which Perfetto and
chrome://tracing open as they are): :data:`TIMELINE_FORMATS`.
"""

from __future__ import annotations

import gzip
import io
from array import array
import json
import math
from pathlib import Path
from typing import Any, Iterator

from dessim.resources import check_output, output_format
from dessim.engine.result import SPAN_COLUMNS, SimulationResult

__all__ = ["chrome_trace", "write_chrome_trace", "LINKS_PID", "TIMELINE_FORMATS", "TIMELINE_HINT"]

LINKS_PID = 0
_US = 1e6

#: Timeline file formats by suffix (→ the extra that writes them: none): JSON, or JSON
#: compressed with gzip (deterministic bytes: no file name or time in the gzip header).
TIMELINE_FORMATS: dict[str, str | None] = {".json": None, ".json.gz": None}

#: Said when a timeline's suffix is refused: what the file is, and where an image comes from.
TIMELINE_HINT = "a timeline is a Chrome/Perfetto trace (JSON); for an image, --gantt x.png or x.html"

#: gzip level of ``.json.gz`` timelines: zlib's default, near level 9's size for trace JSON
#: at a fraction of its time.
_GZIP_LEVEL = 6


def chrome_trace(result: SimulationResult, *, link_counters: bool = True,
                 max_link_tracks: int = 256) -> dict[str, Any]:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    ``max_link_tracks`` keeps the counters of the busiest links only (by bytes), so that
    traces of large clusters stay loadable.
    """
    return {"traceEvents": list(_events(result, link_counters, max_link_tracks)), **_trailer(result)}


def _trailer(result: SimulationResult) -> dict[str, Any]:
    """The trace's keys after ``traceEvents``."""
    return {"displayTimeUnit": "ms",
            "otherData": {"makespan_s": result.makespan_s, "network": result.network,
                          **{k: v for k, v in result.meta.items() if k in ("graph", "topology")}}}


def _events(result: SimulationResult, link_counters: bool, max_link_tracks: int) -> Iterator[dict[str, Any]]:
    """The trace events, in file order (see the module doc)."""
    col = {c: i for i, c in enumerate(SPAN_COLUMNS)}
    events: list[dict[str, Any]] = []
    nodes = result.meta.get("rank_nodes", {})
    streams: dict[int, dict[str, int]] = {}
    for rec in sorted(result.span_records, key=lambda r: (r[col["rank"]], r[col["stream"]])):
        rank, stream = rec[col["rank"]], rec[col["stream"]]
        tids = streams.setdefault(rank, {})
        if stream not in tids:
            tids[stream] = len(tids) + 1
    for rank in sorted(streams):
        pid = rank + 1
        label = f"rank {rank}" + (f" ({nodes[rank]})" if rank in nodes else "")
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for stream, tid in streams[rank].items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
    where: dict[str, tuple[int, int, float, float]] = {}
    for rec in sorted(result.span_records, key=lambda r: (r[col["start_s"]], r[col["rank"]],
                                                           r[col["task"]])):
        rank, stream = rec[col["rank"]], rec[col["stream"]]
        pid, tid = rank + 1, streams[rank][stream]
        start, active, end = rec[col["start_s"]], rec[col["active_s"]], rec[col["end_s"]]
        args = {"task": rec[col["task"]], "kind": rec[col["kind"]]}
        for key in ("category", "op"):
            if rec[col[key]]:
                args[key] = rec[col[key]]
        if rec[col["bytes"]]:
            args["bytes"] = rec[col["bytes"]]
        if rec[col["flops"]]:
            args["flops"] = rec[col["flops"]]
        if active > start:
            args["wait_us"] = (active - start) * _US
        events.append({"ph": "X", "name": rec[col["name"]], "cat": rec[col["kind"]],
                       "pid": pid, "tid": tid, "ts": start * _US, "dur": (end - start) * _US,
                       "args": args})
        where[rec[col["task"]]] = (pid, tid, start, end)
    for n, (before, after) in enumerate(result.meta.get("flows", [])):
        if before not in where or after not in where:
            continue
        bpid, btid, _, bend = where[before]
        apid, atid, astart, _ = where[after]
        events.append({"ph": "s", "id": n + 1, "name": "dep", "cat": "dep", "pid": bpid,
                       "tid": btid, "ts": bend * _US - 1e-3})
        events.append({"ph": "f", "bp": "e", "id": n + 1, "name": "dep", "cat": "dep",
                       "pid": apid, "tid": atid, "ts": max(astart, bend) * _US})
    yield from events
    names: dict[tuple[str, str], str] = {}
    for link, ts, gbps, util in _counter_rows(result, link_counters, max_link_tracks):
        if not names:
            yield _LINKS_PROCESS
        name = names.get(link)
        if name is None:
            name = names[link] = _link_name(link)
        yield _counter_event(name, ts, gbps, util)


#: The metadata event naming the links' process.
_LINKS_PROCESS = {"ph": "M", "name": "process_name", "pid": LINKS_PID, "tid": 0,
                  "args": {"name": "links (GB/s and utilisation)"}}


def _counter_rows(result: SimulationResult, link_counters: bool, max_link_tracks: int
                  ) -> Iterator[tuple[tuple[str, str], float, float | None, float]]:
    """The link counter events as ``(link, ts_us, GB/s or None, utilisation)``, in file
    order: the ``max_link_tracks`` busiest links' change points, each link's value at a
    nanosecond being the last one the simulation set in that nanosecond, at that change's
    place (changes within one nanosecond — several rate solves at one instant — would be
    zero-width steps Perfetto cannot show). Two passes over the series, the first marking
    the superseded changes and keeping each change's rounded time (a byte and a float per
    change): a large trace's millions of rows are never held as objects at once."""
    if not (link_counters and result.link_series):
        return
    busiest = sorted(result.link_bytes, key=lambda k: (-result.link_bytes[k], k))
    keep = set(busiest[:max_link_tracks])
    series = result.link_series
    superseded = bytearray(len(series))
    stamps = array("d", bytes(8 * len(series)))
    last: dict[tuple[str, str], tuple[int, float]] = {}     # link -> (index, ts) of its latest
    for i, (t, link, _) in enumerate(series):
        if link not in keep:
            superseded[i] = 1
            continue
        stamps[i] = ts = round(t * _US, 3)
        prev = last.get(link)
        if prev is not None and prev[1] == ts:
            superseded[prev[0]] = 1
        last[link] = (i, ts)
    capacity = result.link_capacity
    for i, (_, link, util) in enumerate(series):
        if superseded[i]:
            continue
        cap = capacity.get(link)
        yield link, stamps[i], None if cap is None else round(util * cap / 1e9, 9), round(util, 9)


def _counter_event(name: str, ts: float, gbps: float | None, util: float) -> dict[str, Any]:
    """One counter event as a trace dict."""
    values = {"utilisation": util} if gbps is None else {"GB/s": gbps, "utilisation": util}
    return {"ph": "C", "name": name, "pid": LINKS_PID, "tid": 0, "ts": ts, "args": values}


def _link_name(link: tuple[str, str]) -> str:
    return f"{link[0]}->{link[1]}"


def _counter_json(head: str, name: str, ts: float, gbps: float | None, util: float, encode) -> str:
    """One counter event as compact JSON, the bytes ``encode`` gives its dict
    (:func:`_counter_event`) after a comma; ``head`` is that comma and the event's encoded
    start up to the time. Floats are
    written with ``repr``, as :mod:`json` writes finite floats (every counter value is
    finite: rates and utilisations of a finished simulation); ``encode`` otherwise."""
    if not math.isfinite(ts + util if gbps is None else ts + util + gbps):
        return "," + encode(_counter_event(name, ts, gbps, util))
    if gbps is None:
        return f'{head}{ts!r},"args":{{"utilisation":{util!r}}}}}'
    return f'{head}{ts!r},"args":{{"GB/s":{gbps!r},"utilisation":{util!r}}}}}'


def write_chrome_trace(result: SimulationResult, path: str | Path, *, link_counters: bool = True,
                       max_link_tracks: int = 256) -> Path:
    """Write :func:`chrome_trace` to ``path``: compact JSON, or gzip-compressed JSON for a
    ``.json.gz`` path (:data:`TIMELINE_FORMATS`); deterministic bytes, the same JSON either
    way. The events are encoded one at a time, never the whole document at once; the link
    counters (most of a large trace's events) are formatted directly (:func:`_counter_json`),
    the same bytes as encoding their dicts."""
    path = check_output(path, "timeline", TIMELINE_FORMATS, TIMELINE_HINT)
    encode = json.JSONEncoder(separators=(",", ":")).encode
    with open(path, "wb") as raw:
        packed = (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=_GZIP_LEVEL)
                  if output_format(path, TIMELINE_FORMATS) == ".json.gz" else None)
        with io.TextIOWrapper(packed or raw, encoding="utf-8") as out:
            out.write('{"traceEvents":[')
            chunk: list[str] = []
            n = 0
            for n, event in enumerate(_events(result, link_counters=False, max_link_tracks=0), 1):
                chunk.append(("," if n > 1 else "") + encode(event))
                if len(chunk) == 4096:
                    out.write("".join(chunk))
                    chunk.clear()
            heads: dict[tuple[str, str], tuple[str, str]] = {}     # link -> (name, JSON head)
            for link, ts, gbps, util in _counter_rows(result, link_counters, max_link_tracks):
                if not heads:
                    chunk.append(("," if n else "") + encode(_LINKS_PROCESS))
                got = heads.get(link)
                if got is None:
                    name = _link_name(link)
                    got = heads[link] = (name, f',{{"ph":"C","name":{encode(name)},"pid":{LINKS_PID},'
                                               '"tid":0,"ts":')
                # most of a large trace's events: formatted directly, not encoded as dicts
                chunk.append(_counter_json(got[1], got[0], ts, gbps, util, encode))
                if len(chunk) == 65536:
                    out.write("".join(chunk))
                    chunk.clear()
            out.write("".join(chunk) + "]," + encode(_trailer(result))[1:])
    return path
