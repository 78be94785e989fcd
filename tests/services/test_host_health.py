"""A server's health as listeners in its process hear it (services/host.py `watch_health`): what
a Watch stream of it would carry, without one. The web view of an in-process supernode is built
on it (emulator/runtime/webview/sources.py)."""

from __future__ import annotations

import asyncio

from cmemu.emulator.client import faults
from cmemu.emulator.testing import running_supernode
from cmemu.services.host import NOT_SERVING, SERVING

WAIT_S = 30.0  # a bound for what must come, never a timing assertion


class Heard:
    """What a listener heard, in order, and a wake-up at each."""

    def __init__(self) -> None:
        self.statuses: list[int | None] = []
        self.more = asyncio.Event()

    def __call__(self, status: int | None) -> None:
        self.statuses.append(status)
        self.more.set()

    async def ends_with(self, *expected: int | None) -> None:
        """Wait until what was heard ends with `expected` (AssertionError if it never does)."""
        try:
            async with asyncio.timeout(WAIT_S):
                while tuple(self.statuses[-len(expected) :]) != expected:
                    self.more.clear()
                    await self.more.wait()
        except TimeoutError:
            raise AssertionError(f"heard {self.statuses}, not ending {expected}") from None


async def test_a_listener_hears_faults_a_crash_and_the_restart_as_a_watch_would() -> None:
    async with running_supernode("cm-mini") as sn:
        device = "n00-npu6"
        host = sn.local.device_servers[device].host
        heard = Heard()
        host.watch_health(heard)
        await heard.ends_with(SERVING)  # at once, as a Watch's first message
        die = await faults.inject(sn.clients, "die-down", device, {"die": 0})
        down = await faults.inject(sn.clients, "device-down", device)
        await heard.ends_with(SERVING, NOT_SERVING)  # the die's own name is not the server's
        await faults.clear(sn.clients, down.id)
        await faults.clear(sn.clients, die.id)
        await heard.ends_with(NOT_SERVING, SERVING)
        crash = await faults.inject(sn.clients, "crash", device)
        await heard.ends_with(SERVING, NOT_SERVING, None)  # then gone: no server answers
        assert host.served is None
        await faults.clear(sn.clients, crash.id)
        # back at what it serves, not at the NOT_SERVING its new server binds with
        await heard.ends_with(NOT_SERVING, None, SERVING)
        assert heard.statuses == [SERVING, NOT_SERVING, SERVING, NOT_SERVING, None, SERVING]


async def test_a_listener_that_stopped_hears_nothing_more() -> None:
    """The twin: what a listener hears is what the host tells it, and only while it listens."""
    async with running_supernode("cm-mini") as sn:
        device = "n00-npu6"
        host = sn.local.device_servers[device].host
        heard = Heard()
        stop = host.watch_health(heard)
        await heard.ends_with(SERVING)
        stop()
        crash = await faults.inject(sn.clients, "crash", device)
        try:
            assert host.served is None  # the host knows it is gone ...
            await asyncio.sleep(0)  # (the loop's turn, when it would have told)
            assert heard.statuses == [SERVING]  # ... the listener that stopped does not hear it
        finally:
            await faults.clear(sn.clients, crash.id)
