"""A route as a value: what it crosses, its ceiling and its latency, and what it costs one kind of
transaction (priced) or whether the live capacities still carry it (check_reachable).

Apart from routes.py, which finds routes over the link graph's arrays: the fabric engine prices and
checks every transfer's route, and with nothing of numpy here it imports no numpy until its link
graph is made (after a launcher's start, engines/fabric/lazygraph.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from cmemu.emulator.model.costmodel import (
    UbOp,
    endpoint_latency_s,
    hop_latency_s,
    ub_latency_s,
    ub_wire_cost,
)
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Device, DeviceKind, Topology

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

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


@dataclass(frozen=True, kw_only=True)
class Route:
    """One transfer's way between two endpoints: the trunks it occupies, at what share each."""

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


def address_die(profile: HardwareProfile, offset: int) -> int:
    """The die whose HBM holds an NPU's UB address: its dies' HBM one after the other."""
    npu = profile.npu
    return min(offset // npu.hbm_bytes_per_die, npu.dies - 1)


def local_bytes_per_s(profile: HardwareProfile, topology: Topology, device: Device) -> float:
    """A device's copy within itself (an HBM or DRAM copy): an NPU die's HBM, a CPU's UB rate,
    a memory pool's its node's CPUs' together (its traffic is split over them)."""
    if device.kind is DeviceKind.NPU:
        return profile.npu.hbm_bytes_per_s_per_die
    if device.kind is DeviceKind.CPU:
        return profile.cpu.ub_bytes_per_s
    cpus = sum(1 for d in topology.in_node(device.node) if d.kind is DeviceKind.CPU)
    return profile.cpu.ub_bytes_per_s * cpus


def local_route(name: str, bytes_per_s: float, profile: HardwareProfile) -> Route:
    """An endpoint to itself: it crosses no trunk, at its own copy rate, after the endpoint's
    latency (no switch)."""
    return Route(
        kind=RouteKind.LOCAL,
        resources=(),
        cap=bytes_per_s,
        latency_s=base_latency_s(profile, RouteKind.LOCAL),
        hops=(name,),
        planes=0,
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
    dead = graph.dead_trunks(route)
    if dead:
        raise UnavailableError(f"no capacity left on {', '.join(dead)}")
