"""A process's own reading of emulated time, which the clock-skew fault makes wrong.

Emulated time is one function every process of an emulator reads alike (engines/clock.py); a
real host's clock is its own and can be off: stepped (a bad NTP server, a VM restored from a
snapshot) or drifting (an oscillator out of tolerance). `LocalClock` is such a host clock: a
view of the process's `Timeline` that reads the true time plus a `Skew` (model/clock.py), and
whose sleepers wake when the *skewed* reading reaches their instant. Everything a device engine
stamps and keeps (its events and telemetry, its liveness beats, its faults' since/until, its
kernels' and transfers' issue stamps) is read from its LocalClock, so a skew shows everywhere a
real host's wrong clock would, and nowhere else:

- the clock the view reads from is untouched, so the process still follows the authority's
  segments and reports its governor's wish as before (the authority takes rates, never a
  process's reading: a skewed process can neither stall nor speed the supernode);
- a sleeper is re-planned whenever the skew changes: a duration its process keeps as an
  instant to reach (a fault's until_ns) ends early by a step ahead and late by a step behind,
  which is exactly the hazard of a stepped host clock. A sleep begun after the step lasts its
  length (times its drift).

Which engines share one LocalClock is the launcher's choice (runtime/inprocess.py): a process
that follows the authority's clock (procs, compose) shares one among all it hosts; the process
that owns time (in process: the whole emulator) gives each device its own.
"""

from __future__ import annotations

import asyncio

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.clock import Skew


class LocalClock(Timeline):
    """A Timeline-alike that reads `base` plus this host's skew (None: reads it exactly)."""

    def __init__(self, base: Timeline) -> None:
        super().__init__(base.clock)  # its own sleepers' heap stays empty: they sleep on base
        self.base = base
        self.skew: Skew | None = None
        self.now_ns = base.now_ns  # read exactly: the base's own reading, no call between
        self._alarms: set[asyncio.Future[None]] = set()  # its sleepers' wake-ups, on base

    def set_skew(self, skew: Skew | None) -> None:
        """Read wrong by `skew` from now on (None: right again); every sleeper re-plans."""
        self.skew = skew
        self.now_ns = self.base.now_ns if skew is None else self._skewed_ns
        for alarm in self._alarms:
            if not alarm.done():
                alarm.set_result(None)

    def true_ns(self) -> int:
        """The emulator's time, as the unskewed clock reads it."""
        return self.base.now_ns()

    def _skewed_ns(self) -> int:
        true = self.base.now_ns()
        return true if self.skew is None else self.skew.read(true)

    async def sleep_until(self, emulated_ns: int) -> None:
        while self.now_ns() < emulated_ns:
            skew = self.skew
            if skew is None:
                due = emulated_ns
            else:  # at least a nanosecond on: rounding never spins
                due = max(skew.true_of(emulated_ns), self.base.now_ns() + 1)
            alarm = self.base.alarm(due)  # one wake-up on the base's timer, as any sleeper's
            self._alarms.add(alarm)
            try:
                await alarm
            finally:
                self._alarms.discard(alarm)
                if not alarm.done():
                    alarm.cancel()

    async def sleep(self, emulated_s: float) -> None:
        await self.sleep_until(self.now_ns() + round(max(0.0, emulated_s) * 1e9))

    async def pace(self, emulated_s: float) -> None:
        if self.skew is None:
            await self.base.pace(emulated_s)
        else:
            await self.sleep_until(round(emulated_s * 1e9))

    def changed(self) -> None:
        self.base.changed()
