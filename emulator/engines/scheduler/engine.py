"""The scheduler's engine: jobs take and give back whole NPUs, spares replace failed ones.

The allocation model (emulator/model/scheduler) decides; this engine keeps it for one supernode,
stamps each change with the emulated time, announces it (an event on the scheduler's topic:
allocated, released, replaced, failed, healthy, spares) and hands each change of an allocation
to the watches that follow its job: the single source of truth a workload watches to stop on a
failed NPU and restore onto its replacement. Every change is one synchronous model call, so no
two callers interleave inside one (no lock needed on the event loop).

Domain values in and out (model/scheduler/grants.py, the same the typed client returns), and
EmulatorErrors for every refusal: services/scheduler.py translates them to and from protobuf,
engines/scheduler/local.py hands the engine to callers of this process (the router, the
training jobs, the cluster manager) as the remote scheduler would answer them.

It also runs day plans (serve by day, train by night: dayplans.py), the one thing it does in
the background, when the runtime gives it the router and the training jobs as peers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.dayplan import DayRunner, DayServing, DayTraining
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.outage import Outage
from cmemu.emulator.engines.peers import Marked
from cmemu.emulator.engines.scheduler.dayplans import DayPlanAsk, DayPlans
from cmemu.emulator.model.errors import InvalidArgumentError, UnavailableError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import parse_supernode, service_id
from cmemu.emulator.model.scheduler import POLICIES, Inventory, JobRequest, Scheduler, check_job
from cmemu.emulator.model.scheduler import jobs as held
from cmemu.emulator.model.scheduler.grants import (
    AllocatedNpu,
    Allocation,
    AllocationChange,
    Occupancy,
    PolicyInfo,
    Released,
    Spares,
)
from cmemu.emulator.model.scheduler.jobs import Replacement
from cmemu.emulator.model.topology import ServiceKind, Topology

REASON_DOWN = "SCHEDULER_DOWN"  # a killed scheduler, as its callers in this process meet it


class Watch:
    """An open watch of allocation changes (of one job, or every job): iterate it; `cancel` it
    when done. It follows from the moment it is made, before the first change is asked for."""

    def __init__(self, watchers: dict[asyncio.Queue[AllocationChange], str], job: str) -> None:
        self._watchers = watchers
        self._queue: asyncio.Queue[AllocationChange] = asyncio.Queue()
        watchers[self._queue] = job

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> AllocationChange:
        return await self._queue.get()

    def cancel(self) -> None:
        self._watchers.pop(self._queue, None)


class SchedulerEngine:
    """The allocation state of one supernode, and where its changes are announced."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        events: EventSink | None = None,
        serving: DayServing | None = None,
        training: DayTraining | None = None,
    ) -> None:
        """`serving` and `training`: the router and the training jobs, which the day plans
        move NPUs between (None: a scheduler that runs no day plans, as a unit test builds)."""
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
        # the open watches: each a queue and the job it follows ("" = every job)
        self.watchers: dict[asyncio.Queue[AllocationChange], str] = {}
        # its service down, as the callers of this process meet it (engines/outage.py)
        self.outage = Outage("scheduler", REASON_DOWN)
        self.days = (
            None
            if serving is None or training is None
            else DayPlans(
                profile=profile,
                clock=clock,
                serving=serving,
                training=training,
                publish=self.publish,
            )
        )

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """The day plans' runners, until close(); every other change comes from a caller."""
        if self.days is not None:
            await self.days.run()

    async def close(self) -> None:
        """The day plans end where they are (idempotent)."""
        if self.days is not None:
            await self.days.close()

    def publish(self, event: str, **detail: Any) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- allocations ---------------------------------------------------------------------------

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
        request = JobRequest(
            job=job,
            npus=npus,
            whole_nodes=whole_nodes,
            same_rack=same_rack,
            priority=priority,
            policy=policy,
        )
        record = self.model.allocate(request, self.clock.now_ns())
        grant = self.grant(record)
        self._announce(grant, "allocated", record.npus)
        self.publish(
            "allocated",
            job=record.job,
            npus=len(record.npus),
            nodes=list(grant.nodes),
            policy=record.policy,
        )
        return grant

    async def release(self, job: str) -> Released:
        """Give a job's NPUs back (its failed ones stay out of service)."""
        record = self.model.release(job)
        self._announce(self.grant(record), "released", record.npus)
        self.publish("released", job=record.job, npus=len(record.npus))
        return Released(job=record.job, npus=len(record.npus))

    async def allocation(self, job: str) -> Allocation:
        """One job's allocation (NotFoundError for none)."""
        return self.grant(self.model.get(job))

    async def allocations(self) -> Occupancy:
        model = self.model
        return Occupancy(
            allocations=tuple(self.grant(a) for a in model.allocations()),
            total_npus=model.inventory.size,
            free_npus=model.free_count,
            allocated_npus=model.allocated_count,
            spare_npus=len(model.spares),
            failed_npus=len(model.failed),
        )

    def watch(self, job: str = "") -> Watch:
        """Each change of an allocation (of `job`; empty: every job) from now on."""
        if job:
            check_job(job)
        return Watch(self.watchers, job)

    # --- failures and replacement --------------------------------------------------------------

    async def replace(
        self, job: str, *, npu: str = "", node: str = ""
    ) -> tuple[tuple[Replacement, ...], Allocation]:
        """Swap one NPU of `job`, or all it holds in `node`, for spares (all or nothing): the
        swaps and the allocation after."""
        check_job(job)
        record, swaps = self.model.replace(job, npu=npu, node=node)
        grant = self.grant(record)
        self._announce(grant, "replaced", [s.new for s in swaps])
        self.publish(
            "replaced",
            job=record.job,
            replaced={s.old: s.new for s in swaps},
            spares_left=len(self.model.spares),
        )
        return tuple(swaps), grant

    async def mark_failed(self, *, npu: str = "", node: str = "") -> Marked:
        """Take an NPU (or a node's) out of service; the jobs holding any keep them, flagged."""
        model = self.model
        npus = model.targets(npu=npu, node=node)
        already = set(model.failed)
        fresh = [p for p in npus if p not in already]
        affected = model.mark_failed(npus)
        for job in affected:
            record = model.get(job)
            mine = [p for p in fresh if p in record.npus]
            if mine:
                self._announce(self.grant(record), "failed", mine)
        self.publish("failed", npus=fresh, jobs=affected)
        return Marked(npus=tuple(fresh), affected_jobs=tuple(affected))

    async def mark_healthy(self, *, npu: str = "", node: str = "") -> Marked:
        back = self.model.mark_healthy(self.model.targets(npu=npu, node=node))
        self.publish("healthy", npus=back)
        return Marked(npus=tuple(back))

    # --- spares and policies -------------------------------------------------------------------

    async def spares(self, count: int | None = None) -> Spares:
        """The spare NPUs; with `count`, first reserve that many (fewer frees some)."""
        if count is None:
            return self._spares()
        if count < 0:
            raise InvalidArgumentError(f"count must be >= 0, got {count}", field="count")
        self.model.set_spares(count)
        spares = self._spares()
        self.publish("spares", target=spares.target, npus=list(spares.npus))
        return spares

    async def policies(self) -> list[PolicyInfo]:
        default = self.model.default_policy
        return [
            PolicyInfo(name=p.name, description=p.description, default=p.name == default)
            for p in POLICIES.values()
        ]

    # --- day plans -----------------------------------------------------------------------------

    def day_plans(self) -> DayPlans:
        if self.days is None:
            raise UnavailableError("this scheduler runs no day plans (no peers)")
        return self.days

    async def start_day_plan(self, ask: DayPlanAsk) -> DayRunner:
        return await self.day_plans().start(ask)

    async def day_plan(self, name: str) -> DayRunner:
        return await self.day_plans().status(name)

    async def stop_day_plan(self, name: str) -> DayRunner:
        return self.day_plans().stop(name)

    # --- the values callers see ----------------------------------------------------------------

    def grant(self, record: held.Allocation) -> Allocation:
        """The model's record of an allocation as its callers see it: each NPU with its node,
        rack and dies."""
        inventory = self.inventory
        return Allocation(
            job=record.job,
            npus=tuple(
                AllocatedNpu(
                    id=p,
                    node=inventory.node_of(p),
                    rack=inventory.rack_of(p),
                    dies=tuple(inventory.dies(p)),
                    failed=p in record.failed,
                )
                for p in record.npus
            ),
            nodes=tuple(dict.fromkeys(inventory.node_of(p) for p in record.npus)),
            racks=tuple(sorted({inventory.rack_of(p) for p in record.npus})),
            policy=record.policy,
            priority=record.request.priority,
            whole_nodes=record.request.whole_nodes,
            same_rack=record.request.same_rack,
            allocated_ns=record.allocated_ns,
        )

    def _spares(self) -> Spares:
        return Spares(target=self.model.spare_target, npus=tuple(self.model.spares))

    def _announce(self, grant: Allocation, change: str, npus: tuple[str, ...] | list[str]) -> None:
        """Hand an allocation's change to the watches that follow its job (never blocks: the
        queues are unbounded, and a change is rare next to the calls that make it)."""
        event = AllocationChange(
            change=change, allocation=grant, npus=tuple(npus), at_ns=self.clock.now_ns()
        )
        for queue, job in self.watchers.items():
            if not job or job == grant.job:
                queue.put_nowait(event)
