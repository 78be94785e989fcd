"""The cluster manager's servicer over real gRPC on an in-process cm-mini: bad inputs get their
status; WatchAllocations streams what the scheduler changes while the manager is passive. What
the manager does is its engine's (tests/engines/manager/)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import Supernode, running_supernode
from cmemu.v1 import manager_pb2, scheduler_pb2, training_pb2
from tests.engines.manager.test_actions import SCALE, until


async def test_watch_allocations_streams_every_change_of_a_job() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        await clients.manager().SetMode(
            manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
        )
        sched = clients.scheduler()
        stream = sched.WatchAllocations(scheduler_pb2.WatchAllocationsRequest(job="w1"))
        others = sched.WatchAllocations(scheduler_pb2.WatchAllocationsRequest(job=""))
        await until(lambda: _watchers(sn), lambda n: n >= 2)
        alloc = await sched.Allocate(scheduler_pb2.AllocateRequest(job="w1", npus=2))
        await sched.Allocate(scheduler_pb2.AllocateRequest(job="w2", npus=1))
        bad = alloc.npus[1].id
        await sched.MarkFailed(scheduler_pb2.MarkRequest(npu=bad))
        swap = await sched.Replace(scheduler_pb2.ReplaceRequest(job="w1", npu=bad))
        await sched.Release(scheduler_pb2.ReleaseRequest(job="w1"))
        seen = [await _next(stream) for _ in range(4)]
        assert [e.change for e in seen] == ["allocated", "failed", "replaced", "released"]
        assert list(seen[1].npus) == [bad] and seen[1].allocation.npus[1].failed
        assert list(seen[2].npus) == [swap.replaced[0].new_npu]
        assert all(e.allocation.job == "w1" for e in seen)
        assert seen[0].at_ns <= seen[1].at_ns <= seen[3].at_ns
        every = [(await _next(others)).allocation.job for _ in range(2)]
        assert every == ["w1", "w2"]
        stream.cancel()
        others.cancel()


async def _next(stream: Any) -> scheduler_pb2.AllocationEvent:
    event = await stream.read()
    assert isinstance(event, scheduler_pb2.AllocationEvent)
    return event


async def _watchers(sn: Supernode) -> int:
    state = sn.local.service_state(ServiceKind.SCHEDULER)
    assert isinstance(state, SchedulerEngine)
    return len(state.watchers)


async def test_bad_inputs_get_their_status() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.manager().SetMode(manager_pb2.SetModeRequest())
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        training = clients.training()
        cases = [
            (training_pb2.TrainingSpec(name="Bad Name", npus=1), grpc.StatusCode.INVALID_ARGUMENT),
            (training_pb2.TrainingSpec(name="t", npus=0), grpc.StatusCode.INVALID_ARGUMENT),
            (
                training_pb2.TrainingSpec(name="t", npus=2, data_parallel=3),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (training_pb2.TrainingSpec(name="t", npus=1, model="gpt-9"), grpc.StatusCode.NOT_FOUND),
            (training_pb2.TrainingSpec(name="t", npus=999), grpc.StatusCode.OUT_OF_RANGE),
        ]
        for spec, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await training.Start(training_pb2.StartTrainingRequest(spec=spec))
            assert err.value.code() is code, spec
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await training.Get(training_pb2.TrainingRequest(name="nope"))
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        spec = training_pb2.TrainingSpec(name="twice", npus=1)
        await training.Start(training_pb2.StartTrainingRequest(spec=spec))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await training.Start(training_pb2.StartTrainingRequest(spec=spec))
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        stream = clients.scheduler().WatchAllocations(
            scheduler_pb2.WatchAllocationsRequest(job="bad name!")
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
