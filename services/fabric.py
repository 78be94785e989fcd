"""The fabric service: the timing authority every UB transaction and collective crosses.

A device's Submit hands its transaction here. The fabric routes it over the link graph, has the
target device apply it (so a bad address fails at once and nothing is timed for it), prices it by
its op and its target's memory (LinkGraph.priced: a write, or CPU memory, costs more per byte and
has its own latency), runs it as a flow that shares every trunk it crosses max-min fairly with the
flows in flight, and answers when emulated time reaches the flow's completion, paced on the wall
clock by `time_scale`. The reply carries the exact emulated timestamps even where the wall clock
cannot keep up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

import numpy as np
import structlog

from cmemu.v1 import fabric_pb2, fabric_pb2_grpc, ub_pb2
from emulator.model.clock import Clock
from emulator.model.collectives import ALGORITHMS, CollectiveSpec, CollectiveTiming, run_collective
from emulator.model.costmodel import check_duration
from emulator.model.errors import (
    RETRY_AFTER_S,
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    blame,
)
from emulator.model.flowsim import LiveFlows
from emulator.model.hardware import HardwareProfile
from emulator.model.linkfaults import FaultSet, FaultSpec
from emulator.model.linkgraph import Endpoint, LinkGraph, Route, validate_ranks
from emulator.model.topology import Device, DeviceKind, Topology
from services.eventsink import EventSink
from services.flowclock import FlowClock
from services.host import ServiceHost
from services.peers import Peers
from services.status import Context, abort, rpc
from services.ub import PRICED_OP, normalize

SERVICE = "cmemu.v1.Fabric"
DEFAULT_TOP = 20
DEFAULT_WATCH_MS = 1000
U64_MAX = 2**64 - 1
# Collective timings kept for reuse (a decode loop repeats its dispatch and combine every step):
# at most this many, holding at most this many flows together (about 40 bytes each).
MEMO_ENTRIES = 16
MEMO_FLOWS = 1_000_000

OPS = {
    fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL: "all-to-all",
    fabric_pb2.COLLECTIVE_OP_ALL_GATHER: "all-gather",
    fabric_pb2.COLLECTIVE_OP_REDUCE_SCATTER: "reduce-scatter",
    fabric_pb2.COLLECTIVE_OP_ALL_REDUCE: "all-reduce",
    fabric_pb2.COLLECTIVE_OP_BROADCAST: "broadcast",
    fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH: "moe-dispatch",
    fabric_pb2.COLLECTIVE_OP_MOE_COMBINE: "moe-combine",
}
assert set(OPS.values()) == set(ALGORITHMS)
MemoKey = tuple[int, tuple[str, ...], CollectiveSpec]  # graph version, rank names, request


class FabricState:
    """The link graph, its faults and the flows in flight, driven by the emulated clock."""

    name = "fabric"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Clock,
        peers: Peers,
        events: EventSink | None = None,
    ) -> None:
        self.topology = topology
        self.events = events
        # Collectives are CPU-bound (up to millions of flows): they run on threads of their own,
        # so that they never starve the default pool other work (UB transfers, health) uses, and
        # at most collective_queue_max of them wait for one; beyond that, RESOURCE_EXHAUSTED.
        limits = profile.limits
        self._collective_pool = ThreadPoolExecutor(
            max_workers=limits.collective_workers, thread_name_prefix="collective"
        )
        self._collectives_pending = 0
        self._memo: OrderedDict[MemoKey, CollectiveTiming] = OrderedDict()
        self.memo_hits = 0
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.graph = LinkGraph(topology, profile)
        self.faults = FaultSet(self.graph)
        self.flows = FlowClock(
            clock=clock,
            res_cap=self.graph.trunk_cap(),
            cut_message="a fault cut the route of this transfer",
        )
        self.collective_bytes = np.zeros(len(self.graph.trunk_names))
        self._closing = False
        self._faults_moved = asyncio.Event()  # the fault clock re-plans
        self.log = structlog.get_logger("cmemu.fabric").bind(device="fabric")

    def publish(self, event: str, **detail: str) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    # --- endpoints -----------------------------------------------------------------------------

    def source(self, device: Device, die: int) -> Endpoint:
        if device.kind is DeviceKind.NPU:
            return self.graph.npu_die(device, die)
        if die:
            raise InvalidArgumentError(
                f"src_die applies to NPUs; {device.id} is a {device.kind.value}",
                field="src_die",
                subject=device.id,
            )
        return self.graph.endpoint(device.id)

    def target(self, device: Device, offset: int) -> Endpoint:
        """An NPU's UB address space is its dies' HBM one after the other."""
        if device.kind is DeviceKind.NPU:
            die = min(offset // self.profile.npu.hbm_bytes_per_die, self.profile.npu.dies - 1)
            return self.graph.npu_die(device, die)
        return self.graph.endpoint(device.id)

    # --- live flows (services/flowclock.py) ------------------------------------------------

    @property
    def live(self) -> LiveFlows:
        return self.flows.live

    async def run_flow(self, route: Route, nbytes: int, start_s: float) -> float:
        """Emulated completion time (seconds) of a flow, returned once the flow has finished."""
        return await self.flows.run_flow(
            route.resources, route.cap, route.latency_s, nbytes, start_s
        )

    async def pace(self, emulated_s: float) -> None:
        """Return when the wall clock reaches emulated_s."""
        await self.flows.pace(emulated_s)

    async def run(self) -> None:
        """The fabric's clocks until close(): the flows' and the faults'."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._fault_clock(), name="fabric-faults")
            await self.flows.run()

    def fault_added(self) -> None:
        """A fault was added or cleared: apply it, and re-plan the fault clock."""
        self.faults_changed()
        self._faults_moved.set()

    async def _fault_clock(self) -> None:
        """Flip flapping links and clear expired faults at their emulated instants (the
        fabric owns these timers): sleep until the next one or until the faults change."""
        while not self._closing:
            self._faults_moved.clear()
            now = self.now_s()
            for fault_id in self.faults.expired(now):
                self.faults.clear(fault_id)
                self.faults_changed()
                self.log.warning("fault expired", fault=fault_id)
                self.publish("fault-cleared", fault=fault_id, expired="true")
            for spec in self.faults.flap(now):
                self.faults_changed()
                self.publish(
                    "link-flap",
                    fault=spec.id,
                    target=spec.target,
                    state="down" if spec.down else "up",
                )
            next_s = self.faults.next_change_s(now)
            wait = (
                None
                if next_s is None
                else max(0.0, self.clock.wall_at(round(next_s * 1e9)) - self.clock.wall())
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._faults_moved.wait()

    def sync(self) -> None:
        """Bring the flows up to the emulated present."""
        self.flows.sync()

    def faults_changed(self) -> None:
        self.flows.set_capacities(self.graph.trunk_cap())

    @property
    def collectives_pending(self) -> int:
        """Collectives being timed or waiting for a worker (at most workers + queue_max)."""
        return self._collectives_pending

    async def compute_collective(
        self, ranks: list[Endpoint], spec: CollectiveSpec
    ) -> CollectiveTiming:
        """Time a collective on the fabric's own threads (RESOURCE_EXHAUSTED if too many wait).

        A timing depends only on the ranks, the request and the link graph's live state (faults),
        not on the transfers in flight: one computed at the graph's present version is reused."""
        key = (self.graph.version, tuple(e.name for e in ranks), spec)
        known = self._memo.get(key)
        if known is not None:
            self._memo.move_to_end(key)
            self.memo_hits += 1
            return known
        timing = await self._compute_collective(ranks, spec)
        if self.graph.version == key[0]:  # no fault landed meanwhile
            self._remember(key, timing)
        return timing

    def _remember(self, key: MemoKey, timing: CollectiveTiming) -> None:
        for stale in [k for k in self._memo if k[0] != key[0]]:
            del self._memo[stale]
        if timing.flows > MEMO_FLOWS:
            return
        self._memo[key] = timing
        while len(self._memo) > MEMO_ENTRIES or (
            sum(t.flows for t in self._memo.values()) > MEMO_FLOWS
        ):
            self._memo.popitem(last=False)  # the least recently used

    async def _compute_collective(
        self, ranks: list[Endpoint], spec: CollectiveSpec
    ) -> CollectiveTiming:
        limits = self.profile.limits
        bound = limits.collective_workers + limits.collective_queue_max
        if self._collectives_pending >= bound:
            full = CapacityError(
                "collectives in progress or waiting",
                requested=self._collectives_pending + 1,
                free=0,
                unit="collectives",
                reason="COLLECTIVE_QUEUE_FULL",
            )
            full.annotate(retry_after_s=RETRY_AFTER_S)
            raise full
        self._collectives_pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._collective_pool, run_collective, self.graph, ranks, spec
            )
        finally:
            self._collectives_pending -= 1

    async def close(self) -> None:
        """End the clock loop; transfers still in flight end UNAVAILABLE."""
        self._closing = True
        self._faults_moved.set()
        self._collective_pool.shutdown(wait=False, cancel_futures=True)
        self.flows.close("the fabric is stopping")

    # --- statistics ----------------------------------------------------------------------------

    def link_stats(self, top: int) -> fabric_pb2.LinkStats:
        self.sync()
        g = self.graph
        trunk_cap = g.trunk_cap()
        link_cap = g.link_cap()
        trunk_bytes = self.live.res_bytes + self.collective_bytes
        share = np.divide(
            link_cap[g.member_link],
            trunk_cap[g.member_trunk],
            out=np.zeros(len(g.member_link)),
            where=trunk_cap[g.member_trunk] > 0,
        )
        member_bytes = trunk_bytes[g.member_trunk] * share
        utilization = np.divide(
            self.live.res_rate, trunk_cap, out=np.zeros(len(trunk_cap)), where=trunk_cap > 0
        )
        active = self.live.active_per_resource()
        order = np.argsort(-member_bytes, kind="stable")[:top]
        links = []
        for m in order:
            link, trunk = int(g.member_link[m]), int(g.member_trunk[m])
            links.append(
                fabric_pb2.LinkStat(
                    link=g.names[link],
                    kind=g.kinds[link].value,
                    capacity_gb_s=float(link_cap[link]) / 1e9,
                    bytes=min(int(member_bytes[m]), U64_MAX),
                    utilization=float(utilization[trunk]),
                    active_flows=int(active[trunk]),
                    up=bool(g.up[link]),
                )
            )
        return fabric_pb2.LinkStats(
            emulated_ns=self.clock.now_ns(),
            links=links,
            active_flows=len(self.live.flows),
            completed_flows=self.live.completed,
        )


def _fault_proto(spec: FaultSpec) -> fabric_pb2.FabricFault:
    return fabric_pb2.FabricFault(
        id=spec.id,
        kind=spec.kind,
        target=spec.target,
        factor=spec.factor,
        added_latency_us=spec.added_latency_s * 1e6,
        side_a=spec.side_a,
        side_b=spec.side_b,
        period_s=spec.period_s,
        duty=spec.duty,
        for_s=spec.for_s,
        since_ns=round(spec.since_s * 1e9),
        until_ns=round(spec.until_s * 1e9),
    )


FAULT_FIELD = {
    "link-degraded": "factor",
    "ports-degraded": "factor",
    "link-latency": "added_latency_us",
    "partition": "side_a",
    "link-flap": "period_s",
}
"""The request field a fault kind's own check is about (others: the target)."""


def _route_cut(subject: str | None) -> AbstractContextManager[None]:
    """A route that fabric faults cut: UNAVAILABLE, and worth retrying once the fault clears."""
    return blame(
        subject=subject, reason="ROUTE_CUT", retry_after_s=RETRY_AFTER_S, on=UnavailableError
    )


def _collective_spec(request: fabric_pb2.CollectiveRequest) -> CollectiveSpec:
    if request.op not in OPS:
        raise InvalidArgumentError(
            f"op must be one of {', '.join(fabric_pb2.CollectiveOp.keys()[1:])}", field="op"
        )
    return CollectiveSpec(
        op=OPS[request.op],
        bytes=request.bytes,
        bytes_per_pair=request.bytes_per_pair,
        pair_bytes=tuple(request.pair_bytes),
        root=request.root,
        tokens_per_rank=request.tokens_per_rank,
        top_k=request.top_k,  # 0: the profile's (run_collective)
        bytes_per_token=request.bytes_per_token,
    )


class FabricServicer(fabric_pb2_grpc.FabricServicer):
    def __init__(self, state: FabricState) -> None:
        self.state = state

    @rpc
    async def Transfer(
        self, request: ub_pb2.UbTransaction, context: Context
    ) -> ub_pb2.UbCompletion:
        return await self.transfer(request, context.time_remaining())

    async def transfer(
        self, request: ub_pb2.UbTransaction, deadline_s: float | None
    ) -> ub_pb2.UbCompletion:
        """Route, deliver, time and pace one transaction; devices in this process call it
        directly, the others through Transfer."""
        s = self.state
        tx = normalize(request, s.profile.limits.inline_payload_max_bytes)
        if not tx.src_eid:
            raise InvalidArgumentError(
                "src_eid is required: a transfer is issued by a device", field="src_eid"
            )
        with blame(
            field="src_eid", subject=str(tx.src_eid), reason="DEVICE_NOT_FOUND", on=NotFoundError
        ):
            src = s.topology.by_eid(tx.src_eid)
        with blame(
            field="dst.eid", subject=str(tx.dst.eid), reason="DEVICE_NOT_FOUND", on=NotFoundError
        ):
            dst = s.topology.by_eid(tx.dst.eid)
        with blame(field="src_die", subject=src.id):
            issuer = s.source(src, tx.src_die)
        target = s.target(dst, tx.dst.offset)
        # the flow is the data: a READ's bytes travel from the target back to the issuer
        data_from, data_to = (target, issuer) if tx.op == ub_pb2.UB_OP_READ else (issuer, target)
        with _route_cut(f"{src.id}>{dst.id}"):
            route = s.graph.route(data_from, data_to)
            s.graph.check_reachable(route)
        route = s.graph.priced(route, PRICED_OP[tx.op], dst.kind)  # the op, the target's memory
        with blame(field="size"):
            seconds = route.latency_s + tx.size / route.cap if route.cap > 0 else float("inf")
            check_duration(seconds, "the transfer", s.profile)
        now = s.clock.now_ns()
        issue_ns = tx.issue_ns if 0 < tx.issue_ns <= now else now  # never from the future
        tx.issue_ns = issue_ns
        # The target checks first (a bad address fails at once, nothing is timed for it) and
        # applies when the flow completes: a transfer that fails applies nothing, and a READ
        # returns the bytes as of its completion.
        tx.check_only = True
        await s.peers.deliver(dst, tx, deadline_s)
        complete_s = await s.run_flow(route, tx.size, issue_ns / 1e9)
        tx.check_only = False
        completion = await s.peers.deliver(dst, tx, deadline_s)  # applied at the completion
        await s.pace(complete_s)  # the reply waits for the wall clock, not the data
        completion.issue_ns = issue_ns
        completion.complete_ns = round(complete_s * 1e9)
        completion.path[:] = route.hops
        completion.planes = route.planes
        return completion

    @rpc
    async def Collective(
        self, request: fabric_pb2.CollectiveRequest, context: Context
    ) -> fabric_pb2.CollectiveResult:
        s = self.state
        spec = _collective_spec(request)
        with (
            blame(field="ranks", reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="ranks"),
        ):
            ranks = validate_ranks(s.graph, request.ranks)
        issue_ns = s.clock.now_ns()
        started = time.perf_counter()
        # CPU-bound for large groups (100,000 flows): off the event loop
        with _route_cut(None):
            timing = await s.compute_collective(ranks, spec)
        compute_ms = (time.perf_counter() - started) * 1e3
        limit = s.profile.limits.collective_detail_max_flows
        if request.flow_detail and timing.flows > limit:
            raise InvalidArgumentError(
                f"flow_detail is limited to {limit} flows; this has {timing.flows}",
                field="flow_detail",
            )
        s.collective_bytes += timing.res_bytes
        duration_ns = round(timing.duration_s * 1e9)
        await s.pace((issue_ns + duration_ns) / 1e9)
        result = fabric_pb2.CollectiveResult(
            op=request.op,
            ranks=len(ranks),
            phases=timing.phases,
            flows=timing.flows,
            total_bytes=int(timing.total_bytes),
            issue_ns=issue_ns,
            complete_ns=issue_ns + duration_ns,
            duration_ns=duration_ns,
            overhead_ns=round(timing.overhead_s * 1e9),
            wall_compute_ms=compute_ms,
        )
        if request.flow_detail:
            result.flow_timings.extend(
                fabric_pb2.FlowTiming(
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
        return result

    @rpc
    async def Route(
        self, request: fabric_pb2.RouteRequest, context: Context
    ) -> fabric_pb2.RouteInfo:
        g = self.state.graph
        with (
            blame(field="src", subject=request.src, reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="src", subject=request.src),
        ):
            src = g.endpoint(request.src)
        with (
            blame(field="dst", subject=request.dst, reason="DEVICE_NOT_FOUND", on=NotFoundError),
            blame(field="dst", subject=request.dst),
        ):
            dst = g.endpoint(request.dst)
        with _route_cut(f"{request.src}>{request.dst}"):
            route = g.route(src, dst)
        return fabric_pb2.RouteInfo(
            path=route.hops,
            planes=route.planes,
            latency_ns=round(route.latency_s * 1e9),
            max_gb_s=route.cap / 1e9,
        )

    @rpc
    async def InjectFault(
        self, request: fabric_pb2.FabricFault, context: Context
    ) -> fabric_pb2.FabricFault:
        on_target = request.kind != "partition"  # a partition names devices, not a target
        with (
            blame(
                field="target" if on_target else "side_a",
                subject=request.target if on_target else None,
                reason="FAULT_TARGET_NOT_FOUND" if on_target else "DEVICE_NOT_FOUND",
                on=NotFoundError,
            ),
            blame(field=FAULT_FIELD.get(request.kind, "target"), on=InvalidArgumentError),
        ):
            stored = self._add_fault(request)
        self.state.fault_added()
        self.state.log.warning(
            "fault injected", fault=stored.id, kind=stored.kind, target=stored.target
        )
        self.state.publish(
            "fault",
            fault=stored.id,
            kind=stored.kind,
            target=stored.target,
            until_ns=str(round(stored.until_s * 1e9)),
        )
        return _fault_proto(stored)

    def _add_fault(self, request: fabric_pb2.FabricFault) -> FaultSpec:
        return self.state.faults.add(
            FaultSpec(
                kind=request.kind,
                target=request.target,
                factor=request.factor,
                added_latency_s=request.added_latency_us / 1e6,
                side_a=tuple(request.side_a),
                side_b=tuple(request.side_b),
                period_s=request.period_s,
                duty=request.duty,
                for_s=request.for_s,
                since_s=self.state.now_s(),
            )
        )

    @rpc
    async def ClearFault(
        self, request: fabric_pb2.ClearFaultRequest, context: Context
    ) -> fabric_pb2.FaultList:
        self.state.faults.clear(request.id, all=request.all)
        self.state.fault_added()
        self.state.publish("recovered", fault=request.id or "all")
        self.state.publish("fault-cleared", fault=request.id or "all")
        self.state.log.warning("fault cleared", fault=request.id or "all")
        return self._faults()

    @rpc
    async def ListFaults(
        self, request: fabric_pb2.ListFaultsRequest, context: Context
    ) -> fabric_pb2.FaultList:
        return self._faults()

    def _faults(self) -> fabric_pb2.FaultList:
        return fabric_pb2.FaultList(
            faults=[_fault_proto(f) for f in self.state.faults.faults.values()]
        )

    @rpc
    async def GetLinkStats(
        self, request: fabric_pb2.LinkStatsRequest, context: Context
    ) -> fabric_pb2.LinkStats:
        return self.state.link_stats(request.top or DEFAULT_TOP)

    @rpc
    async def GetClock(
        self, request: fabric_pb2.GetClockRequest, context: Context
    ) -> fabric_pb2.ClockInfo:
        """The supernode's clock: the fabric's epoch is every process's epoch."""
        clock = self.state.clock
        return fabric_pb2.ClockInfo(
            epoch_wall_s=clock.epoch_wall_s, time_scale=clock.time_scale, emulated_ns=clock.now_ns()
        )

    async def WatchLinkStats(
        self, request: fabric_pb2.WatchLinkStatsRequest, context: Context
    ) -> AsyncIterator[fabric_pb2.LinkStats]:
        if request.interval_ms and request.interval_ms < 10:
            await abort(
                context, InvalidArgumentError("interval_ms must be >= 10", field="interval_ms")
            )
        interval = (request.interval_ms or DEFAULT_WATCH_MS) / 1000
        while True:
            yield self.state.link_stats(request.top or DEFAULT_TOP)
            await asyncio.sleep(interval)


def create_fabric(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Clock,
    peers: Peers,
    events: EventSink | None = None,
) -> tuple[FabricState, ServiceHost]:
    state = FabricState(topology=topology, profile=profile, clock=clock, peers=peers, events=events)
    servicer = FabricServicer(state)
    peers.register_fabric(servicer)
    host = ServiceHost(
        name="fabric",
        address=address,
        services=[(SERVICE, lambda s: fabric_pb2_grpc.add_FabricServicer_to_server(servicer, s))],
    )
    return state, host
