"""The state of a scale-out RDMA gateway: who it is, its queue pairs, its counters, its
gateway-down fault and, on sn0, the plane's timing authority (plane.py); the checks of the ids
its requests name; the clock that expires its faults; its metrics. What it does with them is
engine.py's."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import answer_within
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.gateway.plane import PlaneAuthority
from cmemu.emulator.engines.gateway.types import AUTHORITY, Qp, RdmaOp
from cmemu.emulator.engines.peers import GatewayDirectory, GatewayPeer
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    blame,
    quote,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.naming import parse_endpoint, service_id
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.model.topology import Device, DeviceKind, Service, ServiceKind, Topology

T = TypeVar("T")
OP_NAMES = tuple(op.value for op in RdmaOp)


class Health(Protocol):
    """What a gateway asks of the server that hosts it: NOT_SERVING while it is down."""

    async def set_serving(self, serving: bool) -> None: ...


@dataclass
class Counters:
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OP_NAMES, 0))
    op_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OP_NAMES, 0))
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
        peers: GatewayDirectory,
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
        self.down: RdmaFault[Any] | None = None  # the gateway-down fault, when injected
        self.server: Health | None = None
        self._faults_moved = asyncio.Event()
        self._closing = False
        self.log = structlog.get_logger("cmemu.gateway").bind(device=self.name)

    def publish(self, event: str, **detail: str) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    async def answer(self, peer: str, call: Awaitable[T]) -> T:
        """A call on the data path to a peer gateway or an NPU: a hung one fails it
        (DeadlineExceededError) after `scaleout.peer_timeout_s` of emulated time; in wall
        seconds it would fail a healthy peer's op on a starved host, where its answer comes late."""
        s = self.profile.scaleout
        return await answer_within(
            self.clock.clock, s.peer_timeout_s, call,
            peer=peer, min_wall_s=s.peer_timeout_min_wall_s,
        )  # fmt: skip

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

    def gateway(self, gateway: str, *, field: str) -> Service:
        """A gateway of the plane by id ("sn1-gw")."""
        for service in self.plane.gateways:
            if service.id == gateway:
                return service
        ids = [g.id for g in self.plane.gateways]
        raise NotFoundError(
            f"no gateway {quote(gateway)} on the plane; gateways: {', '.join(ids)}",
            field=field,
            subject=gateway,
            reason="GATEWAY_NOT_FOUND",
        )

    def peer(self, gateway: str) -> GatewayPeer:
        """Another gateway of the plane by id, or this one called as the others call it."""
        if gateway == self.name:
            return self.as_peer()
        return self.peers.gateway(self.gateway(gateway, field="remote_gateway"))

    def as_peer(self) -> GatewayPeer:
        """This gateway as its peers see it (the engine's, engine.py)."""
        raise NotImplementedError

    def create(self, device: Device, die: int) -> Qp:
        qp = Qp(
            gateway=self.name,
            qpn=self._next_qpn,
            npu=device.id,
            die=die,
            created_ns=self.clock.now_ns(),
        )
        self._next_qpn += 1
        self.qps[qp.qpn] = qp
        return dataclasses.replace(qp)

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

    async def set_down(self, fault: RdmaFault[Any] | None) -> None:
        self.down = fault
        if self.server is not None:
            await self.server.set_serving(fault is None)
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
