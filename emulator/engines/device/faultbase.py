"""What every device fault kind shares: the kind record, the active-fault record, the Effect
contract, how an NPU's fault reaches the collectives it is a rank of, and the memory helpers of
the kinds that touch memory (a reset's wipe, the bytes a region or offset/size names). The kinds
themselves are one module each under kinds/, registered in kinds/__init__.py KINDS; faults.py
runs them (inject, expire, clear, list)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from cmemu.emulator.model.errors import EmulatorError, NotFoundError, OutOfRangeError
from cmemu.emulator.model.faults.fabric import FaultSpec
from cmemu.emulator.model.faults.fabric.rank_slow import RankSlowParams
from cmemu.emulator.model.faults.params import NoParams, params_text
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

log = structlog.get_logger("cmemu.faults")

ALL = frozenset(DeviceKind)
NO_PARAMS = NoParams()


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

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None: ...

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One device fault kind, as its module declares it: its name, typed parameters (a frozen
    dataclass checked by emulator/model/faults/params.py; on the wire the message of the same
    name in FaultState's `oneof params`), help, the device kinds it applies to and its effect.
    The client's record of the kind is made from this one (emulator/client/faultkinds)."""

    name: str
    help: str
    params: type[Any]
    effect: Effect
    on: frozenset[DeviceKind] = ALL
    target: str = "a device id"  # what a user's TARGET names (`cmemu fault kinds`)
    crash: bool = False  # its server is gone while it lasts: injected and cleared via a sibling
    # a user adds it by this name to one device, the client's kind being this record; False: the
    # client's kind of this name acts otherwise (a node's NPUs, every process), or none has it
    one_device: bool = True


async def rank_fault(
    engine: DeviceEngine,
    fault: ActiveFault,
    kind: str,
    *,
    die: int | None = None,
    params: NoParams | RankSlowParams = NO_PARAMS,
) -> None:
    """Carry a fault of an NPU to the collectives it is a rank of (the data path): the fabric
    fails, holds or slows them (emulator/model/faults/fabric/ rank_down, rank_hung, rank_slow;
    `params` the kind's: rank-slow's RankSlowParams). A fabric that cannot be told leaves the
    device's own effect in place, logged."""
    if not engine.dies.count:
        return  # no kernels, no collective ranks
    target = engine.device.id if die is None else f"{engine.device.id}.d{die}"
    try:
        stored = await engine.peers.fabric().link_fault(
            FaultSpec(kind=kind, target=target, params=params)
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


def wipe(engine: DeviceEngine) -> None:
    """A reset: regions, contents and poison gone."""
    memory = engine.memory
    for region in memory.allocator.regions():
        memory.free(region.region_id)
    engine.effects.poison.clear()


def fault_range(engine: DeviceEngine, params: Any) -> tuple[int, int]:
    """The bytes an hbm-ecc or sdc fault names (`params` with region, offset and size): a
    region's, or offset/size."""
    if params.region:
        for region in engine.memory.allocator.regions():
            if region.region_id == params.region:
                return region.offset, region.end
        raise NotFoundError(
            f"{engine.device.id} has no region {params.region}",
            field="params.region",
            subject=str(params.region),
            reason="REGION_NOT_FOUND",
        )
    end = params.offset + params.size
    if end > engine.memory.capacity:
        raise OutOfRangeError(
            f"[{params.offset}, {end}) is outside {engine.device.id}'s"
            f" {engine.memory.capacity} bytes",
            field="params.offset",
            subject=engine.device.id,
        )
    return params.offset, end
