"""The liveness of one process's devices: what its node agent would tell a cluster manager.

One stream per process, not a heartbeat call per device: a beat lists every device the process
hosts and which of them answer, at once, on every change (a device down, a crash, a hang, a die
down or back) and every heartbeat interval of emulated time. A beat carries the process's own
emulated time, so a watcher counts a hang only when that much emulated time passed at the
device without it answering; a busy host slows emulated time for all (engines/clock.py) instead
of making healthy devices look silent. A stopped process falls silent as a whole, which is the
watcher's to judge (a fault); a killed one breaks the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.device.engine import DeviceEngine, die_name


@dataclass(frozen=True, kw_only=True)
class Beat:
    """One heartbeat of a process to the manager: what it hosts, what answers and what is down."""

    emulated_ns: int
    process: str
    covers: tuple[str, ...]
    answering: tuple[str, ...]
    unreachable: tuple[str, ...]
    down: tuple[str, ...]
    dies_down: tuple[str, ...]
    interval_s: float
    ecc: tuple[str, ...] = ()  # uncorrectable memory errors: alive, data lost


class Liveness:
    def __init__(
        self,
        engines: Mapping[str, DeviceEngine],
        clock: Timeline,
        *,
        interval_s: float,
        process: str,
    ) -> None:
        self.engines = dict(engines)
        self.clock = clock
        self.interval_s = interval_s
        self.process = process
        self._changed: list[asyncio.Event] = []  # one per watcher
        for engine in self.engines.values():
            engine.on_change = self.changed
            engine.liveness = self

    def changed(self) -> None:
        """A device's health moved: every watcher gets a beat now."""
        for event in self._changed:
            event.set()

    def beat(self) -> Beat:
        answering, unreachable, down, dies_down, ecc = [], [], [], [], []
        for device, engine in self.engines.items():
            effects = engine.effects
            if effects.crashed:
                unreachable.append(device)
                continue
            if effects.answering.is_set():
                answering.append(device)
            if engine.fault.faulted:
                down.append(device)
            dies_down += [die_name(device, d) for d in sorted(effects.dies_down)]
            if effects.poison.ranges:
                ecc.append(device)
        return Beat(
            emulated_ns=self.clock.now_ns(),
            process=self.process,
            covers=tuple(self.engines),
            answering=tuple(answering),
            unreachable=tuple(unreachable),
            down=tuple(down),
            dies_down=tuple(dies_down),
            interval_s=self.interval_s,
            ecc=tuple(ecc),
        )

    async def watch(self) -> AsyncIterator[Beat]:
        """A beat now, then on every change and every interval (of emulated time)."""
        changed = asyncio.Event()
        self._changed.append(changed)
        try:
            while True:
                changed.clear()
                beat = self.beat()
                yield beat
                await self.clock.wait(changed, beat.emulated_ns + round(self.interval_s * 1e9))
        finally:
            self._changed.remove(changed)
