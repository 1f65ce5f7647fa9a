"""The transformer generator's DeepEP all-to-all tasks: dispatch-direction ones run the
network phase first, combine-direction ones (the forward combine and the dispatch's backward,
deepseek-ai/DeepEP README) NVLink first; both carry the routing's network and NVLink shares,
and a skewed routing names its model among the run's approximations."""

from __future__ import annotations

import pytest

from dessim.topology import load_topology
from dessim.workload.transformer.generator import build_taskgraph
from dessim.workload.transformer.deepep import DEEPEP_APPROXIMATION
from dessim.workload.transformer.routing import (SKEWED_ROUTING_APPROXIMATION, UNMATCHED_ROUTING_APPROXIMATION,
                                                 MoERouting)
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

TOPO2 = load_topology("dgx-h100:nodes=2")


def _graph(routing: dict, dispatch: str = "deepep"):
    doc = moe_doc(routing, dispatch, hidden=512, experts=32, top_k=4, ranks=16)
    return build_taskgraph(parse_workload(doc, "test"), TOPO2)


def test_combine_direction_all_to_alls_run_nvlink_first():
    """Rank 0, one micro-batch, no pipeline: forward L0 dispatch, L0 combine, L1 dispatch, L1
    combine, then backward in reverse, where each all-to-all's direction flips."""
    tasks = [t for t in _graph({}) if t.rank == 0 and t.category == "ep"]
    got = [(t.name.split()[1:3], t.attrs["algo_options"]["nvlink_first"]) for t in tasks]
    assert got == [(["L0", "moe.dispatch"], False), (["L0", "moe.combine"], True),
                   (["L1", "moe.dispatch"], False), (["L1", "moe.combine"], True),
                   (["L1", "moe.combine"], False), (["L1", "moe.dispatch"], True),
                   (["L0", "moe.combine"], False), (["L0", "moe.dispatch"], True)]


@pytest.mark.parametrize("routing", [{}, {"max_nodes": 1}, {"distribution": "zipf", "exponent": 1.0}])
def test_tasks_carry_the_routings_shares(routing):
    """2 nodes × 8 GPUs, 32 experts (2 per GPU), top-4: the options are the routing's shares,
    uniform: D/k and G/k; and a skewed routing is named in the approximations."""
    graph = _graph(routing)
    model = MoERouting(**routing)
    options = {tuple(sorted(t.attrs["algo_options"].items())) for t in graph if t.category == "ep"}
    assert {(o[0][0], o[2][0]) for o in options} == {("network_share", "nvlink_share")}
    assert {o[0][1] for o in options} == {model.network_share(4, 32, 2, 8)}
    assert {o[2][1] for o in options} == {model.nvlink_share(4, 32, 2, 8)}
    if not routing or "max_nodes" in routing:
        assert model.nvlink_share(4, 32, 2, 8) == pytest.approx(model.gpus_per_token(4, 32, 2, 8) / 4)
    skewed = [SKEWED_ROUTING_APPROXIMATION] if "distribution" in routing else []
    assert graph.meta["approximations"] == [DEEPEP_APPROXIMATION] + skewed
    assert "approximations" not in _graph(routing, dispatch="nccl").meta


def test_a_limited_router_that_cannot_have_the_loads_is_named():
    """One hot expert (100 of 131 counts) with top-4 is taken by every token, so with
    max_nodes 1 every token stays on its node and the other node's experts, which have
    counts, can never be picked: no node-limited router has these loads. The run keeps the
    unlimited weights and says so; a Zipf routing the limited router can have does not."""
    hot = {"distribution": "counts", "counts": [100] + [1] * 31, "max_nodes": 1}
    assert not MoERouting(**{**hot, "counts": tuple(hot["counts"])}).spread(4, 32, 2, 8).loads_matched
    assert _graph(hot).meta["approximations"] == [DEEPEP_APPROXIMATION, SKEWED_ROUTING_APPROXIMATION,
                                                   UNMATCHED_ROUTING_APPROXIMATION]
    zipf = {"distribution": "zipf", "exponent": 0.5, "max_nodes": 1}
    assert _graph(zipf).meta["approximations"] == [DEEPEP_APPROXIMATION, SKEWED_ROUTING_APPROXIMATION]


def test_h800_deepep_tasks_carry_deepeps_nvlink_efficiency():
    """On H800 nodes the rail tasks carry DEEPEP_NVLINK_EFFICIENCY (the catalog's, for
    nvlink4_h800) and one-node DeepEP all-to-alls send their NVLink bytes over it; on H100
    nodes (no measurement) neither changes."""
    from dessim.catalog.links import DEEPEP_NVLINK_EFFICIENCY
    from dessim.workload.transformer.deepep import deepep_nvlink_efficiency

    eff = DEEPEP_NVLINK_EFFICIENCY["nvlink4_h800"]
    h800 = load_topology("dgx-h100:nodes=2,gpu=H800")
    assert deepep_nvlink_efficiency(h800, 3) == eff < 1 == deepep_nvlink_efficiency(TOPO2, 3)
    doc = moe_doc({}, "deepep", hidden=512, experts=32, top_k=4, ranks=16)
    for topo, want in ((h800, {eff}), (TOPO2, {None})):
        graph = build_taskgraph(parse_workload(doc, "test"), topo)
        assert {t.attrs["algo_options"].get("nvlink_efficiency") for t in graph if t.category == "ep"} == want
    one = moe_doc({}, "deepep", hidden=512, experts=32, top_k=4, ranks=8)
    sizes = [{t.size for t in build_taskgraph(parse_workload(one, "test"), load_topology(spec))
              if t.category == "ep"} for spec in ("dgx-h100:nodes=1,gpu=H800", "dgx-h100:nodes=1")]
    assert len(sizes[1]) >= 1 and sorted(sizes[0]) == pytest.approx(sorted(s / eff for s in sizes[1]), rel=1e-12)
