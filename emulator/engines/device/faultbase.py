"""What every device fault effect shares: the active-fault record, the Effect contract, and how
an NPU's fault reaches the collectives it is a rank of. The effects themselves live in
faults.py (the dead-device kinds, memory) and gray.py (the degraded-but-alive kinds), registered
by name in faults.py's EFFECTS."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.faults.params import params_text
from cmemu.emulator.model.linkfaults import FaultSpec
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

log = structlog.get_logger("cmemu.faults")

ALL = frozenset(DeviceKind)


@dataclass
class ActiveFault:
    """One active fault of one device."""

    kind: str
    params: Any
    since_ns: int
    until_ns: int = 0
    for_s: float = 0.0
    reason: str = ""  # device-down's
    expiry: asyncio.Task[None] | None = None
    fabric_fault: str = ""  # slow: the fabric fault degrading its ports
    rank_fault: str = ""  # the fabric's rank-down/-hung/-slow fault that carries it to collectives
    by_itself: bool = False  # injected through the device's own server (a crash answers first)
    holds_answers: bool = False  # hang, intermittent-hang in its window: the device answers none
    cycle: asyncio.Task[None] | None = None  # intermittent-hang: its windows' timer

    @property
    def params_text(self) -> dict[str, str]:
        return params_text(self.params)


class Effect(Protocol):
    """What one kind does to a device, and how it is undone."""

    @property
    def on(self) -> frozenset[DeviceKind]: ...

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None: ...

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None: ...


async def rank_fault(
    engine: DeviceEngine, fault: ActiveFault, kind: str, *, die: int | None = None, share: float = 0
) -> None:
    """Carry a fault of an NPU to the collectives it is a rank of (the data path): the fabric
    fails, holds or slows them (emulator/model/linkfaults.py RankDown, RankHung, RankSlow).
    A fabric that cannot be told leaves the device's own effect in place, logged."""
    if not engine.dies.count:
        return  # no kernels, no collective ranks
    target = engine.device.id if die is None else f"{engine.device.id}.d{die}"
    try:
        stored = await engine.peers.fabric().link_fault(
            FaultSpec(kind=kind, target=target, factor=share)
        )
    except EmulatorError as exc:
        log.error("the fabric was not told of a rank fault", device=target, error=str(exc))
        return
    fault.rank_fault = stored.id


async def clear_rank_fault(fault: ActiveFault, engine: DeviceEngine) -> None:
    if fault.rank_fault:
        with contextlib.suppress(EmulatorError):  # cleared at the fabric already
            await engine.peers.fabric().clear_fault(fault.rank_fault)
        fault.rank_fault = ""
