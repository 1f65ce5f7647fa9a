"""The task graph's compact adjacency answers as a networkx DiGraph built from the same calls
would: the same dependencies in the same order (the engine releases tasks in that order, so
results depend on it), the same edge count, and the same verdict on cycles."""

from __future__ import annotations

import re

import networkx as nx
import pytest
from hypothesis import given, settings, strategies as st

from dessim.errors import TaskGraphError
from dessim.taskgraph import Task, TaskGraph

#: (number of tasks, dependencies as (before, after) index pairs, possibly repeated)
graphs = st.integers(2, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
                         .filter(lambda e: e[0] != e[1]), max_size=40)))


def build(n: int, edges: list[tuple[int, int]]) -> tuple[TaskGraph, nx.DiGraph]:
    g, ref = TaskGraph("t"), nx.DiGraph()
    for i in range(n):
        g.add(Task(f"t{i}", 0, "compute", duration=1e-6))
        ref.add_node(f"t{i}")
    for a, b in edges:
        g.depend(f"t{a}", f"t{b}")
        ref.add_edge(f"t{a}", f"t{b}")
    return g, ref


@settings(max_examples=200, deadline=None)
@given(graphs)
def test_adjacency_equals_a_networkx_digraph_built_alike(case):
    n, edges = case
    g, ref = build(n, edges)
    assert len(g) == ref.number_of_nodes()
    assert g.num_dependencies == ref.number_of_edges()
    assert list(g.edges()) == list(ref.edges())
    for node in ref.nodes:
        assert g.deps(node) == list(ref.predecessors(node))
        assert g.dependents(node) == list(ref.successors(node))
        for other in ref.nodes:
            assert g.has_dependency(other, node) == ref.has_edge(other, node)
    assert list(g.as_networkx().edges()) == list(ref.edges())
    index = {t.id: i for i, t in enumerate(g)}
    after, waits = g.index_adjacency(index)
    assert after == [[index[s] for s in ref.successors(t.id)] for t in g]
    assert waits == [ref.in_degree(t.id) for t in g]


@settings(max_examples=200, deadline=None)
@given(graphs)
def test_validate_refuses_exactly_the_cyclic_graphs_and_names_a_real_cycle(case):
    n, edges = case
    g, ref = build(n, edges)
    if nx.is_directed_acyclic_graph(ref):
        g.validate()
        return
    with pytest.raises(TaskGraphError, match="dependency cycle: ") as err:
        g.validate()
    shown = str(err.value).removeprefix("dependency cycle: ").split(" -> ")
    assert "..." not in shown or len(shown) == 8   # long cycles show six tasks, "...", the first
    ids = [s for s in shown if s != "..."]
    assert ids[0] == ids[-1]
    full = "..." not in shown
    for a, b in zip(ids, ids[1:]):
        if full or b != ids[0]:
            assert ref.has_edge(a, b), (a, b, str(err.value))
    # shown from its member added first
    members = ids[:-1]
    assert int(members[0][1:]) == min(int(m[1:]) for m in members) or not full


def test_a_repeated_dependency_is_kept_once():
    g, _ = build(2, [(0, 1), (0, 1)])
    assert g.deps("t1") == ["t0"] and g.num_dependencies == 1


def test_unknown_tasks_are_named():
    g, _ = build(2, [])
    with pytest.raises(TaskGraphError, match=re.escape("dependency 't0' -> 'nope': unknown task 'nope'")):
        g.depend("t0", "nope")
    with pytest.raises(TaskGraphError, match="unknown task 'nope'"):
        g.deps("nope")


def test_an_unhashable_value_is_no_task_id():
    """As a networkx DiGraph answers: membership of a list is False, not a TypeError (a
    hostile task-graph file gets a clear error, tests/test_loader_fuzz.py)."""
    g, _ = build(2, [])
    assert [] not in g and {"id": "t0"} not in g and "t0" in g


#: interleaved building steps: ("add", deps as indices of earlier tasks) or ("depend", a, b)
#: between tasks already there (either order: some point backwards, some close cycles)
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 30), max_size=4)),
    st.tuples(st.just("depend"), st.integers(0, 30), st.integers(0, 30))), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_cycle_check_skipped_for_forward_graphs_agrees_with_networkx(plan):
    """Graphs built by ``add`` (dependencies on tasks already there) interleaved with
    ``depend`` calls: the verdict on cycles is networkx's, whether or not the check could
    skip its sort (every dependency pointing forward in insertion order)."""
    g, ref = TaskGraph("t"), nx.DiGraph()
    n = 0
    for step in plan:
        if step[0] == "add":
            deps = [f"t{d}" for d in step[1] if d < n]
            g.add(Task(f"t{n}", 0, "compute", duration=1e-6), deps)
            ref.add_node(f"t{n}")
            ref.add_edges_from((d, f"t{n}") for d in deps)
            n += 1
        elif max(step[1], step[2]) < n and step[1] != step[2]:
            g.depend(f"t{step[1]}", f"t{step[2]}")
            ref.add_edge(f"t{step[1]}", f"t{step[2]}")
    forward = all(int(a[1:]) < int(b[1:]) for a, b in ref.edges())
    assert forward or g._backward           # a backward edge is never missed
    if nx.is_directed_acyclic_graph(ref):
        g.validate()
    else:
        with pytest.raises(TaskGraphError, match="dependency cycle: "):
            g.validate()
