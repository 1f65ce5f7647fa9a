"""The run configuration is composed, typed parts with one spelling everywhere.

:class:`EngineOptions` holds ``network`` (a name in the network-model registry),
``collectives`` (:class:`CollectiveSettings`), ``noise`` and ``shortcuts``. Every part checks
its values when it is built — before any work — and the former flat spellings are errors that
name the new dotted path, in Python, sweep specs and cluster files alike. A sweep axis
``engine.collectives.algo`` reaches the engine.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.collectives import CollectiveSettings
from dessim.engine import EngineOptions, Noise, Shortcuts
from dessim.engine.options import MOVED, engine_paths
from dessim.errors import CollectiveError, DessimError, NetworkError, SpecError
from dessim.network import NETWORK_MODELS
from dessim.sweep.points import EVALUATORS
from dessim.sweep.spec import parse_sweep
from dessim.workload import simulate_workload
from dessim.workload.multijob import parse_cluster

TINY = {"name": "tiny", "model": {"layers": 2, "hidden": 256, "heads": 8, "ffn_hidden": 1024,
                                  "vocab": 1024, "seq_len": 256},
        "parallelism": {"tp": 1, "pp": 1},
        "training": {"global_batch": 8, "micro_batch": 1, "bucket_size": "1MiB"}}
TOPOLOGY = "dgx-a100:nodes=1"


# ---------------------------------------------------------------- the parts
def test_the_options_are_composed_of_typed_parts():
    o = EngineOptions()
    assert o.network == "flow"
    assert o.collectives == CollectiveSettings()
    assert o.noise == Noise() and not o.noise.active
    assert o.shortcuts == Shortcuts()
    assert o.forced_algo is None          # auto: each collective task keeps its own algorithm


def test_parts_may_be_given_as_mappings_of_their_field_names():
    o = EngineOptions(collectives={"algo": "ring"}, noise={"slowdown": {"3": 1.2}},
                      shortcuts={"bundles": False})
    assert o.collectives == CollectiveSettings(algo="ring") and o.forced_algo == "ring"
    assert o.noise.slowdown == {3: 1.2} and o.noise.active
    assert o.shortcuts == Shortcuts(bundles=False)


def test_no_shortcuts_is_the_full_replay():
    none = Shortcuts.none()
    assert not any((none.compact_schedules, none.bundles, none.shape_memo, none.collective_memo,
                    none.stream_rings))


@pytest.mark.parametrize("build, error, message", [
    (lambda: Noise(straggler_sigma=-0.1), SpecError, r"noise.straggler_sigma must be a number >= 0"),
    (lambda: Noise(straggler_sigma=float("nan")), SpecError, r"noise.straggler_sigma"),
    (lambda: Noise(slowdown={2: 0}), SpecError, r"noise.slowdown of rank 2 must be a number > 0"),
    (lambda: Noise(slowdown={-1: 1.5}), SpecError, r"rank -1 is not a rank number"),
    (lambda: Noise(slowdown={"x": 1.5}), SpecError, r"rank 'x' is not a rank number"),
    (lambda: Noise(slowdown=[1.5]), SpecError, r"noise.slowdown must be a mapping"),
    (lambda: Noise(seed=1.5), SpecError, r"noise.seed must be a whole number"),
    (lambda: Shortcuts(bundles="no"), SpecError, r"shortcuts.bundles must be true or false"),
    (lambda: CollectiveSettings(algo="bogus"), CollectiveError, r"unknown collective algorithm 'bogus'"),
    (lambda: CollectiveSettings(chunks=0), CollectiveError, r"collectives.chunks must be a whole number"),
    (lambda: EngineOptions(network="packet"), NetworkError, r"unknown network model 'packet'"),
    (lambda: EngineOptions(collectives={"algo": "bogus"}), CollectiveError, r"collectives: unknown"),
    (lambda: EngineOptions(collectives={"alg": "ring"}), SpecError,
     r"collectives: unknown key 'alg'; valid keys: algo, protocol"),
    (lambda: EngineOptions(noise={"sigma": 1}), SpecError, r"noise: unknown key 'sigma'"),
    (lambda: EngineOptions(shortcuts={"stream_rings": 1}), SpecError, r"shortcuts.stream_rings"),
    (lambda: EngineOptions(noise=0.1), SpecError, r"noise: expected a Noise or a mapping"),
    (lambda: EngineOptions(precision="int3"), SpecError, r"precision 'int3' is not one of fp32"),
    (lambda: EngineOptions(record_links="yes"), SpecError, r"record_links must be true or false"),
])
def test_each_part_rejects_bad_values_when_it_is_built(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_the_network_model_is_chosen_from_the_registry():
    assert set(NETWORK_MODELS) >= {"flow", "analytical"}
    for name in NETWORK_MODELS:
        assert EngineOptions(network=name).network == name


# ---------------------------------------------------------------- former spellings
@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_former_flat_keyword_names_its_new_place(old):
    part, _, name = MOVED[old].partition(".")
    with pytest.raises(SpecError, match=rf"EngineOptions\({old}=\.\.\.\) is now EngineOptions\({part}="
                                        rf"\w+\({name}=\.\.\.\)\)"):
        EngineOptions(**{old: None})


def test_a_former_flat_key_of_a_mapping_names_its_new_path():
    with pytest.raises(SpecError, match=r"engine.algo is now engine.collectives.algo"):
        EngineOptions.of({"algo": "ring"})
    with pytest.raises(SpecError, match=r"engine.straggler_sigma is now engine.noise.straggler_sigma"):
        EngineOptions.of({"straggler_sigma": 0.1})
    with pytest.raises(SpecError, match=r"unknown engine option 'speed'"):
        EngineOptions.of({"speed": 1})


def collective_sweep(**axes) -> dict:
    return {"name": "s", "kind": "collective",
            "base": {"topology": "ring:4", "collective": {"op": "allreduce", "size": "1MiB"}},
            "axes": axes}


def test_a_sweep_axis_with_a_former_spelling_is_an_error_naming_the_new_one():
    with pytest.raises(SpecError, match=r"axes.engine.algo: engine.algo is now engine.collectives.algo"):
        parse_sweep(collective_sweep(**{"engine.algo": ["ring"]}))
    with pytest.raises(SpecError, match=r"engine.stream_rings is now engine.shortcuts.stream_rings"):
        parse_sweep(collective_sweep(**{"engine.stream_rings": [True]}))


def test_a_sweep_base_engine_section_with_a_former_spelling_is_an_error():
    data = collective_sweep(**{"collective.size": ["1MiB"]})
    data["base"]["engine"] = {"protocol": "raw"}
    with pytest.raises(SpecError, match=r"base.engine: engine.protocol is now engine.collectives.protocol"):
        parse_sweep(data)


def test_a_cluster_engine_section_with_a_former_spelling_is_an_error_when_read():
    doc = {"topology": "dgx-a100:nodes=1", "engine": {"algo": "ring"},
           "jobs": [{"workload": "resnet50", "gpus": 8}]}
    with pytest.raises(SpecError, match=r"engine.algo is now engine.collectives.algo"):
        parse_cluster(doc)
    doc["engine"] = {"collectives": {"algo": "ring"}}
    assert parse_cluster(doc).engine == {"collectives": {"algo": "ring"}}


# ---------------------------------------------------------------- sweeps address the same paths
def test_sweep_axes_address_every_setting_by_its_dotted_path():
    assert {"network", "collectives.algo", "noise.straggler_sigma", "shortcuts.bundles",
            "calibration"} <= set(engine_paths())
    spec = parse_sweep(collective_sweep(**{"engine.collectives.algo": ["ring", "tree"],
                                           "engine.shortcuts.bundles": [False]}))
    cfg = EVALUATORS["collective"].config(spec.base, spec.points()[1].params)
    assert cfg["engine"] == {"collectives": {"algo": "tree"}, "shortcuts": {"bundles": False}}


def test_a_bad_axis_value_fails_the_spec_before_any_point_runs():
    with pytest.raises(DessimError, match=r"axes.engine.collectives.algo\[1\].*unknown collective "
                                          r"algorithm 'bogus'"):
        parse_sweep(collective_sweep(**{"engine.collectives.algo": ["ring", "bogus"]}))
    with pytest.raises(SpecError, match=r"noise.straggler_sigma must be a number >= 0"):
        parse_sweep({"kind": "workload", "base": {"workload": "gpt3-1.3b", "topology": TOPOLOGY},
                     "axes": {"engine.noise.straggler_sigma": [0.1, -1]}})


def test_a_collective_sweep_takes_only_the_settings_one_collective_uses():
    with pytest.raises(SpecError, match=r"unknown engine option 'noise.seed'"):
        parse_sweep(collective_sweep(**{"engine.noise.seed": [1]}))


def test_a_sweep_axis_engine_collectives_algo_reaches_the_engine(tmp_path):
    import yaml

    workload = tmp_path / "tiny.yaml"
    workload.write_text(yaml.safe_dump(TINY))
    spec = parse_sweep({"kind": "workload", "base": {"workload": str(workload), "topology": TOPOLOGY},
                        "axes": {"engine.collectives.algo": ["ring", "tree"]}})
    evaluator = EVALUATORS["workload"]
    swept = [evaluator.evaluate(evaluator.config(spec.base, p.params)) for p in spec.points()]
    api = [simulate_workload(str(workload), TOPOLOGY, options=EngineOptions(
        collectives=CollectiveSettings(algo=algo), record_links=False)).summary()
        for algo in ("ring", "tree")]
    assert [s["iteration_s"] for s in swept] == [a["iteration_s"] for a in api]
    assert swept[0]["iteration_s"] != swept[1]["iteration_s"]     # the axis changed the run


# ---------------------------------------------------------------- the command line's option group
def test_every_simulating_command_takes_the_engine_flags_of_one_group():
    from dessim.cli.common import ENGINE_FLAGS

    flags = {f.path: f for f in ENGINE_FLAGS}
    assert set(flags) <= set(engine_paths())            # each flag sets one path of the options
    for command in ("run", "simulate", "replay", "cluster", "collective", "compare"):
        out = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
        assert out.exit_code == 0
        assert "--network" in out.output and "--protocol" in out.output and "--calibration" in out.output


def test_a_bad_flag_value_fails_before_any_work():
    out = CliRunner().invoke(cli, ["simulate", "--algo", "bogus"])
    assert out.exit_code != 0 and "unknown collective algorithm 'bogus'" in out.output


def test_exact_refuses_the_stream_rings_approximation():
    out = CliRunner().invoke(cli, ["simulate", "--exact", "--stream-rings"])
    assert out.exit_code != 0 and "drop --stream-rings" in out.output


def test_the_network_model_may_be_a_strategy_object():
    """As networkx takes ``flow_func``: a Network subclass is accepted where a name is, gives
    the same run as its registered name, and outputs report its name."""
    from dessim.errors import NetworkError
    from dessim.network import FlowNetwork, Network

    class Counting(FlowNetwork):
        """A user's model: the flow network, counting the transfers it starts."""
        name = "counting-flow"
        started = 0

        def transfer(self, *args, **kwargs):
            type(self).started += 1
            return super().transfer(*args, **kwargs)

    by_name = EngineOptions(network="flow", record_links=False)
    by_class = EngineOptions(network=FlowNetwork, record_links=False)
    custom = EngineOptions(network=Counting, record_links=False)
    assert (by_name.network_name, by_class.network_name, custom.network_name) == \
        ("flow", "flow", "counting-flow")
    from dessim.workload import simulate_workload
    runs = [simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", options=o,
                              overrides={"global_batch": 32}) for o in (by_name, by_class, custom)]
    assert runs[0].iteration_s == runs[1].iteration_s == runs[2].iteration_s
    assert runs[2].simulation.network == "counting-flow" and Counting.started > 0
    with pytest.raises(NetworkError, match="network: unknown network model <class 'int'>"):
        EngineOptions(network=int)
    assert issubclass(Counting, Network)
