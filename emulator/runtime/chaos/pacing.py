"""A chaos run's pace: held to the scenario's time scale, and measured from the fabric's clock.

A scenario may ask for a slower time scale than the emulator runs at (its steps then have the
wall time they need); the set-up runs at the emulator's own. What the run achieved is read from
the fabric's clock at the scenario's start and at its end, so that a verdict reached on a host
that could not keep pace says so (model/chaos/pace.py judges it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.fabric import FabricClient
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.model.chaos.observed import Injection
from cmemu.emulator.model.chaos.pace import Pace, PaceWindow
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.services.rpc import status_line

PACE_SETTLE_WALL_S = 10.0  # how long the fabric may take to apply a scenario's pace
CLOCK_WALL_S = 10.0  # a GetClock's deadline


async def hold_pace(
    keeper: TimeKeeper, pace_scale: float | None, note: Callable[[str], None]
) -> None:
    """Hold emulated time to the scenario's pace from here on (the set-up ran at the
    emulator's own scale), and wait until the fabric applied it: the first fault and the
    first request must see that pace, not the set-up's."""
    clock = keeper.timeline
    if pace_scale is None or pace_scale >= clock.time_scale:
        return
    keeper.limit(pace_scale)
    settle = time.monotonic() + PACE_SETTLE_WALL_S
    while clock.clock.rate > pace_scale * (1 + 1e-9):
        if time.monotonic() > settle:
            note(
                f"time scale {pace_scale:g} asked by the scenario was not applied "
                f"within {PACE_SETTLE_WALL_S:g} s (rate {clock.clock.rate:g}): the "
                "emulator's clock may not dilate (dilation off)"
            )
            return
        await asyncio.sleep(0.02)


async def pace_window(clients: Clients, note: Callable[[str], None]) -> PaceWindow | None:
    """The fabric's clock at the scenario's start (None, noted, when it does not answer)."""
    try:
        info = await FabricClient(clients).clock(deadline_s=CLOCK_WALL_S)
    except EmulatorError as exc:
        note(f"the fabric's clock: {status_line(exc)}")
        return None
    return PaceWindow(
        start_emulated_s=info.emulated_ns / 1e9,
        start_wall_s=time.time(),
        start_worst_lag_emulated_s=info.worst_lag_emulated_s,
        start_silent=set(info.silent),
    )


async def achieved_pace(
    clients: Clients,
    window: PaceWindow | None,
    *,
    pace_scale: float | None,
    injections: Iterable[Injection],
    note: Callable[[str], None],
) -> Pace | None:
    """How this run kept pace, from the fabric's clock at its start and now."""
    if window is None:
        return None
    try:
        info = await FabricClient(clients).clock(deadline_s=CLOCK_WALL_S)
    except EmulatorError as exc:
        note(f"the fabric's clock: {status_line(exc)}")
        return None
    wall = max(time.time() - window.start_wall_s, 1e-9)
    stopped_by_us = {i.target for i in injections if i.kind.startswith("process")}
    silent = set(info.silent) - window.start_silent - stopped_by_us
    return Pace(
        asked_scale=min(info.time_scale, pace_scale or math.inf),
        achieved_scale=(info.emulated_ns / 1e9 - window.start_emulated_s) / wall,
        dilation=info.dilation,
        longest_stall_s=info.longest_stall_s,
        worst_lag_emulated_s=info.worst_lag_emulated_s
        if info.worst_lag_emulated_s > window.start_worst_lag_emulated_s
        else 0.0,
        silent=tuple(sorted(silent)),
        lag_bound_s=DEFAULT_PROFILE.manager.heartbeat_interval_s,
    )
