"""A training job started again under its name after a run whose NPUs the scheduler still
holds, over real gRPC on an in-process cm-mini. A job's state says `stopped` before its runner has
given its NPUs back (a start right then found them held: FAILED_PRECONDITION "already holds 2
NPUs", once in CI), and a release the scheduler never answered left them held for good. A start
now awaits the old runner's end and releases what is left under the name. The race itself is
not reproducible on demand; its deterministic twin is: the scheduler down while the job ends
(seen failing without the fix)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from cmemu.emulator.client import faults
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import scheduler_pb2, training_pb2
from tests.services.test_serving_recovery import _until

T = TypeVar("T")


async def _retried(call: Callable[[], Awaitable[T]]) -> T:
    """`call` again while UNAVAILABLE: the training service's channel to a scheduler that just
    came back reconnects within a second (a bound only stops a hung test)."""
    async with asyncio.timeout(60):
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
            await asyncio.sleep(0.2)


async def test_npus_a_release_never_gave_back_are_released_by_the_next_start() -> None:
    """The deterministic case: the scheduler is down while the job ends, so the runner's release
    is refused (UNAVAILABLE) and the scheduler, back with its memory, still holds the NPUs. The
    next start under the name releases them (before: FAILED_PRECONDITION, for good)."""
    async with running_supernode("cm-mini", time_scale=50.0) as sn:
        training, scheduler = sn.clients.training(), sn.clients.scheduler()
        spec = training_pb2.TrainingSpec(name="orphan", npus=2, steps=0, checkpoint_every=100)
        await training.Start(training_pb2.StartTrainingRequest(spec=spec))
        down = await faults.inject(sn.clients, "service-kill", "scheduler")
        await training.Stop(training_pb2.TrainingRequest(name="orphan"))
        get = training_pb2.TrainingRequest(name="orphan")
        await _until(sn, lambda: training.Get(get), lambda j: j.state in ("stopped", "failed"))
        await faults.clear(sn.clients, down.id)
        listing = scheduler_pb2.ListAllocationsRequest()
        held = await scheduler.ListAllocations(listing, wait_for_ready=True, timeout=60)
        assert [(a.job, len(a.npus)) for a in held.allocations] == [("orphan", 2)]  # left held
        start = training_pb2.StartTrainingRequest(spec=spec)
        again = await _retried(lambda: training.Start(start))  # its channel reconnecting
        assert len(again.npus) == 2
        held = await scheduler.ListAllocations(scheduler_pb2.ListAllocationsRequest())
        assert [(a.job, len(a.npus)) for a in held.allocations] == [("orphan", 2)]
