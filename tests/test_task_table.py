"""The engine reads a generator's runs of rows as columns (dessim.taskgraph.table,
docs/performance.md "Generation: the engine reads rows"): the table read from the deferred
records is the table of the graph made task by task — every column, dependent, queue,
record, task, pair and collective, errors included — and a replay from it is the replay of
the made graph bit for bit (every record, timeline and summary)."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
from hypothesis import event, given, settings, strategies as st

from dessim.engine import EngineOptions, simulate
from dessim.errors import TaskGraphError
from dessim.taskgraph import Task, TaskGraph
from dessim.taskgraph.rows import Rows
from dessim.taskgraph.table import TaskTable, task_table
from dessim.topology import load_topology
from dessim.workload import build_taskgraph
from test_generation_rows import layouts, ops, play, programs, template
from test_generation_templates import case_layout


def task_fields(t: Task) -> tuple:
    return tuple(getattr(t, f.name) for f in fields(Task))


def read(table: TaskTable, num_ranks: int | None) -> tuple:
    """Everything a replay and its result read of ``table``, in order (the check's outcome,
    or the error it raises)."""
    try:
        p2p, colls = table.check(num_ranks)
        checked: object = (sorted(p2p.items()), sorted(colls.items()))
    except TaskGraphError as exc:
        checked = str(exc)
    ids, names, statics, mixes = table.records()
    return (table.n, table.kinds, table.ranks, table.keys, table.durations, table.waits,
            [table.dependents(i) for i in range(table.n)], [table.deps(i) for i in range(table.n)],
            list(table.queues.items()),
            ids, names, statics, [table.mix(i) for i in range(table.n)],
            mixes is None or len(mixes) == table.n,
            [task_fields(t) for t in table.tasks], [table.position(i) for i in ids], checked)


@settings(max_examples=200, deadline=None)
@given(programs, ops, st.lists(st.integers(0, 40), max_size=3), st.integers(1, 3))
def test_the_table_of_runs_of_rows_is_the_table_of_the_graph_made_task_by_task(
        program, steps, mixed, num_ranks):
    """Random runs (dependencies inside the run, numbered collectives, kernel mixes, inputs)
    among plain tasks, and kernel mixes set on any id (before or after its task, or on no
    task): the deferred graph read as rows and the graph built task by task give one table."""
    n, deps, entry, colls = program
    tpl = template(n, [list(d) for d in deps], entry, colls)
    fast, slow = TaskGraph("a"), TaskGraph("b")
    fast.defer()

    def mix(j: int) -> None:     # a kernel mix on some id, known or not (yet)
        for m in mixed:
            if m % 7 == j % 7:
                fast.set_kernel_mix(f"r0.{m}", (("norm", float(m)),))
                slow.set_kernel_mix(f"r0.{m}", (("norm", float(m)),))
    play(tpl, steps, fast, slow, mix)
    table = task_table(fast)
    assert table.rows_path and fast._pending      # read as rows: the graph is not made
    assert read(table, num_ranks) == read(task_table(slow), num_ranks)


def test_what_the_rows_path_does_not_take_is_read_from_the_made_graph():
    tpl = template(2, [[], [0]], 0, [False, False])
    g = TaskGraph()
    g.defer()
    g.add_rows(Rows(tpl, "r0.", 0, "", (), (0, 0)))
    g.add_rows(Rows(tpl, "r0.", 1, "", (), (0, 0)))          # r0.1 again
    with pytest.raises(TaskGraphError, match="duplicate task id 'r0.1'"):
        task_table(g)
    g = TaskGraph()
    g.defer()
    g.add_rows(Rows(tpl, "r0.", 0, "", ("r0.1",), (0, 0)))   # its own later task
    with pytest.raises(TaskGraphError, match="unknown task 'r0.1'"):
        task_table(g)
    g = TaskGraph()
    g.defer()
    g.add_rows(Rows(tpl, "r1", 0, "", (), (0, 0)))           # a prefix ending with a digit
    g.add(Task("x", 0, "compute", duration=1.0), ["r11"])
    table = task_table(g)
    assert not table.rows_path and table.dependents(1) == [2]


def replay(graph: TaskGraph, topo, engine: EngineOptions) -> tuple:
    """The fields of ``graph``'s replay, or the error it raises (some drawn layouts make
    graphs the engine refuses: both ways must refuse them alike)."""
    try:
        return result_fields(simulate(graph, topo, engine))
    except TaskGraphError as exc:
        event("refused by the engine")
        return (str(exc),)


def result_fields(res) -> tuple:
    out = []
    for f in fields(res):
        v = getattr(res, f.name)
        if f.name == "wall_s":
            continue
        out.append(repr(v) if f.name != "span_records" else
                   [tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in r) for r in v])
    return tuple(out)


@settings(max_examples=40, deadline=None)
@given(layouts.filter(lambda case: case["granularity"] != "auto"))    # auto: folded graphs
def test_a_replay_from_rows_is_the_replay_of_the_made_graph(case):
    """Generated workloads (dense and MoE, TP/PP/DP/CP, ZeRO, schedules, recomputation,
    granularity, comm on/off): the replay reading the deferred graph's rows and the replay
    of the same graph made first agree bit for bit on every field of the result."""
    model, layout, options = case_layout(case, tp_closed_form=case["tp_closed_form"])
    n = layout.tp * layout.pp * layout.dp * layout.cp
    topo = load_topology(f"dgx-h100:nodes={n // 8}") if n >= 8 else load_topology(f"ring:{max(n, 2)},device=H100")
    try:
        lazy = build_taskgraph((model, layout), topo, options=options)
    except Exception as err:
        event(f"refused by the generator: {type(err).__name__}")
        return
    made = build_taskgraph((model, layout), topo, options=options).make()
    rows = bool(lazy._pending) and task_table(lazy).rows_path
    event(f"rows path: {rows}")
    engine = EngineOptions(record_links=True)
    a, b = replay(lazy, topo, engine), replay(made, topo, engine)
    assert a == b
    if rows and len(a) > 1:
        assert lazy._pending           # a replay did not make the graph
    assert [task_fields(t) for t in lazy] == [task_fields(t) for t in made]


def test_the_bench_layout_replays_from_rows():
    """A layer-granularity graph with TP collectives and PP sends is read as rows, and its
    replay equals the made graph's."""
    from test_generation_templates import GPT
    from dessim.workload import GeneratorOptions, ParallelLayout
    layout = ParallelLayout(tp=2, pp=2, dp=2, global_batch=16)
    topo = load_topology("ring:8,device=H100")
    opts = GeneratorOptions(granularity="layer", fold=False)
    lazy = build_taskgraph((GPT, layout), topo, options=opts)
    made = build_taskgraph((GPT, layout), topo, options=opts).make()
    assert task_table(lazy).rows_path
    assert result_fields(simulate(lazy, topo)) == result_fields(simulate(made, topo))


def rank_template(rank: int, groups: list[tuple[int, ...]], prefix: str = "tp."):
    """A run on ``rank``: a compute task, then one collective per group of ``groups`` (slot
    0, coll_id ``prefix`` + number), each after the one before."""
    from dessim.taskgraph.rows import RowTemplate
    protos = [Task("p", rank, "compute", duration=1.0 + rank)]
    protos += [Task("p", rank, "collective", op="allreduce", size=64.0 * (k + 1), group=g, coll_id="p")
               for k, g in enumerate(groups)]
    n = len(protos)
    return RowTemplate(protos, [f"s{k}" for k in range(n)], [[]] + [[k] for k in range(n - 1)], 0,
                       [None] + [(0, prefix)] * len(groups), [()] * n)


@pytest.mark.parametrize("groups", [[(0, 1), (0, 1)], [(0, 1), (1, 0)]])
def test_collectives_numbered_by_runs_are_grouped_as_the_made_graph_groups_them(groups):
    """Members in several runs (one per rank and micro-batch), in one group order for every
    collective of a block or in several: the table's members in group order, the replay
    from rows the replay of the made graph."""
    topo = load_topology("ring:2,device=H100")
    graphs = []
    for deferred in (True, False):
        g = TaskGraph("c")
        if deferred:
            g.defer()
        for mb in range(3):
            for rank in (1, 0):
                g.add_rows(Rows(rank_template(rank, groups), f"r{rank}.", mb * 3, f" mb{mb}",
                                (f"r{rank}.{mb * 3 - 1}",) if mb else (), (mb * 2,)))
        graphs.append(g)
    lazy, made = graphs
    table = task_table(lazy)
    assert table.rows_path
    assert read(table, 2) == read(task_table(made), 2)
    assert table.check(2)[1]["tp.1"] == ([2, 5] if groups[1] == (1, 0) else [5, 2])
    assert result_fields(simulate(lazy, topo)) == result_fields(simulate(made, topo))
    assert lazy._pending
