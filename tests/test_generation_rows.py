"""Passes emitted as runs of rows, and graphs built lazily (docs/performance.md, "Generation:
pass runs"), are the graphs built task by task: the same tasks field for field, ids, names,
collective ids, dependencies and dependents in the same order, the same kernel mixes (in the
same order) and metadata — over models, layouts, schedules, granularities and free
communication; and :meth:`TaskGraph.add_rows` and deferred building, on their own, keep what
:meth:`TaskGraph.add` one task at a time keeps, errors included."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import event, given, settings, strategies as st

from dessim.errors import TaskGraphError
from dessim.taskgraph import Task, TaskGraph
from dessim.taskgraph.rows import Rows, RowTemplate
from dessim.topology import load_topology
from dessim.workload import GeneratorOptions, ParallelLayout, build_taskgraph
from dessim.workload.transformer import generator as gen
from test_generation_templates import GPT, case_layout



def snapshot(g: TaskGraph) -> tuple:
    """Everything a replay, a file or an output reads of ``g``, in order."""
    tasks = [(tuple(getattr(t, f.name) for f in fields(Task)), g.deps(t.id), g.dependents(t.id)) for t in g]
    return (tasks, list(g.kernel_mix.items()), g.num_dependencies, list(g.edges()),
            repr(sorted(g.meta.items(), key=str)), len(g))


def adjacency(g: TaskGraph) -> tuple:
    """The engine's set-up read of ``g`` (:meth:`TaskGraph.index_adjacency` by position)."""
    return g.index_adjacency({t.id: i for i, t in enumerate(g)})


def build(model, layout: ParallelLayout, options: GeneratorOptions, rows: bool) -> TaskGraph:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gen._Generator, "use_rows", rows)
        n = layout.tp * layout.pp * layout.dp * layout.cp
        topo = load_topology(f"dgx-h100:nodes={n // 8}") if n >= 8 else load_topology(f"ring:{n},device=H100")
        return build_taskgraph((model, layout), topo, options=options)


layouts = st.fixed_dictionaries({
    "moe": st.booleans(),
    "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2, 4]), "dp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]), "sp": st.booleans(), "zero_stage": st.sampled_from([0, 1, 2, 3]),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe"]),
    "m": st.sampled_from([1, 2, 4]), "recompute": st.sampled_from(["none", "selective", "full"]),
    "granularity": st.sampled_from(["layer", "kernel", "auto"]), "comm": st.booleans(),
    "tp_closed_form": st.booleans(),
})


@settings(max_examples=80, deadline=None)
@given(layouts)
def test_rows_and_deferred_building_give_the_graph_built_task_by_task(case):
    model, layout, options = case_layout(case, tp_closed_form=case["tp_closed_form"])
    try:
        fast = build(model, layout, options, True)
    except Exception as err:
        event(f"refused by the generator: {type(err).__name__}")
        with pytest.raises(type(err)):
            build(model, layout, options, False)
        return
    slow = build(model, layout, options, False)
    event("compared")
    assert adjacency(fast) == adjacency(slow)       # read before the dependents' dicts exist
    assert snapshot(fast) == snapshot(slow)


def test_a_layer_granularity_graph_is_mostly_rows_and_made_when_read():
    layout = ParallelLayout(tp=2, pp=2, dp=1, global_batch=8)
    topo = load_topology("ring:4,device=H100")
    g = build_taskgraph((GPT, layout), topo, options=GeneratorOptions(granularity="layer", fold=False))
    runs = [p for p in g._pending if p[0] == 1]
    assert sum(r.template.size for _, r, _ in runs) > 0.8 * len(g)     # counted before made
    n = len(g)
    assert g._pending and g.num_dependencies > 0 and not g._pending and len(g) == n == len(list(g))


# ---------------------------------------------------------------------- the store alone
def expand(g: TaskGraph, rows: Rows) -> None:
    """``rows`` added task by task with :meth:`TaskGraph.add`, as the rows module says."""
    tpl = rows.template
    ids = [f"{rows.prefix}{rows.first + k}" for k in range(tpl.size)]
    seen: dict[int, int] = {}
    for k, proto in enumerate(tpl.protos):
        c = tpl.colls[k]
        t = replace(proto, id=ids[k], name=tpl.labels[k] + rows.suffix)   # checked constructor
        t.attrs = proto.attrs
        if c is not None:
            slot, _, prefix = c
            t.coll_id = f"{prefix}{rows.bases[slot] + seen.get(slot, 0)}"
            seen[slot] = seen.get(slot, 0) + 1
            t.attrs = dict(proto.attrs)
        g.add(t, [ids[r] for r in tpl.deps[k]] + (list(rows.inputs) if k == tpl.entry else []))
        if tpl.mixes[k]:
            g.set_kernel_mix(ids[k], tpl.mixes[k])


def template(n: int, deps: list[list[int]], entry: int, colls: list[bool]) -> RowTemplate:
    protos, coll_specs = [], []
    for k in range(n):
        if colls[k]:
            protos.append(Task("p", 0, "collective", stream="tp", op="allreduce", size=8.0 * (k + 1),
                               group=(0, 1), coll_id="p", attrs={"k": k}))
            coll_specs.append((k % 2, f"tp{k % 2}."))
        else:
            protos.append(Task("p", 0, "compute", duration=1.0 + k, attrs={"k": k}))
            coll_specs.append(None)
    mixes = [(("matmul", 0.5 * k),) if k % 3 == 1 else () for k in range(n)]
    return RowTemplate(protos, [f"step{k}" for k in range(n)], deps, entry, coll_specs, mixes)


programs = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n),
    st.tuples(*[st.lists(st.integers(0, max(k - 1, 0)), max_size=3, unique=True)
                .map(lambda refs, k=k: [r for r in refs if r < k]) for k in range(n)]),
    st.integers(-1, n - 1), st.lists(st.booleans(), min_size=n, max_size=n)))
ops = st.lists(st.one_of(st.tuples(st.just("rows"), st.integers(0, 3), st.integers(0, 3)),
                         st.tuples(st.just("task"), st.integers(0, 5), st.integers(0, 3))),
               min_size=1, max_size=12)


def play(tpl: RowTemplate, steps: list[tuple[str, int, int]], fast: TaskGraph, slow: TaskGraph,
         after_step=None) -> list[str]:
    """``steps`` (``ops``) added to ``fast`` as runs of ``tpl`` and plain tasks, and to
    ``slow`` task by task; ``after_step(j)`` after step ``j``. The ids added, in order."""
    made: list[str] = []
    n = tpl.size
    nxt, bases = 0, [0, 0]
    for j, (kind, a, b) in enumerate(steps):
        if kind == "rows":
            inputs = tuple(made[-1 - i] for i in range(min(a, len(made))))
            rows = Rows(tpl, "r0.", nxt, f" mb{j}", inputs, tuple(bases[:tpl.slots]))
            fast.add_rows(rows)
            expand(slow, rows)
            made += [rows.task_id(k) for k in range(n)]
            nxt += n
            bases = [bases[s] + (tpl.per_slot[s] if s < tpl.slots else 0) for s in range(2)]
        else:
            t = Task(f"x{j}", 1, "compute", duration=float(a))
            dep = [made[(a * 7 + i) % len(made)] for i in range(b)] if made else []
            fast.add(t, dep)
            slow.add(replace(t), dep)
            made.append(t.id)
        assert len(fast) == len(slow)
        if after_step is not None:
            after_step(j)
    return made


@settings(max_examples=200, deadline=None)
@given(programs, ops, st.booleans())
def test_add_rows_keeps_what_add_one_by_one_keeps(program, steps, deferred):
    """Runs of a random template (dependencies inside the run, collectives numbered by slot,
    kernel mixes, inputs on the entry task) interleaved with plain tasks depending on any
    earlier task: added as rows — deferred or at once — or task by task, the same graph."""
    n, deps, entry, colls = program
    tpl = template(n, [list(d) for d in deps], entry, colls)
    fast, slow = TaskGraph("a"), TaskGraph("b")
    if deferred:
        fast.defer()
    made = play(tpl, steps, fast, slow)
    if steps[-1][1] % 2:    # the engine's read first (dependents from _pred), or an other index
        assert adjacency(fast) == adjacency(slow)
    else:
        backwards = {t.id: -i for i, t in enumerate(slow)}
        assert fast.index_adjacency(backwards) == slow.index_adjacency(backwards)
    if steps[0][1] % 2:     # a dependency added afterwards goes after all the others
        last = list(slow)[-1].id
        for g in (fast, slow):
            g.depend(made[0], last) if made[0] != last else None
    assert snapshot(fast) == snapshot(slow)


def test_a_dependency_added_to_a_made_graph_goes_after_those_made():
    tpl = template(3, [[], [0], [0, 1]], 0, [False, True, False])
    fast, slow = TaskGraph("a"), TaskGraph("b")
    fast.defer()
    for g in (fast, slow):
        g.add(Task("x", 1, "compute", duration=1.0))
    for j in range(2):
        rows = Rows(tpl, "r0.", 3 * j, f" mb{j}", ("x",), (j, j))
        fast.add_rows(rows)
        expand(slow, rows)
    assert fast.has_dependency("r0.0", "r0.2") and not fast.has_dependency("r0.2", "r0.0")
    for g in (fast, slow):
        g.depend("r0.4", "r0.2")      # backwards, onto a run's task: a cycle-free graph still
        g.depend("x", "r0.5")
        g.add(Task("y", 1, "compute", duration=1.0), ["r0.2", "x"])
    assert snapshot(fast) == snapshot(slow)
    fast._check_cycles()          # the backward edge made a Kahn sort run: no cycle


def test_deferred_errors_are_raised_when_the_graph_is_read():
    tpl = template(2, [[], [0]], 0, [False, True])
    g = TaskGraph()
    g.defer()
    g.add(Task("r0.1", 0, "compute", duration=1.0))
    g.add_rows(Rows(tpl, "r0.", 0, "", (), (0, 0)))         # r0.1 again
    with pytest.raises(TaskGraphError, match="duplicate task id 'r0.1'"):
        list(g)
    g = TaskGraph()
    g.defer()
    g.add_rows(Rows(tpl, "r0.", 0, "", ("nope",), (0, 0)))
    with pytest.raises(TaskGraphError, match="unknown task 'nope'"):
        g.validate()
    g = TaskGraph()
    g.defer()
    g.add(Task("a", 0, "compute", duration=1.0), ["missing"])
    assert len(g) == 1
    with pytest.raises(TaskGraphError, match="unknown task 'missing'"):
        "a" in g


def test_row_templates_refuse_what_no_run_could_be():
    with pytest.raises(ValueError, match="earlier tasks"):
        template(2, [[1], []], 0, [False, False])
    with pytest.raises(ValueError, match="earlier tasks"):
        template(2, [[], [0, 0]], 0, [False, False])
    with pytest.raises(ValueError, match="entry"):
        template(2, [[], []], 2, [False, False])
