"""intermittent-hang: the device hangs (accepts calls, answers none, health included) for `hang_s`
at the start of every `period_s`, counted from the injection in emulated time, and answers again
by itself in between, until the fault clears, as a real one stalled by a firmware or driver
hiccup does. The device's process runs the windows (a task per fault); a hung NPU holds the
collectives it is a rank of."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind
from cmemu.emulator.engines.device.kinds.hang import HANG
from cmemu.emulator.model.faults.params import POSITIVE, invalid, param
from cmemu.emulator.model.hardware import DEFAULT_PROFILE

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass(frozen=True, kw_only=True)
class IntermittentHangParams:
    period_s: float = param(60.0, "emulated seconds from one hang to the next", POSITIVE)
    hang_s: float = param(5.0, "emulated seconds each hang lasts, less than period_s", POSITIVE)

    def check(self) -> None:
        shortest = DEFAULT_PROFILE.limits.fault_window_min_s
        if self.hang_s < shortest:
            raise invalid("intermittent-hang", "hang_s", f"must be at least {shortest:g} s")
        if self.period_s - self.hang_s < shortest:
            raise invalid(
                "intermittent-hang",
                "hang_s",
                f"must be below period_s by at least {shortest:g} s (else it is a hang)",
            )


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
    """Hung windows on the emulated clock, run by a task of the device's process."""

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


KIND = Kind(
    name="intermittent-hang",
    help="the device hangs for hang_s every period_s and recovers by itself, until cleared",
    params=IntermittentHangParams,
    effect=IntermittentHang(),
)
