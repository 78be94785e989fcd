"""A deadline counted on the emulator's clock (engines/deadline.py): it ends a hang once its
emulated seconds have passed, and a clock slowed or held meanwhile stretches it. Each case that
must time out has a twin, the same body, that must not."""

from __future__ import annotations

import asyncio

import pytest

from cmemu.emulator.engines.deadline import EmulatedDeadline, answer_within
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import DeadlineExceededError


async def test_it_ends_a_hang_once_its_emulated_seconds_have_passed() -> None:
    clock = Clock(time_scale=1000.0)  # 5 emulated seconds are 5 wall milliseconds
    with pytest.raises(TimeoutError):
        async with EmulatedDeadline(clock, 5.0):
            await asyncio.Event().wait()  # never set: a hang
    assert clock.now_ns() >= 5_000_000_000


async def test_a_body_done_in_time_returns_its_result() -> None:
    clock = Clock(time_scale=1.0)
    async with EmulatedDeadline(clock, 3600.0):
        await asyncio.sleep(0)
        result = 42
    assert result == 42


@pytest.mark.parametrize("held", [False, True])
async def test_a_held_clock_stretches_it(held: bool) -> None:
    """0.2 wall seconds are 200 emulated seconds at this scale, far past the deadline's one,
    however busy the host: unless time is held (a stalled owner of time), when none pass."""
    clock = Clock(time_scale=1000.0)
    if held:
        clock.hold_until(clock.wall())
    body = _sleep_in(clock, 1.0, wall_s=0.2)
    if held:
        assert await body == "done"
    else:
        with pytest.raises(TimeoutError):
            await body


@pytest.mark.parametrize("slowed", [False, True])
async def test_a_clock_slowed_after_entering_re_arms_it(slowed: bool) -> None:
    """The deadline's timer is armed at the rate of its start (1 emulated s: 1 wall ms); the
    clock then slows to 1 emulated ms per wall second, so at its firing the deadline is not due
    and it re-arms rather than ending the body. The clock reads a wall of the test's own, moved
    2 ms on by hand, so that no pause of this process between the steps can change the case."""
    wall = [1000.0]
    clock = Clock(time_scale=1000.0, wall=lambda: wall[0])

    async def body() -> str:
        async with EmulatedDeadline(clock, 1.0):
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


async def _sleep_in(clock: Clock, emulated_s: float, *, wall_s: float) -> str:
    async with EmulatedDeadline(clock, emulated_s):
        await asyncio.sleep(wall_s)
    return "done"


@pytest.mark.parametrize("floor_s", [0.0, 3600.0])
async def test_a_wall_floor_holds_it_past_its_emulated_seconds(floor_s: float) -> None:
    """200 emulated seconds pass in the body's 0.2 wall seconds; a floor of an hour of wall
    time keeps the deadline (of 1 emulated second) from ending it, no floor does not."""
    clock = Clock(time_scale=1000.0)

    async def body() -> str:
        async with EmulatedDeadline(clock, 1.0, min_wall_s=floor_s):
            await asyncio.sleep(0.2)
        return "done"

    if floor_s:
        assert await body() == "done"
    else:
        with pytest.raises(TimeoutError):
            await body()


@pytest.mark.parametrize("held", [False, True])
async def test_answer_within_ends_a_hang_as_a_grpc_deadline_would(held: bool) -> None:
    """One error for callers to catch, wherever the peer lives: DeadlineExceededError naming
    the peer and the emulated bound; a held clock keeps the same call waiting to its answer."""
    clock = Clock(time_scale=1000.0)
    if held:
        clock.hold_until(clock.wall())
    call = asyncio.sleep(0.2, result="answered")  # 200 emulated seconds unheld
    if held:
        assert await answer_within(clock, 1.0, call, peer="n00-npu0") == "answered"
    else:
        with pytest.raises(DeadlineExceededError, match="n00-npu0 gave no answer within 1 "):
            await answer_within(clock, 1.0, call, peer="n00-npu0")
