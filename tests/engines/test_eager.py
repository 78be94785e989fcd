"""gather_eager (engines/eager.py), what EMS writes a put's copies with: asyncio.gather's promises
(every call started, results in order, the first failure raised, the caller's cancellation
passed on) without a task per call that answers at its first step. Each case has its twin: the
call that waits beside the one that does not, asyncio.gather beside gather_eager."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest

from cmemu.emulator.engines.eager import gather_eager
from cmemu.emulator.engines.wheel import DeadlineWheel
from cmemu.emulator.model.clock import Clock

Gather = Callable[[Sequence[Coroutine[Any, Any, Any]]], Coroutine[Any, Any, list[Any]]]


async def _plain(calls: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
    return list(await asyncio.gather(*calls))


@pytest.mark.parametrize(("gather", "own_task"), [(gather_eager, True), (_plain, False)])
async def test_calls_that_answer_at_once_run_in_the_callers_task(
    gather: Gather, own_task: bool
) -> None:
    caller = asyncio.current_task()
    ran_in: list[asyncio.Task[Any] | None] = []

    async def call(n: int) -> int:
        ran_in.append(asyncio.current_task())
        return n * 10

    assert await gather([call(1), call(2), call(3)]) == [10, 20, 30]
    assert (ran_in == [caller] * 3) is own_task


@pytest.mark.parametrize("waits", [True, False])
async def test_the_calls_after_one_that_waits_run_meanwhile(waits: bool) -> None:
    """The first call waits for what only the second does: had the second waited for the first
    to end, neither would."""
    done = asyncio.Event()
    order: list[str] = []

    async def first() -> str:
        order.append("first starts")
        if waits:
            await done.wait()
        order.append("first ends")
        return "a"

    async def second() -> str:
        order.append("second starts")
        done.set()
        return "b"

    assert await gather_eager([first(), second()]) == ["a", "b"]
    if waits:
        assert order == ["first starts", "second starts", "first ends"]
    else:
        assert order == ["first starts", "first ends", "second starts"]


@pytest.mark.parametrize("hung", [True, False])
async def test_a_bound_entered_by_a_call_that_waits_ends_it(hung: bool) -> None:
    """The waiting call's first step ran in the caller's task, where the wheel's bound took its
    task: the call goes on awaited there, so the wheel's cancellation reaches it and ends it
    with TimeoutError, as it would have in a task of its own."""
    clock = Clock(time_scale=10.0)
    wheel = DeadlineWheel(clock, 5.0)
    event = asyncio.Event()
    if not hung:
        asyncio.get_running_loop().call_soon(event.set)

    async def answer() -> str:
        await event.wait()
        return "answered"

    async def quick() -> str:
        return "quick"

    calls = [wheel.run(answer()), wheel.run(quick())]
    if hung:
        with pytest.raises(TimeoutError):
            await gather_eager(calls)
        assert clock.now_ns() >= 5_000_000_000
    else:
        assert await gather_eager(calls) == ["answered", "quick"]
    assert wheel.pending == 0


@pytest.mark.parametrize("waits", [True, False])
async def test_a_failure_is_raised_after_every_call_started(waits: bool) -> None:
    started: list[int] = []
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))

    async def failing() -> None:
        started.append(0)
        raise ValueError("copy 0 failed")

    async def later(n: int) -> int:
        started.append(n)
        if waits:
            await asyncio.sleep(0)
            raise KeyError(n)  # after the first failure was raised: nobody's to read
        return n

    try:
        with pytest.raises(ValueError, match="copy 0 failed"):
            await gather_eager([failing(), later(1), later(2)])
        for _ in range(3):
            await asyncio.sleep(0)
        assert started == [0, 1, 2]
        gc.collect()
        assert unretrieved == []
    finally:
        loop.set_exception_handler(None)


@pytest.mark.parametrize("cancelled", [True, False])
async def test_cancelling_the_caller_cancels_the_calls_still_running(cancelled: bool) -> None:
    gate = asyncio.Event()
    ended: list[str] = []

    async def call(name: str) -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            ended.append(f"{name} cancelled")
            raise
        ended.append(f"{name} answered")
        return name

    caller = asyncio.ensure_future(gather_eager([call("a"), call("b"), call("c")]))
    await asyncio.sleep(0)
    if cancelled:
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0)
        assert sorted(ended) == ["a cancelled", "b cancelled", "c cancelled"]
    else:
        gate.set()
        assert await caller == ["a", "b", "c"]
        assert sorted(ended) == ["a answered", "b answered", "c answered"]
