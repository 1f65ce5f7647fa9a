"""DeepEP with expert tensor parallelism ``etp != tp`` (issue 18), as Megatron-core runs it.

Megatron-core's flex dispatcher takes its TP size from the *expert* TP group
(``MoETokenDispatcher.__init__``: ``self.tp_group = pg_collection.expt_tp``, ``self.tp_ep_group
= pg_collection.tp_ep``) and builds DeepEP's buffer on that expert-TP × EP group
(``MoEFlexTokenDispatcher``: ``_DeepepManager(group=self.tp_ep_group,
router_topk=self.tp_size * moe_router_topk, num_experts=self.tp_size * num_moe_experts)``,
NVIDIA/Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py``; the group is
``get_expert_tensor_and_model_parallel_group()``, the expert generator's ``'tp-ep'`` ranks,
``megatron/core/transformer/moe/moe_utils.py`` and ``megatron/core/parallel_state.py``).
Nothing in ``token_dispatcher.py``, ``moe_utils.py``, ``fused_a2a.py``, ``transformer_config.py``
or ``megatron/training/arguments.py`` refuses ``expert_tensor_parallel_size != tensor_model_
parallel_size`` with the flex dispatcher (its only assert is ``tp_size * ep_size > 1``). So:

* each rank dispatches its ``T/tp`` sequence-parallel tokens (the attention's shard);
* ``_initialize_metadata`` replicates a token's routing over the ``etp`` expert-TP ranks of
  every target EP rank: the flat all-to-all carries ``top_k·etp·T/tp`` copies per rank;
* DeepEP sends a token once per target node over the network and once per target GPU over
  NVLink (deepseek-ai/DeepEP ``csrc/legacy/buffer.hpp``: group rank ``r`` is NVLink peer
  ``r mod 8`` of RDMA rank ``r div 8``), so per same-rail pair the network carries ``T/tp ·
  P(node hit)`` hidden vectors and per NVLink pair ``H · T/tp · P(EP rank hit)``;
* each of the ``etp`` GPUs of an EP rank receives the ``etp·ep · T/tp · P(hit)`` rows of
  its EP rank and runs its ``moe_ffn_hidden/etp`` slice of the local experts on their copies.

The tiny case (tests/test_moe_deepep_tp.py): 2 nodes × 8 H100s, TP 2 with SP, DP 8,
32 experts, top-4, hidden 512, T = 512 tokens per TP group (256 per rank), bf16."""

from __future__ import annotations

from math import ceil

import pytest

from dessim.engine import EngineOptions
from dessim.errors import WorkloadError
from dessim.topology import load_topology
from dessim.workload import simulate_workload
from dessim.workload.transformer.generator import _Generator, build_taskgraph, make_plan
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.spec import parse_workload
from tests.fold_helpers import assert_folded_equals_unfolded
from tests.test_moe_deepep_tp import E, H, K, T, TP, _distinct, _doc, _rank0_forward_l0
from tests.test_moe_expert_grid import _rank_generator

HOSTS, PER_HOST = 2, 8


def _etp_doc(etp: int, ep: int, nodes: int = HOSTS, tp: int = TP, **kw) -> dict:
    doc = _doc(nodes, tp=tp, **kw)
    doc["parallelism"].update({"etp": etp, "ep": ep})
    return doc


def _gen(etp: int, ep: int, nodes: int = HOSTS, **kw) -> _Generator:
    topo = load_topology(f"dgx-h100:nodes={nodes}")
    spec = parse_workload(_etp_doc(etp, ep, nodes, **kw), "t")
    return _Generator(make_plan(spec.model, spec.layout(PER_HOST * nodes), topo, device="H100"), topo)


def _ep_tasks(etp: int, ep: int, nodes: int = HOSTS, **kw) -> list:
    graph = build_taskgraph(parse_workload(_etp_doc(etp, ep, nodes, **kw), "t"),
                            load_topology(f"dgx-h100:nodes={nodes}"))
    return [t for t in _rank0_forward_l0(graph=graph) if t.category == "ep"]


@pytest.mark.parametrize("etp, ep", [(1, 16), (4, 4)])
def test_bytes_per_rank_per_phase(etp, ep):
    """The dispatch and the combine on the 16 GPUs of the expert-TP × EP group, the rail
    algorithm. By hand, per rank: the flat all-to-all carries top_k · etp · T/tp = 4·etp·256
    copies of 1,024 bytes; a token crosses to a node with probability P(node) = D/2, D =
    2(1 − C(16,4)/C(32,4)) (16 experts per node whatever the split), so each same-rail pair
    of the network phase carries 256 · D/2 vectors; it reaches an EP rank with probability
    G/ep, G = ep(1 − C(32 − 32/ep, 4)/C(32, 4)), so each NVLink pair carries the tokens of
    both hosts' rail ranks, 2 · 256 · G/ep vectors."""
    d, g = _distinct(2, 16), _distinct(ep, E // ep)
    vec = H * 2                                             # one bf16 hidden vector
    flat = K * etp * (T // TP) * vec
    assert flat == {1: 1_048_576, 4: 4_194_304}[etp]
    p = etp * ep                                            # group members
    n = PER_HOST                                            # members per host
    ep_tasks = _ep_tasks(etp, ep)
    assert [t.name.split()[2] for t in ep_tasks] == ["moe.dispatch", "moe.combine"]
    for t in ep_tasks:
        assert t.group == tuple(range(16)) and t.algo == "rail" and t.size == flat
        opts = t.attrs["algo_options"]
        network_pair = opts["network_share"] * n * t.size / p          # rail.py phase 1
        nvlink_pair = opts["nvlink_share"] * HOSTS * t.size / p        # rail.py phase 2
        assert network_pair == pytest.approx((T // TP) * d / 2 * vec, rel=1e-12)
        assert nvlink_pair == pytest.approx(HOSTS * (T // TP) * g / ep * vec, rel=1e-12)


def test_the_network_phase_does_not_grow_with_etp_the_nvlink_phase_does():
    """Per same-rail pair the network carries a token once per node whatever etp (256·D/2
    vectors for etp 1, 2 and 4); the NVLink phase delivers it to the etp GPUs of each hit EP
    rank, etp·G of them per token (G over ep ranks: 3.81, 3.44, 2.82 for ep 16, 8, 4), so a
    host's NVLink bytes (8 senders × 7 peers × the pair bytes) grow from etp 1 to 2 to 4."""
    network, nvlink = [], []
    for etp, ep in [(1, 16), (2, 8), (4, 4)]:
        gen = _gen(etp, ep)
        group = gen.lo.groups(gen.ep_kind)[0]
        opts = gen._ep_attrs(group, combine=False)["algo_options"]
        flat = K * etp * (T // TP) * H * 2
        network.append(opts["network_share"] * PER_HOST * flat / (etp * ep))
        nvlink.append(PER_HOST * (PER_HOST - 1) * opts["nvlink_share"] * HOSTS * flat / (etp * ep))
    assert network == pytest.approx([network[0]] * 3, rel=1e-12)
    assert nvlink[0] < nvlink[1] < nvlink[2]


@pytest.mark.parametrize("etp, ep", [(1, 16), (4, 4)])
def test_the_group_is_megatron_cores_tp_ep(etp, ep):
    """The all-to-all's groups are the expert RankGenerator's ``'tp-ep'`` groups (tp = etp,
    cp = 1, dp = 16/(etp·ep), order tp-cp-ep-dp-pp), and the experts' TP group its ``'tp'``."""
    gen = _gen(etp, ep)
    expert = {"tp": etp, "cp": 1, "dp": 16 // (etp * ep), "pp": 1, "ep": ep}
    assert gen.ep_kind == "tp_ep"
    assert list(gen.lo.groups("tp_ep")) == _rank_generator(expert, "tp-cp-ep-dp-pp", "tp-ep")
    assert list(gen.lo.groups("etp")) == _rank_generator(expert, "tp-cp-ep-dp-pp", "tp")


@pytest.mark.parametrize("etp, ep", [(1, 16), (4, 4)])
def test_received_rows_and_expert_kernels(etp, ep):
    """R = ⌈etp·ep · T/tp · G/ep⌉ = ⌈etp · 256 · G⌉ rows per GPU (975 for etp 1, 2,886 for
    etp 4); the local experts (32/ep of them) run their moe_ffn_hidden/etp = 256/etp slice on
    the top_k · etp · 256 copies; the router and the FP8-free permutation as with etp = tp."""
    gen = _gen(etp, ep)
    g = _distinct(ep, E // ep)
    r = ceil(etp * (T // TP) * g)
    assert r == {1: 975, 4: 2886}[etp]
    ks = gen.layer_kinds[False][0]
    assert ks == layer_kernels(gen.model, gen.lo, received=r)
    by = {k.name: k for k in ks.forward}
    copies = K * etp * (T // TP)
    assert by["moe.router"].shape == (T // TP, E, H)
    assert (by["moe.permute"].bytes_read, by["moe.permute"].bytes_written) == (r * H * 2, copies * H * 2)
    assert (by["moe.expert.up"].shape, by["moe.expert.up"].groups) == ((copies, H // 2 // etp, H), E // ep)
    u = by["moe.unpermute"]
    assert (u.bytes_read, u.bytes_written) == (copies * H * 2, r * H * 2)


def test_tp1_with_expert_tp_sends_each_token_to_both_expert_tp_ranks():
    """TP 1 (no SP needed), etp 2, EP 8 on 16 GPUs: still Megatron's expert-TP × EP group; each
    rank dispatches all its T = 512 tokens, top_k·etp·T copies flat."""
    doc = _etp_doc(2, 8, tp=1)
    topo = load_topology("dgx-h100:nodes=2")
    graph = build_taskgraph(parse_workload(doc, "t"), topo)
    ep_tasks = [t for t in _rank0_forward_l0(graph=graph) if t.category == "ep"]
    assert [t.size for t in ep_tasks] == [K * 2 * T * H * 2] * 2
    assert all(t.group == tuple(range(16)) and t.algo == "rail" for t in ep_tasks)
    assert not [t for t in _rank0_forward_l0(graph=graph) if t.category == "tp"]


def test_one_host_runs_the_direct_all_to_all_deduplicated_per_gpu():
    """1 node, TP 2 × DP 4, etp 1 × EP 8: the direct all-to-all on the 8 GPUs carries the
    flat K·256 copies times G/K (one copy per distinct target GPU), G over 8 EP ranks."""
    g = _distinct(8, 4)
    ep_tasks = _ep_tasks(1, 8, nodes=1)
    assert all(t.group == tuple(range(8)) and t.algo == "auto" for t in ep_tasks)
    assert [t.size for t in ep_tasks] == pytest.approx([K * (T // TP) * H * 2 * g / K] * 2, rel=1e-12)


def test_expert_tp_groups_across_hosts_are_refused():
    """4 nodes × 8, TP 2, DP 16, etp 16 × EP 2: an expert-TP group spans two hosts, which
    the per-node layout of DeepEP's two phases does not express: one WorkloadError."""
    with pytest.raises(WorkloadError, match="etp=16 needs every expert-TP group on one host"):
        _gen(16, 2, nodes=4)


def _simulate(dispatch: str, etp: int, ep: int, fold: bool = True, nodes: int = HOSTS) -> object:
    doc = _etp_doc(etp, ep, nodes)
    doc["training"]["moe_dispatch"] = dispatch
    return simulate_workload(parse_workload(doc, "t"), f"dgx-h100:nodes={nodes}",
                             overrides={"generator": {"granularity": "layer", "fold": fold}},
                             options=EngineOptions(record_links=False))


def _network_bytes(result) -> float:
    """Bytes the hosts' NICs sent into the fabric."""
    return sum(v for (a, b), v in result.simulation.link_bytes.items() if ".nic" in a and ".nic" not in b)


@pytest.mark.parametrize("etp, ep, nodes, algo", [(1, 16, 4, "rail"), (4, 4, 4, "rail"), (1, 8, 2, "auto"),
                                                   (4, 1, 1, "auto"), (2, 1, 1, "auto")])
def test_folded_equals_unfolded(etp, ep, nodes, algo):
    """Replica folding (lanes shift the stage-local index by lcm(tp, etp·ep)) keeps the
    DeepEP run exact — the rail all-to-all across two hosts (4 nodes: two lanes) and the
    intranode one, also with EP 1 (DeepEP on the expert-TP group alone) — the same iteration,
    exposed communication and bytes on every link."""
    full, folded = (_simulate("deepep", etp, ep, fold, nodes) for fold in (False, True))
    assert {t.algo for t in folded.taskgraph if t.category == "ep" and t.kind == "collective"} == {algo}
    assert_folded_equals_unfolded(full, folded)


def test_iteration_moves_the_expected_way():
    """DeepEP sends a token once per node, NCCL's flat layout every copy: fewer bytes through
    the NICs with etp 1 × EP 16. Among DeepEP runs the network bytes stay (a token crosses to
    a node once whatever etp) while the NVLink fan-out grows with etp (test above) and the
    experts' GEMMs get narrower: the exposed all-to-all time and the iteration grow from
    etp 1 × EP 16 to etp 2 × EP 8 (= tp) to etp 4 × EP 4."""
    assert _network_bytes(_simulate("deepep", 1, 16)) < _network_bytes(_simulate("nccl", 1, 16))
    runs = [_simulate("deepep", etp, ep) for etp, ep in [(1, 16), (2, 8), (4, 4)]]
    assert _network_bytes(runs[0]) == pytest.approx(_network_bytes(runs[2]), rel=1e-12)
    ep_exposed = [r.summary()["exposed_comm_s"]["ep"] for r in runs]
    assert ep_exposed[0] < ep_exposed[1] < ep_exposed[2]
    assert runs[0].iteration_s < runs[1].iteration_s < runs[2].iteration_s


@pytest.mark.parametrize("tp, etp", [(2, 2), (2, 4), (1, 2)])
def test_ep1_runs_deepep_on_the_expert_tp_group(tp, etp):
    """EP 1 with expert TP: Megatron-core's flex dispatcher still runs DeepEP, on the expert-TP
    group (its assert is only etp·ep > 1). Every token goes once to each expert-TP rank: the
    direct all-to-all on the etp ranks of one host carries the flat top_k·etp·T/tp copies
    times 1/top_k, so each rank sends its T/tp tokens (T = 512) to each other member; every
    GPU receives the etp·T/tp tokens of its group and runs its moe_ffn_hidden/etp slice of all
    32 experts on their top_k copies. No TP collective surrounds the routed experts (the
    shared expert keeps its all-gather and reduce-scatter)."""
    doc = _etp_doc(etp, 1, nodes=1, tp=tp, sp=tp > 1)
    topo = load_topology("dgx-h100:nodes=1")
    spec = parse_workload(doc, "t")
    gen = _Generator(make_plan(spec.model, spec.layout(8), topo, device="H100"), topo)
    assert (gen.ep_kind, gen.ep_intranode) == ("tp_ep", True)
    assert gen.lo.groups("tp_ep") == gen.lo.groups("etp") and len(gen.lo.groups("etp")[0]) == etp
    rows = etp * T // tp
    assert gen._deepep_received_rows() == rows
    by = {k.name: k for k in gen.layer_kinds[False][0].forward}
    assert (by["moe.expert.up"].shape, by["moe.expert.up"].groups) == ((K * rows, H // 2 // etp, H), E)
    tasks = _rank0_forward_l0(graph=build_taskgraph(spec, topo))
    ep_tasks = [t for t in tasks if t.category == "ep"]
    assert [t.name.split()[2] for t in ep_tasks] == ["moe.dispatch", "moe.combine"]
    for t in ep_tasks:
        assert t.group == gen.lo.group_of(0, "etp") and t.algo == "auto"
        assert t.size / etp == (T // tp) * H * 2          # per pair: the rank's T/tp tokens
    routed = [t for t in tasks if t.category == "tp" and t.name.split()[2].startswith("moe.")
              and not t.name.split()[2].startswith("moe.shared")]
    assert not routed
