"""A supernode-wide service down while its engine runs on (service-kill, -hang, -slow and
-partition in one process, issue 20 item 4): what the callers of this process meet when they
reach the engine directly (the fabric's devices: engines/peers.py LocalFabric; the router's and
the training jobs' scheduler and EMS: engines/scheduler/local.py, engines/ems/local.py), as
remote callers meet its gated or stopped server.

In one process those callers do not go through the service's server, so stopping the server
alone would cut nobody off: every call of theirs goes through this outage instead. Killed:
refused at once (UNAVAILABLE `<SERVICE>_DOWN`, as a closed port); hung or cut off: unanswered
until the caller's deadline (DEADLINE_EXCEEDED), or until it is back; slow: each call waits its
emulated latency first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cmemu.emulator.model.errors import DeadlineExceededError, UnavailableError

T = TypeVar("T")
RETRY_AFTER_S = 1.0


class Outage:
    def __init__(self, service: str, reason: str) -> None:
        self.service = service
        self.reason = reason  # a kill's UNAVAILABLE reason, e.g. FABRIC_DOWN
        self.how = ""  # "", "kill", "hang", "partition" or "slow"
        self.delay: Callable[[], Awaitable[None]] | None = None  # slow: an emulated sleep
        self._up = asyncio.Event()
        self._up.set()
        self.killed = asyncio.Event()  # set while killed: an open stream ends as its server's

    def down(self, how: str, delay: Callable[[], Awaitable[None]] | None = None) -> None:
        self.how, self.delay = how, delay
        if how != "slow":
            self._up.clear()
        if how == "kill":
            self.killed.set()

    def up(self) -> None:
        self.how, self.delay = "", None
        self._up.set()
        self.killed.clear()

    def refusal(self) -> UnavailableError:
        return UnavailableError(
            f"the {self.service} service is down (service-kill): nothing reaches it",
            reason=self.reason,
            retry_after_s=RETRY_AFTER_S,
        )

    async def admit(self, deadline_s: float | None) -> None:
        """Return when a call may reach the service; raise as a caller of a down one would.
        `deadline_s` is the caller's wire deadline (wall, as a gRPC one is: see peers.within)."""
        if not self.how:
            return
        if self.how == "kill":
            raise self.refusal()
        if self.how == "slow":
            if self.delay is not None:
                await self.delay()
            return
        try:
            async with asyncio.timeout(deadline_s):
                await self._up.wait()
        except TimeoutError:
            raise DeadlineExceededError(
                f"deadline exceeded ({deadline_s:.3g} s): the {self.service} service answers "
                f"nothing ({self.how})"
            ) from None

    async def through(self, call: Awaitable[T]) -> T:
        """`call` once the service admits it (no deadline: the typed clients of one process
        set none); nothing is awaited first while the service is up."""
        if self.how:
            try:
                await self.admit(None)
            except BaseException:
                if asyncio.iscoroutine(call):
                    call.close()  # never awaited: no warning
                raise
        return await call
