"""Several jobs on one cluster: merged graphs, and interference on shared oversubscribed links
equal to what max-min fair sharing predicts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dessim.cli import cluster_cmd
from dessim.errors import SpecError, WorkloadError
from dessim.topology import load_topology
from dessim.workload.multijob import job_view, parse_cluster, parse_gpus, simulate_cluster

BW = 25e9                      # GPU link bandwidth, bytes/s
GRADS = 4 * 25_557_032         # ResNet-50 fp32 gradients (DDP under autocast), one all-reduce (bucket_size 0)
N = 8                          # GPUs per job
# 16 hosts on 2 leaves (8 each), oversubscription 4, one spine: the leaf's uplink carries
# 8 * BW / 4 = 2 BW per direction.
TOPO = "leafspine:hosts=16,leaves=2,oversub=4,spines=1,bw=25GB/s,lat=0,device=H100"


def two_jobs(**extra):
    job = {"workload": "resnet50", "overrides": {"training": {"global_batch": 8, "bucket_size": 0}}}
    return parse_cluster({"topology": TOPO, "engine": {"collectives": {"algo": "ring", "protocol": "raw"}}, "jobs": [
        {**job, "name": "a", "gpus": [0, 8, 1, 9, 2, 10, 3, 11]},
        {**job, "name": "b", "gpus": "4,12,5,13,6,14,7,15"}], **extra}, "<test>")


def ring_allreduce_s(share):
    """2(N-1) ring steps of GRADS/N bytes at ``share`` bytes/s (no latency)."""
    return 2 * (N - 1) * (GRADS / N) / share


def test_allreduces_crossing_one_oversubscribed_uplink_slow_down_as_max_min_predicts():
    # Each job alternates leaves, so all 8 ring hops cross the spine: 4 flows per direction.
    # Alone: 4 flows share the 2 BW uplink -> BW/2 each (< BW of the GPU links).
    # Together: 8 flows -> BW/4 each. Compute is identical and unshared.
    res = simulate_cluster(two_jobs())
    alone, shared = ring_allreduce_s(2 * BW / 4), ring_allreduce_s(2 * BW / 8)
    for job in res.jobs:
        assert job.exposed_comm_alone_s["dp"] == pytest.approx(alone, rel=1e-9)
        assert job.exposed_comm_shared_s["dp"] == pytest.approx(shared, rel=1e-9)
        assert job.shared_s - job.alone_s == pytest.approx(shared - alone, rel=1e-9)
        compute = job.alone_s - alone
        assert job.slowdown == pytest.approx((compute + shared) / (compute + alone), rel=1e-9)
    assert res.jobs[0].slowdown > 1.3


def test_jobs_on_separate_leaves_do_not_interfere():
    job = {"workload": "resnet50", "overrides": {"training": {"global_batch": 8, "bucket_size": 0}}}
    spec = parse_cluster({"topology": TOPO, "engine": {"collectives": {"algo": "ring", "protocol": "raw"}}, "jobs": [
        {**job, "name": "left", "gpus": "0-7"}, {**job, "name": "right", "gpus": 8}]}, "<test>")
    res = simulate_cluster(spec)
    assert [j.gpus for j in res.jobs] == [tuple(range(8)), tuple(range(8, 16))]
    for j in res.jobs:
        assert j.shared_s == pytest.approx(j.alone_s, rel=1e-12)
        assert j.exposed_comm_alone_s["dp"] == pytest.approx(ring_allreduce_s(BW), rel=1e-9)


def test_merged_graph_maps_ranks_and_prefixes_ids():
    res = simulate_cluster(two_jobs(), alone=False)
    colls = [t for t in res.taskgraph if t.kind == "collective"]
    groups = {t.coll_id: t.group for t in colls}
    assert groups == {"a/dp0.0": (0, 8, 1, 9, 2, 10, 3, 11), "b/dp0.0": (4, 12, 5, 13, 6, 14, 7, 15)}
    assert all(t.id.startswith(("a/", "b/")) for t in res.taskgraph)
    assert {t.rank for t in res.taskgraph if t.id.startswith("b/")} == {4, 5, 6, 7, 12, 13, 14, 15}


def test_job_view_keeps_the_network_and_renumbers_the_gpus():
    topo = load_topology(TOPO)
    view = job_view(topo, [8, 0], "x")
    assert view.num_gpus == 2 and view.gpus == ("gpu8", "gpu0")
    assert view.graph.number_of_edges() == topo.graph.number_of_edges()
    assert view.kind("gpu3") == "switch"


def test_bad_cluster_specs():
    with pytest.raises(SpecError, match="given to both"):
        simulate_cluster(parse_cluster({"topology": TOPO, "jobs": [
            {"workload": "resnet50", "gpus": "0-3"}, {"workload": "resnet50", "gpus": [3, 4]}]}, "c.yaml"))
    with pytest.raises(SpecError, match="only 0 are free"):
        simulate_cluster(parse_cluster({"topology": TOPO, "jobs": [
            {"workload": "resnet50", "gpus": 16}, {"workload": "resnet50", "gpus": 1}]}, "c.yaml"))
    with pytest.raises(SpecError, match="unknown key 'ranks'"):
        parse_cluster({"topology": TOPO, "jobs": [{"workload": "resnet50", "ranks": 2}]}, "c.yaml")
    with pytest.raises(SpecError, match="runs backwards"):
        parse_gpus("5-2", "gpus")


def test_cluster_command_prints_slowdowns(tmp_path):
    res = CliRunner().invoke(cluster_cmd.command, ["workloads/cluster-two-jobs.yaml", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [j["name"] for j in out["jobs"]] == ["a", "b"] and out["jobs"][0]["slowdown"] > 1.3


def test_without_the_alone_runs_no_alone_figure_is_made_up():
    """--no-alone: the text said 'exposed dp 0s alone -> 14.4ms shared' and --json printed
    "alone_s": NaN (not JSON) and "slowdown": 1.0; now the text shows the shared figure only
    and the JSON has null for both, and strict JSON parsers read it."""
    args = ["workloads/cluster-two-jobs.yaml", "--no-alone"]
    text = CliRunner().invoke(cluster_cmd.command, args)
    assert text.exit_code == 0, text.output
    assert "alone ->" not in text.output and "exposed dp" in text.output
    res = CliRunner().invoke(cluster_cmd.command, [*args, "--json"])
    assert res.exit_code == 0 and "NaN" not in res.output
    jobs = json.loads(res.output, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))["jobs"]
    assert all(j["alone_s"] is None and j["slowdown"] is None and j["shared_s"] > 0 for j in jobs)


@pytest.mark.parametrize("path, words", [
    ("workloads/gpt3-1.3b.yaml", ["a workload file (kind transformer)", "dessim simulate workloads/gpt3-1.3b.yaml"]),
    ("workloads/resnet50.yaml", ["a workload file (kind cnn)"]),
    ("examples/shared-cluster/sweep.yaml", ["a sweep spec", "dessim sweep examples/shared-cluster/sweep.yaml"])])
def test_a_workload_or_sweep_file_given_as_a_cluster_says_which_command_runs_it(path, words):
    """Before, the cluster schema listed every key it did not know (model, parallelism, ...)."""
    from dessim.cli.main import cli

    res = CliRunner().invoke(cli, ["cluster", path])
    assert res.exit_code == 2
    assert all(w in res.output for w in words) and "unknown key" not in res.output, res.output


TINY_GPT = {"name": "tiny-gpt",
            "model": {"layers": 2, "hidden": 256, "heads": 8, "ffn_hidden": 1024, "vocab": 1024, "seq_len": 256},
            "parallelism": {"tp": 2, "pp": 1},
            "training": {"global_batch": 8, "micro_batch": 1, "bucket_size": "1MiB"}}


def test_transformer_jobs_are_generated_unfolded_since_a_cluster_merges_them_rank_by_rank():
    """Replica folding is on by default where it applies; in a cluster it is off unless a job
    asks for it, and asking for it is a clear error."""
    from dessim.workload.transformer.spec import parse_workload

    spec = parse_workload(TINY_GPT, "<test>")
    job = {"name": "gpt", "workload": spec, "gpus": 8}
    res = simulate_cluster(parse_cluster({"topology": "dgx-h100:nodes=1", "jobs": [job]}, "<test>"))
    assert res.taskgraph.fold is None and {t.rank for t in res.taskgraph} == set(range(8))
    with pytest.raises(WorkloadError, match="job 'gpt' has a folded task graph"):
        simulate_cluster(parse_cluster({"topology": "dgx-h100:nodes=1",
                                        "jobs": [{**job, "overrides": {"fold": True}}]}, "<test>"))


def test_a_jobs_exposed_tp_communication_includes_the_closed_form_tp_time():
    """TP collectives of an isolated NVSwitch island run as delay tasks (closed form), which the
    engine counts as compute; the cluster reports their exposed time as the workload summary does."""
    from dessim.workload import simulate_workload
    from dessim.workload.transformer.spec import parse_workload

    spec = parse_workload({**TINY_GPT, "parallelism": {"tp": 8}}, "<test>")
    alone = simulate_workload(spec, "dgx-h100:nodes=1", overrides={"granularity": "stage", "fold": False})
    assert alone.taskgraph.meta["tp_closed_form_groups"] == 1
    res = simulate_cluster(parse_cluster({"topology": "dgx-h100:nodes=1", "jobs": [
        {"name": "gpt", "workload": spec, "gpus": 8, "overrides": {"granularity": "stage"}}]}, "<test>"))
    tp = alone.summary()["exposed_comm_s"]["tp"]
    assert tp > 0
    assert res.jobs[0].exposed_comm_alone_s["tp"] == res.jobs[0].exposed_comm_shared_s["tp"] == tp
