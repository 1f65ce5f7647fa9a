"""Parameter servers (training.gradient_sync: parameter_server): topology nodes, closed-form
push/pull on an idle network, the servers-vs-NIC knee, consistency modes, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from dessim.engine import EngineOptions
from dessim.errors import DessimError, SpecError
from dessim.topology import load_topology
from dessim.topology.paramservers import attach_parameter_servers
from dessim.workload import simulate_workload
from dessim.workload.dataparallel.paramserver import push_time
from dessim.workload.kinds import generate_workload

LEAF = "leafspine:hosts=8,leaves=1,bw=10GB/s,lat=1us"


def _ps(n: int, topology: str = LEAF, options: EngineOptions | None = None, **training):
    tr = {"global_batch": 8, "parameter_servers": n}
    tr.update(training)
    return simulate_workload("resnet50", topology, overrides={"training": tr}, options=options)


def _window(result, what: str, it: int) -> tuple[float, float, float]:
    """(first start, last end, bytes per worker) of iteration ``it``'s pushes or pulls."""
    recs = [r for r in result.simulation.span_records if r[3].startswith(what) and f" it{it} " in r[3]]
    size = sum(t.size for t in result.taskgraph if t.name.startswith(what) and f" it{it} " in t.name)
    return min(r[6] for r in recs), max(r[8] for r in recs), size / result.layout["dp"]


@pytest.mark.parametrize("servers", [1, 2, 16])
def test_push_and_pull_on_an_idle_network_match_the_closed_form(servers):
    """One bucket (bucket_size 0), 8 workers on one 10 GB/s leaf: a push takes
    max(W·G/(N·B), G/B) + the two 1 us links — server-bound for N < W, worker-bound beyond."""
    r = _ps(servers, bucket_size=0)
    for what in ("push", "pull"):
        start, end, per_worker = _window(r, what, 0)
        expected = push_time(per_worker, 8, servers, 10e9, 10e9, 2e-6)
        assert end - start == pytest.approx(expected, rel=1e-9)
    assert per_worker == pytest.approx(r.details["params"] * 2)      # bf16 parameters


def test_server_count_knee_nic_bound_then_compute_bound():
    """Few servers: their links bound the iteration (time ∝ 1/N); many: the iteration
    approaches the compute time and stops improving (Li et al. 2014 / Project Adam)."""
    topo = "leafspine:hosts=8,leaves=2,bw=12.5GB/s"
    times, busy = {}, {}
    for n in (1, 2, 8, 16):
        s = simulate_workload("resnet50", topo, overrides={"training": {"global_batch": 256,
                                                                        "parameter_servers": n}}).summary()
        times[n], busy[n] = s["iteration_s"], s["gpu_busy_fraction"]
        compute = s["compute_s"]
    assert times[1] / times[2] == pytest.approx(2.0, rel=0.15)      # NIC-bound: halves
    assert times[8] == pytest.approx(times[16], rel=0.01)          # past the knee: flat
    # what is left past the knee: the last bucket's push + pull at a worker's own link
    assert times[16] < 1.35 * compute
    assert busy[1] < 0.3 and busy[16] > 0.75


def test_summary_reports_the_setting_per_iteration():
    r = _ps(2, ps_mode="async", ps_staleness=1)
    s = r.summary()
    d = s["details"]
    assert (d["gradient_sync"], d["parameter_servers"], d["ps_mode"], d["ps_staleness"], d["ps_iterations"]) \
        == ("parameter_server", 2, "async", 1, 4)
    assert s["memory_per_gpu_bytes"]["optimizer"] == 0.0            # state lives on the servers
    assert not any(t.category == "optimizer" for t in r.taskgraph)
    # figures are per iteration: model FLOPs equal the one-iteration all-reduce run's
    ar = simulate_workload("resnet50", LEAF, overrides={"training": {"global_batch": 8}}).summary()
    assert s["model_flops"] == pytest.approx(ar["model_flops"])
    assert ar["details"]["gradient_sync"] == "allreduce" and ar["details"]["parameter_servers"] == 0
    assert s["iteration_s"] < r.simulation.makespan_s


def test_async_bounded_staleness_lets_fast_workers_run_ahead_but_not_further():
    """Rank 0 is 4x slower. Sync: every worker ends iteration 0 with it. Async s=1: fast workers
    end iteration 0 earlier, yet never start iteration k before every worker pushed k−2. (4x, was
    3x: with the fp32 gradients of PyTorch DDP under autocast the pushes take twice as long, and
    a 3x slowdown left the fast workers' lead at 0.61 of the sync time.)"""
    slow = EngineOptions.of({"noise": {"slowdown": {0: 4.0}}})
    kw = dict(options=slow, global_batch=128, bucket_size=0, ps_iterations=4)
    sync = _ps(8, **kw)
    asy = _ps(8, ps_mode="async", ps_staleness=1, **kw)

    def pull_end(r, rank, it):
        return max(rec[8] for rec in r.simulation.span_records
                   if rec[0] == rank and rec[3].startswith("pull") and f" it{it} " in rec[3])

    assert pull_end(asy, 5, 0) < 0.6 * pull_end(sync, 5, 0)
    assert pull_end(sync, 5, 0) == pytest.approx(pull_end(sync, 0, 0))
    # the slow worker bounds both in the steady state
    assert asy.iteration_s == pytest.approx(sync.iteration_s, rel=1e-6)
    spans = asy.simulation.span_records
    for k in range(2, 4):
        slow_push = max(rec[8] for rec in spans if rec[0] == 0 and rec[3].startswith("push") and f" it{k - 2} " in rec[3])
        fast_start = min(rec[6] for rec in spans if rec[0] == 5 and rec[5] == "fwd"
                         and rec[6] > pull_end(asy, 5, k - 1) - 1e-12)
        assert fast_start >= slow_push - 1e-12


def test_colocated_servers_share_the_workers_nics():
    topo = "dgx-h100:nodes=2"
    over = {"global_batch": 64, "parameter_servers": 2}
    ded = simulate_workload("resnet50", topo, overrides={"training": over}).summary()
    col = simulate_workload("resnet50", topo, overrides={"training": {**over, "ps_placement": "colocated"}}).summary()
    assert col["details"]["ps_placement"] == "colocated"
    assert ded["iteration_s"] > 0 and col["iteration_s"] > 0
    assert ded["iteration_s"] != col["iteration_s"]


def test_dlrm_dense_part_through_parameter_servers():
    s = simulate_workload("dlrm-small", "leafspine:hosts=8,leaves=2,bw=12.5GB/s",
                          overrides={"training": {"parameter_servers": 4}}).summary()
    assert s["details"]["gradient_sync"] == "parameter_server"
    assert s["exposed_comm_s"].get("ps", 0) > 0 and "dp" not in s["exposed_comm_s"]


def test_deterministic():
    a, b = _ps(4, ps_mode="async", ps_staleness=2).summary(), _ps(4, ps_mode="async", ps_staleness=2).summary()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


@pytest.mark.parametrize("training, message", [
    ({"gradient_sync": "gossip"}, "gradient_sync: 'gossip' is unknown"),
    ({"gradient_sync": "parameter_server"}, "needs training.parameter_servers"),
    ({"gradient_sync": "allreduce", "parameter_servers": 2}, "training.parameter_servers: applies to"),
    ({"parameter_servers": 2, "ps_staleness": 2}, "ps_staleness: 2 needs ps_mode: async"),
    ({"parameter_servers": 2, "ps_mode": "eventual"}, "ps_mode: 'eventual' is unknown"),
    ({"parameter_servers": 2, "ps_placement": "cloud"}, "ps_placement: 'cloud' is unknown"),
    ({"parameter_servers": 0}, "parameter_servers"),
    ({"parameter_servers": 2, "ps_iterations": 1}, "ps_iterations"),
    ({"parameter_servers": 2, "ps_nic_bw": "fast"}, "ps_nic_bw"),
])
def test_bad_settings_name_the_key(training, message):
    with pytest.raises(DessimError, match=message.replace("(", r"\(")):
        simulate_workload("resnet50", LEAF, overrides={"training": {"global_batch": 8, **training}})


def test_compression_is_for_allreduce_only():
    with pytest.raises(DessimError, match="compression 'topk' applies to gradient_sync: allreduce only"):
        simulate_workload("resnet50", LEAF, overrides={"training": {"global_batch": 8, "parameter_servers": 2},
                                                       "compression": {"method": "topk"}})


def test_ps_attach_places_servers_on_named_nodes():
    over = {"training": {"global_batch": 8, "parameter_servers": 2}}
    default = generate_workload("resnet50", "leafspine:hosts=8,leaves=2,bw=10GB/s", overrides=over).topology
    named = generate_workload("resnet50", "leafspine:hosts=8,leaves=2,bw=10GB/s", overrides={
        "training": {**over["training"], "ps_attach": ["leaf1", "leaf1"]}}).topology
    assert sorted(default.graph.adj["ps0"]) + sorted(default.graph.adj["ps1"]) == ["leaf0", "leaf1"]
    assert sorted(named.graph.adj["ps0"]) + sorted(named.graph.adj["ps1"]) == ["leaf1", "leaf1"]
    with pytest.raises(DessimError, match="ps_attach.*'nowhere' is not a node"):
        _ps(1, ps_attach=["nowhere"])
    with pytest.raises(DessimError, match="ps_attach"):
        _ps(1, ps_attach="leaf0")


def test_ps_nic_bw_sets_the_server_links():
    r = _ps(1, bucket_size=0, ps_nic_bw="40GB/s")
    start, end, g = _window(r, "push", 0)
    assert end - start == pytest.approx(push_time(g, 8, 1, 40e9, 10e9, 2e-6), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 20), placement=st.sampled_from(["dedicated", "colocated"]),
       preset=st.sampled_from(["leafspine:hosts=8,leaves=2,bw=10GB/s", "dgx-a100:nodes=2"]))
def test_attached_servers_are_leaves_that_route_nothing(count, placement, preset):
    base = load_topology(preset)
    topo = attach_parameter_servers(base, count, placement)
    servers = topo.nodes_of_kind("param_server")
    assert sorted(servers) == sorted(f"ps{i}" for i in range(count))
    for s in servers:
        assert topo.graph.degree[s] == 1 and topo.graph.nodes[s]["transit"] is False
    assert topo.num_gpus == base.num_gpus
    assert topo.graph.number_of_edges() == base.graph.number_of_edges() + count


def test_attach_errors():
    base = load_topology(LEAF)
    with pytest.raises(DessimError, match="placement 'x' is unknown"):
        attach_parameter_servers(base, 1, "x")
    with pytest.raises(DessimError, match="attach names 1 nodes for 2 servers"):
        attach_parameter_servers(base, 2, attach=["leaf0"])
    with pytest.raises(DessimError, match="'nowhere' is not a node"):
        attach_parameter_servers(base, 1, attach=["nowhere"])
    with pytest.raises(SpecError, match="already has parameter-server nodes"):
        simulate_workload("resnet50", attach_parameter_servers(base, 1),
                          overrides={"training": {"global_batch": 8, "parameter_servers": 1}})


def test_jobs_with_parameter_servers_share_a_cluster():
    """Each job brings its servers (renamed <job>/ps<i>); a job alone in the cluster reports what
    the workload reports on its own, the steady state of its iterations."""
    from dessim.workload.multijob import job_view, parse_cluster, simulate_cluster

    topo = "leafspine:hosts=8,leaves=2,oversub=4,spines=1,bw=12.5GB/s,lat=1us,device=H100"
    job = {"workload": "resnet50", "overrides": {"training": {"global_batch": 32, "parameter_servers": 2}}}
    res = simulate_cluster(parse_cluster({"topology": topo, "jobs": [{**job, "name": "a", "gpus": "0-3"},
                                                                     {**job, "name": "b", "gpus": 4}]}, "<t>"))
    assert sorted(n for n in res.topology.graph.nodes if "ps" in n) == ["a/ps0", "a/ps1", "b/ps0", "b/ps1"]
    solo = simulate_workload("resnet50", job_view(load_topology(topo), range(4), "a"), overrides=job["overrides"])
    a = res.jobs[0]
    assert a.alone_s == pytest.approx(solo.iteration_s, rel=1e-9)
    assert a.exposed_comm_alone_s["ps"] == pytest.approx(solo.summary()["exposed_comm_s"]["ps"], rel=1e-9)
    assert all(j.shared_s >= j.alone_s * (1 - 1e-9) for j in res.jobs)
