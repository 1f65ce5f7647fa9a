"""Network models: how long transfers take on a topology (simpy, SI units).

* :class:`FlowNetwork` (``"flow"``): flow-level, max-min fair sharing of directed channels,
  latency paid before sharing (SimGrid CM02 semantics without cross traffic).
* :class:`AnalyticalNetwork` (``"analytical"``): alpha-beta, no sharing.

Both implement :class:`Network`; pick one by name with :func:`make_network`, or run a list of
transfers with :func:`simulate_transfers`. See docs/network.md.
"""

from __future__ import annotations

from dessim.network.analytical import AnalyticalNetwork
from dessim.network.base import NETWORK_MODELS, Network, Route, make_network, network_model
from dessim.network.channels import Channel, ChannelMap
from dessim.network.flow import FlowNetwork
from dessim.network.maxmin import solve_maxmin
from dessim.network.transfers import TransferResult, simulate_transfers

__all__ = [
    "NETWORK_MODELS",
    "AnalyticalNetwork",
    "Channel",
    "ChannelMap",
    "FlowNetwork",
    "Network",
    "Route",
    "TransferResult",
    "make_network",
    "network_model",
    "simulate_transfers",
    "solve_maxmin",
]
