"""The scheduler service: protobuf in, the scheduler's engine (emulator/engines/scheduler/) in
between, protobuf out; a refusal is the engine's EmulatorError, mapped to its status by `rpc`.

The day plans' peers, the router and the training jobs, are their engines where this process
hosts them (services/peers.py `day_serving`, `day_training`: through their services' outages,
with the errors the gRPC side gives), else reached over gRPC through the process's shared
channels (which carry the token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, abort, rpc
from cmemu.services.schedwire import (
    allocation_message,
    change_message,
    day_plan_ask,
    day_plan_message,
    occupancy_message,
    policies_message,
    spares_message,
)
from cmemu.v1 import scheduler_pb2, scheduler_pb2_grpc

__all__ = ["SERVICE", "SchedulerServicer", "create_scheduler"]

SERVICE = "cmemu.v1.Scheduler"


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, engine: SchedulerEngine) -> None:
        self.engine = engine

    @rpc
    async def Allocate(
        self, request: scheduler_pb2.AllocateRequest, context: Context
    ) -> scheduler_pb2.Allocation:
        allocation = await self.engine.allocate(
            request.job,
            request.npus,
            whole_nodes=request.whole_nodes,
            same_rack=request.same_rack,
            priority=request.priority,
            policy=request.policy,
        )
        return allocation_message(allocation)

    @rpc
    async def Release(
        self, request: scheduler_pb2.ReleaseRequest, context: Context
    ) -> scheduler_pb2.ReleaseResponse:
        released = await self.engine.release(request.job)
        return scheduler_pb2.ReleaseResponse(job=released.job, npus=released.npus)

    @rpc
    async def ListAllocations(
        self, request: scheduler_pb2.ListAllocationsRequest, context: Context
    ) -> scheduler_pb2.ListAllocationsResponse:
        return occupancy_message(await self.engine.allocations())

    @rpc
    async def GetAllocation(
        self, request: scheduler_pb2.GetAllocationRequest, context: Context
    ) -> scheduler_pb2.Allocation:
        return allocation_message(await self.engine.allocation(request.job))

    @rpc
    async def Replace(
        self, request: scheduler_pb2.ReplaceRequest, context: Context
    ) -> scheduler_pb2.ReplaceResponse:
        swaps, allocation = await self.engine.replace(
            request.job, npu=request.npu, node=request.node
        )
        return scheduler_pb2.ReplaceResponse(
            allocation=allocation_message(allocation),
            replaced=[scheduler_pb2.Replaced(old_npu=s.old, new_npu=s.new) for s in swaps],
        )

    @rpc
    async def MarkFailed(
        self, request: scheduler_pb2.MarkRequest, context: Context
    ) -> scheduler_pb2.MarkResponse:
        marked = await self.engine.mark_failed(npu=request.npu, node=request.node)
        return scheduler_pb2.MarkResponse(npus=marked.npus, affected_jobs=marked.affected_jobs)

    @rpc
    async def MarkHealthy(
        self, request: scheduler_pb2.MarkRequest, context: Context
    ) -> scheduler_pb2.MarkResponse:
        marked = await self.engine.mark_healthy(npu=request.npu, node=request.node)
        return scheduler_pb2.MarkResponse(npus=marked.npus)

    @rpc
    async def GetSpares(
        self, request: scheduler_pb2.GetSparesRequest, context: Context
    ) -> scheduler_pb2.Spares:
        return spares_message(await self.engine.spares())

    @rpc
    async def SetSpares(
        self, request: scheduler_pb2.SetSparesRequest, context: Context
    ) -> scheduler_pb2.Spares:
        return spares_message(await self.engine.spares(request.count))

    async def WatchAllocations(
        self, request: scheduler_pb2.WatchAllocationsRequest, context: Context
    ) -> AsyncIterator[scheduler_pb2.AllocationEvent]:
        """Changes from now on; the stream ends only when the caller cancels it (or the
        scheduler stops). INVALID_ARGUMENT: a malformed job name."""
        try:
            watch = self.engine.watch(request.job)
        except EmulatorError as exc:
            await abort(context, exc)
        try:
            async for change in watch:
                yield change_message(change)
        finally:
            watch.cancel()

    @rpc
    async def ListPolicies(
        self, request: scheduler_pb2.ListPoliciesRequest, context: Context
    ) -> scheduler_pb2.ListPoliciesResponse:
        return policies_message(await self.engine.policies())

    @rpc
    async def StartDayPlan(
        self, request: scheduler_pb2.StartDayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        return day_plan_message(await self.engine.start_day_plan(day_plan_ask(request)))

    @rpc
    async def GetDayPlan(
        self, request: scheduler_pb2.DayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        return day_plan_message(await self.engine.day_plan(request.name))

    @rpc
    async def StopDayPlan(
        self, request: scheduler_pb2.DayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        return day_plan_message(await self.engine.stop_day_plan(request.name))


def create_scheduler(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None,
) -> tuple[SchedulerEngine, ServiceHost]:
    """The scheduler's engine and its server (not started); `peers` host the engine, so the
    callers of this process reach it directly, and reach the router and the training jobs
    for the day plans (directly where this process hosts them, else over gRPC; the scheduler
    calls no device)."""
    engine = SchedulerEngine(
        topology=topology,
        profile=profile,
        clock=clock,
        events=events,
        serving=peers.day_serving(),  # resolved at each call: the router and the manager
        training=peers.day_training(),  # are made after the scheduler
    )
    peers.host_scheduler(engine)
    servicer = SchedulerServicer(engine)
    host = ServiceHost(
        name=engine.name,
        address=address,
        services=[
            (SERVICE, lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s))
        ],
    )
    return engine, host
