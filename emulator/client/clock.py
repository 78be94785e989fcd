"""The emulated time of a running emulator, for a program outside it: a follower of its
fabric's clock (emulator/engines/clock.py), so a chaos runner, a trace replay, `cmemu status`
or a test reads the same "now" as every device, and sleeps in the same dilated time.

    async with followed_time(topology, credentials, name="chaos-runner") as time:
        await time.timeline.sleep(30.0)  # 30 emulated seconds, however the rate moves

With `report` (the default) this program's own event-loop lag is reported too, so that a
runner that cannot keep pace slows the emulator down rather than injecting its faults late.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.client.remote import ClockStream, RemoteFabric
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.emulatorprofile import ClockProfile
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind, Topology

SYNC_WAIT_S = 30.0  # wall: how long the fabric may take to tell its clock


def clock_address(topology: Topology) -> str:
    """The fabric that owns emulated time: sn0's."""
    plane = topology.scaleout
    if plane is not None and topology.index != 0:
        return plane.clock
    return topology.service(ServiceKind.FABRIC).address


@contextlib.asynccontextmanager
async def followed_time(
    topology: Topology,
    credentials: Credentials = ANONYMOUS,
    *,
    name: str,
    report: bool = True,
    profile: ClockProfile = DEFAULT_PROFILE.clock,
    sync_wait_s: float = SYNC_WAIT_S,
) -> AsyncIterator[TimeKeeper]:
    """A TimeKeeper following the emulator's clock, synced before it is yielded."""
    clock = Clock(time_scale=topology.time_scale, epoch_wall_s=topology.epoch_wall_s)
    keeper = TimeKeeper(clock, profile=profile, process=name, owner=False)
    follower = keeper.follower
    assert follower is not None
    channels = Channels(credentials)
    source = ClockStream(channels, clock_address(topology))
    task = asyncio.ensure_future(keeper.run(source) if report else follower.run(source), loop=None)
    try:
        try:
            async with asyncio.timeout(sync_wait_s):
                await follower.synced.wait()
        except TimeoutError:
            raise UnavailableError(
                f"the fabric at {clock_address(topology)} did not tell its clock within "
                f"{sync_wait_s:g} s",
                reason="NO_CLOCK",
            ) from None
        yield keeper
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        keeper.close()
        await channels.close()


HOLD_SETTLE_S = 10.0  # wall: how long the fabric may take to apply a hold before it is skipped


@contextlib.asynccontextmanager
async def held_time(
    topology: Topology,
    credentials: Credentials = ANONYMOUS,
    *,
    name: str,
    profile: ClockProfile = DEFAULT_PROFILE.clock,
) -> AsyncIterator[bool]:
    """Emulated time all but stands still (the clock's slowest rate, `min_rate`) while the body
    runs: for wall-clock work that is no part of what is emulated, such as a restarted
    container's process starting (the engine's start, imports, binding), which would otherwise
    pass as emulated minutes at a high time scale and eat a chaos scenario's recovery bound.

    The hold is a wish like a lagging process's, renewed well within `stale_s`, and ends with
    the stream (the fabric forgets a process whose stream closed). Yields whether the hold took
    effect: the fabric that owns time may itself be what is starting, and then nothing holds."""
    channels = Channels(credentials)
    source = RemoteFabric(channels.get(clock_address(topology)))
    held = asyncio.Event()

    async def wishes() -> AsyncIterator[tuple[float, float]]:
        while True:
            yield profile.min_rate, 0.0
            await asyncio.sleep(profile.stale_s / 3)

    async def hold() -> None:
        async for state in source.follow(name, wishes()):
            if state.segment.rate <= profile.min_rate:
                held.set()

    task = asyncio.ensure_future(hold())
    waiter = asyncio.ensure_future(held.wait())
    try:
        await asyncio.wait(
            [task, waiter], timeout=HOLD_SETTLE_S, return_when=asyncio.FIRST_COMPLETED
        )
        yield held.is_set()
    finally:
        waiter.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await channels.close()
