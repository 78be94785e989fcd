"""How late this process's event loop runs, and the fastest rate of emulated time it can keep.

`Governor` measures the loop's lateness with a tick every `tick_s`. In the process that owns
time it keeps the clock's horizon just ahead of the wall clock, so a stall of the loop is cut
out of emulated time instead of showing up, when the loop wakes, as heartbeats missed and
deadlines passed (time dilation); everywhere it works out the fastest rate at which this loop's
lateness stays within `lag_budget_s` of emulated time, and wishes it (emulator/engines/clock.py:
the authority takes the slowest wish of every process). A follower whose loop idled through its
last window (little CPU, lateness within what the asked rate allows) ticks every `idle_tick_s`
instead: the 100 Hz tick was most of an idle device process's CPU, and a loop with nothing to
run has no stall to miss between two ticks (the window's CPU shows any work, which brings the
fine tick back for the next window).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.emulatorprofile import ClockProfile

if TYPE_CHECKING:
    from cmemu.emulator.engines.clock import Timeline

log = structlog.get_logger("cmemu.clock")


@dataclass
class LagWindow:
    """The lateness of this loop's ticks over the last window, in wall seconds, each with the
    number of fine ticks (tick_s) it stands for: the quantile drops a lone spike (a stall, a
    paused container's resume) among a window of ticks on time, and a slow tick back on time
    stands for the fine ticks it spans, so that an idle follower drops it alike (with five
    slow ticks unweighted, the 0.9 quantile was their maximum: every spike was the wish)."""

    lags: list[tuple[float, int]] = field(default_factory=list)

    def add(self, lag_s: float, weight: int = 1) -> None:
        self.lags.append((max(0.0, lag_s), weight))

    def quantile(self, q: float) -> float:
        if not self.lags:
            return 0.0
        ordered = sorted(self.lags)
        rank = int(q * sum(weight for _, weight in ordered))
        seen = 0
        for lag, weight in ordered:
            seen += weight
            if seen > rank:
                return lag
        return ordered[-1][0]


def fastest_rate(profile: ClockProfile, lag_s: float, asked: float) -> float:
    """The fastest rate at which a loop late by `lag_s` wall seconds stays within the lag
    budget in emulated time, and never slower than `min_rate` nor faster than asked."""
    rate = profile.lag_budget_s / max(lag_s, profile.lag_floor_s)
    return max(min(rate, asked), min(profile.min_rate, asked))


class Governor:
    """This loop's lateness, measured every tick; the rate it can keep, every window."""

    def __init__(
        self,
        clock: Clock,
        timeline: Timeline,
        *,
        profile: ClockProfile,
        owner: bool,
        wish: Callable[[float, float], None],
    ) -> None:
        self.clock = clock
        self.timeline = timeline
        self.profile = profile
        self.owner = owner  # this process owns time: it moves the horizon and cuts stalls
        self.wish = wish  # (rate this loop can keep, its lateness): to the authority
        self.window = LagWindow()
        self.last_lag_s = 0.0
        self.worst_lag_s = 0.0  # wall seconds, since start
        self.ticking_s = profile.tick_s  # the tick of this window (idle_tick_s: an idle follower)

    def hold(self) -> None:
        """Move the horizon just ahead of now (the owner, at each tick and at start)."""
        if self.owner and self.profile.dilation:
            self.clock.hold_until(self.clock.wall() + self.profile.horizon_s)

    async def run(self) -> None:
        p = self.profile
        loop = asyncio.get_running_loop()
        self.hold()
        while True:
            # a window is wall time, not a count of ticks: on a loop late by 50 ms a tick, 50
            # ticks would take 3 s, and a wish that rare goes stale (the process "silent")
            began, cpu_began = loop.time(), time.process_time()
            ends = began + p.window_s
            tick = self.ticking_s
            while loop.time() < ends:
                before = loop.time()
                await asyncio.sleep(tick)
                lag = loop.time() - before - tick
                self.last_lag_s = lag
                self.worst_lag_s = max(self.worst_lag_s, lag)
                if self.owner and p.dilation:
                    cut = self.clock.resume(self.clock.wall() + p.horizon_s)
                    if cut:
                        log.info("stall cut out of emulated time", wall_s=round(cut, 3))
                        self.timeline.changed()
                        # emulated time never saw the part cut out: only what ran before the
                        # horizon held it is lateness a deadline could read. Counted whole, one
                        # stall (the boot's second, a collective's solve) slowed time to a
                        # tenth for the 5 s the rate takes to climb back by raise_factor
                        lag -= cut
                # back within a fine tick: on time, for each fine tick it spans; later: one
                # late tick, as it would be among fine ones
                self.window.add(lag, round(tick / p.tick_s) if lag <= p.tick_s else 1)
            lag_s = self.window.quantile(p.lag_quantile)
            self.window = LagWindow()
            rate = fastest_rate(p, lag_s, self.clock.time_scale) if p.dilation else math.inf
            cpu_share = (time.process_time() - cpu_began) / max(loop.time() - began, p.tick_s)
            self.ticking_s = self.next_tick(rate, cpu_share)
            self.wish(rate, lag_s)

    def next_tick(self, rate: float, cpu_share: float) -> float:
        """The tick of the next window. The owner always ticks finely: its tick moves the
        horizon. A follower idles (idle_tick_s) only after a window in which its loop kept the
        asked rate and spent at most idle_cpu_share of a core: any work it takes on shows as
        CPU within one window, and brings the fine tick back before its stalls could add up."""
        p = self.profile
        idle = cpu_share <= p.idle_cpu_share and rate >= self.clock.time_scale
        return p.idle_tick_s if idle and not self.owner else p.tick_s
