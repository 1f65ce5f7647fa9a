"""The replay engine: task graphs on topologies, event by event, with a device model.

Run options: :class:`EngineOptions` composed of the network model name, the collective
settings, :class:`Noise` and :class:`Shortcuts` (:mod:`dessim.engine.options`). A watcher of
a long run: :func:`watching` (:mod:`dessim.engine.progress`)."""

from dessim.engine.device import DeviceModel, RankDevices
from dessim.engine.engine import simulate
from dessim.engine.options import EngineOptions, Noise, Shortcuts
from dessim.engine.progress import Progress, watching
from dessim.engine.result import SPAN_COLUMNS, RankTimes, SimulationResult

__all__ = ["DeviceModel", "RankDevices", "EngineOptions", "Noise", "Shortcuts", "simulate", "SimulationResult",
           "RankTimes", "SPAN_COLUMNS", "Progress", "watching"]
