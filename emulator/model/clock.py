"""Emulated time: a piecewise-linear function of wall time that never outruns the emulator.

`time_scale` (emulated seconds per wall second) is what the user asked for, a ceiling: the clock
runs at `rate` <= time_scale, and slower when any part of the emulator cannot keep up (time
dilation, as time-warped network emulators do). Each change of rate starts a new `Segment`
continuing from the emulated instant reached, so emulated time is continuous and never goes
back. A `horizon` (a wall instant) caps every reading: the process that owns time moves it
forward while its event loop keeps turning, so a loop that stalls (a busy host, a GC pause)
sees time stand still at the horizon instead of jumping when it wakes; the stall is cut out of
emulated time.

Every process of one emulator reads the same segments: in one process there is one clock; across
processes the fabric owns the epoch, the rate and the horizon, and streams its segments to the
others (emulator/engines/clock.py). Heartbeats, timeouts and recovery deadlines are read from
this clock, which is how a 10-minute recovery can be proven in seconds of wall time, on a quiet
laptop or a busy one alike.

This module is pure arithmetic; the loops that measure lag and move the rate are in
emulator/engines/clock.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError

NEVER = math.inf


@dataclass(frozen=True, kw_only=True)
class Segment:
    """From wall instant `wall_s` on, emulated time runs at `rate` from `emulated_ns`."""

    wall_s: float
    emulated_ns: int
    rate: float

    def at(self, wall_s: float) -> int:
        return self.emulated_ns + round(max(0.0, wall_s - self.wall_s) * self.rate * 1e9)


def check_scale(time_scale: float) -> float:
    if not time_scale > 0 or not math.isfinite(time_scale):
        raise InvalidArgumentError(f"time_scale must be > 0 and finite, got {time_scale}")
    return time_scale


class Clock:
    """Emulated time of one emulator, as this process reads it.

    Readings are monotonic: a segment adopted from elsewhere that would read earlier than what
    this process has already read is held at that reading until it catches up."""

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        epoch_wall_s: float | None = None,
        wall: Callable[[], float] = time.time,  # injected so that tests are deterministic
    ) -> None:
        self.time_scale = check_scale(time_scale)
        self.wall = wall
        self.epoch_wall_s = wall() if epoch_wall_s is None else epoch_wall_s
        self.segment = Segment(wall_s=self.epoch_wall_s, emulated_ns=0, rate=self.time_scale)
        self.horizon_wall_s = NEVER  # no reading passes this wall instant
        self.floor_ns = 0  # no reading is below this (a follower's adopted segment)
        self.version = 0  # bumped on every change: sleepers re-plan their wall wait
        self.stalled_wall_s = 0.0  # wall seconds cut out of emulated time, in all
        self.longest_stall_wall_s = 0.0

    # --- reading -------------------------------------------------------------------------------

    def now_ns(self) -> int:
        """Emulated nanoseconds since the epoch (Segment.at inlined: every UB transaction reads
        the clock about five times, an EMS put ten; comparisons, not min/max calls, which
        cost a third of a reading)."""
        s = self.segment
        wall_s = self.wall()
        if wall_s > self.horizon_wall_s:  # noqa: PLR1730 (not min(): a call per reading)
            wall_s = self.horizon_wall_s
        elapsed = wall_s - s.wall_s
        at = s.emulated_ns + round(elapsed * s.rate * 1e9) if elapsed > 0.0 else s.emulated_ns
        floor = self.floor_ns
        return at if at >= floor else floor

    def now_s(self) -> float:
        return self.now_ns() / 1e9

    @property
    def rate(self) -> float:
        """Emulated seconds per wall second now (<= time_scale)."""
        return self.segment.rate

    def wall_at(self, emulated_ns: int) -> float:
        """The wall instant at which emulated time is expected to reach `emulated_ns` at the
        present rate: a prediction, which a rate change or a stall moves later (a sleeper
        checks `now_ns` when it wakes, engines/clock.py)."""
        s = self.segment
        start_ns = max(s.emulated_ns, self.floor_ns)
        start_wall = s.wall_s + (start_ns - s.emulated_ns) / 1e9 / s.rate
        return start_wall + max(0, emulated_ns - start_ns) / 1e9 / s.rate

    def emulated_delay_s(self, wall_s: float) -> float:
        """The emulated seconds that pass in `wall_s` wall seconds at the present rate."""
        return wall_s * self.rate

    def wall_delay_s(self, emulated_s: float) -> float:
        """Wall seconds that `emulated_s` of emulated time take at the present rate."""
        return emulated_s / self.rate

    def achieved_scale(self) -> float:
        """Emulated seconds per wall second since the epoch: what the run really achieved."""
        wall = self.wall() - self.epoch_wall_s
        return self.now_ns() / 1e9 / wall if wall > 0 else self.rate

    # --- moving it (the process that owns time, or the follower of it) ------------------------

    def set_rate(self, rate: float) -> None:
        """Run at `rate` from now on (at most time_scale), continuing from the present reading."""
        rate = min(check_scale(rate), self.time_scale)
        if rate == self.segment.rate:
            return
        now_wall = min(self.wall(), self.horizon_wall_s)
        self.segment = Segment(wall_s=now_wall, emulated_ns=self.now_ns(), rate=rate)
        self.version += 1

    def hold_until(self, horizon_wall_s: float) -> None:
        """No reading passes `horizon_wall_s` until the horizon moves again."""
        self.horizon_wall_s = horizon_wall_s

    def resume(self, horizon_wall_s: float) -> float:
        """Time stood still at the horizon while the owner could not move it (a stall): cut the
        stall out of emulated time (a new segment from now, at the emulated instant where time
        stood) and move the horizon on. Returns the wall seconds cut (0 when none)."""
        wall = self.wall()
        stall = wall - self.horizon_wall_s
        if stall <= 0:
            self.horizon_wall_s = horizon_wall_s
            return 0.0
        held = self.now_ns()
        self.segment = Segment(wall_s=wall, emulated_ns=held, rate=self.segment.rate)
        self.horizon_wall_s = horizon_wall_s
        self.stalled_wall_s += stall
        self.longest_stall_wall_s = max(self.longest_stall_wall_s, stall)
        self.version += 1
        return stall

    def adopt(self, segment: Segment, horizon_wall_s: float) -> None:
        """Follow the segment and horizon of the process that owns time. A segment that would
        read earlier than this process already has is held at that reading (never backwards)."""
        before = self.now_ns()
        self.segment = segment
        self.horizon_wall_s = horizon_wall_s
        self.floor_ns = max(self.floor_ns, before)
        self.version += 1


@dataclass(frozen=True, kw_only=True)
class Skew:
    """A process's clock reading wrong (the clock-skew fault): from the instant `since_ns` of
    true emulated time it reads `offset_ns` off (a step: positive ahead, negative behind) and
    runs `drift_ppm` parts per million fast (positive) or slow (negative) from there on.

    Readings and instants convert both ways: what a process with this clock reads at a true
    instant (`read`), and the true instant at which it reads a given value (`true_of`), which is
    when a sleeper of that process wakes."""

    offset_ns: int
    drift_ppm: float
    since_ns: int

    @property
    def factor(self) -> float:
        """Skewed seconds per true second (> 0: the drift bound keeps it so)."""
        return 1.0 + self.drift_ppm / 1e6

    def read(self, true_ns: int) -> int:
        """What the skewed clock reads at the true instant `true_ns`."""
        return true_ns + self.offset_ns + round((true_ns - self.since_ns) * self.drift_ppm / 1e6)

    def true_of(self, skewed_ns: int) -> int:
        """The first true instant at which the skewed clock reads `skewed_ns` or later."""
        true = self.since_ns + math.ceil((skewed_ns - self.offset_ns - self.since_ns) / self.factor)
        while self.read(true) < skewed_ns:  # float rounding: a step or two either way
            true += 1
        while self.read(true - 1) >= skewed_ns:
            true -= 1
        return true
