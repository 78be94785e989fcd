"""The routing rules of the link graph: what a route crosses, its ceiling and its latency.

LinkGraph holds the links, trunks and endpoints with their live state and caches routes; this
module decides, from that state, which trunks a transfer between two endpoints occupies and how
fast it can go alone (what a route is, and what it costs one kind of transaction: route.py). The
same rules in array form (l2_plane_caps, flow_plane_caps) time collectives over 100,000 pairs at
once.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.naming import directed_link_id
from cmemu.emulator.model.route import Route, RouteKind, base_latency_s, local_route

if TYPE_CHECKING:
    from cmemu.emulator.model.endpoints import Endpoint
    from cmemu.emulator.model.linkgraph import LinkGraph

FloatArray = npt.NDArray[np.float64]


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
        return local_route(src.name, src.local_bytes_per_s, graph.profile)
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
