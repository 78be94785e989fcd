"""The live-flow clock: flows in flight, timed max-min fairly and finished in emulated time.

One piece shared by every timing authority: the fabric (the UB plane of a supernode) and the
gateway of sn0 (the RDMA scale-out plane). Each owns its link graph and its faults; this owns
the flows (emulator/model/flowsim.py `LiveFlows`), the futures of the callers waiting for them,
and the loop that wakes when the next flow completes. A caller hands it a route's resources and
ceiling, awaits the emulated completion instant, then paces its reply to the clock.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.flowsim import Incidence, LiveFlows

FloatArray = npt.NDArray[np.float64]


class FlowClock:
    """The flows of one timing authority, advanced by its emulated clock (one event loop)."""

    def __init__(self, *, clock: Timeline, res_cap: FloatArray, cut_message: str) -> None:
        self.clock = clock
        self.live = LiveFlows(res_cap=res_cap, now_s=self.now_s())
        self._cut_message = cut_message  # what a flow whose route a fault cut fails with
        self._waiters: dict[int, tuple[asyncio.Future[float], float]] = {}
        self._closing = False
        self._closed = ""  # why no flow runs any more (close's message)
        self._changed = asyncio.Event()
        self._settling = False  # a _settle is scheduled

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    async def run_flow(
        self, resources: Incidence, cap: float, latency_s: float, nbytes: int, start_s: float
    ) -> float:
        """Emulated completion time (seconds) of a flow, returned once the flow has finished:
        its fluid end on the shared resources plus its route's latency. Once closed, refused
        (a call still arriving while its server stops)."""
        if self._closing:
            raise UnavailableError(self._closed)
        # alone and ended already (a device's copy within itself, a UB transaction on a quiet
        # fabric): answered now, not after the event-loop round that settles shared flows
        ended = self.live.ended_alone(start_s, resources, cap, float(nbytes), self.now_s())
        if ended is not None:
            return ended + latency_s
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        flow_id, finished = self.live.add(start_s, resources, cap, float(nbytes))
        self._waiters[flow_id] = (future, latency_s)
        self._finish(finished)
        self._wake()
        return await future

    def ended_now(
        self, resources: Incidence, cap: float, latency_s: float, nbytes: int, start_s: float
    ) -> float | None:
        """What run_flow would answer at once, asked without running the flow: the emulated
        completion time of a flow alone that has ended by now (LiveFlows.take_alone), else None
        (then run_flow runs it). Counted by `count_ended`, once the flow is applied."""
        if self._closing:
            return None
        end = self.live.take_alone(start_s, resources, cap, float(nbytes), self.now_s())
        return None if end is None else end + latency_s

    def count_ended(self, resources: Incidence, nbytes: int) -> None:
        """A flow `ended_now` answered for has been applied: completed and carried, as run_flow
        counts it."""
        self.live.count_alone(resources, float(nbytes))

    def _finish(self, finished: list[tuple[int, float]]) -> None:
        for flow_id, fluid_end_s in finished:
            future, latency_s = self._waiters.pop(flow_id)
            if not future.done():
                future.set_result(fluid_end_s + latency_s)

    def _wake(self) -> None:
        """The next event may have moved: settle the flows once this round of the event loop is
        done (every flow that arrived in it is in by then, so flows issued together share)."""
        if self._settling:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs (a caller outside one): the clock loop settles
            self._changed.set()
            return
        self._settling = True
        loop.call_soon(self._settle)

    def _settle(self) -> None:
        """Bring the flows up to the present: a small flow (a UB transaction beside others) has
        ended by then, and its caller is answered with no round of the clock loop (its tasks,
        futures and timer cost more than the transaction). The loop is woken only for what is
        still in flight; with nothing left, a wake it had scheduled finds nothing to do."""
        self._settling = False
        if self._closing:
            return
        self.sync()
        if self.live.flows:
            self._changed.set()

    async def run(self) -> None:
        """Wait until the next flow completes or the flows change, bring the flows up to the
        present, repeat, until close()."""
        while not self._closing:
            self._changed.clear()
            next_s = self.live.next_event_s()
            if next_s is None:
                await self._changed.wait()
                continue
            changed = asyncio.ensure_future(self._changed.wait())
            due = asyncio.ensure_future(self.clock.pace(next_s))
            try:
                await asyncio.wait((changed, due), return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                due.cancel()
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
        self._closed = message
        self._changed.set()
        for future, _ in self._waiters.values():
            if not future.done():
                future.set_exception(UnavailableError(message))
        self._waiters.clear()
        # their flows go with them: a flow left behind would finish later with nobody waiting
        # (a KeyError in whichever caller's flow finished it, and that caller's flow lost)
        self.live.drop_all()
