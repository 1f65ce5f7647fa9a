"""dessim: a discrete-event simulator of clusters that train deep-learning models.

Public API (everything in SI units: seconds, bytes, bytes/second, FLOP/s):

* :func:`load_topology` — a :class:`Topology` from an inline spec, a YAML file or a preset.
* :func:`simulate_transfers` — point-to-point transfers on a topology's network.
* :func:`run_collective`, :func:`compare_collectives` — one collective, algorithms side by side.
* :func:`load_workload`, :func:`simulate_workload` — a training iteration of a workload (a
  preset name, a workload YAML file or a Hugging Face ``config.json``).
* :func:`simulate`, :class:`EngineOptions` — replay a task graph; :func:`read_chakra`,
  :func:`replay_chakra` — Chakra execution traces; :func:`load_sweep`, :func:`run_sweep`.
* :func:`simulate_training_run`, :func:`parse_train_options` — a whole training run: time to
  train, failures and goodput, energy and cost (docs/training-run.md).

Architecture, bottom to top (a layer imports only from layers below it; README "Architecture")::

    units, errors        parsing of human units, user-facing errors
    resources            finding shipped data files (topologies, workloads)
    catalog              devices and link types, with sources; the calibration file
    topology             networkx graphs of clusters, builders, presets, specs, routing
    network              flow-level (max-min fair) and analytical network models on simpy
    collectives          collective algorithms as schedules of transfers
    taskgraph            task graphs of compute, collectives, send/recv, memory moves
    engine               simpy replay of task graphs on the network; the kernel model
    workload             model + parallel layout -> task graph, one subpackage per domain:
                           common, transformer, dataparallel, recsys (DLRM), vision (CNN, ViT);
                           front: api (simulate_workload), kinds, multijob; jobtrace,
                           schedulers, sharedcluster (a shared cluster over time)
    trace                Chakra execution traces
    training_run         a whole run from one iteration: failures, goodput, energy, cost
    outputs              timelines, Gantt charts, tables, plots
    sweep                design-space exploration
    calibrate            fitting the calibration file to a user's measurements
    cli                  the ``dessim`` command
"""

from __future__ import annotations

import importlib
from typing import Any

from dessim.errors import DessimError
from dessim.network import simulate_transfers
from dessim.topology import load_topology
from dessim.topology.graph import Link, Topology

__version__ = "0.1.0"

#: The rest of the public API (README "The Python API"), by name → defining module. Imported
#: on first use (PEP 562), so that ``import dessim`` and the ``dessim`` command stay fast.
LAZY_EXPORTS: dict[str, str] = {
    "run_collective": "dessim.collectives",
    "compare_collectives": "dessim.collectives",
    "CollectiveSettings": "dessim.collectives",
    "EngineOptions": "dessim.engine",
    "simulate": "dessim.engine",
    "load_workload": "dessim.workload",
    "simulate_workload": "dessim.workload",
    "simulate_job_trace": "dessim.workload.sharedcluster",
    "read_chakra": "dessim.trace",
    "replay_chakra": "dessim.trace",
    "load_sweep": "dessim.sweep.spec",
    "run_sweep": "dessim.sweep.runner",
    "simulate_training_run": "dessim.training_run",
    "parse_train_options": "dessim.training_run",
}

__all__ = ["DessimError", "Link", "Topology", "load_topology", "simulate_transfers", "__version__",
           *LAZY_EXPORTS]


def __getattr__(name: str) -> Any:
    module = LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dessim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY_EXPORTS))
