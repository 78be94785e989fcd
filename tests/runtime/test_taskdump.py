"""The SIGUSR1 task dump reaches the frame a task actually waits in: through coroutines, an
`anext()` of an async generator (how a clock follower reads its stream) and the generator
itself, where asyncio's own stack of a suspended task stops at its outermost frame."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

from cmemu.emulator.runtime.taskdump import chain, print_tasks


async def _innermost_wait(event: asyncio.Event) -> None:
    await event.wait()


async def _stream(event: asyncio.Event) -> AsyncIterator[int]:
    await _innermost_wait(event)
    yield 1


async def _follow(event: asyncio.Event) -> None:
    states = _stream(event)
    async with asyncio.timeout(600):  # a bound only: the event is set by the test
        await anext(states)


async def test_the_dump_follows_the_await_chain_into_an_async_generator() -> None:
    event = asyncio.Event()
    task = asyncio.ensure_future(_follow(event))
    try:
        await asyncio.sleep(0)  # it runs up to its wait
        links = list(chain(task))
        names = [line.rsplit(" in ", 1)[-1] for line in links]
        assert names[:2] == ["_follow", "<async_generator_asend>"]
        assert "_stream" in names and "_innermost_wait" in names
        # asyncio's own view of the same task: the outermost frame only
        assert [f.f_code.co_name for f in task.get_stack()] == ["_follow"]
        out = io.StringIO()
        print_tasks("in a test", file=out)
        assert "tasks in a test" in out.getvalue() and "_innermost_wait" in out.getvalue()
    finally:
        event.set()
        await task
