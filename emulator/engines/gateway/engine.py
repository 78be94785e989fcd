"""The scale-out RDMA gateway of a supernode (sn0-gw, sn1-gw, ...), without its wire.

Queue pairs are created on the dies of this supernode's NPUs and connected to a queue pair of
any gateway of the plane (that gateway agrees: `accept_qp`). An operation on a connected QP:
the owner of the remote NPU checks it first (`land` with check_only: a bad address fails before
any time passes), the plane's timing authority times the flow (plane.py: the sn0 gateway,
asked by the others), the owner applies it through the NPU's own UB Deliver when the flow
completes, and the reply is paced to the completion instant. RDMA never goes through the
fabric, and the fabric never sees the plane.

Another gateway is a `GatewayPeer` (emulator/engines/peers.py): this engine itself, called as a
remote one would be, or the typed gRPC client of one in another process.
"""

from __future__ import annotations

import dataclasses
import uuid

from cmemu.emulator.engines.gateway.faults import GatewayFaults
from cmemu.emulator.engines.gateway.local import LocalGateway
from cmemu.emulator.engines.gateway.plane import PlaneAuthority
from cmemu.emulator.engines.gateway.types import (
    DEFAULT_TOP,
    PEER_TIMEOUT_S,
    GatewayStats,
    Landing,
    LinkStats,
    OpRequest,
    OpResult,
    Qp,
    QpState,
    RdmaOp,
    RouteInfo,
    TimedFlow,
    shape,
)
from cmemu.emulator.engines.peers import GatewayPeer
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    blame,
    quote,
)
from cmemu.emulator.model.naming import DeviceName, DieName, die_id, parse_endpoint
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.model.ub import Transaction

LINK_BROKEN = ("ROUTE_CUT", "GATEWAY_DOWN", "PEER_UNREACHABLE")
"""The reasons an op's failure leaves its queue pair in ERROR, as RDMA's retry-exceeded does."""


def _device_of(endpoint: str) -> str:
    """The device of an RDMA endpoint (an NPU die, "n00-npu3.d1"), by id; "" for none."""
    if not endpoint:
        return ""
    name = parse_endpoint(endpoint)
    return (name.device if isinstance(name, DieName) else name).id


class GatewayEngine(GatewayFaults):
    """What a gateway does: its queue pairs' lifecycle and operations, the plane's views and
    faults (asked of the authority where this is not it).

    A down gateway (a gateway-down fault) refuses its queue pairs' calls and the bytes landing
    on its NPUs (GATEWAY_DOWN); it still answers its fault control and statistics, the plane's
    views and (sn0) the plane's timing, which the other gateways' traffic needs whatever state
    sn0's own NPUs are in."""

    def as_peer(self) -> GatewayPeer:
        return LocalGateway(self)

    def _copy(self, qp: Qp) -> Qp:
        return dataclasses.replace(qp)

    # --- queue pairs ---------------------------------------------------------------------------

    async def create_qp(self, npu: str, die: int = 0) -> Qp:
        self.require_up()
        device, die = self.npu(npu, die)
        return self.create(device, die)

    async def connect_qp(self, qpn: int, remote_gateway: str, remote_qpn: int) -> Qp:
        self.require_up()
        if not remote_gateway:
            raise InvalidArgumentError("remote_gateway is required", field="remote_gateway")
        self.gateway(remote_gateway, field="remote_gateway")
        if remote_gateway == self.name and remote_qpn == qpn:
            raise InvalidArgumentError(
                "a queue pair cannot be connected to itself", field="remote_qpn"
            )
        qp = self.qp(qpn)
        if qp.state not in (QpState.INIT, QpState.ERROR):
            raise PreconditionError(
                f"queue pair {qp.qpn} is connected; destroy it or use another",
                field="qpn",
                subject=f"{self.name}/{qp.qpn}",
                reason="QP_ALREADY_CONNECTED",
            )
        accepted = self.peer(remote_gateway).accept_qp(
            remote_qpn,
            peer_gateway=self.name,
            peer_qpn=qp.qpn,
            peer_npu=qp.npu,
            peer_die=qp.die,
            deadline_s=None,
        )
        remote = await self.answer(remote_gateway, accepted)
        qp.remote_gateway, qp.remote_qpn = remote_gateway, remote_qpn
        qp.remote_npu, qp.remote_die = remote.npu, remote.die
        qp.state = QpState.RTS  # through RTR: the remote end is known and agreed
        self.publish(
            "qp-connected",
            qp=f"{self.name}/{qp.qpn}",
            local=qp.local_die,
            remote=f"{qp.remote_gateway}/{qp.remote_qpn}",
            remote_die=qp.remote,
        )
        self.log.info("qp connected", qpn=qp.qpn, remote=qp.remote)
        return self._copy(qp)

    async def accept_qp(
        self, qpn: int, *, peer_gateway: str, peer_qpn: int, peer_npu: str, peer_die: int
    ) -> Qp:
        """Agree to a connection another queue pair asks of one of ours."""
        self.require_up()
        qp = self.qp(qpn)
        again = (qp.remote_gateway, qp.remote_qpn) == (peer_gateway, peer_qpn)
        if qp.state not in (QpState.INIT, QpState.ERROR) and not again:
            raise PreconditionError(
                f"queue pair {qp.qpn} of {self.name} is connected already",
                field="remote_qpn",
                subject=f"{self.name}/{qp.qpn}",
                reason="QP_ALREADY_CONNECTED",
            )
        qp.state = QpState.RTR
        qp.remote_gateway, qp.remote_qpn = peer_gateway, peer_qpn
        qp.remote_npu, qp.remote_die = peer_npu, peer_die
        qp.state = QpState.RTS
        return self._copy(qp)

    async def destroy_qp(self, qpn: int) -> int:
        self.require_up()
        qp = self.qp(qpn)
        del self.qps[qp.qpn]
        return qp.qpn

    async def list_qps(self) -> list[Qp]:
        self.require_up()
        return [self._copy(q) for q in self.qps.values()]

    # --- operations ----------------------------------------------------------------------------

    async def op(self, op: RdmaOp, request: OpRequest) -> OpResult:
        """WRITE, READ or SEND on a connected queue pair, returned at its completion instant."""
        self.require_up()
        qp = self.qp(request.qpn)
        if qp.state is not QpState.RTS:
            raise PreconditionError(
                f"queue pair {qp.qpn} is {qp.state.name}, not connected (RTS): ConnectQp first",
                field="qpn",
                subject=f"{self.name}/{qp.qpn}",
                reason="QP_NOT_CONNECTED",
            )
        size = shape(op, request, self.profile.limits.inline_payload_max_bytes)
        op_id = request.id or uuid.uuid4().hex
        issue_ns = self.clock.now_ns()
        src, dst = (qp.remote, qp.local_die) if op is RdmaOp.READ else (qp.local_die, qp.remote)
        land = Landing(
            op=op,
            npu=qp.remote_npu,
            offset=request.remote_offset,
            data=request.data,
            size=size,
            size_only=request.size_only,
            check_only=True,
            src=qp.local_die,
            id=op_id,
            issue_ns=issue_ns,
        )
        try:
            owner = self.peer(qp.remote_gateway)
            gateway = qp.remote_gateway
            await self.answer(gateway, owner.land(land, deadline_s=None))  # a bad address: at once
            timed = await self.peer(self.authority_id).time_flow(
                src, dst, size, issue_ns, deadline_s=None
            )
            land = dataclasses.replace(land, check_only=False, complete_ns=timed.complete_ns)
            data = await self.answer(gateway, owner.land(land, deadline_s=None))
        except EmulatorError as exc:
            self.counters.failed += 1
            if exc.reason in LINK_BROKEN:
                qp.state = QpState.ERROR
            raise
        self.counters.ops[op.value] += 1
        self.counters.op_bytes[op.value] += size
        qp.ops += 1
        qp.bytes += size
        await self.clock.pace(timed.complete_ns / 1e9)  # the reply waits for the clock
        return OpResult(
            id=op_id,
            op=op,
            qpn=qp.qpn,
            src=src,
            dst=dst,
            size=size,
            data=data,
            issue_ns=issue_ns,
            complete_ns=timed.complete_ns,
            path=timed.path,
            paths=timed.paths,
        )

    async def land(self, landing: Landing) -> bytes:
        """Check, or apply, an op's bytes on an NPU of this supernode, through its UB Deliver;
        the bytes a READ brings back."""
        self.require_up()
        device, _ = self.npu(landing.npu, 0)
        tx = Transaction(
            id=landing.id,
            op=landing.op.ub,
            dst_eid=device.eid,
            dst_offset=landing.offset,
            size=landing.size,
            data=landing.data,
            size_only=landing.size_only,
            issue_ns=landing.issue_ns,
            src_device=_device_of(landing.src),
            arrive_ns=landing.complete_ns,
        )
        delivered = self.peers.device(device).deliver(
            tx, check_only=landing.check_only, deadline_s=None
        )
        completion = await self.answer(device.id, delivered)
        if not landing.check_only:
            self.counters.bytes_in += landing.size
        return completion.data

    async def time_flow(self, src: str, dst: str, size: int, issue_ns: int) -> TimedFlow:
        """The plane's timing of one flow (the authority only), once it has completed."""
        plane = self._authority()
        with blame(subject=f"{src}>{dst}", reason="ROUTE_CUT", on=UnavailableError):
            complete_ns, route = await plane.time_flow(src, dst, size, issue_ns)
        return TimedFlow(complete_ns=complete_ns, path=route.hops, paths=route.paths)

    def _authority(self) -> PlaneAuthority:
        if self.authority is None:
            raise PreconditionError(
                f"{self.name} does not time the plane: {self.authority_id} does",
                subject=self.name,
                reason="NOT_THE_AUTHORITY",
            )
        return self.authority

    # --- plane views ---------------------------------------------------------------------------

    async def link_stats(self, top: int) -> LinkStats:
        if self.authority is None:
            return await self.peer(self.authority_id).link_stats(top, deadline_s=PEER_TIMEOUT_S)
        return self.authority.link_stats(top or DEFAULT_TOP, self.name)

    async def route(self, src: str, dst: str) -> RouteInfo:
        if self.authority is None:
            return await self.peer(self.authority_id).route(src, dst, deadline_s=PEER_TIMEOUT_S)
        ends = [self._plane_die(src, "src"), self._plane_die(dst, "dst")]
        with blame(subject=f"{src}>{dst}", reason="ROUTE_CUT", on=UnavailableError):
            route = self.authority.route(ends[0], ends[1])
        return RouteInfo(
            path=route.hops,
            paths=route.paths,
            switches=route.switches,
            latency_ns=round(route.latency_s * 1e9),
            max_gb_s=route.cap / 1e9,
        )

    def _plane_die(self, name: str, field_name: str) -> str:
        """A die of the plane from a die or NPU id (an NPU: its die 0), any supernode."""
        if not name:
            raise InvalidArgumentError(f"{field_name} is required", field=field_name)
        with blame(field=field_name, subject=name):
            parsed = parse_endpoint(name)
        if isinstance(parsed, DeviceName) and parsed.kind is not DeviceKind.NPU:
            raise InvalidArgumentError(
                f"{parsed.id} is a {parsed.kind.value}: RDMA ports are on NPU dies only",
                field=field_name,
                subject=name,
                reason="NOT_AN_NPU",
            )
        die = name if "." in name else die_id(parsed.id, 0)
        plane = self.authority
        assert plane is not None
        if die not in plane.graph.ports:
            raise NotFoundError(
                f"{quote(name)} has no RDMA port on the plane (NPU dies only)",
                field=field_name,
                subject=name,
                reason="NO_RDMA_PORT",
            )
        return die

    def stats(self) -> GatewayStats:
        c = self.counters
        return GatewayStats(
            gateway=self.name,
            down=self.down is not None,
            qps=len(self.qps),
            write_ops=c.ops[RdmaOp.WRITE.value],
            read_ops=c.ops[RdmaOp.READ.value],
            send_ops=c.ops[RdmaOp.SEND.value],
            bytes_out=sum(c.op_bytes.values()),
            bytes_in=c.bytes_in,
            failed_ops=c.failed,
            emulated_ns=self.clock.now_ns(),
        )
