"""The fabric service down while its engine runs on (service-kill, -hang, -slow and -partition of
the fabric in one process, issue 20 item 4): what the devices of the process meet when they
reach the fabric directly (emulator/engines/peers.py LocalFabric), as remote callers meet its
gated server.

In one process the devices do not go through the fabric's server, so stopping the server alone
would cut nobody off: every transfer, collective, link fault and arrivals read goes through this
outage instead. Killed: refused at once (UNAVAILABLE FABRIC_DOWN, as a closed port); hung or cut
off: unanswered until the caller's deadline (DEADLINE_EXCEEDED), or until it is back; slow: each
call waits its emulated latency first. Time is not the fabric's to lose: the emulator's clock,
which its server also tells, keeps running (those calls are exempt from its gate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from cmemu.emulator.model.errors import DeadlineExceededError, UnavailableError

REASON = "FABRIC_DOWN"
RETRY_AFTER_S = 1.0


class Outage:
    def __init__(self) -> None:
        self.how = ""  # "", "kill", "hang", "partition" or "slow"
        self.delay: Callable[[], Awaitable[None]] | None = None  # slow: an emulated sleep
        self._up = asyncio.Event()
        self._up.set()

    def down(self, how: str, delay: Callable[[], Awaitable[None]] | None = None) -> None:
        self.how, self.delay = how, delay
        if how != "slow":
            self._up.clear()

    def up(self) -> None:
        self.how, self.delay = "", None
        self._up.set()

    async def admit(self, deadline_s: float | None) -> None:
        """Return when a call may reach the fabric; raise as a caller of a down fabric would."""
        if not self.how:
            return
        if self.how == "kill":
            raise UnavailableError(
                "the fabric service is down (service-kill): nothing reaches it",
                reason=REASON,
                retry_after_s=RETRY_AFTER_S,
            )
        if self.how == "slow":
            if self.delay is not None:
                await self.delay()
            return
        try:
            async with asyncio.timeout(deadline_s):
                await self._up.wait()
        except TimeoutError:
            raise DeadlineExceededError(
                f"deadline exceeded ({deadline_s:.3g} s): the fabric service answers nothing "
                f"({self.how})"
            ) from None
