"""Where every task of the loop waits, down its whole await chain.

asyncio's own `Task.print_stack` shows a suspended task's outermost frame only (a coroutine's
frame has no f_back while it waits), and raised TypeError on grpc's Cython coroutines: a dump of
a stuck process read "await self._follow(source)" at best, never the call it hung in. This walks
`cr_await` (and an async generator's `ag_await`, through the `anext()` awaitable that hides it)
to the innermost frame, and names whatever it cannot open instead of failing."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

DEPTH_MAX = 40  # links followed per task: a chain is a handful deep; a cycle would be endless


def _frame_of(awaitable: object) -> FrameType | None:
    for attr in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(awaitable, attr, None)
        if isinstance(frame, FrameType):
            return frame
    return None


def _next_of(awaitable: object) -> object | None:
    for attr in ("cr_await", "ag_await", "gi_yieldfrom"):
        inner: object | None = getattr(awaitable, attr, None)
        if inner is not None:
            return inner
    if type(awaitable).__name__ in ("async_generator_asend", "async_generator_athrow"):
        # anext()'s awaitable exposes no attribute for its generator; the collector knows it
        return next((r for r in gc.get_referents(awaitable) if hasattr(r, "ag_frame")), None)
    return None


def chain(task: asyncio.Task[object]) -> Iterator[str]:
    """One line per link, outermost first: `file:line in function`, or what the link is."""
    link: object | None = task.get_coro()
    for _ in range(DEPTH_MAX):
        if link is None:
            return
        frame = _frame_of(link)
        if frame is not None:
            code = frame.f_code
            yield f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        else:
            yield f"<{type(link).__name__}>"
        link = _next_of(link)


def print_tasks(why: str, file: TextIO | None = None) -> None:
    """Every task of the running loop and the chain it waits in (stderr by default)."""
    out = file or sys.stderr
    tasks = asyncio.all_tasks()
    print(f"cmemu: {len(tasks)} tasks {why}:", file=out)
    for task in tasks:
        print(f"  {task.get_name()}: waits on {task._fut_waiter!r}"[:400], file=out)  # type: ignore[attr-defined]
        try:
            for line in chain(task):
                print(f"    {line}", file=out)
        except Exception as exc:  # a frame mid-teardown
            print(f"    (unreadable: {exc!r})", file=out)
    out.flush()
