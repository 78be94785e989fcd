"""hbm-ecc: an uncorrectable ECC error poisons a region (or offset/size): reads and atomics
touching it fail DATA_LOSS (reason HBM_UNCORRECTABLE_ECC) and count in telemetry; a write over
poisoned bytes heals them; clearing the fault scrubs what is left. The device's liveness reports
it (`ecc`) while any byte stays poisoned: the manager takes it out of service (isolate, replace
its jobs) and returns it once repaired."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind, fault_range
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, invalid, param

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass(frozen=True, kw_only=True)
class HbmEccParams:
    region: int = param(
        0, "poison this region id (see ListRegions); 0: use offset/size", AT_LEAST_ZERO
    )
    offset: int = param(0, "first poisoned byte (UB address at the device)", AT_LEAST_ZERO)
    size: int = param(0, "poisoned bytes from offset", AT_LEAST_ZERO)

    def check(self) -> None:
        if (self.region == 0) == (self.size == 0):
            raise invalid("hbm-ecc", "region", "or size (with offset) is required, not both")


@dataclass(frozen=True)
class HbmEcc:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        start, end = fault_range(engine, fault.params)
        fault.params = HbmEccParams(offset=start, size=end - start)  # what stays poisoned
        engine.effects.poison.add(start, end)
        engine.health_moved()  # its process's liveness reports it at once (a RAS event)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        engine.effects.poison.heal(fault.params.offset, fault.params.size)
        engine.health_moved()


KIND = Kind(
    name="hbm-ecc",
    help="a region's bytes are poisoned: reads DATA_LOSS, writes heal; the manager takes the "
    "device out of service until none is left",
    params=HbmEccParams,
    effect=HbmEcc(),
)
