"""hang: the device accepts every call and answers none, its health Check included, until the
fault clears (a heartbeat's deadline finds it); calls in flight proceed when it clears. The fault
methods of the Device service still answer a hung device (a BMC). A hung NPU holds the
collectives it is a rank of (rank-hung at the fabric). A hang's hold on answers is released only
when no other active fault holds it (intermittent-hang's window)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import (
    ActiveFault,
    Kind,
    clear_rank_fault,
    rank_fault,
)
from cmemu.emulator.model.faults.params import NoParams

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass(frozen=True)
class Hang:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        fault.holds_answers = True
        engine.effects.answering.clear()
        await rank_fault(engine, fault, "rank-hung")

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        fault.holds_answers = False
        if not any(f.holds_answers for f in engine.faults.active.values()):
            engine.effects.answering.set()
        await clear_rank_fault(fault, engine)


HANG = Hang()

KIND = Kind(
    name="hang",
    help="the device accepts calls and never answers (health too)",
    params=NoParams,
    effect=HANG,
)
