"""Where a stalled chaos run waited: every task's chain of awaits, for the error that ends a run
past its wall limit (runner.py) instead of hanging a CI job."""

from __future__ import annotations

import asyncio
from pathlib import Path


def stacks(*, exclude: asyncio.Task[object] | None, limit_chars: int = 6000) -> str:
    """Where every task of this loop is parked (innermost frames), for a stalled run's error."""
    lines = []
    for task in asyncio.all_tasks():
        if task is not exclude and not task.done():
            where = " -> ".join(awaiting(task.get_coro())[-6:])
            lines.append(f"  {task.get_name()}: {where}")
    return "\n".join(lines)[-limit_chars:]


def awaiting(coro: object) -> list[str]:
    """A suspended coroutine's chain of awaits, outermost first (a task's own stack holds only
    its outermost frame)."""
    chain = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}"
                         f":{frame.f_lineno})")  # fmt: skip
        coro = (getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
                or getattr(coro, "gi_yieldfrom", None))  # fmt: skip
    return chain
