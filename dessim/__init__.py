"""dessim: a discrete-event simulator of clusters that train deep-learning models.

Public API (everything in SI units: seconds, bytes, bytes/second, FLOP/s):

* :func:`load_topology` — a :class:`Topology` from an inline spec, a YAML file or a preset.
* :func:`simulate_transfers` — point-to-point transfers on a topology's network.

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
                           front: api (simulate_workload), kinds, multijob
    trace                Chakra execution traces
    outputs              timelines, Gantt charts, tables
    sweep                design-space exploration
    calibrate            fitting the calibration file to a user's measurements
    cli                  the ``dessim`` command
"""

from __future__ import annotations

from dessim.errors import DessimError
from dessim.network import simulate_transfers
from dessim.topology import load_topology
from dessim.topology.graph import Link, Topology

__version__ = "0.1.0"

__all__ = ["DessimError", "Link", "Topology", "load_topology", "simulate_transfers", "__version__"]
