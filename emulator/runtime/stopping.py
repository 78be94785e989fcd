"""A start step that a stop signal may cut short: what `cmemu serve` and the engine launcher
share, so that a process or a `docker compose up` stopped while it starts stops then, not after
the step's own timeouts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable


async def unless_stopped(step: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await `step` unless `stop` is set first (then the step is cancelled): False when
    stopped. A step that failed raises its error."""
    task = asyncio.ensure_future(step)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()
    return True
