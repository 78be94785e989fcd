"""The state of a scale-out RDMA gateway: its queue pairs, its counters, its gateway-down fault
and, on sn0, the plane's timing authority (services/gateway_plane.py); and the checks of its
requests' shapes. The RPCs over it are services/gateway.py's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog

from cmemu.v1 import gateway_pb2, ub_pb2
from emulator.engines.clock import Timeline
from emulator.engines.events import EventSink
from emulator.model.errors import (
    RETRY_AFTER_S,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    blame,
    quote,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.instruments import Family
from emulator.model.naming import die_id, parse_endpoint, service_id
from emulator.model.rdmagraph import RdmaFault
from emulator.model.topology import Device, DeviceKind, ServiceKind, Topology
from services.gateway_plane import PlaneAuthority
from services.host import ServiceHost
from services.peers import Peers

AUTHORITY = 0  # the supernode whose gateway times the plane
DEFAULT_TOP = 20
PEER_TIMEOUT_S = 30.0  # wall seconds a gateway waits for a peer's agreement or check
GATEWAY_DOWN = "gateway-down"
OP_NAME: dict[gateway_pb2.RdmaOp.ValueType, str] = {
    gateway_pb2.RDMA_OP_WRITE: "write",
    gateway_pb2.RDMA_OP_READ: "read",
    gateway_pb2.RDMA_OP_SEND: "send",
}
UB_OP: dict[gateway_pb2.RdmaOp.ValueType, ub_pb2.UbOp.ValueType] = {
    gateway_pb2.RDMA_OP_WRITE: ub_pb2.UB_OP_WRITE,
    gateway_pb2.RDMA_OP_READ: ub_pb2.UB_OP_READ,
    gateway_pb2.RDMA_OP_SEND: ub_pb2.UB_OP_SEND,
}
MANAGEMENT = frozenset({"InjectFault", "ClearFault", "ListFaults", "GetStats", "TimeFlow"})
"""What a down gateway still answers: its fault control and statistics, and (sn0) the plane's
timing, which the other gateways' traffic needs whatever state sn0's own NPUs are in."""


@dataclass
class Qp:
    qpn: int
    npu: str
    die: int
    created_ns: int
    state: gateway_pb2.QpState.ValueType = gateway_pb2.QP_STATE_INIT
    remote_gateway: str = ""
    remote_qpn: int = 0
    remote_npu: str = ""
    remote_die: int = 0
    ops: int = 0
    bytes: int = 0

    @property
    def local_die(self) -> str:
        return die_id(self.npu, self.die)

    @property
    def remote(self) -> str:
        return die_id(self.remote_npu, self.remote_die)


@dataclass
class Counters:
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OP_NAME.values(), 0))
    op_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OP_NAME.values(), 0))
    bytes_in: int = 0
    failed: int = 0


class GatewayState:
    """One gateway: its QPs, its supernode's NPUs, its statistics and, on sn0, the plane."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Peers,
        events: EventSink | None = None,
    ) -> None:
        if topology.scaleout is None:
            raise PreconditionError(
                f"preset {topology.preset} has no RDMA scale-out plane: no gateway to run"
            )
        self.topology = topology
        self.plane = topology.scaleout
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.events = events
        self.index = topology.index
        self.name = service_id(ServiceKind.GATEWAY.value, supernode=self.index)
        self.authority_id = self.plane.gateway(AUTHORITY).id
        self.authority = (
            PlaneAuthority(plane=self.plane, profile=profile, clock=clock)
            if self.index == AUTHORITY
            else None
        )
        self.qps: dict[int, Qp] = {}
        self._next_qpn = 1
        self.counters = Counters()
        self.down: RdmaFault | None = None  # the gateway-down fault, when injected
        self.host: ServiceHost | None = None
        self._faults_moved = asyncio.Event()
        self._closing = False
        self.log = structlog.get_logger("cmemu.gateway").bind(device=self.name)

    def publish(self, event: str, **detail: str) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    # --- who is who ----------------------------------------------------------------------------

    def require_up(self) -> None:
        if self.down is not None:
            raise UnavailableError(
                f"{self.name} is down (fault {self.down.id})",
                subject=self.name,
                reason="GATEWAY_DOWN",
                retry_after_s=RETRY_AFTER_S,
            )

    def npu(self, name: str, die: int, *, field: str = "npu") -> tuple[Device, int]:
        """An NPU of this supernode and one of its dies; each wrong kind of id its status."""
        if not name:
            raise InvalidArgumentError("an NPU id is required", field=field)
        with blame(field=field, subject=name):
            parsed = parse_endpoint(name)
        if "." in name:
            die = int(getattr(parsed, "die", die))
        if parsed.supernode != self.index:
            raise InvalidArgumentError(
                f"{quote(name)} is in supernode sn{parsed.supernode}: its queue pairs are "
                f"created on {service_id(ServiceKind.GATEWAY.value, supernode=parsed.supernode)}",
                field=field,
                subject=name,
                reason="OTHER_SUPERNODE",
            )
        device_name = name.split(".", 1)[0] if "." in name else name
        with blame(field=field, subject=name, reason="DEVICE_NOT_FOUND", on=NotFoundError):
            device = self.topology.device(device_name)
        if device.kind is not DeviceKind.NPU:
            raise InvalidArgumentError(
                f"{device.id} is a {device.kind.value}: RDMA ports are on NPU dies only",
                field=field,
                subject=device.id,
                reason="NOT_AN_NPU",
            )
        if not 0 <= die < self.profile.npu.dies:
            raise InvalidArgumentError(
                f"die must be below {self.profile.npu.dies}, got {die}",
                field="die",
                subject=device.id,
                reason="NO_SUCH_DIE",
            )
        return device, die

    def qp(self, qpn: int) -> Qp:
        found = self.qps.get(qpn)
        if found is None:
            raise NotFoundError(
                f"no queue pair {qpn} on {self.name}; its QPs: "
                f"{', '.join(str(q) for q in self.qps) or 'none'}",
                field="qpn",
                subject=f"{self.name}/{qpn}",
                reason="QP_NOT_FOUND",
            )
        return found

    def gateway_index(self, gateway: str, *, field: str) -> int:
        """A gateway of the plane by id ("sn1-gw")."""
        ids = [g.id for g in self.plane.gateways]
        if gateway not in ids:
            raise NotFoundError(
                f"no gateway {quote(gateway)} on the plane; gateways: {', '.join(ids)}",
                field=field,
                subject=gateway,
                reason="GATEWAY_NOT_FOUND",
            )
        return ids.index(gateway)

    def message(self, qp: Qp) -> gateway_pb2.QueuePair:
        return gateway_pb2.QueuePair(
            gateway=self.name,
            qpn=qp.qpn,
            npu=qp.npu,
            die=qp.die,
            state=qp.state,
            remote_gateway=qp.remote_gateway,
            remote_qpn=qp.remote_qpn,
            remote_npu=qp.remote_npu,
            remote_die=qp.remote_die,
            created_ns=qp.created_ns,
            ops=qp.ops,
            bytes=qp.bytes,
        )

    def create(self, device: Device, die: int) -> Qp:
        qp = Qp(qpn=self._next_qpn, npu=device.id, die=die, created_ns=self.clock.now_ns())
        self._next_qpn += 1
        self.qps[qp.qpn] = qp
        return qp

    # --- the background: fault expiry ----------------------------------------------------------

    def faults_moved(self) -> None:
        self._faults_moved.set()

    async def run(self) -> None:
        """The plane's flows (sn0) and the faults' expiry, until close()."""
        async with asyncio.TaskGroup() as tasks:
            if self.authority is not None:
                tasks.create_task(self.authority.run(), name=f"{self.name}-flows")
            await self._fault_clock()

    async def _fault_clock(self) -> None:
        while not self._closing:
            self._faults_moved.clear()
            if self.authority is not None:
                for fault_id in self.authority.expire():
                    self.publish("fault-cleared", fault=fault_id, expired="true")
            if self.down is not None and self.down.for_s and self.down.until_s <= self.now_s():
                fault_id = self.down.id
                await self.set_down(None)
                self.publish("fault-cleared", fault=fault_id, expired="true")
            times = [self.down.until_s] if self.down is not None and self.down.for_s else []
            if self.authority is not None:
                times += [t for t in [self.authority.faults.next_change_s()] if t is not None]
            until = round(min(times) * 1e9) if times else None
            await self.clock.wait(self._faults_moved, until)

    async def set_down(self, fault: RdmaFault | None) -> None:
        self.down = fault
        if self.host is not None:
            await self.host.set_serving(fault is None)
        self.faults_moved()

    def metrics(self) -> list[Family]:
        """Per gateway: ops and bytes by op, bytes landed, failures, QPs, down; on sn0 (the
        plane's authority) each plane link kind's carried bytes and utilisation."""
        gw: dict[str, str] = {}  # the collector labels each sample with the gateway (device)
        c = self.counters
        families = [
            Family(
                name="cmemu_gateway_ops_total",
                help="RDMA operations its queue pairs completed, by op",
                type="counter",
                samples=[({**gw, "op": op}, n) for op, n in c.ops.items()],
            ),
            Family(
                name="cmemu_gateway_op_bytes_total",
                help="Bytes its queue pairs' operations moved, by op",
                type="counter",
                samples=[({**gw, "op": op}, n) for op, n in c.op_bytes.items()],
            ),
            Family(
                name="cmemu_gateway_landed_bytes_total",
                help="Bytes of RDMA operations that landed on its supernode's NPUs",
                type="counter",
                samples=[(gw, c.bytes_in)],
            ),
            Family(
                name="cmemu_gateway_failed_ops_total",
                help="RDMA operations its queue pairs issued that failed",
                type="counter",
                samples=[(gw, c.failed)],
            ),
            Family(
                name="cmemu_gateway_queue_pairs",
                help="Queue pairs on the gateway",
                type="gauge",
                samples=[(gw, len(self.qps))],
            ),
            Family(
                name="cmemu_gateway_down",
                help="1 while a gateway-down fault holds the gateway",
                type="gauge",
                samples=[(gw, int(self.down is not None))],
            ),
        ]
        if self.authority is not None:
            families += self.authority.metrics()
        return families

    async def close(self) -> None:
        self._closing = True
        self._faults_moved.set()
        if self.authority is not None:
            self.authority.close()


def fault_proto(fault: RdmaFault) -> gateway_pb2.GatewayFault:
    return gateway_pb2.GatewayFault(
        id=fault.id,
        kind=fault.kind,
        target=fault.target,
        factor=fault.factor,
        for_s=fault.for_s,
        since_ns=round(fault.since_s * 1e9),
        until_ns=round(fault.until_s * 1e9),
    )


def shape(
    op: gateway_pb2.RdmaOp.ValueType, request: gateway_pb2.RdmaRequest, inline_max: int
) -> int:
    """The size an op moves, its request's shape checked (never touches state)."""
    if request.data and op == gateway_pb2.RDMA_OP_READ:
        raise InvalidArgumentError("a READ carries no data; give size", field="data")
    if request.data and request.size_only:
        raise InvalidArgumentError("data and size_only are exclusive", field="size_only")
    size = request.size
    if request.data:
        if size not in (0, len(request.data)):
            raise InvalidArgumentError(
                f"size {size} differs from len(data) {len(request.data)}", field="size"
            )
        size = len(request.data)
    if size == 0:
        raise InvalidArgumentError("size must be > 0 (or data non-empty)", field="size")
    if op != gateway_pb2.RDMA_OP_READ and not request.data and not request.size_only:
        raise InvalidArgumentError(
            "WRITE and SEND carry data, or set size_only for a bulk transfer", field="data"
        )
    if not request.size_only and size > inline_max:
        raise InvalidArgumentError(
            f"{size} bytes exceed the {inline_max}-byte inline payload limit; use size_only",
            field="size",
            reason="PAYLOAD_TOO_LARGE",
        )
    return size
