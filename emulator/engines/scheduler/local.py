"""The scheduler engine of this process, called as the remote scheduler would be (the other
implementation of the JobScheduler and SchedulerPeer protocols, emulator/engines/peers.py, is
the typed gRPC client): through its outage, so a scheduler service killed, hung, slowed or cut
off in one process looks to the router, the training jobs and the cluster manager as it does
across processes (engines/outage.py; runtime/servicecontrol.py sets it).

A refusal is the engine's EmulatorError, as the typed client raises it from the status: the
same class and reason; for the cluster manager prefixed "scheduler: ", as its remote peer
(emulator/client/control.py) reads a relayed status. An open watch ends as a stream of a
killed server does: UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from cmemu.emulator.engines.peers import Marked
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine, Watch
from cmemu.emulator.model.errors import EmulatorError, relayed
from cmemu.emulator.model.scheduler.grants import Allocation, AllocationChange, Released
from cmemu.emulator.model.scheduler.jobs import Replacement

T = TypeVar("T")
RELAYED_BY = "scheduler"  # the cluster manager's remote peer prefixes its errors so


class LocalScheduler:
    def __init__(self, engine: SchedulerEngine) -> None:
        self.engine = engine
        self.outage = engine.outage

    # --- JobScheduler: a serving deployment, a training job ------------------------------------

    async def allocate(self, job: str, npus: int) -> Allocation:
        return await self.outage.through(self.engine.allocate(job, npus))

    async def allocation(self, job: str) -> Allocation:
        return await self.outage.through(self.engine.allocation(job))

    async def release(self, job: str) -> Released:
        return await self.outage.through(self.engine.release(job))

    def watch(self, job: str = "") -> LocalWatch:
        return LocalWatch(self, job)

    # --- SchedulerPeer: the cluster manager ----------------------------------------------------

    async def mark_failed(self, npu: str) -> Marked:
        return await self._relayed(self.engine.mark_failed(npu=npu))

    async def mark_healthy(self, npu: str) -> Marked:
        return await self._relayed(self.engine.mark_healthy(npu=npu))

    async def replace(self, job: str, npu: str) -> tuple[Replacement, ...]:
        swaps, _ = await self._relayed(self.engine.replace(job, npu=npu))
        return swaps

    async def _relayed(self, call: Awaitable[T]) -> T:
        try:
            return await self.outage.through(call)
        except EmulatorError as exc:
            raise relayed(exc, RELAYED_BY) from exc


class LocalWatch:
    """A watch of the engine's, opened at once (a remote stream opens when called, too). Opened
    while the service is hung or cut off, its first change waits until it is back (as a stream
    held at its server's gate); one opened before flows on (as an open stream does); a kill
    ends it UNAVAILABLE (as its server's stop ends a stream)."""

    def __init__(self, scheduler: LocalScheduler, job: str) -> None:
        self._outage = scheduler.outage
        self._watch: Watch = scheduler.engine.watch(job)
        self._admitted = not self._outage.how

    def __aiter__(self) -> LocalWatch:
        return self

    async def __anext__(self) -> AllocationChange:
        outage = self._outage
        if outage.how == "kill":
            self.cancel()
            raise outage.refusal()
        if not self._admitted:
            if outage.how:
                await outage.admit(None)
            self._admitted = True
        change = asyncio.ensure_future(anext(self._watch))
        killed = asyncio.ensure_future(outage.killed.wait())
        try:
            await asyncio.wait((change, killed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            killed.cancel()
            if not change.done():
                change.cancel()
        if change.done() and not change.cancelled():
            return change.result()
        self.cancel()
        raise outage.refusal()

    def cancel(self) -> None:
        self._watch.cancel()
