"""The RDMA plane's timing authority, hosted by the gateway of sn0.

There is ONE for the whole plane, as the UB plane of a supernode has one fabric: max-min fair
sharing is a property of every flow crossing a link at once, so the flows of every gateway must
be shared in one place. Splitting them (each gateway timing its own) would give two flows that
meet on a core switch each the whole link. So the sn0 gateway times every flow of the plane and
holds the plane's faults; the other gateways ask it (`GatewayPeer.time_flow`, over gRPC from another
process) and keep their own queue pairs, NPUs, statistics and gateway-down fault.

The flows run on the same live-flow clock as the fabric's (emulator/engines/flows.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.flows import FlowClock
from cmemu.emulator.engines.gateway.types import LinkStat, LinkStats
from cmemu.emulator.model.costmodel import check_duration
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.model.rdmagraph import RdmaFaultSet, RdmaGraph, RdmaRoute
from cmemu.emulator.model.topology import ScaleOut

U64_MAX = 2**64 - 1
ROUTE_CACHE_MAX = 100_000


class PlaneAuthority:
    """The plane's link graph, its faults and the flows in flight, on one emulated clock."""

    def __init__(self, *, plane: ScaleOut, profile: HardwareProfile, clock: Timeline) -> None:
        self.profile = profile
        self.clock = clock
        self.graph = RdmaGraph(plane, profile)
        self.faults = RdmaFaultSet(self.graph)
        self.flows = FlowClock(
            clock=clock,
            res_cap=self.graph.link_cap(),
            cut_message="a fault cut the RDMA route of this operation",
        )
        self._routes: dict[tuple[str, str], RdmaRoute] = {}
        self._routes_version = self.graph.version
        self.log = structlog.get_logger("cmemu.gateway").bind(device="rdma-plane")

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    def route(self, src: str, dst: str) -> RdmaRoute:
        """The route between two dies at the plane's present state (cached per fault state:
        a cross-supernode route spreads over spines x core x spines paths)."""
        if self._routes_version != self.graph.version:
            self._routes.clear()
            self._routes_version = self.graph.version
        known = self._routes.get((src, dst))
        if known is None:
            known = self.graph.route(src, dst)
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            self._routes[(src, dst)] = known
        return known

    async def time_flow(
        self, src: str, dst: str, size: int, issue_ns: int
    ) -> tuple[int, RdmaRoute]:
        """The emulated completion instant of `size` bytes from die src to die dst, returned
        once the flow has finished (not paced: the caller paces its own reply)."""
        route = self.route(src, dst)
        check_duration(route.latency_s + size / route.cap, "the RDMA transfer", self.profile)
        now = self.clock.now_ns()
        start_ns = issue_ns if 0 < issue_ns <= now else now  # never from the future
        complete_s = await self.flows.run_flow(
            route.resources, route.cap, route.latency_s, size, start_ns / 1e9
        )
        return round(complete_s * 1e9), route

    # --- faults --------------------------------------------------------------------------------

    def add_fault(self, fault: RdmaFault[Any]) -> RdmaFault[Any]:
        stored = self.faults.add(fault)
        self.flows.set_capacities(self.graph.link_cap())
        return stored

    def clear_fault(self, fault_id: str, *, all: bool) -> None:
        self.faults.clear(fault_id, all=all)
        self.flows.set_capacities(self.graph.link_cap())

    def expire(self) -> list[str]:
        """Clear the faults whose duration ran out; their ids."""
        gone = self.faults.expired(self.now_s())
        for fault_id in gone:
            self.faults.clear(fault_id)
        if gone:
            self.flows.set_capacities(self.graph.link_cap())
        return gone

    async def run(self) -> None:
        await self.flows.run()

    def close(self) -> None:
        self.flows.close("the RDMA gateway is stopping")

    # --- statistics ----------------------------------------------------------------------------

    def link_stats(self, top: int, authority: str) -> LinkStats:
        self.flows.sync()
        g, live = self.graph, self.flows.live
        cap = g.link_cap()
        utilization = np.divide(live.res_rate, cap, out=np.zeros(len(cap)), where=cap > 0)
        active = live.active_per_resource()
        order = np.argsort(-live.res_bytes, kind="stable")[:top]
        return LinkStats(
            emulated_ns=self.clock.now_ns(),
            links=tuple(
                LinkStat(
                    link=g.names[i],
                    kind=g.kinds[i].value,
                    capacity_gb_s=float(cap[i]) / 1e9,
                    bytes=min(int(live.res_bytes[i]), U64_MAX),
                    utilization=float(utilization[i]),
                    active_flows=int(active[i]),
                    up=bool(g.up[i]),
                )
                for i in (int(x) for x in order)
            ),
            active_flows=len(live.flows),
            completed_flows=live.completed,
            authority=authority,
        )

    def metrics(self) -> list[Family]:
        """Per plane link kind: bytes carried, and utilisation (rate over capacity, now)."""
        self.flows.sync()
        g, live = self.graph, self.flows.live
        cap = g.link_cap()
        kinds = sorted({k.value for k in g.kinds})
        of = np.array([kinds.index(k.value) for k in g.kinds], dtype=np.int64)
        carried = np.bincount(of, weights=live.res_bytes, minlength=len(kinds))
        rate = np.bincount(of, weights=live.res_rate, minlength=len(kinds))
        total = np.bincount(of, weights=cap, minlength=len(kinds))
        use = np.divide(rate, total, out=np.zeros(len(kinds)), where=total > 0)
        return [
            Family(
                name="cmemu_rdma_link_bytes_total",
                help="Bytes the RDMA plane's links of a kind carried",
                type="counter",
                samples=[({"link_kind": k}, float(v)) for k, v in zip(kinds, carried, strict=True)],
            ),
            Family(
                name="cmemu_rdma_link_utilization_ratio",
                help="The RDMA plane's links of a kind: current rate over capacity",
                type="gauge",
                samples=[({"link_kind": k}, float(v)) for k, v in zip(kinds, use, strict=True)],
            ),
        ]
