"""The tasks a long-lived service starts on request (a day plan's runner, a training job's), owned
until the service closes: one TaskGroup held by `run()`, so that none outlives its server and a
failure in one is not lost; `close()` ends them where they are."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from cmemu.emulator.model.errors import UnavailableError


class TaskOwner:
    def __init__(self, not_running: str) -> None:
        self.not_running = not_running  # why a start is refused before run() or after close()
        self._group: asyncio.TaskGroup | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()

    async def run(self) -> None:
        """Own the tasks until close(); then cancel those still running."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await self._closed.wait()
            finally:
                self._group = None
                for task in list(self._running):
                    task.cancel()

    async def close(self) -> None:
        self._closed.set()

    @property
    def running(self) -> bool:
        """run() owns the tasks: a start is taken."""
        return self._group is not None

    def require_running(self) -> None:
        """Refuse a start, UNAVAILABLE and worth retrying, while nothing owns the tasks."""
        if self._group is None:
            raise UnavailableError(self.not_running, retry_after_s=1.0)

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        group = self._group
        if group is None:
            coro.close()
            raise UnavailableError(self.not_running, retry_after_s=1.0)
        task = group.create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task
