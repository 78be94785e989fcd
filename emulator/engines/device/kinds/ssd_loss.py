"""ssd-loss: the drives of EMS's SSD tier fail. What only the SSD held (objects EMS had demoted
there from its DRAM pools) is gone: a get finds no such key (NOT_FOUND), the objects still in
the pools are untouched, and until the fault clears (new, empty drives: emulator/engines/ems
EmsState.lose_ssd) an eviction drops the object instead of demoting it. The device carries it
for the EMS hosted in its process (service_down.py's ServiceControl); the client's kind of this
name targets the EMS service and picks the carrier (emulator/client/faultkinds/ssd_loss.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind
from cmemu.emulator.engines.device.kinds.service_down import control_of
from cmemu.emulator.model.faults.params import NoParams

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "ssd-loss"


@dataclass(frozen=True)
class SsdLoss:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await control_of(engine, "ems").ssd(lost=True)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        control = engine.faults.siblings.services
        if control is not None:
            await control.ssd(lost=False)


KIND = Kind(
    name=NAME,
    help="EMS's SSD tier fails: the objects only it held are gone, evictions drop until "
    "cleared (new drives; in process)",
    params=NoParams,
    effect=SsdLoss(),
    target="the EMS service (ems; sn1-ems in supernode 1)",
    one_device=False,
)
