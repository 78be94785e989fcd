"""The routing rules of the link graph: what a route crosses, its ceiling and its latency.

LinkGraph holds the links, trunks and endpoints with their live state and caches routes; this
module decides, from that state, which trunks a transfer between two endpoints occupies, how fast
it can go alone, and what it costs per byte for one kind of transaction. The same rules in array
form (l2_plane_caps, flow_plane_caps) time collectives over 100,000 pairs at once.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.costmodel import (
    UbOp,
    endpoint_latency_s,
    hop_latency_s,
    ub_latency_s,
    ub_wire_cost,
)
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import directed_link_id
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.model.endpoints import Endpoint
    from cmemu.emulator.model.linkgraph import LinkGraph

FloatArray = npt.NDArray[np.float64]
Incidence = tuple[tuple[int, float], ...]  # (trunk index, share of the flow that crosses it)


class RouteKind(StrEnum):
    """What a route crosses, which decides its fixed latency (base_latency_s)."""

    LOCAL = "local"  # an endpoint to itself: an HBM or DRAM copy
    SIBLING = "sibling"  # the two dies of one NPU package, over their die-to-die link
    SAME_NODE = "same-node"  # through one L1 chip on each plane
    CROSS_NODE = "cross-node"  # L1, L2, L1 on each plane


SWITCH_HOPS = {
    RouteKind.LOCAL: 0,
    RouteKind.SIBLING: 0,
    RouteKind.SAME_NODE: 1,
    RouteKind.CROSS_NODE: 3,
}


def l2_plane_caps(up: FloatArray, down: FloatArray) -> FloatArray:
    """Per plane, the ceiling of a flow across the L2 tier: one L1->L2 link out of the source
    node and one L2->L1 link into the destination node, through the best L2 chip live on both
    (0 where no chip is). Chips on the last axis, planes before; other axes broadcast."""
    best: FloatArray = np.minimum(up, down).max(axis=-1)
    return best


def flow_plane_caps(
    src_ports: FloatArray, dst_ports: FloatArray, l2: FloatArray | None = None
) -> FloatArray:
    """Per plane, a flow's own ceiling: a plane carries it only where both ends have live ports
    on it (and, across nodes, the L2 tier connects them: `l2`, from l2_plane_caps). Planes on the
    last axis; a flow's ceiling is the sum over its planes."""
    caps: FloatArray = np.minimum(src_ports, dst_ports)
    return caps if l2 is None else np.minimum(caps, l2)


@dataclass(frozen=True, kw_only=True)
class Route:
    kind: RouteKind
    resources: Incidence
    cap: float  # the flow's own ceiling, bytes/s
    latency_s: float
    hops: tuple[str, ...]
    planes: int


def base_latency_s(profile: HardwareProfile, kind: RouteKind) -> float:
    """The fixed latency of a route of this kind, before any added by a fault: the endpoint
    cost and one hop per switch crossed."""
    return endpoint_latency_s(profile) + SWITCH_HOPS[kind] * hop_latency_s(profile)


def route_kind(graph: LinkGraph, src: Endpoint, dst: Endpoint) -> RouteKind:
    if src.name == dst.name:
        return RouteKind.LOCAL
    if graph.die_link(src, dst) is not None:
        return RouteKind.SIBLING
    if src.device.node == dst.device.node:
        return RouteKind.SAME_NODE
    return RouteKind.CROSS_NODE


def find_route(graph: LinkGraph, src: Endpoint, dst: Endpoint) -> Route:
    """The route from src to dst and its uncontended ceiling over the graph's live state;
    UnavailableError when nothing connects them (LinkGraph.route caches it)."""
    if graph.partitioned(src.device.id, dst.device.id):
        raise UnavailableError(f"{src.device.id} and {dst.device.id} are partitioned")
    kind = route_kind(graph, src, dst)
    extra = graph.trunk_extra_latency()
    if kind is RouteKind.LOCAL:
        return Route(
            kind=kind,
            resources=(),
            cap=src.local_bytes_per_s,
            latency_s=base_latency_s(graph.profile, kind),
            hops=(src.name,),
            planes=0,
        )
    if kind is RouteKind.SIBLING:
        link = graph.die_link(src, dst)
        assert link is not None
        trunk, cap = link
        if cap <= 0:
            raise UnavailableError(
                f"die-to-die link {directed_link_id(src.name, dst.name)} is down"
            )
        return Route(
            kind=kind,
            resources=((trunk, 1.0),),
            cap=cap,
            latency_s=base_latency_s(graph.profile, kind) + float(extra[trunk]),
            hops=(src.name, dst.name),
            planes=0,
        )
    src_node, dst_node = src.device.node, dst.device.node
    resources = [*src.out]
    l2: FloatArray | None = None
    if kind is RouteKind.CROSS_NODE:
        resources += [(graph.uplink_trunk(src_node), 1.0), (graph.downlink_trunk(dst_node), 1.0)]
        up = graph.l2_caps()[graph.node_row[src_node]]
        down = graph.l2_caps(down=True)[graph.node_row[dst_node]]
        l2 = l2_plane_caps(up, down)
    resources += dst.inn
    per_plane = flow_plane_caps(
        graph.port_caps()[src.row], graph.port_caps(inbound=True)[dst.row], l2
    )
    usable = np.flatnonzero(per_plane > 0)
    if not len(usable):
        raise UnavailableError(f"no live UB plane connects {src.name} and {dst.name}")
    first = int(usable[0])
    hops: tuple[str, ...]
    if kind is RouteKind.SAME_NODE:
        hops = (src.name, graph.l1_ids[(src_node, first)], dst.name)
    else:
        # ECMP: a flow is hashed to one of the plane's L2 chips live on both sides
        both = np.minimum(up[first], down[first])
        common = np.flatnonzero(both > 0)
        pick = zlib.crc32(directed_link_id(src.name, dst.name).encode()) % len(common)
        hops = (
            src.name,
            graph.l1_ids[(src_node, first)],
            graph.l2_ids[(first, int(common[pick]))],
            graph.l1_ids[(dst_node, first)],
            dst.name,
        )
    latency = base_latency_s(graph.profile, kind) + float(sum(extra[t] for t, _ in resources))
    return Route(
        kind=kind,
        resources=tuple(resources),
        cap=float(per_plane.sum()),
        latency_s=latency,
        hops=hops,
        planes=len(usable),
    )


def priced(route: Route, op: UbOp, target: DeviceKind, profile: HardwareProfile) -> Route:
    """The route as one transaction sees it: routes (and collectives) are priced as the
    reference NPU -> NPU read; a transaction of another op, or against CPU memory, takes
    its own latency and occupies every trunk it crosses at its own cost per byte
    (costmodel.ub_wire_cost), so that alone it achieves its calibrated bandwidth.

    Remembered per route, op, target and profile, by identity (the entry holds the route and
    the profile, so their ids are never reused): the link graph caches its routes per live
    state, so a stream of writes to one target is priced once, not copied per transaction."""
    key = (id(route), op, target, id(profile))
    held = _PRICED.get(key)
    if held is not None and held[0] is route and held[1] is profile:
        return held[2]
    cost = ub_wire_cost(op, target, profile)
    extra = ub_latency_s(op, target, profile) - ub_latency_s(profile=profile)
    if cost == 1.0 and extra == 0.0:
        out = route
    else:
        out = dataclasses.replace(
            route,
            resources=tuple((t, w * cost) for t, w in route.resources),
            cap=route.cap / cost,
            latency_s=route.latency_s + extra,
        )
    if len(_PRICED) >= _PRICED_MAX:  # routes come and go with the graph's live state
        _PRICED.clear()
    _PRICED[key] = (route, profile, out)
    return out


_PRICED: dict[tuple[int, UbOp, DeviceKind, int], tuple[Route, HardwareProfile, Route]] = {}
_PRICED_MAX = 4096


def check_reachable(graph: LinkGraph, route: Route) -> None:
    """UnavailableError when a trunk of a cached route has lost its last live member since.
    A route that crosses no trunk (a device's transfer within itself: EMS's copies read and
    written by their own pool) has none to lose: the live capacities are not even read."""
    if not route.resources:
        return
    caps = graph.trunk_cap()
    dead = [graph.trunk_names[t] for t, _ in route.resources if caps[t] <= 0]
    if dead:
        raise UnavailableError(f"no capacity left on {', '.join(dead)}")
