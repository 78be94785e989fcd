"""Scheduled and repeated experiments (issue 20 item 6), as Chaos Mesh's Schedule runs one: the
same scenario `repeat` times against the running emulator, run i with the seed + i (its steps'
jitter, its random targets and its traffic differ), each starting `every_s` of emulated time after
the one before started. Never two at once (Chaos Mesh's concurrencyPolicy Forbid): a run that
lasts longer than `every_s` delays the next, which starts as soon as it ends and says how late.
Without `every_s` the runs follow one another at once.

Every run is a whole run (its workloads started and stopped, its own verdict), so a schedule
fails when any run fails: a fault that recovers in most runs and not in one is found here, where
a single run would pass by luck.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.fabric import FabricClient
from cmemu.emulator.model.chaos.pace import ABORTED
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.timeline import Entry
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario

CLOCK_WALL_S = 10.0  # a clock read's deadline
POLL_WALL_S = 0.5  # at most this long between two clock reads while waiting for a run's instant


@dataclass(frozen=True, kw_only=True)
class ScheduledRun:
    index: int  # from 0
    seed: int
    planned_s: float  # emulated: when the schedule said it starts
    started_s: float  # emulated: when it started (later when the run before lasted longer)
    late_s: float  # emulated: how late the run before made it (0: it waited for its instant)
    result: RunResult


@dataclass(frozen=True, kw_only=True)
class Schedule:
    repeat: int = 1
    every_s: float | None = None  # emulated seconds from one run's start to the next's

    def check(self) -> None:
        if self.repeat < 1:
            raise InvalidArgumentError(f"repeat must be at least 1, got {self.repeat}",
                                       field="repeat")  # fmt: skip
        if self.every_s is not None and self.every_s <= 0:
            raise InvalidArgumentError(f"every must be positive, got {self.every_s:g} s",
                                       field="every")  # fmt: skip
        if self.every_s is not None and self.repeat == 1:
            raise InvalidArgumentError("every needs repeat of 2 or more (one run has no next)",
                                       field="every")  # fmt: skip


def outcome(runs: list[ScheduledRun]) -> str:
    """ok when every run passed; aborted when none failed but one aborted; else failed."""
    if all(r.result.ok for r in runs):
        return "ok"
    if all(r.result.ok or r.result.outcome == ABORTED for r in runs):
        return ABORTED
    return "failed"


async def emulated_s(clients: Clients) -> tuple[float, float]:
    """The fabric's emulated time and its rate now (emulated seconds per wall second)."""
    info = await FabricClient(clients).clock(deadline_s=CLOCK_WALL_S)
    return info.emulated_ns / 1e9, info.rate


async def _until(clients: Clients, at_s: float) -> tuple[float, float]:
    """Wait until emulated time reaches `at_s`: the time then, and how late it already was
    when asked (0 when it waited: the overshoot of a poll is no lateness)."""
    late_s: float | None = None
    while True:
        now, rate = await emulated_s(clients)
        if late_s is None:
            late_s = max(0.0, now - at_s)
        if now >= at_s:
            return now, late_s
        await asyncio.sleep(min(POLL_WALL_S, (at_s - now) / max(rate, 1e-9)))


async def run_schedule(
    clients: Clients,
    scenario: Scenario,
    options: RunOptions,
    schedule: Schedule,
    *,
    on_entry: Callable[[Entry], None] | None = None,
    on_start: Callable[[int, int, float], None] | None = None,
) -> list[ScheduledRun]:
    """Each run in turn; `on_start(index, seed, late_s)` before each."""
    schedule.check()
    seed = scenario.seed if options.seed is None else options.seed
    runs: list[ScheduledRun] = []
    first_s = (await emulated_s(clients))[0]
    for i in range(schedule.repeat):
        if schedule.every_s:
            planned_s = first_s + i * schedule.every_s
            started_s, late_s = await _until(clients, planned_s)
        else:
            planned_s = started_s = (await emulated_s(clients))[0]
            late_s = 0.0
        if on_start is not None:
            on_start(i, seed + i, late_s)
        result = await run_scenario(
            clients, scenario, dataclasses.replace(options, seed=seed + i), on_entry=on_entry
        )
        runs.append(ScheduledRun(index=i, seed=seed + i, planned_s=planned_s,
                                 started_s=started_s, late_s=late_s, result=result))  # fmt: skip
    return runs
