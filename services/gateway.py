"""The scale-out RDMA gateway of a supernode (`cmemu.v1.Gateway`, sn0-gw, sn1-gw, ...).

Queue pairs are created on the dies of this supernode's NPUs and connected to a queue pair of
any gateway of the plane (that gateway agrees: AcceptQp). An operation on a connected QP:
the owner of the remote NPU checks it first (Land with check_only: a bad address fails before
any time passes), the plane's timing authority times the flow (services/gateway_plane.py: the
sn0 gateway, asked over TimeFlow by the others), the owner applies it through the NPU's own UB
Deliver when the flow completes, and the reply is paced to the completion instant. RDMA never
goes through the fabric, and the fabric never sees the plane.
"""

from __future__ import annotations

import uuid
from typing import Any

import grpc

from cmemu.v1 import gateway_pb2, gateway_pb2_grpc
from emulator.client.wire import ub as ub_wire
from emulator.engines.clock import Timeline
from emulator.engines.events import EventSink
from emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    blame,
    quote,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.naming import DeviceName, DieName, die_id, parse_endpoint
from emulator.model.rdmagraph import RdmaFault
from emulator.model.topology import DeviceKind, Topology
from emulator.model.ub import Transaction
from services.gateway_plane import PlaneAuthority
from services.gateway_state import (
    DEFAULT_TOP,
    GATEWAY_DOWN,
    MANAGEMENT,
    OP_NAME,
    PEER_TIMEOUT_S,
    UB_OP,
    GatewayState,
    fault_proto,
    shape,
)
from services.host import ServiceHost
from services.peers import LOCAL_CONTEXT, Peers
from services.rpc import Context, RemoteError, rpc

__all__ = ["SERVICE", "GatewayServicer", "GatewayState", "create_gateway"]

SERVICE = "cmemu.v1.Gateway"


def _device_of(endpoint: str) -> str:
    """The device of an RDMA endpoint (an NPU die, "n00-npu3.d1"), by id; "" for none."""
    if not endpoint:
        return ""
    name = parse_endpoint(endpoint)
    return (name.device if isinstance(name, DieName) else name).id


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self._stubs: dict[str, Any] = {}  # peer gateway id -> its stub

    # --- peers ---------------------------------------------------------------------------------

    async def _peer(
        self, gateway: str, method: str, request: Any, deadline_s: float | None = PEER_TIMEOUT_S
    ) -> Any:
        """A Gateway method of another gateway (or of this one, called directly)."""
        s = self.state
        if gateway == s.name:
            try:
                return await getattr(self, method)(request, LOCAL_CONTEXT)
            except RemoteError:
                raise
            except EmulatorError as exc:
                raise RemoteError.from_error(exc, gateway) from exc
        stub = self._stubs.get(gateway)
        if stub is None:  # a stub makes a callable per method: one per peer, kept
            index = s.gateway_index(gateway, field="remote_gateway")
            address = s.plane.gateway(index).address
            stub = self._stubs[gateway] = gateway_pb2_grpc.GatewayStub(s.peers.channel(address))
        try:
            return await getattr(stub, method)(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            raise RemoteError.from_rpc_error(exc, gateway) from exc

    def _admit(self, method: str) -> None:
        if method not in MANAGEMENT:
            self.state.require_up()

    # --- queue pairs ---------------------------------------------------------------------------

    @rpc
    async def CreateQp(
        self, request: gateway_pb2.CreateQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        self._admit("CreateQp")
        device, die = self.state.npu(request.npu, request.die)
        return self.state.message(self.state.create(device, die))

    @rpc
    async def ConnectQp(
        self, request: gateway_pb2.ConnectQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        s = self.state
        self._admit("ConnectQp")
        if not request.remote_gateway:
            raise InvalidArgumentError("remote_gateway is required", field="remote_gateway")
        s.gateway_index(request.remote_gateway, field="remote_gateway")
        if request.remote_gateway == s.name and request.remote_qpn == request.qpn:
            raise InvalidArgumentError(
                "a queue pair cannot be connected to itself", field="remote_qpn"
            )
        qp = s.qp(request.qpn)
        if qp.state not in (gateway_pb2.QP_STATE_INIT, gateway_pb2.QP_STATE_ERROR):
            raise PreconditionError(
                f"queue pair {qp.qpn} is connected; destroy it or use another",
                field="qpn",
                subject=f"{s.name}/{qp.qpn}",
                reason="QP_ALREADY_CONNECTED",
            )
        remote: gateway_pb2.QueuePair = await self._peer(
            request.remote_gateway,
            "AcceptQp",
            gateway_pb2.AcceptQpRequest(
                qpn=request.remote_qpn,
                peer_gateway=s.name,
                peer_qpn=qp.qpn,
                peer_npu=qp.npu,
                peer_die=qp.die,
            ),
        )
        qp.remote_gateway, qp.remote_qpn = request.remote_gateway, request.remote_qpn
        qp.remote_npu, qp.remote_die = remote.npu, remote.die
        qp.state = gateway_pb2.QP_STATE_RTS  # through RTR: the remote end is known and agreed
        s.publish(
            "qp-connected",
            qp=f"{s.name}/{qp.qpn}",
            local=qp.local_die,
            remote=f"{qp.remote_gateway}/{qp.remote_qpn}",
            remote_die=qp.remote,
        )
        s.log.info("qp connected", qpn=qp.qpn, remote=qp.remote)
        return s.message(qp)

    @rpc
    async def AcceptQp(
        self, request: gateway_pb2.AcceptQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        s = self.state
        self._admit("AcceptQp")
        qp = s.qp(request.qpn)
        again = (qp.remote_gateway, qp.remote_qpn) == (request.peer_gateway, request.peer_qpn)
        if qp.state not in (gateway_pb2.QP_STATE_INIT, gateway_pb2.QP_STATE_ERROR) and not again:
            raise PreconditionError(
                f"queue pair {qp.qpn} of {s.name} is connected already",
                field="remote_qpn",
                subject=f"{s.name}/{qp.qpn}",
                reason="QP_ALREADY_CONNECTED",
            )
        qp.state = gateway_pb2.QP_STATE_RTR
        qp.remote_gateway, qp.remote_qpn = request.peer_gateway, request.peer_qpn
        qp.remote_npu, qp.remote_die = request.peer_npu, request.peer_die
        qp.state = gateway_pb2.QP_STATE_RTS
        return s.message(qp)

    @rpc
    async def DestroyQp(
        self, request: gateway_pb2.DestroyQpRequest, context: Context
    ) -> gateway_pb2.DestroyQpResponse:
        self._admit("DestroyQp")
        qp = self.state.qp(request.qpn)
        del self.state.qps[qp.qpn]
        return gateway_pb2.DestroyQpResponse(qpn=qp.qpn)

    @rpc
    async def ListQps(
        self, request: gateway_pb2.ListQpsRequest, context: Context
    ) -> gateway_pb2.QpList:
        self._admit("ListQps")
        return gateway_pb2.QpList(qps=[self.state.message(q) for q in self.state.qps.values()])

    # --- operations ----------------------------------------------------------------------------

    @rpc
    async def Write(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(gateway_pb2.RDMA_OP_WRITE, request)

    @rpc
    async def Read(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(gateway_pb2.RDMA_OP_READ, request)

    @rpc
    async def Send(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(gateway_pb2.RDMA_OP_SEND, request)

    async def _op(
        self, op: gateway_pb2.RdmaOp.ValueType, request: gateway_pb2.RdmaRequest
    ) -> gateway_pb2.RdmaCompletion:
        s = self.state
        self._admit("op")
        qp = s.qp(request.qpn)
        if qp.state != gateway_pb2.QP_STATE_RTS:
            raise PreconditionError(
                f"queue pair {qp.qpn} is {gateway_pb2.QpState.Name(qp.state)[9:]}, not "
                "connected (RTS): ConnectQp first",
                field="qpn",
                subject=f"{s.name}/{qp.qpn}",
                reason="QP_NOT_CONNECTED",
            )
        size = shape(op, request, s.profile.limits.inline_payload_max_bytes)
        op_id = request.id or uuid.uuid4().hex
        issue_ns = s.clock.now_ns()
        src, dst = (
            (qp.remote, qp.local_die)
            if op == gateway_pb2.RDMA_OP_READ
            else (
                qp.local_die,
                qp.remote,
            )
        )
        land = gateway_pb2.LandRequest(
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
            await self._peer(qp.remote_gateway, "Land", land)  # a bad address fails at once
            timed: gateway_pb2.TimeFlowResponse = await self._time(src, dst, size, issue_ns)
            land.check_only = False
            land.complete_ns = timed.complete_ns
            landed: gateway_pb2.LandResponse = await self._peer(qp.remote_gateway, "Land", land)
        except EmulatorError as exc:
            s.counters.failed += 1
            if exc.reason in ("ROUTE_CUT", "GATEWAY_DOWN", "PEER_UNREACHABLE"):
                qp.state = gateway_pb2.QP_STATE_ERROR  # as RDMA's retry-exceeded does
            raise
        name = OP_NAME[op]
        s.counters.ops[name] += 1
        s.counters.op_bytes[name] += size
        qp.ops += 1
        qp.bytes += size
        await s.clock.pace(timed.complete_ns / 1e9)  # the reply waits for the clock
        return gateway_pb2.RdmaCompletion(
            id=op_id,
            op=op,
            qpn=qp.qpn,
            src=src,
            dst=dst,
            size=size,
            data=landed.data,
            issue_ns=issue_ns,
            complete_ns=timed.complete_ns,
            path=timed.path,
            paths=timed.paths,
        )

    async def _time(
        self, src: str, dst: str, size: int, issue_ns: int
    ) -> gateway_pb2.TimeFlowResponse:
        request = gateway_pb2.TimeFlowRequest(src=src, dst=dst, size=size, issue_ns=issue_ns)
        reply: gateway_pb2.TimeFlowResponse = await self._peer(
            self.state.authority_id, "TimeFlow", request, deadline_s=None
        )
        return reply

    @rpc
    async def Land(
        self, request: gateway_pb2.LandRequest, context: Context
    ) -> gateway_pb2.LandResponse:
        """Check, or apply, an op's bytes on an NPU of this supernode, through its UB Deliver."""
        s = self.state
        self._admit("Land")
        device, _ = s.npu(request.npu, 0)
        if request.op not in UB_OP:
            raise InvalidArgumentError("op must be WRITE, READ or SEND", field="op")
        tx = Transaction(
            id=request.id,
            op=ub_wire.op_of(UB_OP[request.op]),
            dst_eid=device.eid,
            dst_offset=request.offset,
            size=request.size,
            data=request.data,
            size_only=request.size_only,
            issue_ns=request.issue_ns,
            src_device=_device_of(request.src),
            arrive_ns=request.complete_ns,
        )
        completion = await s.peers.device(device).deliver(
            tx, check_only=request.check_only, deadline_s=PEER_TIMEOUT_S
        )
        if not request.check_only:
            s.counters.bytes_in += request.size
        return gateway_pb2.LandResponse(data=completion.data)

    @rpc
    async def TimeFlow(
        self, request: gateway_pb2.TimeFlowRequest, context: Context
    ) -> gateway_pb2.TimeFlowResponse:
        plane = self._authority()
        with blame(subject=f"{request.src}>{request.dst}", reason="ROUTE_CUT", on=UnavailableError):
            complete_ns, route = await plane.time_flow(
                request.src, request.dst, request.size, request.issue_ns
            )
        return gateway_pb2.TimeFlowResponse(
            complete_ns=complete_ns, path=route.hops, paths=route.paths
        )

    def _authority(self) -> PlaneAuthority:
        if self.state.authority is None:
            raise PreconditionError(
                f"{self.state.name} does not time the plane: {self.state.authority_id} does",
                subject=self.state.name,
                reason="NOT_THE_AUTHORITY",
            )
        return self.state.authority

    # --- plane views ---------------------------------------------------------------------------

    @rpc
    async def GetLinkStats(
        self, request: gateway_pb2.GatewayLinkStatsRequest, context: Context
    ) -> gateway_pb2.GatewayLinkStats:
        s = self.state
        if s.authority is None:
            reply: gateway_pb2.GatewayLinkStats = await self._peer(
                s.authority_id, "GetLinkStats", request
            )
            return reply
        return s.authority.link_stats(request.top or DEFAULT_TOP, s.name)

    @rpc
    async def Route(
        self, request: gateway_pb2.RdmaRouteRequest, context: Context
    ) -> gateway_pb2.RdmaRouteInfo:
        s = self.state
        if s.authority is None:
            reply: gateway_pb2.RdmaRouteInfo = await self._peer(s.authority_id, "Route", request)
            return reply
        ends = []
        for name, field_name in ((request.src, "src"), (request.dst, "dst")):
            ends.append(self._plane_die(name, field_name))
        with blame(subject=f"{request.src}>{request.dst}", reason="ROUTE_CUT", on=UnavailableError):
            route = s.authority.route(ends[0], ends[1])
        return gateway_pb2.RdmaRouteInfo(
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
        plane = self.state.authority
        assert plane is not None
        if die not in plane.graph.ports:
            raise NotFoundError(
                f"{quote(name)} has no RDMA port on the plane (NPU dies only)",
                field=field_name,
                subject=name,
                reason="NO_RDMA_PORT",
            )
        return die

    @rpc
    async def GetStats(
        self, request: gateway_pb2.GatewayStatsRequest, context: Context
    ) -> gateway_pb2.GatewayStats:
        s = self.state
        c = s.counters
        return gateway_pb2.GatewayStats(
            gateway=s.name,
            down=s.down is not None,
            qps=len(s.qps),
            write_ops=c.ops["write"],
            read_ops=c.ops["read"],
            send_ops=c.ops["send"],
            bytes_out=sum(c.op_bytes.values()),
            bytes_in=c.bytes_in,
            failed_ops=c.failed,
            emulated_ns=s.clock.now_ns(),
        )

    # --- faults --------------------------------------------------------------------------------

    @rpc
    async def InjectFault(
        self, request: gateway_pb2.GatewayFault, context: Context
    ) -> gateway_pb2.GatewayFault:
        s = self.state
        if request.kind == GATEWAY_DOWN:
            return await self._gateway_down(request)
        if s.authority is None:  # the plane's faults live with its timing
            reply: gateway_pb2.GatewayFault = await self._peer(
                s.authority_id, "InjectFault", request
            )
            return reply
        fault = RdmaFault(
            kind=request.kind,
            target=request.target,
            factor=request.factor,
            for_s=request.for_s,
            since_s=s.now_s(),
        )
        with blame(field="target", on=NotFoundError):
            stored = s.authority.add_fault(fault)
        s.faults_moved()
        self._announce_fault(stored)
        return fault_proto(stored)

    async def _gateway_down(self, request: gateway_pb2.GatewayFault) -> gateway_pb2.GatewayFault:
        s = self.state
        target = request.target or s.name
        s.gateway_index(target, field="target")
        if target != s.name:
            reply: gateway_pb2.GatewayFault = await self._peer(target, "InjectFault", request)
            return reply
        if s.down is not None:
            raise PreconditionError(
                f"{s.name} is down already (fault {s.down.id})",
                subject=s.name,
                reason="FAULT_ACTIVE",
            )
        if not request.for_s >= 0:
            raise InvalidArgumentError("for_s must be >= 0 (0: until cleared)", field="for_s")
        fault = RdmaFault(
            kind=GATEWAY_DOWN,
            target=s.name,
            for_s=request.for_s,
            since_s=s.now_s(),
            id=f"{s.name}-down",
        )
        await s.set_down(fault)
        self._announce_fault(fault)
        return fault_proto(fault)

    def _announce_fault(self, fault: RdmaFault) -> None:
        s = self.state
        s.log.warning("fault injected", fault=fault.id, kind=fault.kind, target=fault.target)
        s.publish(
            "fault-injected",
            fault=fault.id,
            kind=fault.kind,
            target=fault.target,
            until_ns=str(round(fault.until_s * 1e9)),
        )

    @rpc
    async def ClearFault(
        self, request: gateway_pb2.ClearGatewayFaultRequest, context: Context
    ) -> gateway_pb2.GatewayFaultList:
        s = self.state
        if request.id and request.all:
            raise InvalidArgumentError("name one fault (id) or all, not both", field="all")
        if not request.id and not request.all:
            raise InvalidArgumentError(
                "id is required (clearing every fault takes all=true)", field="id"
            )
        own = s.down is not None and (request.all or request.id == s.down.id)
        if own:
            await s.set_down(None)
        plane = request.all or not own
        if plane and s.authority is None:
            await self._peer(s.authority_id, "ClearFault", request)
        elif plane and s.authority is not None:
            s.authority.clear_fault(request.id, all=request.all)
            s.faults_moved()
        s.publish("fault-cleared", fault=request.id or "all")
        s.log.warning("fault cleared", fault=request.id or "all")
        return await self._faults()

    @rpc
    async def ListFaults(
        self, request: gateway_pb2.ListGatewayFaultsRequest, context: Context
    ) -> gateway_pb2.GatewayFaultList:
        return await self._faults()

    async def _faults(self) -> gateway_pb2.GatewayFaultList:
        """This gateway's own fault, then the plane's."""
        s = self.state
        out = gateway_pb2.GatewayFaultList(
            faults=[fault_proto(s.down)] if s.down is not None else []
        )
        if s.authority is not None:
            out.faults.extend(fault_proto(f) for f in s.authority.faults.faults.values())
            return out
        plane: gateway_pb2.GatewayFaultList = await self._peer(
            s.authority_id, "ListFaults", gateway_pb2.ListGatewayFaultsRequest()
        )
        out.faults.extend(f for f in plane.faults if f.kind != GATEWAY_DOWN)
        return out


def create_gateway(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None = None,
) -> tuple[GatewayState, ServiceHost]:
    """The gateway of this topology's supernode and its server (not started)."""
    state = GatewayState(
        topology=topology, profile=profile, clock=clock, peers=peers, events=events
    )
    servicer = GatewayServicer(state)
    host = ServiceHost(
        name=state.name,
        address=address,
        services=[(SERVICE, lambda s: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, s))],
    )
    state.host = host
    return state, host
