"""Emulated time that never outruns the emulator: sleeping in it, and moving it.

- `Timeline` sleeps in emulated time: one loop timer for the earliest sleeper, re-planned when
  the clock's rate or horizon changes, so a wait of 5 emulated seconds lasts 5 emulated seconds
  however the rate moves meanwhile.
- `Governor` (emulator/engines/governor.py) measures how late this process's event loop runs
  and the rate it can keep; the owner's also moves the clock's horizon.
- `ClockAuthority` (the process that owns time: the fabric's, or the only one) takes the rate as
  the slowest wish of every process that reports (its own governor's included), never above the
  asked scale, and streams its segments and horizon to the others; a process that stops
  reporting is forgotten after `stale_s` (a stopped process is a fault, not a slow host).
- `ClockFollower` (every other process) adopts what the authority streams and reports its own
  governor's wish.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog

from cmemu.emulator.engines.governor import Governor
from cmemu.emulator.model.clock import Clock, Segment, check_scale
from cmemu.emulator.model.emulatorprofile import ClockProfile

T = TypeVar("T")
SPIN_S = 0.002  # the last wall milliseconds of a precise wait are spent yielding, not sleeping
REARM_WHILE_HELD_S = 0.005  # a sleeper due past a held horizon looks again this much later
log = structlog.get_logger("cmemu.clock")


class Timeline:
    """Sleepers in emulated time, woken by one loop timer armed for the earliest of them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # the clock's own reading, not a method that calls it: every UB transaction reads the
        # time about five times through a Timeline (a LocalClock sets its own: skewclock.py)
        self.now_ns: Callable[[], int] = clock.now_ns
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: tuple[int, int] | None = None  # (due, clock version) of the timer

    def now_s(self) -> float:
        return self.now_ns() / 1e9

    @property
    def time_scale(self) -> float:
        """The asked scale: a ceiling of the rate."""
        return self.clock.time_scale

    @property
    def epoch_wall_s(self) -> float:
        return self.clock.epoch_wall_s

    async def sleep_until(self, emulated_ns: int) -> None:
        """Return once emulated time reaches `emulated_ns` (at once if it has)."""
        if self.clock.now_ns() >= emulated_ns:
            return
        future = self.alarm(emulated_ns)
        try:
            await future
        finally:
            if not future.done():
                future.cancel()  # dropped lazily by _fire

    def alarm(self, emulated_ns: int) -> asyncio.Future[None]:
        """A future set once emulated time reaches `emulated_ns`: a sleeper that its owner may
        also wake early by setting it (engines/skewclock.py re-plans its sleepers so)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (emulated_ns, next(self._seq), future))
        if self._heap[0][2] is future:
            self._arm()
        return future

    async def sleep(self, emulated_s: float) -> None:
        await self.sleep_until(self.clock.now_ns() + round(max(0.0, emulated_s) * 1e9))

    async def pace(self, emulated_s: float) -> None:
        """Return when emulated time reaches `emulated_s`, to within the event loop's own
        precision: timers are late by up to a millisecond (epoll rounds up), so the last SPIN_S
        of wall time are spent yielding. Time held at a horizon is waited for, not spun on."""
        due_ns = round(emulated_s * 1e9)
        clock = self.clock
        while clock.now_ns() < due_ns:
            left = clock.wall_at(due_ns) - clock.wall()
            if left > SPIN_S:
                await self.sleep_until(due_ns - round(SPIN_S * clock.rate * 1e9))
            elif left > -SPIN_S:
                await asyncio.sleep(0)  # a deliberate sub-ms spin
            else:  # due by the segment, yet held: the owner of time has not moved it on
                await asyncio.sleep(REARM_WHILE_HELD_S)

    async def wait(self, event: asyncio.Event, until_ns: int | None) -> bool:
        """Until `event` is set (True) or emulated time reaches `until_ns` (False); None: for
        the event alone."""
        if event.is_set():
            return True
        if until_ns is None:
            await event.wait()
            return True
        waiter = asyncio.ensure_future(event.wait())
        timer = asyncio.ensure_future(self.sleep_until(until_ns))
        try:
            await asyncio.wait((waiter, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()
        return event.is_set()

    async def timeout(self, awaitable: Awaitable[T], emulated_s: float) -> T:
        """`awaitable`'s result, or TimeoutError once `emulated_s` of emulated time passed."""
        task = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self.sleep(emulated_s))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise TimeoutError(f"{emulated_s} emulated seconds passed")

    def changed(self) -> None:
        """The clock's rate or horizon moved: the earliest sleeper's wall instant with it."""
        self._arm()

    def _arm(self) -> None:
        while self._heap and self._heap[0][2].done():  # cancelled sleepers
            heapq.heappop(self._heap)
        if not self._heap:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._armed_for = None
            return
        due = self._heap[0][0]
        key = (due, self.clock.version)
        if self._timer is not None:
            if self._armed_for == key:
                return
            self._timer.cancel()
        clock = self.clock
        delay = clock.wall_at(due) - clock.wall()
        if delay <= 0:  # due by the segment, but held (a horizon): look again shortly
            delay = REARM_WHILE_HELD_S if clock.now_ns() < due else 0.0
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)
        self._armed_for = key

    def _fire(self) -> None:
        self._timer = self._armed_for = None
        now = self.clock.now_ns()
        while self._heap and (self._heap[0][0] <= now or self._heap[0][2].done()):
            _, _, future = heapq.heappop(self._heap)
            if not future.done():
                future.set_result(None)
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for _, _, future in self._heap:
            future.cancel()
        self._heap.clear()


@dataclass(frozen=True, kw_only=True)
class ClockState:
    """What the authority streams: the segment, how far readers may go, and why."""

    segment: Segment
    horizon_wall_s: float
    time_scale: float
    epoch_wall_s: float


@dataclass
class _Wish:
    """One process's latest wish for the rate, and how late it ran when it asked."""

    rate: float
    lag_s: float
    at_wall_s: float


class ClockAuthority:
    """The rate of every process of one emulator: the slowest fresh wish, at most asked."""

    def __init__(self, clock: Clock, timeline: Timeline, *, profile: ClockProfile) -> None:
        self.clock = clock
        self.timeline = timeline
        self.profile = profile
        # oldest report first (a report moves its process to the end): the stale are a prefix
        self._wishes: dict[str, _Wish] = {}
        self._slowest: tuple[str, float] | None = None  # (process, rate) of the slowest, or unknown
        self._changed = asyncio.Event()
        self.slowest: str = ""  # the process whose wish sets the rate now
        self.worst_lag_s = 0.0  # wall, the worst any process reported
        self.worst_lag_emulated_s = 0.0  # the same at the rate of the moment
        self.silent: list[str] = []  # processes forgotten because they stopped reporting

    def wish(self, process: str, rate: float, lag_s: float) -> None:
        """A process's wish (this one's governor's, or a follower's report). Constant time for
        all but a rise of the slowest's own wish: with a process per device (cm384's 633, two
        reports a second each) a walk over every wish per report cost 6.5% of a core."""
        self._wishes.pop(process, None)
        self._wishes[process] = _Wish(rate=rate, lag_s=lag_s, at_wall_s=time.monotonic())
        slowest = self._slowest
        if slowest is not None and rate <= slowest[1]:
            self._slowest = (process, rate)
        elif slowest is not None and process == slowest[0]:
            self._slowest = None  # it rose: another may be slowest now
        self.worst_lag_s = max(self.worst_lag_s, lag_s)
        self.worst_lag_emulated_s = max(self.worst_lag_emulated_s, lag_s * self.clock.rate)
        if process in self.silent:
            self.silent.remove(process)  # it speaks again
        self._decide()

    def forget(self, process: str) -> None:
        self._drop(process)
        self._decide()

    def _drop(self, process: str) -> None:
        self._wishes.pop(process, None)
        if self._slowest is not None and self._slowest[0] == process:
            self._slowest = None

    def wishes(self) -> dict[str, tuple[float, float]]:
        """Every fresh wish: process -> (rate, lag_s)."""
        self._expire()
        return {k: (w.rate, w.lag_s) for k, w in self._wishes.items()}

    def _expire(self) -> None:
        stale = time.monotonic() - self.profile.stale_s
        gone: list[str] = []
        for process, wish in self._wishes.items():  # oldest first: stop at the first fresh one
            if wish.at_wall_s >= stale:
                break
            gone.append(process)
        for process in gone:
            log.warning("a process stopped reporting its clock: forgotten", process=process)
            self._drop(process)
            self.silent.append(process)

    def _decide(self) -> None:
        self._expire()
        p = self.profile
        asked = self.clock.time_scale
        if self._slowest is None and self._wishes:
            process, wish = min(self._wishes.items(), key=lambda kv: kv[1].rate)
            self._slowest = (process, wish.rate)
        slowest = self._slowest if p.dilation else None  # off: lag is reported, never acted on
        target = asked if slowest is None else min(asked, slowest[1])
        self.slowest = "" if slowest is None or target >= asked else slowest[0]
        current = self.clock.rate
        if target < current:  # slow down at once
            new = target
        elif target > current * p.raise_factor:  # speed up by steps: the lag is measured anew
            new = current * p.raise_factor
        else:
            new = target if target >= asked else current
        if new != current:
            self.clock.set_rate(new)
            self.timeline.changed()
            self._changed.set()

    def state(self) -> ClockState:
        c = self.clock
        return ClockState(
            segment=c.segment,
            horizon_wall_s=c.wall() + self.profile.lease_s,
            time_scale=c.time_scale,
            epoch_wall_s=c.epoch_wall_s,
        )

    async def watch(self) -> AsyncIterator[ClockState]:
        """The clock now, then again at every change and at least every lease_s / 4 (a
        follower holds at the lease's end if the authority goes silent)."""
        while True:
            self._changed.clear()
            yield self.state()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.profile.lease_s / 4):
                    await self._changed.wait()


class ClockSource(Protocol):
    """Where a follower gets time from (the fabric of sn0, in-process or over gRPC)."""

    def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]: ...


class ClockFollower:
    """A process that follows the authority's clock and reports its own governor's wish."""

    def __init__(self, clock: Clock, timeline: Timeline, *, process: str, silence_s: float) -> None:
        self.clock = clock
        self.timeline = timeline
        self.process = process
        # The authority speaks at least every lease_s / 4; a stream silent this long (wall) is
        # stuck, whatever its transport says: it is dropped and opened anew.
        self.silence_s = silence_s
        self._wishes: asyncio.Queue[tuple[float, float]] = asyncio.Queue(maxsize=4)
        self.synced = asyncio.Event()  # the first state arrived
        # wall (monotonic) since the stream broke or fell silent, until a new one speaks: said
        # when it does, so a follower that came back is not read as one that hung (a stream
        # that works logs nothing else)
        self._lost_at: float | None = None

    def wish(self, rate: float, lag_s: float) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # the authority is behind: it has one
            self._wishes.put_nowait((rate, lag_s))

    async def _reports(self) -> AsyncIterator[tuple[float, float]]:
        while True:
            yield await self._wishes.get()

    def adopt(self, state: ClockState) -> None:
        self.clock.adopt(state.segment, state.horizon_wall_s)
        self.timeline.changed()
        self.synced.set()

    async def run(self, source: ClockSource) -> None:
        """Adopt every state the source streams; reconnect when the stream breaks (the
        authority restarting) or falls silent (a partition): the clock holds at the last
        lease meanwhile."""
        while True:
            try:
                await self._follow(source)
            except Exception as exc:
                log.info("clock stream broke; retrying", error=str(exc)[:200])
            if self._lost_at is None:
                self._lost_at = time.monotonic()
            await asyncio.sleep(0.5)

    async def _follow(self, source: ClockSource) -> None:
        states = aiter(source.follow(self.process, self._reports()))
        try:
            while True:
                try:
                    async with asyncio.timeout(self.silence_s):
                        state = await anext(states)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    log.warning("clock stream silent; reconnecting", silent_s=self.silence_s)
                    return
                if self._lost_at is not None:
                    lost_s, self._lost_at = time.monotonic() - self._lost_at, None
                    log.info("clock stream back", after_wall_s=round(lost_s, 1))
                self.adopt(state)
        finally:
            close = getattr(states, "aclose", None)
            if close is not None:
                await close()


class TimeKeeper:
    """This process's emulated time: the clock, its sleepers, the governor measuring this
    loop, and either the authority (this process owns time) or a follower of it."""

    def __init__(self, clock: Clock, *, profile: ClockProfile, process: str, owner: bool) -> None:
        self.clock = clock
        self.profile = profile
        self.process = process
        self.timeline = Timeline(clock)
        self.authority = ClockAuthority(clock, self.timeline, profile=profile) if owner else None
        self.follower = (
            None
            if owner
            else ClockFollower(
                clock, self.timeline, process=process, silence_s=profile.follower_silence_s
            )
        )
        self.governor = Governor(
            clock, self.timeline, profile=profile, owner=owner, wish=self._wish
        )
        if not owner:
            # Until the owner's first segment arrives this process does not know emulated time.
            # A guess from the epoch (wall x time_scale) runs ahead of the owner's time by all
            # that dilation cut, and a reading once given out is a floor (never backwards), so
            # a process started late (a restarted container, a replay, a chaos runner) stood
            # still until the owner's time caught up with its guess: minutes at a high time
            # scale on a busy host, its heartbeats silent meanwhile. It reads 0 instead, held,
            # and its sleepers wait for the first segment.
            clock.hold_until(clock.epoch_wall_s)
        self.cap = math.inf  # the fastest rate wished whatever this loop could keep (limit())
        self._measured = (math.inf, 0.0)  # the governor's last wish, before the cap

    def limit(self, rate: float | None) -> None:
        """Wish emulated time no faster than `rate` while this process reports (None: only
        what its loop can keep). A wish like a lagging loop's, so it slows every process of the
        emulator alike: how a chaos run holds its steps and traffic to a pace of its own below
        the emulator's time scale, after its set-up (weights loading) ran at full speed."""
        self.cap = math.inf if rate is None else check_scale(rate)
        self._wish(*self._measured)

    def _wish(self, rate: float, lag_s: float) -> None:
        self._measured = (rate, lag_s)
        rate = min(rate, self.cap)
        if self.authority is not None:
            self.authority.wish(self.process, rate, lag_s)
        elif self.follower is not None:
            self.follower.wish(rate, lag_s)

    async def run(self, source: ClockSource | None = None) -> None:
        """Measure this loop and move (or follow) time, until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.governor.run(), name="clock-governor")
            if self.follower is not None and source is not None:
                tasks.create_task(self.follower.run(source), name="clock-follower")

    def close(self) -> None:
        self.timeline.close()
