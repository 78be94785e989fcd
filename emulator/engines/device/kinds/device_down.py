"""device-down: the device reports NOT_SERVING and refuses UB and compute calls (UNAVAILABLE,
DEVICE_FAULTED); its server stays up. The older fault (SetFaultState) with a duration here; one
set by SetFaultState is listed and cleared as this kind too (faults.py). An NPU's fails the
collectives it is a rank of. Its client fault id is `dev:<device>` (no kind suffix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import (
    ActiveFault,
    Kind,
    clear_rank_fault,
    rank_fault,
)
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.faults.params import param

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "device-down"


@dataclass(frozen=True, kw_only=True)
class DeviceDownParams:
    """device-down's params: the reason the device reports while it is down."""

    reason: str = param("cmemu fault add", "the reason the device reports")


@dataclass(frozen=True)
class DeviceDown:
    """device-down's effect: the device stops answering (NOT_SERVING) until cleared."""

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        if engine.fault.faulted:
            raise PreconditionError(
                f"{engine.device.id} is down already; clear it first",
                field="kind",
                subject=engine.device.id,
                reason="FAULT_ALREADY_ACTIVE",
            )
        await engine.set_fault(True, fault.params.reason, announce=False)
        await rank_fault(engine, fault, "rank-down")

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await clear_rank_fault(fault, engine)
        await engine.set_fault(False, "", announce=False)


KIND = Kind(
    name=NAME,
    help="a device reports NOT_SERVING and refuses UB and compute calls",
    params=DeviceDownParams,
    effect=DeviceDown(),
)
