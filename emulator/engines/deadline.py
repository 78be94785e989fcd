"""A deadline in emulated time: `asyncio.timeout`, but counted on the emulator's clock.

A bound on a hang (a pool that never answers) is a statement about the emulated machine, so it
must pass in emulated time. Counted in wall seconds it fails on a starved host, where every
process runs late and a healthy pool's answer arrives after the wall bound; counted on the
clock, which the governor slows when this process's loop runs late (engines/governor.py), it
stretches with the host's slowness and still ends a real hang.

One loop timer per deadline, no task: armed for the wall instant at which the clock's present
rate reaches the due time; when it fires it reads the clock, and re-arms when the clock was
slowed or held meanwhile. The timed-out body gets `TimeoutError`, as from `asyncio.timeout`.

`min_wall_s`, a floor in wall seconds: at a fast time scale a few emulated seconds are a few wall
milliseconds, less than the RPCs a body makes take on any host (the serving driver's step).

`answer_within` is the shape most callers want: one call to a peer, passed over the wire with no
deadline of its own (the caller's cancellation ends a gRPC call as surely, and any wall deadline
there would end healthy calls on the starved host this exists for), and a hang ended as a gRPC
deadline would end it, with DeadlineExceededError, so that callers keep one error to catch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import TypeVar

from cmemu.emulator.engines.clock import REARM_WHILE_HELD_S
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import DeadlineExceededError

T = TypeVar("T")


class EmulatedDeadline:
    """`async with EmulatedDeadline(clock, 20.0):` ends the body with TimeoutError once 20
    emulated seconds (and `min_wall_s` wall seconds) have passed since entering it."""

    __slots__ = ("_clock", "_due_ns", "_emulated_s", "_handle", "_min_wall_s", "_timeout")

    def __init__(self, clock: Clock, emulated_s: float, *, min_wall_s: float = 0.0) -> None:
        self._clock = clock
        self._emulated_s = emulated_s
        self._min_wall_s = min_wall_s
        self._due_ns = 0
        self._handle: asyncio.TimerHandle | None = None
        self._timeout = asyncio.timeout(None)

    @property
    def emulated_s(self) -> float:
        return self._emulated_s

    async def __aenter__(self) -> EmulatedDeadline:
        await self._timeout.__aenter__()
        self._due_ns = self._clock.now_ns() + round(max(0.0, self._emulated_s) * 1e9)
        loop = asyncio.get_running_loop()
        if self._min_wall_s > 0:  # the floor first, then the clock
            self._handle = loop.call_later(self._min_wall_s, self._arm)
        else:
            self._arm()
        return self

    def _arm(self) -> None:
        clock = self._clock
        loop = asyncio.get_running_loop()
        if clock.now_ns() >= self._due_ns:
            self._handle = None
            self._timeout.reschedule(loop.time())  # ends the body at its next await
            return
        delay = clock.wall_at(self._due_ns) - clock.wall()
        self._handle = loop.call_later(delay if delay > 0 else REARM_WHILE_HELD_S, self._arm)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError when it expired


async def answer_within(
    clock: Clock, emulated_s: float, call: Awaitable[T], *, peer: str, min_wall_s: float = 0.0
) -> T:
    """`call`'s answer, or DeadlineExceededError naming `peer` once `emulated_s` emulated seconds
    (and `min_wall_s` wall seconds) passed without one."""
    try:
        async with EmulatedDeadline(clock, emulated_s, min_wall_s=min_wall_s):
            return await call
    except TimeoutError:
        raise no_answer(peer, emulated_s) from None


def no_answer(peer: str, emulated_s: float) -> DeadlineExceededError:
    """What a bounded call to `peer` that timed out raises: as a gRPC deadline would end it."""
    return DeadlineExceededError(f"{peer} gave no answer within {emulated_s:g} emulated s")
