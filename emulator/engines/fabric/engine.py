"""The fabric: the timing authority every UB transaction and collective crosses.

A transfer is routed over the link graph, its target checks it (a bad address fails at once and
nothing is timed for it), it is priced by its op and its target's memory, run as a flow that shares
every trunk it crosses max-min fairly with the flows in flight, applied by the target at the flow's
completion, and answered when emulated time reaches that completion. Collectives are timed whole
(engines/fabric/collectives.py). Faults change the graph's live capacities; the fault clock flips
flapping links and ends expiring faults at their emulated instants.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.fabric.lazygraph import LazyGraph
from cmemu.emulator.engines.fabric.outage import fabric_outage
from cmemu.emulator.engines.fabric.plans import Plans
from cmemu.emulator.engines.fabric.types import LinkStats
from cmemu.emulator.engines.peers import CollectiveOutcome, DevicePeer, Directory, FlowTime
from cmemu.emulator.model.arrivals import ArrivalBatch, ArrivalLog
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.costmodel import check_duration
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    blame,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.linkfaults import FaultSpec, RankState
from cmemu.emulator.model.route import Route
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.model.ub import CHECKED_BY_APPLYING, Completion, Op, Transaction, normalize

if TYPE_CHECKING:  # the numpy side (the graph, its collectives and metrics): made at first use
    from cmemu.emulator.engines.fabric.metrics import LinkGroups
    from cmemu.emulator.model.collectives import CollectiveTiming
    from cmemu.emulator.model.endpoints import Endpoint


def route_cut(subject: str | None) -> contextlib.AbstractContextManager[None]:
    """A route that fabric faults cut: UNAVAILABLE, and worth retrying once the fault clears."""
    return blame(
        subject=subject, reason="ROUTE_CUT", retry_after_s=RETRY_AFTER_S, on=UnavailableError
    )


def _flow_times(ranks: Sequence[Endpoint], timing: CollectiveTiming) -> tuple[FlowTime, ...]:
    return tuple(
        FlowTime(
            src=ranks[int(a)].name,
            dst=ranks[int(b)].name,
            bytes=int(n),
            complete_ns=round(t * 1e9),
            gb_s=float(g),
        )
        for a, b, n, t, g in zip(
            timing.flow_src,
            timing.flow_dst,
            timing.flow_bytes,
            timing.flow_complete_s,
            timing.flow_gb_s,
            strict=True,
        )
    )


async def _delivered(
    fabric: FabricEngine,
    target: DevicePeer,
    tx: Transaction,
    route: Route,
    deadline_s: float | None,
) -> tuple[Completion, float]:
    """A transfer checked by its target (a bad address fails at once, nothing is timed for it),
    run as a flow, and applied by the target when the flow completes (a transfer that fails
    applies nothing, and a READ returns the bytes as of its completion); and its emulated
    completion (s).

    A flow alone that has ended already (a device's copy within itself, EMS's; a UB transaction
    on a quiet fabric: FlowClock.ended_now) has nothing to wait for between the check and the
    applying: it is delivered once, for an op whose applying checks what the check would
    (CHECKED_BY_APPLYING), refused as the check would refuse it and counted completed only once
    applied."""
    flows = fabric.flows
    start_s = tx.issue_ns / 1e9
    if tx.op in CHECKED_BY_APPLYING:
        ended_s = flows.ended_now(route.resources, route.cap, route.latency_s, tx.size, start_s)
        if ended_s is not None:
            completion = await target.deliver(
                tx, check_only=False, deadline_s=deadline_s, timed=True
            )
            flows.count_ended(route.resources, tx.size)
            return completion, ended_s
    await target.deliver(tx, check_only=True, deadline_s=deadline_s, timed=True)
    complete_s = await fabric.run_flow(route, tx.size, start_s)
    if tx.op is Op.SEND:  # its message arrives when the flow completed, contention and all
        tx = dataclasses.replace(tx, arrive_ns=round(complete_s * 1e9))
    return await target.deliver(tx, check_only=False, deadline_s=deadline_s, timed=True), complete_s


class FabricEngine(LazyGraph):
    """The link graph, its faults and the flows in flight, driven by the emulated clock."""

    name = "fabric"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Directory,
        events: EventSink | None = None,
    ) -> None:
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.events = events
        super().__init__()  # the link graph: made at its first use (lazygraph.py)
        self.plans = Plans(topology, profile)  # each transfer's route and ends, per live state
        self.outage = fabric_outage()  # its service down, as its callers in this process meet it
        self.arrivals = ArrivalLog(profile.limits.collective_arrivals_kept)
        # link-stats tables computed (GetLinkStats, each WatchLinkStats table): what watching
        # the links costs, seen in /metrics (a web view with no page open asks for none)
        self.link_tables = 0
        self._closing = False
        self._faults_moved = asyncio.Event()  # the fault clock re-plans
        self._ranks_moved = asyncio.Event()  # set and replaced when any fault changes
        self._groups: LinkGroups | None = None  # for metrics(), made at the first scrape
        self.log = structlog.get_logger("cmemu.fabric").bind(device="fabric")

    def metrics(self) -> list[Family]:
        """What /metrics shows of the fabric (metrics.py: numpy's, imported at the first scrape)."""
        from cmemu.emulator.engines.fabric.metrics import LinkGroups, fabric_families

        if self._groups is None:
            self._groups = LinkGroups(self)
        return fabric_families(self, self._groups)

    def link_stats(self, top: int) -> LinkStats:
        """The `top` links that carried the most bytes (GetLinkStats): numpy's, as metrics()."""
        from cmemu.emulator.engines.fabric.usage import link_stats

        return link_stats(self, top)

    def publish(self, event: str, **detail: str) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- transfers -----------------------------------------------------------------------------

    async def transfer(self, request: Transaction, *, deadline_s: float | None) -> Completion:
        """Route, deliver, time and pace one transaction."""
        tx = normalize(request, self.profile.limits.inline_payload_max_bytes)
        if not tx.src_eid:
            raise InvalidArgumentError(
                "src_eid is required: a transfer is issued by a device", field="src_eid"
            )
        src, dst, route, other_way_cut = self.plans.plan(self.graph, tx)
        seconds = route.latency_s + tx.size / route.cap if route.cap > 0 else float("inf")
        try:
            check_duration(seconds, "the transfer", self.profile)
        except EmulatorError as exc:
            exc.annotate(field="size")
            raise
        now = self.clock.now_ns()
        oldest = now - round(self.clock.clock.rate * self.profile.clock.stamp_max_age_s * 1e9)
        # never from the future, nor from further back than a transit: a wrong clock's
        issue_ns = tx.issue_ns if max(0, oldest) < tx.issue_ns <= now else now
        if issue_ns != tx.issue_ns:  # a copy only when the stamp changes (not on the hot path)
            tx = dataclasses.replace(tx, issue_ns=issue_ns)
        peer = self.peers.device(dst)
        completion, complete_s = await _delivered(self, peer, tx, route, deadline_s)
        if self.clock.now_ns() < round(complete_s * 1e9):  # pace's own test: no coroutine when due
            await self.clock.pace(complete_s)  # the reply waits for the clock, not the data
        if other_way_cut:
            raise UnavailableError(
                f"delivered at {dst.id}, but its acknowledgement never reaches {src.id}: "
                "a one-way partition (the data is there; a retry applies it again)",
                subject=f"{src.id}>{dst.id}",
                reason="ACK_LOST",
                retry_after_s=RETRY_AFTER_S,
            )
        completion.issue_ns = issue_ns
        completion.complete_ns = round(complete_s * 1e9)
        completion.path = tuple(route.hops)
        completion.planes = route.planes
        return completion

    async def run_flow(self, route: Route, nbytes: int, start_s: float) -> float:
        """Emulated completion time (seconds) of a flow, returned once the flow has finished."""
        return await self.flows.run_flow(
            route.resources, route.cap, route.latency_s, nbytes, start_s
        )

    # --- collectives ---------------------------------------------------------------------------

    async def collective(
        self, rank_names: Sequence[str], spec: CollectiveSpec, *, detail: bool = False
    ) -> CollectiveOutcome:
        """Time a collective whole, and answer when emulated time reaches its end. `detail`:
        the caller wants every flow's timing, which is refused past a bound before any wait."""
        from cmemu.emulator.model.linkgraph import validate_ranks  # made with the graph by now

        with (
            blame(field="ranks", reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="ranks"),
        ):
            ranks = validate_ranks(self.graph, list(rank_names))
        state = await self._live_ranks([e.name for e in ranks])
        issue_ns = self.clock.now_ns()
        started = time.perf_counter()
        with route_cut(None):  # CPU-bound for large groups: off the event loop
            timing = await self.collectives.time(ranks, spec)
        compute_ms = (time.perf_counter() - started) * 1e3
        limit = self.profile.limits.collective_detail_max_flows
        if detail and timing.flows > limit:
            raise InvalidArgumentError(
                f"flow_detail is limited to {limit} flows; this has {timing.flows}",
                field="flow_detail",
            )
        self.collectives.carried += timing.res_bytes
        # a slowed rank's share of the per-phase software work, run on every rank, waits for it
        overhead_s = timing.overhead_s / state.compute_share
        duration_ns = round((timing.transfer_s + overhead_s) * 1e9)
        self._arrived(ranks, spec, issue_ns, timing.overhead_s, state)
        await self.clock.pace((issue_ns + duration_ns) / 1e9)
        return CollectiveOutcome(
            op=spec.op,
            ranks=len(ranks),
            phases=timing.phases,
            flows=timing.flows,
            total_bytes=int(timing.total_bytes),
            issue_ns=issue_ns,
            complete_ns=issue_ns + duration_ns,
            overhead_ns=round(overhead_s * 1e9),
            wall_compute_ms=compute_ms,
            detail=_flow_times(ranks, timing) if detail else (),
            compute_share=state.compute_share,
        )

    def _arrived(
        self,
        ranks: Sequence[Endpoint],
        spec: CollectiveSpec,
        issue_ns: int,
        overhead_s: float,
        state: RankState,
    ) -> None:
        """Record when each rank was ready: after its own share of the per-phase software work
        (emulator/model/arrivals.py), so a controller can see who arrives last."""
        names = tuple(e.name for e in ranks)
        ready: tuple[int, ...] = ()
        if state.slowed:
            ready = tuple(round(overhead_s / state.slowed.get(n, 1.0) * 1e9) for n in names)
        self.arrivals.add(op=spec.op, issue_ns=issue_ns, ranks=names, ready_ns=ready)

    def collective_arrivals(self, after_seq: int, limit: int = 0) -> ArrivalBatch:
        """The ranks' arrivals of the collectives timed after `after_seq` (at most `limit`)."""
        if limit < 0:
            raise InvalidArgumentError(f"limit must be >= 0, got {limit}", field="limit")
        return self.arrivals.since(after_seq, limit)

    async def _live_ranks(self, names: Sequence[str]) -> RankState:
        """The ranks' faults as a collective meets them: a dead rank fails it at once
        (UNAVAILABLE, PEER_UNREACHABLE), a hung one holds it until the hang clears (the
        caller's deadline ends the wait); what is left is the slowest rank's share."""
        while True:
            state = self.faults.ranks(names)
            if state.down is not None:
                raise UnavailableError(
                    f"rank {state.down} is unreachable: its device is down (a collective with "
                    "a dead rank cannot complete)",
                    field="ranks",
                    subject=state.down,
                    reason="PEER_UNREACHABLE",
                    retry_after_s=RETRY_AFTER_S,
                )
            if state.hung is None:
                return state
            await self._ranks_moved.wait()

    # --- routes and faults -------------------------------------------------------------------

    def route(self, src: str, dst: str) -> Route:
        g = self.graph
        with (
            blame(field="src", subject=src, reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="src", subject=src),
        ):
            a = g.endpoint(src)
        with (
            blame(field="dst", subject=dst, reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="dst", subject=dst),
        ):
            b = g.endpoint(dst)
        with route_cut(f"{src}>{dst}"):
            return g.route(a, b)

    def add_fault(self, spec: FaultSpec[Any]) -> FaultSpec[Any]:
        """Apply a link or switch fault now (its `since_s` is set here)."""
        stored = self.faults.add(dataclasses.replace(spec, since_s=self.clock.now_s()))
        self._faults_changed()
        self.log.warning("fault injected", fault=stored.id, kind=stored.kind, target=stored.target)
        self.publish(
            "fault",
            fault=stored.id,
            kind=stored.kind,
            target=stored.target,
            until_ns=str(round(stored.until_s * 1e9)),
        )
        return stored

    def clear_fault(self, fault_id: str, *, every: bool = False) -> None:
        self.faults.clear(fault_id, all=every)
        self._faults_changed()
        self.publish("recovered", fault=fault_id or "all")
        self.publish("fault-cleared", fault=fault_id or "all")
        self.log.warning("fault cleared", fault=fault_id or "all")

    def _faults_changed(self) -> None:
        """Apply the faults to the flows in flight, and re-plan the fault clock."""
        self.flows.set_capacities(self.graph.trunk_cap())
        self._faults_moved.set()
        self._rank_faults_moved()

    def _rank_faults_moved(self) -> None:
        """Wake the collectives waiting on a hung rank: they look again."""
        self._ranks_moved.set()
        self._ranks_moved = asyncio.Event()

    async def _fault_clock(self) -> None:
        """Flip flapping links and clear expired faults at their emulated instants (the
        fabric owns these timers): sleep until the next one or until the faults change."""
        while not self._closing:
            self._faults_moved.clear()
            now = self.clock.now_s()
            for fault_id in self.faults.expired(now):
                self.faults.clear(fault_id)
                self.flows.set_capacities(self.graph.trunk_cap())
                self._rank_faults_moved()
                self.log.warning("fault expired", fault=fault_id)
                self.publish("fault-cleared", fault=fault_id, expired="true")
            for spec in self.faults.flap(now):
                self.flows.set_capacities(self.graph.trunk_cap())
                self.publish(
                    "link-flap",
                    fault=spec.id,
                    target=spec.target,
                    state="down" if spec.down else "up",
                )
            next_s = self.faults.next_change_s(now)
            until = None if next_s is None else round(next_s * 1e9)
            await self.clock.wait(self._faults_moved, until)

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """The fabric's clocks until close(): the flows' and the faults', from the moment there
        is a link graph (until then no flow and no fault can be)."""
        await self._built.wait()
        if self._closing:
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._fault_clock(), name="fabric-faults")
            await self.flows.run()

    async def close(self) -> None:
        """End the clock loops; transfers still in flight end UNAVAILABLE."""
        self._closing = True
        self._faults_moved.set()
        if not self.built:  # nothing was built: nothing runs (run() returns)
            self._built.set()
            return
        self.collectives.close()
        self.flows.close("the fabric is stopping")
