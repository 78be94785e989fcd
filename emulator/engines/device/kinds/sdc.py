"""sdc: silent data corruption of a region (or offset/size): reads of it succeed with bits flipped
(`mask`, memory.py Corruption), and the device neither refuses nor counts them, as bit flips past
ECC go unnoticed. Only end-to-end checksums find it: EMS checks every copy it reads against the
CRC-32 it kept at put, reads another replica and drops the bad one (emulator/engines/ems/reads.py).
Clearing it (the part replaced) makes reads right again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind, fault_range
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, POSITIVE, invalid, param

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass(frozen=True, kw_only=True)
class SdcParams:
    region: int = param(
        0, "corrupt this region id (see ListRegions); 0: use offset/size", AT_LEAST_ZERO
    )
    offset: int = param(0, "first corrupted byte (UB address at the device)", AT_LEAST_ZERO)
    size: int = param(0, "corrupted bytes from offset", AT_LEAST_ZERO)
    mask: int = param(1, "bits flipped in every corrupted byte a read returns, 1 to 255", POSITIVE)

    def check(self) -> None:
        if (self.region == 0) == (self.size == 0):
            raise invalid("sdc", "region", "or size (with offset) is required, not both")
        if self.mask > 0xFF:
            raise invalid("sdc", "mask", f"is one byte's bits: 1 to 255, got {self.mask}")


@dataclass(frozen=True)
class Sdc:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        start, end = fault_range(engine, fault.params)
        fault.params = SdcParams(offset=start, size=end - start, mask=fault.params.mask)
        engine.effects.corruption.add(start, end)
        engine.effects.corruption.mask = fault.params.mask

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        engine.effects.corruption.clear()


KIND = Kind(
    name="sdc",
    help="silent data corruption: a region's reads succeed with flipped bits; only checksums "
    "(EMS's CRCs) find it",
    params=SdcParams,
    effect=Sdc(),
)
