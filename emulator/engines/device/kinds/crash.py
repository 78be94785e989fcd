"""crash: the device's server is gone (port closed: UNAVAILABLE, connection refused; in-process
callers get the same UNAVAILABLE, reason PEER_UNREACHABLE) until the fault clears. It comes back
as a new server on the same address, empty of volatile state (inbox, queued kernels) and, with
`wipe` (the default), of its memory too. An NPU's crash fails the collectives it is a rank of
(rank-down at the fabric). Its server being gone, it is injected and cleared through a sibling
of its process (faults.py Siblings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import (
    ActiveFault,
    Kind,
    clear_rank_fault,
    rank_fault,
    wipe,
)
from cmemu.emulator.model.faults.params import param

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "crash"
CRASHES = (NAME, "pool-loss")  # kinds whose device has no server while they last


@dataclass(frozen=True, kw_only=True)
class CrashParams:
    wipe: bool = param(
        True,
        "the restart loses memory contents and regions (a reset reinitialises HBM/DRAM); "
        "false keeps them, as a process restart over persistent memory would",
    )


@dataclass(frozen=True)
class Crash:
    wipe_always: bool = False  # pool-loss: the contents are always lost

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        already = engine.effects.crashed  # a pool lost while its node is powered off
        await rank_fault(engine, fault, "rank-down")
        engine.effects.crashed = True
        engine.bus.drop_volatile()
        engine.dies.drop_queued()
        if self.wipe_always or (isinstance(fault.params, CrashParams) and fault.params.wipe):
            wipe(engine)
        if not already and engine.server is not None:
            await engine.server.set_serving(False)
            engine.publish("health", status="NOT_SERVING")
            await engine.server.stop(deferred=fault.by_itself)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await clear_rank_fault(fault, engine)
        if any(kind in engine.faults.active for kind in CRASHES):
            return  # still down for another reason
        engine.effects.crashed = False
        if engine.server is not None:
            await engine.server.restart()
            await engine.show_health()
        engine.publish("health", status="NOT_SERVING" if engine.fault.faulted else "SERVING")


KIND = Kind(
    name=NAME,
    help="the device's server is gone; it restarts (memory wiped) when cleared",
    params=CrashParams,
    effect=Crash(),
    crash=True,
)
