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
    # 5 emulated seconds are 0.5 wall s: the twin's answer, one loop round away, would need a
    # stall that long to lose the race (at x1000 a 5 ms stall of a loaded host lost it)
    clock = Clock(time_scale=10.0)
    wheel = DeadlineWheel(clock, 5.0)
    event = asyncio.Event()
    if not hung:
        asyncio.get_running_loop().call_soon(event.set)

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
    clock = Clock(time_scale=10.0)  # 0.2 wall s: the quick calls' one round each is far less
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


@pytest.mark.parametrize("floor_s", [0.3, 0.0])
async def test_a_wall_floor_holds_a_bound_a_fast_clock_would_end_at_once(floor_s: float) -> None:
    """At x1000 EMS's 20 emulated s are 20 wall ms, less than a loaded host's scheduling delays:
    the floor keeps the bound at least its wall seconds, and a hang is still ended. Removing the
    floor fails the first case (the hang ends at once); the second is a hang with no floor,
    ended too. Only "not before" is asserted: load can only make an ending later."""
    clock = Clock(time_scale=1000.0)
    wheel = DeadlineWheel(clock, 0.001, min_wall_s=floor_s)  # 1 emulated ms: 1 wall us
    loop = asyncio.get_running_loop()

    async def hang() -> None:
        with wheel.bound():
            await asyncio.Event().wait()

    started = loop.time()
    task = asyncio.create_task(hang())
    done, _ = await asyncio.wait({task}, timeout=60)  # a bound on a broken wheel, not a timing
    assert done and isinstance(task.exception(), TimeoutError)
    assert loop.time() - started >= floor_s
    assert wheel.pending == 0


# --- run(): the first step taken at once, the bound entered only by a call that waits --------


@pytest.mark.parametrize("waits", [False, True])
async def test_run_enters_the_bound_only_for_a_call_that_waits(waits: bool) -> None:
    """A call that answers at its first step (a pool of this process) arms no timer and queues
    nothing; its twin, which waits one loop round, is queued under the bound while it waits."""
    wheel = DeadlineWheel(Clock(time_scale=10.0), 5.0)

    async def call() -> int:
        if waits:
            await asyncio.sleep(0)
        return wheel.pending

    assert await wheel.run(call()) == (1 if waits else 0)
    assert wheel.pending == 0
    assert (wheel._handle is not None) is waits  # the twin armed the timer


@pytest.mark.parametrize("hung", [True, False])
async def test_run_ends_a_call_that_hangs_after_its_first_step(hung: bool) -> None:
    """The first step outside the bound must not take the call out of it: a call that hangs
    is ended once its emulated seconds have passed; its twin, answered a round later, is not."""
    clock = Clock(time_scale=10.0)
    wheel = DeadlineWheel(clock, 5.0)
    event = asyncio.Event()
    if not hung:
        asyncio.get_running_loop().call_soon(event.set)

    async def call() -> str:
        await event.wait()
        return "answered"

    task = asyncio.create_task(wheel.run(call()))
    done, _ = await asyncio.wait({task}, timeout=60)  # a bound on a broken wheel, not a timing
    assert done
    if hung:
        assert isinstance(task.exception(), TimeoutError)
        assert clock.now_ns() >= 5_000_000_000
    else:
        assert task.result() == "answered"
    assert wheel.pending == 0


@pytest.mark.parametrize("own", [True, False])
async def test_run_passes_on_errors_and_only_its_own_cancellation_is_a_timeout(own: bool) -> None:
    """An error of the first step is the call's own; a caller's cancellation of a waiting call
    reaches it (its cleanup runs) and stays a CancelledError; the wheel's is a TimeoutError."""
    wheel = DeadlineWheel(Clock(time_scale=1000.0), 1.0 if own else 3600.0)
    cleaned = []

    async def refused() -> None:
        raise ValueError("refused")

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    with pytest.raises(ValueError, match="refused"):
        await wheel.run(refused())
    task = asyncio.create_task(wheel.run(hang()))
    if not own:
        await asyncio.sleep(0.01)
        task.cancel()
    done, _ = await asyncio.wait({task}, timeout=60)  # a bound on a broken wheel, not a timing
    assert done
    if own:
        assert isinstance(task.exception(), TimeoutError)
    else:
        assert task.cancelled()
    assert cleaned == [True] and wheel.pending == 0
