"""Deadlines in emulated time for many short calls of one length, on one loop timer.

`EmulatedDeadline` (deadline.py) arms a loop timer when a call starts and cancels it when the
call ends: about 7 us of CPU, paid six times by every EMS put (two regions allocated, two copies
written, the two old ones freed) and once by every get, though a pool of this process answers
before any timer could fire. A wheel serves every call of one bound: the calls enter in the
order of their due instants (the bound is one length and the clock does not run backwards), so
only the oldest needs a timer. A call that ends is marked and leaves the queue once it reaches
its head; the timer fires at the oldest running call's due instant, ends it as `asyncio.timeout`
would (the body gets `TimeoutError`), and re-arms for the next. Steady traffic of calls that
finish costs one timer per bound's length, not one per call.

The bound is in emulated time, as EmulatedDeadline's: the timer is armed for the wall instant at
which the clock's present rate reaches the due time, and when it fires it reads the clock and
re-arms when the clock was slowed or held meanwhile. A clock that jumped back (a follower adopting
its authority's segment) at worst keeps a later call waiting behind an earlier one's due instant.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

from cmemu.emulator.engines.clock import REARM_WHILE_HELD_S
from cmemu.emulator.model.clock import Clock

_RUNNING, _DONE, _EXPIRED = 0, 1, 2


class DeadlineWheel:
    """`with wheel.bound():` ends its body with TimeoutError once `emulated_s` emulated seconds
    have passed since entering it (in a task; the body's awaits are where it is ended)."""

    __slots__ = ("_bound_ns", "_clock", "_handle", "_queue", "emulated_s")

    def __init__(self, clock: Clock, emulated_s: float) -> None:
        self._clock = clock
        self.emulated_s = emulated_s
        self._bound_ns = round(max(0.0, emulated_s) * 1e9)
        self._queue: deque[Bound] = deque()
        self._handle: asyncio.TimerHandle | None = None

    def bound(self) -> Bound:
        return Bound(self)

    @property
    def pending(self) -> int:
        """Calls still queued (running, or ended behind a running one): what the wheel holds."""
        return len(self._queue)

    def _enter(self, call: Bound) -> int:
        self._queue.append(call)
        due_ns = self._clock.now_ns() + self._bound_ns
        if self._handle is None:
            self._arm(due_ns)
        return due_ns

    def _leave(self) -> None:
        queue = self._queue
        while queue and queue[0].state != _RUNNING:
            queue.popleft()

    def _arm(self, due_ns: int) -> None:
        clock = self._clock
        delay = clock.wall_at(due_ns) - clock.wall()
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(delay if delay > 0 else REARM_WHILE_HELD_S, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._clock.now_ns()
        queue = self._queue
        while queue:
            head = queue[0]
            if head.state == _RUNNING:
                if head.due_ns > now:
                    self._arm(head.due_ns)
                    return
                head.state = _EXPIRED
                head.task.cancel()  # suspended in its body: the wheel runs between its steps
            queue.popleft()


class Bound:
    """One call under a wheel's bound (what asyncio.timeout's Timeout is, without a timer)."""

    __slots__ = ("_cancelling", "_wheel", "due_ns", "state", "task")

    def __init__(self, wheel: DeadlineWheel) -> None:
        self._wheel = wheel
        self.state = _RUNNING
        self.due_ns = 0

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
