"""The Fabric service: the fabric engine (emulator/engines/fabric/) and the supernode's clock
behind the wire.

The fabric's process owns emulated time for every process of the emulator: GetClock says where
it stands, SyncClock streams its segments to the processes that follow it and takes their
reports of how late they run (emulator/engines/clock.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from cmemu.emulator.client.wire import fabric as wire
from cmemu.emulator.client.wire import ub as ub_wire
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.engines.fabric.engine import FabricEngine
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, OutOfRangeError, blame
from cmemu.services.host import ServiceHost
from cmemu.services.rpc import Context, abort, rpc, while_reading
from cmemu.v1 import fabric_pb2, fabric_pb2_grpc, ub_pb2

SERVICE = "cmemu.v1.Fabric"
# answered whatever a service fault did to the fabric: the emulator's time is not the fabric's
CLOCK_METHODS = frozenset({f"/{SERVICE}/GetClock", f"/{SERVICE}/SyncClock"})
DEFAULT_TOP = 20
DEFAULT_WATCH_MS = 1000


class FabricServicer(fabric_pb2_grpc.FabricServicer):
    def __init__(self, engine: FabricEngine, time: TimeKeeper) -> None:
        self.engine = engine
        self.time = time

    @property
    def name(self) -> str:
        return self.engine.name

    @rpc
    async def Transfer(
        self, request: ub_pb2.UbTransaction, context: Context
    ) -> ub_pb2.UbCompletion:
        done = await self.engine.transfer(
            ub_wire.transaction(request), deadline_s=context.time_remaining()
        )
        return ub_wire.completion_proto(done)

    @rpc
    async def Collective(
        self, request: fabric_pb2.CollectiveRequest, context: Context
    ) -> fabric_pb2.CollectiveResult:
        spec = wire.collective_spec(request)
        outcome = await self.engine.collective(request.ranks, spec, detail=request.flow_detail)
        return wire.collective_result(outcome)

    @rpc
    async def ListCollectiveArrivals(
        self, request: fabric_pb2.ListCollectiveArrivalsRequest, context: Context
    ) -> fabric_pb2.CollectiveArrivals:
        batch = self.engine.collective_arrivals(request.after_seq, request.limit)
        return wire.arrivals_proto(batch)

    @rpc
    async def Route(
        self, request: fabric_pb2.RouteRequest, context: Context
    ) -> fabric_pb2.RouteInfo:
        route = self.engine.route(request.src, request.dst)
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
                field="target" if on_target else "params.side_a",
                subject=request.target if on_target else None,
                reason="FAULT_TARGET_NOT_FOUND" if on_target else "DEVICE_NOT_FOUND",
                on=NotFoundError,
            ),
            # a kind's own check names its field (a params range, a partition's sides); else the
            # target is what the link graph refused (an L1 chip that is not one, a rank that
            # is no NPU)
            blame(field="target", on=InvalidArgumentError),
            blame(field="target", on=OutOfRangeError),  # a die past the NPU's last
        ):
            stored = self.engine.add_fault(wire.fault_spec(request))
        return wire.fault_proto(stored)

    @rpc
    async def ClearFault(
        self, request: fabric_pb2.ClearFaultRequest, context: Context
    ) -> fabric_pb2.FaultList:
        self.engine.clear_fault(request.id, every=request.all)
        return self._faults()

    @rpc
    async def ListFaults(
        self, request: fabric_pb2.ListFaultsRequest, context: Context
    ) -> fabric_pb2.FaultList:
        return self._faults()

    def _faults(self) -> fabric_pb2.FaultList:
        return fabric_pb2.FaultList(
            faults=[wire.fault_proto(f) for f in self.engine.faults.faults.values()]
        )

    @rpc
    async def GetLinkStats(
        self, request: fabric_pb2.LinkStatsRequest, context: Context
    ) -> fabric_pb2.LinkStats:
        return wire.link_stats_proto(self.engine.link_stats(request.top or DEFAULT_TOP))

    async def WatchLinkStats(
        self, request: fabric_pb2.WatchLinkStatsRequest, context: Context
    ) -> AsyncIterator[fabric_pb2.LinkStats]:
        if request.interval_ms and request.interval_ms < 10:
            await abort(
                context, InvalidArgumentError("interval_ms must be >= 10", field="interval_ms")
            )
        interval = (request.interval_ms or DEFAULT_WATCH_MS) / 1000
        while True:
            yield wire.link_stats_proto(self.engine.link_stats(request.top or DEFAULT_TOP))
            await asyncio.sleep(interval)

    @rpc
    async def GetClock(
        self, request: fabric_pb2.GetClockRequest, context: Context
    ) -> fabric_pb2.ClockInfo:
        """The supernode's clock: the fabric's epoch and rate are every process's."""
        return clock_info(self.time)

    async def SyncClock(
        self, requests: AsyncIterator[fabric_pb2.ClockReport], context: Context
    ) -> AsyncIterator[fabric_pb2.ClockSegment]:
        authority = self.time.authority
        if authority is None:  # this fabric follows sn0's
            await abort(
                context,
                InvalidArgumentError(
                    "this fabric follows another's clock: ask sn0's fabric",
                    reason="NOT_THE_CLOCK",
                ),
            )
            return
        reports = [""]  # the process reporting (its first report names it)

        async def read() -> None:
            async for report in requests:
                reports[0] = report.process or reports[0] or context.peer()
                if report.rate > 0:  # the first report only names the process
                    authority.wish(reports[0], report.rate, report.lag_s)

        reader = asyncio.ensure_future(read())
        try:
            async for state in while_reading(reader, authority.watch()):
                yield wire.segment_proto(state)
        finally:
            reader.cancel()
            if reports[0]:
                authority.forget(reports[0])


def clock_info(time: TimeKeeper) -> fabric_pb2.ClockInfo:
    c = time.clock
    authority = time.authority
    return fabric_pb2.ClockInfo(
        epoch_wall_s=c.epoch_wall_s,
        time_scale=c.time_scale,
        emulated_ns=c.now_ns(),
        rate=c.rate,
        achieved_scale=c.achieved_scale(),
        longest_stall_s=c.longest_stall_wall_s,
        stalled_s=c.stalled_wall_s,
        slowest=authority.slowest if authority is not None else "",
        worst_lag_s=authority.worst_lag_s if authority is not None else time.governor.worst_lag_s,
        worst_lag_emulated_s=authority.worst_lag_emulated_s if authority is not None else 0.0,
        silent=authority.silent if authority is not None else [],
        dilation=time.profile.dilation,
    )


def fabric_server(
    engine: FabricEngine, time: TimeKeeper, *, address: str
) -> tuple[FabricServicer, ServiceHost]:
    servicer = FabricServicer(engine, time)
    host = ServiceHost(
        name="fabric",
        address=address,
        services=[(SERVICE, lambda s: fabric_pb2_grpc.add_FabricServicer_to_server(servicer, s))],
    )
    host.gate.exempt_methods(CLOCK_METHODS)  # the emulator's time is told whatever its state
    return servicer, host
