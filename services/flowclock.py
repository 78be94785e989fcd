"""The live-flow clock: flows in flight, timed max-min fairly and finished in emulated time.

One piece shared by every timing authority: the fabric (the UB plane of a supernode) and the
gateway of sn0 (the RDMA scale-out plane). Each owns its link graph and its faults; this owns
the flows (emulator/model/flowsim.py `LiveFlows`), the futures of the callers waiting for them,
and the loop that wakes when the next flow completes. A caller hands it a route's resources and
ceiling, awaits the emulated completion instant, then paces its reply to the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import numpy.typing as npt

from emulator.model.clock import Clock
from emulator.model.errors import UnavailableError
from emulator.model.flowsim import LiveFlows

SPIN_S = 0.002
FloatArray = npt.NDArray[np.float64]
Incidence = tuple[tuple[int, float], ...]


async def pace(clock: Clock, emulated_s: float) -> None:
    """Return when the wall clock reaches emulated_s. The event loop's timers are late by up
    to a millisecond (epoll rounds up), so the last SPIN_S are spent yielding instead."""
    due_wall = clock.wall_at(round(emulated_s * 1e9))
    delay = due_wall - clock.wall()
    if delay > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    while clock.wall() < due_wall:  # noqa: ASYNC110 - a deliberate sub-ms spin
        await asyncio.sleep(0)


class FlowClock:
    """The flows of one timing authority, advanced by its emulated clock (one event loop)."""

    def __init__(self, *, clock: Clock, res_cap: FloatArray, cut_message: str) -> None:
        self.clock = clock
        self.live = LiveFlows(res_cap=res_cap, now_s=self.now_s())
        self._cut_message = cut_message  # what a flow whose route a fault cut fails with
        self._waiters: dict[int, tuple[asyncio.Future[float], float]] = {}
        self._closing = False
        self._changed = asyncio.Event()

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    async def run_flow(
        self, resources: Incidence, cap: float, latency_s: float, nbytes: int, start_s: float
    ) -> float:
        """Emulated completion time (seconds) of a flow, returned once the flow has finished:
        its fluid end on the shared resources plus its route's latency."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        flow_id, finished = self.live.add(start_s, resources, cap, float(nbytes))
        self._waiters[flow_id] = (future, latency_s)
        self._finish(finished)
        self._wake()
        return await future

    async def pace(self, emulated_s: float) -> None:
        """Return when the wall clock reaches emulated_s."""
        await pace(self.clock, emulated_s)

    def _finish(self, finished: list[tuple[int, float]]) -> None:
        for flow_id, fluid_end_s in finished:
            future, latency_s = self._waiters.pop(flow_id)
            if not future.done():
                future.set_result(fluid_end_s + latency_s)

    def _wake(self) -> None:
        """Tell the clock loop that the next event may have moved."""
        self._changed.set()

    async def run(self) -> None:
        """Sleep until the next flow completes or the flows change, bring the flows up to the
        present, repeat, until close(). Timers are late by up to a millisecond (epoll rounds
        up), so the last SPIN_S before a completion are spent yielding instead."""
        while not self._closing:
            self._changed.clear()
            next_s = self.live.next_event_s()
            if next_s is None:
                await self._changed.wait()
                continue
            due = self.clock.wall_at(round(next_s * 1e9))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, due - self.clock.wall() - SPIN_S)):
                    await self._changed.wait()
            while not self._changed.is_set() and self.clock.wall() < due:  # noqa: ASYNC110
                await asyncio.sleep(0)
            self.sync()

    def sync(self) -> None:
        """Bring the flows up to the emulated present."""
        self._finish(self.live.advance(max(self.now_s(), self.live.now_s)))

    def set_capacities(self, res_cap: FloatArray) -> None:
        """Faults changed the resources: finish what finished, share the new capacities, and
        fail the flows left with no bandwidth at all (UNAVAILABLE)."""
        finished, stalled = self.live.set_capacities(res_cap, max(self.now_s(), self.live.now_s))
        self._finish(finished)
        for flow_id in stalled:
            future, _ = self._waiters.pop(flow_id)
            if not future.done():
                future.set_exception(UnavailableError(self._cut_message))
        self._wake()

    def close(self, message: str) -> None:
        """End the clock loop; flows still in flight end UNAVAILABLE with `message`."""
        self._closing = True
        self._changed.set()
        for future, _ in self._waiters.values():
            if not future.done():
                future.set_exception(UnavailableError(message))
        self._waiters.clear()
