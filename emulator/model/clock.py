"""Emulated time: the wall clock scaled by `time_scale`, identical in every process.

`time_scale` is emulated seconds per wall second. The epoch (a wall-clock instant) and the scale
both come from the topology document, so every process of one emulator computes the same emulated
time without talking to the others. Heartbeats, timeouts and recovery deadlines are read from this
clock, which is how a 10-minute recovery can be proven in seconds of wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from emulator.model.errors import InvalidArgumentError


@dataclass(frozen=True, kw_only=True)
class Clock:
    time_scale: float = 1.0
    epoch_wall_s: float = field(default_factory=time.time)
    wall: Callable[[], float] = time.time  # injected so that tests are deterministic

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise InvalidArgumentError(f"time_scale must be > 0, got {self.time_scale}")

    def now_ns(self) -> int:
        """Emulated nanoseconds since the epoch."""
        return int((self.wall() - self.epoch_wall_s) * self.time_scale * 1e9)

    def wall_at(self, emulated_ns: int) -> float:
        """The wall-clock instant (time.time() scale) at which emulated time reaches emulated_ns."""
        return self.epoch_wall_s + emulated_ns / 1e9 / self.time_scale

    def emulated_delay_s(self, wall_s: float) -> float:
        """The emulated seconds that pass in `wall_s` wall seconds (wall_delay_s's inverse)."""
        return wall_s * self.time_scale

    def wall_delay_s(self, emulated_s: float) -> float:
        """Wall seconds that `emulated_s` of emulated time take: how long periodic work
        (telemetry, health sweeps, polls) sleeps between rounds."""
        return emulated_s / self.time_scale
