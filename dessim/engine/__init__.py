"""The replay engine: task graphs on topologies, event by event, with a device model."""

from dessim.engine.device import DeviceModel, RankDevices
from dessim.engine.engine import EngineOptions, simulate
from dessim.engine.result import SPAN_COLUMNS, RankTimes, SimulationResult

__all__ = ["DeviceModel", "RankDevices", "EngineOptions", "simulate", "SimulationResult",
           "RankTimes", "SPAN_COLUMNS"]
