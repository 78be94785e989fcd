"""The scheduler service: jobs take and give back whole NPUs, spares replace failed ones.

Protobuf in, the allocation model (emulator/model/scheduler) in between, protobuf out. Every
change is one synchronous model call, so no two RPCs interleave inside one (no lock needed on the
event loop). Each change publishes an event on the scheduler's topic (allocated, released,
replaced, failed, healthy, spares) for controllers and the chaos runner to follow, and each
change of an allocation goes to its WatchAllocations streams: the single source of truth a
workload watches to stop on a failed NPU and restore onto its replacement.

The scheduler also runs day plans (serve by day, train by night: services/dayplans.py), the one
thing it does in the background: at nightfall and in the morning a plan moves NPUs between a
deployment of the router and a training job, through their services.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.model.errors import EmulatorError, UnavailableError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import parse_supernode, service_id
from cmemu.emulator.model.scheduler import (
    POLICIES,
    Allocation,
    Inventory,
    JobRequest,
    Scheduler,
    check_job,
)
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.services.dayplans import DayPlans
from cmemu.services.dayplans import message as dayplan_message
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, abort, rpc
from cmemu.v1 import scheduler_pb2, scheduler_pb2_grpc

__all__ = ["SERVICE", "SchedulerServicer", "SchedulerState", "create_scheduler"]

SERVICE = "cmemu.v1.Scheduler"


class SchedulerState:
    """The allocation state of one supernode, and where its changes are announced."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        events: EventSink | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.name = service_id(
            ServiceKind.SCHEDULER.value, supernode=parse_supernode(topology.supernode)
        )
        self.clock = clock
        self.events = events
        self.inventory = Inventory.from_topology(topology, profile)
        spares = min(
            profile.scheduler.spares_per_rack * len(self.inventory.racks), self.inventory.size
        )
        self.model = Scheduler(self.inventory, spares=spares)
        # WatchAllocations streams: each a queue and the job it follows ("" = every job)
        self.watchers: dict[asyncio.Queue[scheduler_pb2.AllocationEvent], str] = {}
        # serve by day, train by night: its plans move NPUs through the router and the
        # training jobs (None: a scheduler without peers, as a unit test builds one)
        self.days = (
            None
            if peers is None
            else DayPlans(
                topology=topology, profile=profile, clock=clock, peers=peers, publish=self.publish
            )
        )

    def publish(self, event: str, **detail: Any) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    def announce(self, allocation: scheduler_pb2.Allocation, change: str, npus: list[str]) -> None:
        """Hand an allocation's change to the streams that follow its job (never blocks: the
        queues are unbounded, and a change is rare next to the RPCs that make it)."""
        event = scheduler_pb2.AllocationEvent(
            allocation=allocation, change=change, npus=npus, at_ns=self.clock.now_ns()
        )
        for queue, job in self.watchers.items():
            if not job or job == allocation.job:
                queue.put_nowait(event)

    async def run(self) -> None:
        """The day plans' runners, until close(); every other change comes from an RPC."""
        if self.days is not None:
            await self.days.run()

    async def close(self) -> None:
        """The day plans end where they are (idempotent)."""
        if self.days is not None:
            await self.days.close()

    def day_plans(self) -> DayPlans:
        if self.days is None:
            raise UnavailableError("this scheduler runs no day plans (no peers)")
        return self.days

    def message(self, allocation: Allocation) -> scheduler_pb2.Allocation:
        inventory = self.inventory
        nodes = list(dict.fromkeys(inventory.node_of(p) for p in allocation.npus))
        racks = sorted({inventory.rack_of(p) for p in allocation.npus})
        return scheduler_pb2.Allocation(
            job=allocation.job,
            npus=[
                scheduler_pb2.AllocatedNpu(
                    id=p,
                    node=inventory.node_of(p),
                    rack=inventory.rack_of(p),
                    dies=inventory.dies(p),
                    failed=p in allocation.failed,
                )
                for p in allocation.npus
            ],
            nodes=nodes,
            racks=racks,
            policy=allocation.policy,
            priority=allocation.request.priority,
            whole_nodes=allocation.request.whole_nodes,
            same_rack=allocation.request.same_rack,
            allocated_ns=allocation.allocated_ns,
        )

    def spares(self) -> scheduler_pb2.Spares:
        return scheduler_pb2.Spares(target=self.model.spare_target, npus=self.model.spares)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    @property
    def model(self) -> Scheduler:
        return self.state.model

    @rpc
    async def Allocate(
        self, request: scheduler_pb2.AllocateRequest, context: Context
    ) -> scheduler_pb2.Allocation:
        job = JobRequest(
            job=request.job,
            npus=request.npus,
            whole_nodes=request.whole_nodes,
            same_rack=request.same_rack,
            priority=request.priority,
            policy=request.policy,
        )
        allocation = self.model.allocate(job, self.state.clock.now_ns())
        reply = self.state.message(allocation)
        self.state.announce(reply, "allocated", list(allocation.npus))
        self.state.publish(
            "allocated",
            job=allocation.job,
            npus=len(allocation.npus),
            nodes=list(reply.nodes),
            policy=allocation.policy,
        )
        return reply

    @rpc
    async def Release(
        self, request: scheduler_pb2.ReleaseRequest, context: Context
    ) -> scheduler_pb2.ReleaseResponse:
        allocation = self.model.release(request.job)
        self.state.announce(self.state.message(allocation), "released", list(allocation.npus))
        self.state.publish("released", job=allocation.job, npus=len(allocation.npus))
        return scheduler_pb2.ReleaseResponse(job=allocation.job, npus=len(allocation.npus))

    @rpc
    async def ListAllocations(
        self, request: scheduler_pb2.ListAllocationsRequest, context: Context
    ) -> scheduler_pb2.ListAllocationsResponse:
        model = self.model
        return scheduler_pb2.ListAllocationsResponse(
            allocations=[self.state.message(a) for a in model.allocations()],
            total_npus=model.inventory.size,
            free_npus=model.free_count,
            allocated_npus=model.allocated_count,
            spare_npus=len(model.spares),
            failed_npus=len(model.failed),
        )

    @rpc
    async def GetAllocation(
        self, request: scheduler_pb2.GetAllocationRequest, context: Context
    ) -> scheduler_pb2.Allocation:
        return self.state.message(self.model.get(request.job))

    @rpc
    async def Replace(
        self, request: scheduler_pb2.ReplaceRequest, context: Context
    ) -> scheduler_pb2.ReplaceResponse:
        check_job(request.job)
        allocation, swaps = self.model.replace(request.job, npu=request.npu, node=request.node)
        self.state.announce(self.state.message(allocation), "replaced", [s.new for s in swaps])
        self.state.publish(
            "replaced",
            job=allocation.job,
            replaced={s.old: s.new for s in swaps},
            spares_left=len(self.model.spares),
        )
        return scheduler_pb2.ReplaceResponse(
            allocation=self.state.message(allocation),
            replaced=[scheduler_pb2.Replaced(old_npu=s.old, new_npu=s.new) for s in swaps],
        )

    @rpc
    async def MarkFailed(
        self, request: scheduler_pb2.MarkRequest, context: Context
    ) -> scheduler_pb2.MarkResponse:
        npus = self.model.targets(npu=request.npu, node=request.node)
        already = set(self.model.failed)
        fresh = [p for p in npus if p not in already]
        affected = self.model.mark_failed(npus)
        for job in affected:
            allocation = self.model.get(job)
            mine = [p for p in fresh if p in allocation.npus]
            if mine:
                self.state.announce(self.state.message(allocation), "failed", mine)
        self.state.publish("failed", npus=fresh, jobs=affected)
        return scheduler_pb2.MarkResponse(npus=fresh, affected_jobs=affected)

    @rpc
    async def MarkHealthy(
        self, request: scheduler_pb2.MarkRequest, context: Context
    ) -> scheduler_pb2.MarkResponse:
        npus = self.model.targets(npu=request.npu, node=request.node)
        back = self.model.mark_healthy(npus)
        self.state.publish("healthy", npus=back)
        return scheduler_pb2.MarkResponse(npus=back)

    @rpc
    async def GetSpares(
        self, request: scheduler_pb2.GetSparesRequest, context: Context
    ) -> scheduler_pb2.Spares:
        return self.state.spares()

    @rpc
    async def SetSpares(
        self, request: scheduler_pb2.SetSparesRequest, context: Context
    ) -> scheduler_pb2.Spares:
        self.model.set_spares(request.count)
        reply = self.state.spares()
        self.state.publish("spares", target=reply.target, npus=list(reply.npus))
        return reply

    async def WatchAllocations(
        self, request: scheduler_pb2.WatchAllocationsRequest, context: Context
    ) -> AsyncIterator[scheduler_pb2.AllocationEvent]:
        """Changes from now on; the stream ends only when the caller cancels it (or the
        scheduler stops). INVALID_ARGUMENT: a malformed job name."""
        if request.job:
            try:
                check_job(request.job)
            except EmulatorError as exc:
                await abort(context, exc)
        queue: asyncio.Queue[scheduler_pb2.AllocationEvent] = asyncio.Queue()
        self.state.watchers[queue] = request.job
        try:
            while True:
                yield await queue.get()
        finally:
            self.state.watchers.pop(queue, None)

    @rpc
    async def ListPolicies(
        self, request: scheduler_pb2.ListPoliciesRequest, context: Context
    ) -> scheduler_pb2.ListPoliciesResponse:
        return scheduler_pb2.ListPoliciesResponse(
            policies=[
                scheduler_pb2.PolicyInfo(name=p.name, description=p.description)
                for p in POLICIES.values()
            ],
            default_policy=self.model.default_policy,
        )

    @rpc
    async def StartDayPlan(
        self, request: scheduler_pb2.StartDayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        runner = await self.state.day_plans().start(request)
        return dayplan_message(runner)

    @rpc
    async def GetDayPlan(
        self, request: scheduler_pb2.DayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        return await self.state.day_plans().status(request.name)

    @rpc
    async def StopDayPlan(
        self, request: scheduler_pb2.DayPlanRequest, context: Context
    ) -> scheduler_pb2.DayPlan:
        return await self.state.day_plans().stop(request.name)


def create_scheduler(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None,
) -> tuple[SchedulerState, ServiceHost]:
    """The scheduler's state and its server (not started). `peers` reach the router and the
    training jobs for the day plans (the scheduler calls no device)."""
    state = SchedulerState(
        topology=topology, profile=profile, clock=clock, events=events, peers=peers
    )
    servicer = SchedulerServicer(state)
    host = ServiceHost(
        name=state.name,
        address=address,
        services=[
            (SERVICE, lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s))
        ],
    )
    return state, host
