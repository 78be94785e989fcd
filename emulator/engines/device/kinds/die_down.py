"""die-down: one NPU die fails: kernels on it and UB accesses to its HBM half are UNAVAILABLE
(DIE_DOWN), its health name "<npu>.d<die>" turns NOT_SERVING while the NPU's server stays
SERVING (degraded); the collectives the die is a rank of fail (rank-down of the die)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import (
    ActiveFault,
    Kind,
    clear_rank_fault,
    rank_fault,
)
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, param
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass(frozen=True, kw_only=True)
class DieDownParams:
    die: int = param(0, "the NPU die that fails (0 or 1)", AT_LEAST_ZERO)


@dataclass(frozen=True)
class DieDown:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        die = fault.params.die
        if die >= engine.dies.count:
            raise InvalidArgumentError(
                f"die-down: {engine.device.id} has dies 0 to {engine.dies.count - 1}, not {die}",
                field="params.die",
                subject=engine.device.id,
                reason="INVALID_FAULT_PARAM",
            )
        await rank_fault(engine, fault, "rank-down", die=die)
        engine.effects.dies_down.add(die)
        await _die_health(engine, die, serving=False)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        die = fault.params.die
        engine.effects.dies_down.discard(die)
        await clear_rank_fault(fault, engine)
        await _die_health(engine, die, serving=True)


async def _die_health(engine: DeviceEngine, die: int, *, serving: bool) -> None:
    from cmemu.emulator.engines.device.engine import die_name

    up = serving and not engine.fault.faulted
    name = die_name(engine.device.id, die)
    if engine.server is not None:
        await engine.server.set_part(name, up)
    engine.publish("health", service=name, status="SERVING" if up else "NOT_SERVING")


KIND = Kind(
    name="die-down",
    help="one die of an NPU fails; the NPU serves degraded",
    params=DieDownParams,
    effect=DieDown(),
    on=frozenset({DeviceKind.NPU}),
    target="an NPU id",
)
