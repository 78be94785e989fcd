"""slow: alive but degraded (a gray failure). Kernels take 1/compute as long; with link < 1 the
fabric degrades the device's UB ports (fabric kind `ports-degraded`), cleared with it. An NPU's
compute slowdown slows the collectives it is a rank of (rank-slow at the fabric). Slowdowns
compound: a device both slowed and throttled computes at the product of the shares."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import (
    ActiveFault,
    Kind,
    clear_rank_fault,
    rank_fault,
)
from cmemu.emulator.model.errors import EmulatorError, PreconditionError
from cmemu.emulator.model.faults.fabric import FaultSpec, ports_degraded, rank_slow
from cmemu.emulator.model.faults.fabric.ports_degraded import PortsDegradedParams
from cmemu.emulator.model.faults.fabric.rank_slow import RankSlowParams
from cmemu.emulator.model.faults.params import SHARE, invalid, param

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

COMPUTE_KINDS = ("slow", "thermal-throttle")  # their params' `compute` is a share of kernel speed


@dataclass(frozen=True, kw_only=True)
class SlowParams:
    compute: float = param(0.5, "share of kernel throughput left, in (0, 1]", SHARE)
    link: float = param(1.0, "share of its ports' bandwidth left, in (0, 1]", SHARE)

    def check(self) -> None:
        if self.compute == 1.0 and self.link == 1.0:
            raise invalid("slow", "compute", "or link must be below 1 (nothing would slow)")


def _refresh_share(engine: DeviceEngine) -> None:
    engine.effects.compute_share = math.prod(
        getattr(f.params, "compute", 1.0)
        for f in engine.faults.active.values()
        if f.kind in COMPUTE_KINDS
    )


@dataclass(frozen=True)
class Slow:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        compute: float = fault.params.compute
        link: float = getattr(fault.params, "link", 1.0)
        if compute < 1 and not engine.dies.count:
            raise PreconditionError(
                f"{engine.device.id} runs no kernels: slow it with link=, not compute=",
                field="params.compute",
                subject=engine.device.id,
                reason="WRONG_DEVICE_KIND",
            )
        if link < 1:
            stored = await engine.peers.fabric().link_fault(
                FaultSpec(
                    kind=ports_degraded.NAME,
                    target=engine.device.id,
                    params=PortsDegradedParams(factor=link),
                )
            )
            fault.fabric_fault = stored.id
        if compute < 1:
            await rank_fault(engine, fault, rank_slow.NAME, params=RankSlowParams(factor=compute))
        _refresh_share(engine)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        _refresh_share(engine)
        await clear_rank_fault(fault, engine)
        if fault.fabric_fault:
            with contextlib.suppress(EmulatorError):  # the fabric may have cleared it already
                await engine.peers.fabric().clear_fault(fault.fabric_fault)


KIND = Kind(
    name="slow",
    help="kernels and/or the device's UB ports run at a share",
    params=SlowParams,
    effect=Slow(),
)
