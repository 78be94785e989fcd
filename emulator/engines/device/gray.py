"""The device faults that leave a device alive but degraded (gray failures), one effect each:

- hang: every call is accepted and never answered, the health Check included; calls in flight
  proceed when it clears.
- slow: kernels take 1/compute as long; with link < 1 the fabric degrades the device's UB ports
  (fabric kind `ports-degraded`), cleared with it.
- thermal-throttle: an NPU of a throttled node computes at `compute` of its speed (the slow
  effect, without the ports); the client's kind sets it on every NPU of the node at once.
- intermittent-hang: the device hangs for hang_s at the start of every period_s (emulated,
  counted from the injection) and answers again by itself, until cleared.

Slowdowns compound: a device both slowed and throttled computes at the product of the shares.
A hang's hold on answers is released only when no other active fault holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmemu.emulator.engines.device.faultbase import ALL, ActiveFault, clear_rank_fault, rank_fault
from cmemu.emulator.model.errors import EmulatorError, PreconditionError
from cmemu.emulator.model.faults.catalogue import IntermittentHangParams
from cmemu.emulator.model.linkfaults import FaultSpec
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

COMPUTE_KINDS = ("slow", "thermal-throttle")  # their params' `compute` is a share of kernel speed


def _refresh_share(engine: DeviceEngine) -> None:
    engine.effects.compute_share = math.prod(
        getattr(f.params, "compute", 1.0)
        for f in engine.faults.active.values()
        if f.kind in COMPUTE_KINDS
    )


@dataclass(frozen=True)
class Hang:
    on: frozenset[DeviceKind] = ALL

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


@dataclass(frozen=True)
class Slow:
    on: frozenset[DeviceKind] = ALL

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
                FaultSpec(kind="ports-degraded", target=engine.device.id, factor=link)
            )
            fault.fabric_fault = stored.id
        if compute < 1:
            await rank_fault(engine, fault, "rank-slow", share=compute)
        _refresh_share(engine)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        _refresh_share(engine)
        await clear_rank_fault(fault, engine)
        if fault.fabric_fault:
            with contextlib.suppress(EmulatorError):  # the fabric may have cleared it already
                await engine.peers.fabric().clear_fault(fault.fabric_fault)


async def _whole(step: Coroutine[Any, Any, None]) -> None:
    """Run a window's step to its end even when the fault is cleared meanwhile: a rank fault
    half-set at the fabric (its id not yet recorded) would outlive the fault."""
    inner = asyncio.ensure_future(step)
    try:
        await asyncio.shield(inner)
    except asyncio.CancelledError:
        await inner
        raise


@dataclass(frozen=True)
class IntermittentHang:
    """Hung windows on the emulated clock, run by a task of the device's process: the device
    recovers by itself at each window's end, as a real one stalled by a firmware or driver
    hiccup does, and hangs again a period later."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await HANG.apply(engine, fault)  # the first window opens with the injection
        fault.cycle = asyncio.get_running_loop().create_task(
            self._cycle(engine, fault), name=f"{engine.device.id}-intermittent-hang"
        )

    async def _cycle(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        """Bring the device to the window it is in now, sleep to the window's end, repeat.
        From the clock, never by counting windows: a host that falls behind skips the windows
        it missed instead of replaying them."""
        params: IntermittentHangParams = fault.params
        period_ns, hang_ns = round(params.period_s * 1e9), round(params.hang_s * 1e9)
        while True:
            elapsed = engine.clock.now_ns() - fault.since_ns
            start = fault.since_ns + elapsed - elapsed % period_ns
            hung = elapsed % period_ns < hang_ns
            if hung != fault.holds_answers:
                await _whole((HANG.apply if hung else HANG.undo)(engine, fault))
                engine.publish("hang-window", hung=hung)
            await engine.clock.sleep_until(start + (hang_ns if hung else period_ns))

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        task, fault.cycle = fault.cycle, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await HANG.undo(engine, fault)
