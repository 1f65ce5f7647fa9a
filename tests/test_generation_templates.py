"""Tasks copied from per-rank templates (docs/performance.md, step 19) are the tasks the
generator built one by one with the checked constructor: the same fields, ids, names,
collective ids, dependencies in the same order, kernel mixes and metadata; and the graph's
bulk ``add`` keeps the edges ``depend`` would, in the same order."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import assume, event, given, settings, strategies as st

from dessim.errors import TaskGraphError
from dessim.taskgraph import Task, TaskGraph
from dessim.topology import load_topology
from dessim.workload import GeneratorOptions, ParallelLayout, TransformerConfig, build_taskgraph
from dessim.workload.transformer import generator as gen

GPT = TransformerConfig("tiny-gpt", layers=4, hidden=256, heads=4, ffn_hidden=1024, vocab=2048, seq_len=128)
MOE = TransformerConfig("tiny-moe", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=2048,
                        seq_len=128, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                        bias=False, dropout=False, tied_embeddings=False, experts=4, top_k=2)


def snapshot(g: TaskGraph) -> tuple:
    """Everything a replay or a file reads of ``g``, in order."""
    tasks = [(tuple(getattr(t, f.name) for f in fields(Task)), g.deps(t.id), g.dependents(t.id)) for t in g]
    return tasks, sorted(g.kernel_mix.items()), g.num_dependencies, repr(sorted(g.meta.items(), key=str))


def build(model, layout: ParallelLayout, options: GeneratorOptions, per_task: bool, monkeypatch) -> TaskGraph:
    """The graph with templates made once per (template, rank), or — ``per_task`` — made
    again for every pass, i.e. every task built by the checked constructor as before (and
    added one by one, not as runs of rows: tests/test_generation_rows.py)."""
    if per_task:
        monkeypatch.setattr(gen._Generator, "use_rows", False)
        original = gen._Generator._rank_template

        def fresh(self, t, rank):
            self.rank_templates.clear()
            return original(self, t, rank)

        monkeypatch.setattr(gen._Generator, "_rank_template", fresh)
    try:
        n = layout.tp * layout.pp * layout.dp * layout.cp
        topo = load_topology(f"dgx-h100:nodes={n // 8}") if n >= 8 else load_topology(f"ring:{n},device=H100")
        return build_taskgraph((model, layout), topo, options=options)
    finally:
        monkeypatch.undo()


layouts = st.fixed_dictionaries({
    "moe": st.booleans(),
    "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2, 4]), "dp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]), "sp": st.booleans(), "zero_stage": st.sampled_from([0, 1, 3]),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe"]),
    "m": st.sampled_from([1, 2, 4]), "recompute": st.sampled_from(["none", "selective", "full"]),
    "granularity": st.sampled_from(["layer", "kernel", "auto"]), "comm": st.booleans(),
})


def case_layout(case: dict, **options) -> tuple[TransformerConfig, ParallelLayout, GeneratorOptions]:
    """The model, layout and generator options of a drawn ``case`` (``layouts``), the schedule
    adjusted to what the pipeline allows; a case the layout or options refuse is skipped
    (nothing to compare). ``options``: further :class:`GeneratorOptions` fields."""
    model = MOE if case["moe"] else GPT
    pp, schedule = case["pp"], case["schedule"]
    v = 2 if schedule == "interleaved" else 1
    if schedule == "interleaved" and (model.layers % (pp * v) or pp == 1):
        schedule, v = "1f1b", 1
    if schedule == "dualpipe" and (pp % 2 or pp == 1):
        schedule = "1f1b"
    ep = 2 if case["moe"] and case["dp"] == 2 else 1
    m = case["m"] * (2 * pp if schedule == "dualpipe" else 1)
    try:
        layout = ParallelLayout(tp=case["tp"], pp=pp, dp=case["dp"], cp=case["cp"], ep=ep,
                                sp=case["sp"] and case["tp"] > 1, zero_stage=case["zero_stage"],
                                schedule=schedule, virtual_stages=v, global_batch=m * case["dp"],
                                recompute=case["recompute"])
        generator = GeneratorOptions(granularity=case["granularity"], comm=case["comm"],
                                     fold=None if case["granularity"] == "auto" else False, **options)
    except Exception:                 # a layout the options refuse: nothing to compare
        assume(False)
    return model, layout, generator


@settings(max_examples=40, deadline=None)
@given(layouts)
def test_templated_graph_equals_the_graph_built_task_by_task(case):
    model, layout, options = case_layout(case)
    with pytest.MonkeyPatch.context() as mp:
        try:
            fast = build(model, layout, options, False, mp)
        except Exception as err:
            event(f"refused by the generator: {type(err).__name__}")
            with pytest.raises(type(err)):
                build(model, layout, options, True, mp)
            return
        slow = build(model, layout, options, True, mp)
    event("compared")
    assert snapshot(fast) == snapshot(slow)
    # every copied task is a task the checked constructor accepts, field for field
    for t in fast:
        assert Task(**{f.name: getattr(t, f.name) for f in fields(Task)}) == t


def test_templates_are_made_once_per_template_and_rank():
    layout = ParallelLayout(tp=2, pp=2, dp=1, global_batch=8)
    g = gen._Generator(gen.plan_for((GPT, layout), load_topology("ring:4,device=H100"),
                                    options=GeneratorOptions(granularity="layer", fold=False)),
                       load_topology("ring:4,device=H100"))
    graph = g.run()
    # 4 ranks x (F, B) of one chunk; 8 micro-batches each reuse them
    assert len(g.rank_templates) == 4 * 2
    assert sum(t.kind == "compute" for t in graph) > 8 * len(g.rank_templates)


def test_derived_copies_every_field_but_id_and_name():
    proto = Task("p", 3, "collective", name="x", category="tp", op="allreduce", size=8.0, group=(2, 3),
                 coll_id="c", attrs={"a": 1})
    t = proto.derived("r3.7", "tp ar mb2")
    assert (t.id, t.name) == ("r3.7", "tp ar mb2")
    for f in fields(Task):
        if f.name not in ("id", "name"):
            assert getattr(t, f.name) is getattr(proto, f.name)


deps_lists = st.lists(st.lists(st.integers(0, 9), max_size=6), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(deps_lists)
def test_bulk_add_keeps_the_edges_depend_adds_one_by_one(case):
    """Task k depends on earlier tasks (indices mod k, repeats included): ``add(task, deps)``
    and ``add(task)`` + ``depend`` one by one give the same adjacency and edge count."""
    bulk, single = TaskGraph("a"), TaskGraph("b")
    for k, deps in enumerate(case):
        ids = [f"t{d % k}" for d in deps] if k else []
        bulk.add(Task(f"t{k}", 0, "compute", duration=1.0), ids)
        single.add(Task(f"t{k}", 0, "compute", duration=1.0))
        for d in ids:
            single.depend(d, f"t{k}")
    assert bulk.num_dependencies == single.num_dependencies
    assert list(bulk.edges()) == list(single.edges())
    for t in single:
        assert bulk.deps(t.id) == single.deps(t.id)
        assert bulk.dependents(t.id) == single.dependents(t.id)


def test_bulk_add_names_an_unknown_dependency():
    g = TaskGraph()
    g.add(Task("a", 0, "compute", duration=1.0))
    with pytest.raises(TaskGraphError, match="unknown task 'nope'"):
        g.add(Task("b", 0, "compute", duration=1.0), ["a", "nope"])


def test_collector_contexts_restore_the_collector():
    import gc

    from dessim.taskgraph.collector import collector_paused, heap_frozen

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()          # was off: stays off
    finally:
        gc.enable()
    before = gc.get_freeze_count()
    with heap_frozen() as freezer:
        assert gc.get_freeze_count() > before
        freezer.thaw()
        assert gc.get_freeze_count() == 0
        junk = [[] for _ in range(10)]
        freezer.freeze()
        assert gc.get_freeze_count() >= len(junk)
    assert gc.get_freeze_count() == 0
    with heap_frozen(active=False) as freezer:     # small graphs: nothing frozen or collected
        freezer.freeze()
        assert gc.get_freeze_count() == 0
    assert gc.get_freeze_count() == 0
