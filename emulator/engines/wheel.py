"""Deadlines in emulated time for many short calls of one length, on one loop timer.

`EmulatedDeadline` (deadline.py) arms a loop timer when a call starts and cancels it when the
call ends: about 7 us of CPU, paid six times by every EMS put (two regions allocated, two copies
written, the two old ones freed) and once by every get, though a pool of this process answers
before any timer could fire. A wheel serves every call of one bound: the calls enter in the
order of their due instants (the bound is one length and the clock does not run backwards), so
only the oldest needs a timer. A call that ends is marked and leaves the queue once it reaches
its head; the timer fires at the oldest running call's due instant, ends it as `asyncio.timeout`
would (the body gets `TimeoutError`), and re-arms for the next. Steady traffic of calls that
finish costs one timer per bound's length, not one per call. `run(call)` goes one step further:
it takes the call's first step at once and enters the bound only if the call then waits, so a
call that answers at once (a pool of this process) costs no entry at all.

The bound is in emulated time, as EmulatedDeadline's: the timer is armed for the wall instant at
which the clock's present rate reaches the due time, and when it fires it reads the clock and
re-arms when the clock was slowed or held meanwhile. A clock that jumped back (a follower adopting
its authority's segment) at worst keeps a later call waiting behind an earlier one's due instant.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import Any, TypeVar, cast

from cmemu.emulator.engines.clock import REARM_WHILE_HELD_S
from cmemu.emulator.model.clock import Clock

T = TypeVar("T")
_RUNNING, _DONE, _EXPIRED = 0, 1, 2


class DeadlineWheel:
    """`with wheel.bound():` ends its body with TimeoutError once `emulated_s` emulated seconds
    have passed since entering it (in a task; the body's awaits are where it is ended)."""

    __slots__ = ("_bound_ns", "_clock", "_handle", "_queue", "emulated_s", "min_wall_s")

    def __init__(self, clock: Clock, emulated_s: float, *, min_wall_s: float = 0.0) -> None:
        """`min_wall_s`: a floor in wall seconds (as EmulatedDeadline's): at a fast time scale
        the emulated bound is a few wall milliseconds, less than a loaded host's delays."""
        self._clock = clock
        self.emulated_s = emulated_s
        self.min_wall_s = max(0.0, min_wall_s)
        self._bound_ns = round(max(0.0, emulated_s) * 1e9)
        self._queue: deque[Bound] = deque()
        self._handle: asyncio.TimerHandle | None = None

    def bound(self) -> Bound:
        return Bound(self)

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        """`call` under this bound, its first step taken at once: a call that answers at its
        first step (a device of this process whose gate is open: an allocation, or a copy within
        a pool that has ended) never suspended, so no bound could have ended it, and it enters
        none (no Bound, no clock reading, nothing queued). One that waits (a hung or slowed
        device, a flow in flight, a call over gRPC) enters the bound where it starts waiting,
        the microseconds of its first step later, and is ended as `bound()` ends its body."""
        try:
            waiting = call.send(None)
        except StopIteration as answered:
            return cast(T, answered.value)
        with self.bound():
            return cast(T, await resumed(call, waiting))

    @property
    def pending(self) -> int:
        """Calls still queued (running, or ended behind a running one): what the wheel holds."""
        return len(self._queue)

    def _enter(self, call: Bound) -> int:
        self._queue.append(call)
        due_ns = self._clock.now_ns() + self._bound_ns
        call.wall_due = asyncio.get_running_loop().time() + self.min_wall_s
        if self._handle is None:
            self._arm(due_ns, self.min_wall_s)
        return due_ns

    def _leave(self) -> None:
        queue = self._queue
        while queue and queue[0].state != _RUNNING:
            queue.popleft()

    def _arm(self, due_ns: int, wall_left_s: float = 0.0) -> None:
        clock = self._clock
        delay = max(clock.wall_at(due_ns) - clock.wall(), wall_left_s)
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(delay if delay > 0 else REARM_WHILE_HELD_S, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._clock.now_ns()
        wall = asyncio.get_running_loop().time()
        queue = self._queue
        while queue:
            head = queue[0]
            if head.state == _RUNNING:
                # both dues grow along the queue (one bound's length, one floor): the head's
                # are the earliest of the calls running
                if head.due_ns > now or head.wall_due > wall:
                    self._arm(head.due_ns, head.wall_due - wall)
                    return
                head.state = _EXPIRED
                head.task.cancel()  # suspended in its body: the wheel runs between its steps
            queue.popleft()


@types.coroutine
def resumed(call: Coroutine[Any, Any, Any], waiting: Any) -> Generator[Any, None, Any]:
    """`call` awaited on from its first step, which yielded `waiting` (the future it waits for)
    outside any task's step: handed to the task now, as if the task had taken that step. A task
    resumes a coroutine with send(None), or throws in its cancellation: both go on to `call`."""
    try:
        yield waiting
    except GeneratorExit:
        call.close()
        raise
    except BaseException as exc:  # a cancellation (the wheel's own, or any other)
        try:
            waiting = call.throw(exc)
        except StopIteration as answered:
            return answered.value
        return (yield from resumed(call, waiting))
    return (yield from call)


class Bound:
    """One call under a wheel's bound (what asyncio.timeout's Timeout is, without a timer)."""

    __slots__ = ("_cancelling", "_wheel", "due_ns", "state", "task", "wall_due")

    def __init__(self, wheel: DeadlineWheel) -> None:
        self._wheel = wheel
        self.state = _RUNNING
        self.due_ns = 0
        self.wall_due = 0.0  # the loop's time before which the floor keeps it running

    def __enter__(self) -> Bound:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline bounds a call in a task")
        self.task = task
        self._cancelling = task.cancelling()
        self.due_ns = self._wheel._enter(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state == _EXPIRED:
            # as asyncio.timeout: the cancellation was the wheel's (no other one came since)
            if self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
            return
        self.state = _DONE
        self._wheel._leave()
