"""The scheduler of a running emulator as a program (or `cmemu sched`) calls it: allocate,
release, list, replace, spares and policies, with plain values in and out (the day plans:
emulator/client/dayplan.py). Every decision and refusal is the scheduler's; a refusal is the
EmulatorError its status names, the server's message unprefixed."""

from __future__ import annotations

from typing import Any

import grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import error_from, reply_of
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.scheduler.grants import AllocatedNpu as AllocatedNpu  # noqa: PLC0414
from cmemu.emulator.model.scheduler.grants import Allocation as Allocation  # noqa: PLC0414
from cmemu.emulator.model.scheduler.grants import (
    AllocationChange as AllocationChange,  # noqa: PLC0414
)
from cmemu.emulator.model.scheduler.grants import Occupancy as Occupancy  # noqa: PLC0414
from cmemu.emulator.model.scheduler.grants import PolicyInfo as Policy
from cmemu.emulator.model.scheduler.grants import Released as Released  # noqa: PLC0414
from cmemu.emulator.model.scheduler.grants import Spares as Spares  # noqa: PLC0414
from cmemu.emulator.model.scheduler.jobs import Replacement
from cmemu.emulator.model.topology import ServiceKind
from cmemu.v1 import scheduler_pb2, scheduler_pb2_grpc


class SchedulerClient:
    """The scheduler of `clients`' supernode, over its channels (not closed here)."""

    def __init__(
        self, clients: Clients | grpc.aio.Channel, *, timeout_s: float | None = None
    ) -> None:
        """`clients`' scheduler, or the one at the other end of a channel (a service's own,
        shared channel: services/peers.py). `timeout_s`: every unary call's wall deadline
        (None: none); the watch stream has none (it is meant to stay open)."""
        self._timeout_s = timeout_s
        if isinstance(clients, grpc.aio.Channel):
            channel = clients
        else:
            channel = clients.channel_to(clients.topology.service(ServiceKind.SCHEDULER).address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(channel)

    async def allocation(self, job: str) -> Allocation:
        """One job's allocation (NotFoundError for none)."""
        request = scheduler_pb2.GetAllocationRequest(job=job)
        return _allocation(
            await reply_of(None, self._stub.GetAllocation(request, timeout=self._timeout_s))
        )

    def watch(self, job: str = "") -> AllocationChanges:
        """Each change of an allocation (of `job`; empty: every job), as it happens, until
        the stream ends; a broken stream is the EmulatorError its status names (UNIMPLEMENTED:
        an InternalError of that reason, from a scheduler without the stream). The stream
        opens here, before the first item is asked for: a caller may read the state it
        follows in between without missing a change."""
        request = scheduler_pb2.WatchAllocationsRequest(job=job)
        return AllocationChanges(self._stub.WatchAllocations(request))

    async def allocate(
        self,
        job: str,
        npus: int,
        *,
        whole_nodes: bool = False,
        same_rack: bool = False,
        priority: int = 0,
        policy: str = "",
    ) -> Allocation:
        """Whole NPUs for `job` (refused, never partly granted, when they do not fit)."""
        if npus < 1:
            raise InvalidArgumentError(f"npus must be >= 1, got {npus}", field="npus")
        request = scheduler_pb2.AllocateRequest(
            job=job,
            npus=npus,
            whole_nodes=whole_nodes,
            same_rack=same_rack,
            priority=priority,
            policy=policy,
        )
        return _allocation(
            await reply_of(None, self._stub.Allocate(request, timeout=self._timeout_s))
        )

    async def release(self, job: str) -> Released:
        """Give a job's NPUs back (its failed ones stay out of service)."""
        reply = await reply_of(
            None, self._stub.Release(scheduler_pb2.ReleaseRequest(job=job), timeout=self._timeout_s)
        )
        return Released(job=reply.job, npus=reply.npus)

    async def allocations(self) -> Occupancy:
        request = scheduler_pb2.ListAllocationsRequest()
        m = await reply_of(None, self._stub.ListAllocations(request, timeout=self._timeout_s))
        return Occupancy(
            allocations=tuple(_allocation(a) for a in m.allocations),
            total_npus=m.total_npus,
            free_npus=m.free_npus,
            allocated_npus=m.allocated_npus,
            spare_npus=m.spare_npus,
            failed_npus=m.failed_npus,
        )

    async def replace(
        self, job: str, *, npu: str = "", node: str = ""
    ) -> tuple[tuple[Replacement, ...], Allocation]:
        """Swap one NPU of `job`, or all it holds in `node`, for spares (all or nothing): the
        swaps and the allocation after."""
        if bool(npu) == bool(node):
            raise InvalidArgumentError("replace one npu or one node (exactly one)", field="target")
        request = scheduler_pb2.ReplaceRequest(job=job)
        if npu:
            request.npu = npu
        else:
            request.node = node
        m = await reply_of(None, self._stub.Replace(request, timeout=self._timeout_s))
        swaps = tuple(Replacement(old=r.old_npu, new=r.new_npu) for r in m.replaced)
        return swaps, _allocation(m.allocation)

    async def spares(self, count: int | None = None) -> Spares:
        """The spare NPUs; with `count`, first reserve that many (fewer frees some)."""
        if count is None:
            m = await reply_of(
                None,
                self._stub.GetSpares(scheduler_pb2.GetSparesRequest(), timeout=self._timeout_s),
            )
        elif count < 0:
            raise InvalidArgumentError(f"count must be >= 0, got {count}", field="count")
        else:
            request = scheduler_pb2.SetSparesRequest(count=count)
            m = await reply_of(None, self._stub.SetSpares(request, timeout=self._timeout_s))
        return Spares(target=m.target, npus=tuple(m.npus))

    async def policies(self) -> list[Policy]:
        m = await reply_of(
            None,
            self._stub.ListPolicies(scheduler_pb2.ListPoliciesRequest(), timeout=self._timeout_s),
        )
        return [
            Policy(name=p.name, description=p.description, default=p.name == m.default_policy)
            for p in m.policies
        ]


class AllocationChanges:
    """An open WatchAllocations stream: iterate it for the changes; `cancel` it when done (the
    stream stays open until then, or until it ends)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, scheduler_pb2.AllocationEvent]) -> None:
        self._call = call
        self._events = aiter(call)

    def __aiter__(self) -> AllocationChanges:
        return self

    async def __anext__(self) -> AllocationChange:
        try:
            event = await anext(self._events)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from None
        return AllocationChange(
            change=event.change,
            allocation=_allocation(event.allocation),
            npus=tuple(event.npus),
            at_ns=event.at_ns,
        )

    def cancel(self) -> None:
        self._call.cancel()


def _allocation(m: scheduler_pb2.Allocation) -> Allocation:
    return Allocation(
        job=m.job,
        npus=tuple(
            AllocatedNpu(id=n.id, node=n.node, rack=n.rack, dies=tuple(n.dies), failed=n.failed)
            for n in m.npus
        ),
        nodes=tuple(m.nodes),
        racks=tuple(m.racks),
        policy=m.policy,
        priority=m.priority,
        whole_nodes=m.whole_nodes,
        same_rack=m.same_rack,
        allocated_ns=m.allocated_ns,
    )
