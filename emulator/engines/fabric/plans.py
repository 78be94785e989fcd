"""A transfer's plan: its issuing and target devices, its route as its op sees it (priced for the
op and the target's memory) and whether its other way is cut by a one-way partition. Worked out
from the link graph's live state and remembered until that state changes (a fault moves
LinkGraph.version), as the graph remembers its routes: a stream of transactions between two
dies is planned once, and each then costs one lookup (not two device lookups, two endpoints, a
route, its dead trunks, the partitions and its pricing per transaction). A plan that cannot be
made (an unknown device, a cut route) raises, and is worked out again at the next asking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.route import Route, address_die, check_reachable, priced
from cmemu.emulator.model.topology import Device, DeviceKind, Topology
from cmemu.emulator.model.ub import PRICED, Op, Transaction

if TYPE_CHECKING:  # the numpy side: made at first use (engines/fabric/lazygraph.py)
    from cmemu.emulator.model.endpoints import Endpoint
    from cmemu.emulator.model.linkgraph import LinkGraph

PLANS_MAX = 65_536  # plans remembered per live state; past it, the memory starts over


class Plan(NamedTuple):
    src: Device
    dst: Device
    route: Route  # the data's way (a READ's from the target back), priced for the op
    other_way_cut: bool  # the acknowledgement's way cut by a one-way partition


class Plans:
    """The plans of one fabric's transfers, per (issuer, its die, target, the target's die, op),
    for one live state of its link graph."""

    def __init__(self, topology: Topology, profile: HardwareProfile) -> None:
        self.topology = topology
        self.profile = profile
        self._graph: LinkGraph | None = None
        self._version = -1
        self._plans: dict[tuple[int, int, int, int, Op], Plan] = {}

    def plan(self, graph: LinkGraph, tx: Transaction) -> Plan:
        if graph is not self._graph or graph.version != self._version:
            self._graph, self._version, self._plans = graph, graph.version, {}
        key = (tx.src_eid, tx.src_die, tx.dst_eid, address_die(self.profile, tx.dst_offset), tx.op)
        plan = self._plans.get(key)
        if plan is None:
            plan = _work_out(self.topology, graph, tx)
            if len(self._plans) >= PLANS_MAX:
                self._plans.clear()
            self._plans[key] = plan
        return plan


def _work_out(topology: Topology, graph: LinkGraph, tx: Transaction) -> Plan:
    src, dst, issuer, target = _ends(topology, graph, tx)
    # the flow is the data: a READ's bytes travel from the target back to the issuer
    data_from, data_to = (target, issuer) if tx.op is Op.READ else (issuer, target)
    try:
        route = graph.route(data_from, data_to)
        check_reachable(graph, route)
    except UnavailableError as exc:  # route_cut's annotations
        exc.annotate(subject=f"{src.id}>{dst.id}", reason="ROUTE_CUT", retry_after_s=RETRY_AFTER_S)
        raise
    # The other way (a READ's request, a write's acknowledgement) can be cut alone, by a
    # one-way partition: a request that never arrives changes nothing; an acknowledgement
    # that never returns leaves the data delivered and the issuer told it failed.
    other_way_cut = graph.partitioned(data_to.device.id, data_from.device.id)
    if other_way_cut and tx.op is Op.READ:
        raise UnavailableError(
            f"{src.id}'s request never reaches {dst.id}: a one-way partition",
            subject=f"{src.id}>{dst.id}",
            reason="ROUTE_CUT",
            retry_after_s=RETRY_AFTER_S,
        )
    route = priced(route, PRICED[tx.op], dst.kind, graph.profile)  # the op, the target's memory
    return Plan(src, dst, route, other_way_cut)


def _source(graph: LinkGraph, device: Device, die: int) -> Endpoint:
    """Where a transfer a device issues starts: the NPU's die it names, or the device."""
    if device.kind is DeviceKind.NPU:
        return graph.npu_die(device, die)
    if die:
        raise InvalidArgumentError(
            f"src_die applies to NPUs; {device.id} is a {device.kind.value}",
            field="src_die",
            subject=device.id,
        )
    return graph.endpoint(device.id)


def _target(graph: LinkGraph, device: Device, offset: int) -> Endpoint:
    """An NPU's UB address space is its dies' HBM one after the other."""
    if device.kind is DeviceKind.NPU:
        return graph.npu_die(device, address_die(graph.profile, offset))
    return graph.endpoint(device.id)


def _ends(
    topology: Topology, graph: LinkGraph, tx: Transaction
) -> tuple[Device, Device, Endpoint, Endpoint]:
    """A transfer's issuing and target devices and the endpoints its data leaves and reaches.
    try/except where `with blame(...)` stood: the same annotations, nothing per call."""
    try:
        src = topology.by_eid(tx.src_eid)
    except NotFoundError as exc:
        exc.annotate(field="src_eid", subject=str(tx.src_eid), reason="DEVICE_NOT_FOUND")
        raise
    try:
        dst = topology.by_eid(tx.dst_eid)
    except NotFoundError as exc:
        exc.annotate(field="dst.eid", subject=str(tx.dst_eid), reason="DEVICE_NOT_FOUND")
        raise
    try:
        issuer = _source(graph, src, tx.src_die)
    except EmulatorError as exc:
        exc.annotate(field="src_die", subject=src.id)
        raise
    return src, dst, issuer, _target(graph, dst, tx.dst_offset)
