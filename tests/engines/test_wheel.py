"""Deadlines of one length on one timer (engines/wheel.py): each running call is ended once its
emulated seconds have passed, whatever the calls around it did, and calls that end leave
nothing behind. Each case that must time out has a twin, the same body, that must not."""

from __future__ import annotations

import asyncio

import pytest

from cmemu.emulator.engines.wheel import DeadlineWheel
from cmemu.emulator.model.clock import Clock


@pytest.mark.parametrize("hung", [True, False])
async def test_it_ends_a_hang_once_its_emulated_seconds_have_passed(hung: bool) -> None:
    clock = Clock(time_scale=1000.0)  # 5 emulated seconds are 5 wall milliseconds
    wheel = DeadlineWheel(clock, 5.0)
    event = asyncio.Event()
    if not hung:
        asyncio.get_running_loop().call_later(0.001, event.set)

    async def call() -> str:
        with wheel.bound():
            await event.wait()
        return "answered"

    if hung:
        with pytest.raises(TimeoutError):
            await call()
        assert clock.now_ns() >= 5_000_000_000
    else:
        assert await call() == "answered"
    assert wheel.pending == 0


async def test_a_hang_behind_calls_that_finished_is_still_ended() -> None:
    """The timer is armed for the first call, which answers at once; the hung one entered after
    it must not be left without a timer."""
    clock = Clock(time_scale=1000.0)
    wheel = DeadlineWheel(clock, 2.0)

    async def quick() -> None:
        with wheel.bound():
            await asyncio.sleep(0)

    async def hang() -> None:
        with wheel.bound():
            await asyncio.Event().wait()

    await quick()
    hung = asyncio.create_task(hang())
    results = await asyncio.gather(hung, *(quick() for _ in range(50)), return_exceptions=True)
    assert isinstance(results[0], TimeoutError)
    assert results[1:] == [None] * 50
    assert wheel.pending == 0


async def test_calls_that_end_in_any_order_leave_nothing_queued() -> None:
    """A call ending behind a running one waits in the queue until that one leaves; none stays
    once all have ended (the wheel holds no more than the calls in flight)."""
    clock = Clock(time_scale=1.0)
    wheel = DeadlineWheel(clock, 3600.0)
    gates = [asyncio.Event() for _ in range(8)]

    async def call(i: int) -> int:
        with wheel.bound():
            await gates[i].wait()
        return i

    tasks = [asyncio.create_task(call(i)) for i in range(8)]
    await asyncio.sleep(0)
    for i in (5, 2, 7, 1):  # out of order: the first is still running
        gates[i].set()
    await asyncio.sleep(0.01)
    assert wheel.pending == 8  # ended ones queued behind call 0, which runs
    for gate in gates:
        gate.set()
    assert await asyncio.gather(*tasks) == list(range(8))
    assert wheel.pending == 0


@pytest.mark.parametrize("slowed", [False, True])
async def test_a_clock_slowed_after_entering_re_arms_it(slowed: bool) -> None:
    """The timer is armed at the rate of the call's start (1 emulated s: 1 wall ms); the clock
    then slows to 1 emulated ms per wall second, so at its firing the call is not due and the
    wheel re-arms rather than ending it (the clock reads a wall of the test's own)."""
    wall = [1000.0]
    clock = Clock(time_scale=1000.0, wall=lambda: wall[0])
    wheel = DeadlineWheel(clock, 1.0)

    async def body() -> str:
        with wheel.bound():
            if slowed:
                clock.set_rate(0.001)
            wall[0] += 0.002  # 2 emulated s at the asked scale, 2 emulated us slowed
            await asyncio.sleep(0.2)
        return "done"

    if slowed:
        assert await body() == "done"
    else:
        with pytest.raises(TimeoutError):
            await body()


@pytest.mark.parametrize("own", [True, False])
async def test_only_its_own_cancellation_becomes_a_timeout(own: bool) -> None:
    """A call cancelled by its caller stays cancelled (CancelledError), as under
    asyncio.timeout; only the wheel's cancellation is a TimeoutError."""
    clock = Clock(time_scale=1000.0)
    wheel = DeadlineWheel(clock, 1.0 if own else 3600.0)

    async def call() -> None:
        with wheel.bound():
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    if own:
        with pytest.raises(TimeoutError):
            await task
    else:
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert wheel.pending == 0
