"""Hardware catalog: GPUs (:mod:`.devices`) and link technologies (:mod:`.links`) as data,
each figure with its source. Lowest layer above units/errors; imports nothing from dessim
except :mod:`dessim.errors`."""

from __future__ import annotations

from dessim.catalog.devices import DEVICES, PRECISIONS, GPUSpec, device_names, get_device
from dessim.catalog.links import LINK_TECHS, LINK_TYPES, LinkTech, check_link_type, get_link_tech

__all__ = ["DEVICES", "PRECISIONS", "GPUSpec", "device_names", "get_device",
           "LINK_TECHS", "LINK_TYPES", "LinkTech", "check_link_type", "get_link_tech"]
