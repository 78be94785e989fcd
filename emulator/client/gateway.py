"""A gateway of the RDMA plane in another process, as a gateway's engine (or a KV transfer)
calls it: the gRPC side of emulator/engines/peers.py `GatewayPeer`. It translates with
emulator/client/wire/gateway.py and turns a failed call into the EmulatorError its status names,
prefixed with the gateway's id (emulator/client/status.py), as the in-process `LocalGateway`
(emulator/engines/gateway/local.py) does.

A program (or `cmemu rdma`) gets one by `gateway_of(clients, which)`: besides the peer
protocol's calls, it lists and destroys queue pairs and reads the gateway's counters; there a
failure is the server's message unprefixed (`prefixed=False`), as a person reads it."""

from __future__ import annotations

from typing import Any

import grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import gateway as wire
from cmemu.emulator.engines.gateway.types import (
    GatewayStats,
    Landing,
    LinkStats,
    OpRequest,
    OpResult,
    Qp,
    RdmaOp,
    RouteInfo,
    TimedFlow,
)
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.v1 import gateway_pb2, gateway_pb2_grpc


class RemoteGateway:
    def __init__(
        self, channel: grpc.aio.Channel, gateway_id: str, *, prefixed: bool = True
    ) -> None:
        self.id = gateway_id
        self._stub = gateway_pb2_grpc.GatewayStub(channel)
        self._prefix = gateway_id if prefixed else None

    async def create_qp(self, npu: str, die: int, *, deadline_s: float | None) -> Qp:
        request = gateway_pb2.CreateQpRequest(npu=npu, die=die)
        return wire.qp(
            await reply_of(self._prefix, self._stub.CreateQp(request, timeout=deadline_s))
        )

    async def connect_qp(
        self, qpn: int, remote_gateway: str, remote_qpn: int, *, deadline_s: float | None
    ) -> Qp:
        request = gateway_pb2.ConnectQpRequest(
            qpn=qpn, remote_gateway=remote_gateway, remote_qpn=remote_qpn
        )
        return wire.qp(
            await reply_of(self._prefix, self._stub.ConnectQp(request, timeout=deadline_s))
        )

    async def accept_qp(
        self,
        qpn: int,
        *,
        peer_gateway: str,
        peer_qpn: int,
        peer_npu: str,
        peer_die: int,
        deadline_s: float | None,
    ) -> Qp:
        request = gateway_pb2.AcceptQpRequest(
            qpn=qpn,
            peer_gateway=peer_gateway,
            peer_qpn=peer_qpn,
            peer_npu=peer_npu,
            peer_die=peer_die,
        )
        return wire.qp(
            await reply_of(self._prefix, self._stub.AcceptQp(request, timeout=deadline_s))
        )

    async def op(self, op: RdmaOp, request: OpRequest, *, deadline_s: float | None) -> OpResult:
        message = wire.op_request_proto(request)
        call = {
            RdmaOp.WRITE: self._stub.Write,
            RdmaOp.READ: self._stub.Read,
            RdmaOp.SEND: self._stub.Send,
        }[op]
        return wire.op_result(await reply_of(self._prefix, call(message, timeout=deadline_s)))

    async def land(self, landing: Landing, *, deadline_s: float | None) -> bytes:
        request = wire.landing_proto(landing)
        landed = await reply_of(self._prefix, self._stub.Land(request, timeout=deadline_s))
        return landed.data

    async def time_flow(
        self, src: str, dst: str, size: int, issue_ns: int, *, deadline_s: float | None
    ) -> TimedFlow:
        request = gateway_pb2.TimeFlowRequest(src=src, dst=dst, size=size, issue_ns=issue_ns)
        timed = await reply_of(self._prefix, self._stub.TimeFlow(request, timeout=deadline_s))
        return wire.timed_flow(timed)

    async def link_stats(self, top: int, *, deadline_s: float | None) -> LinkStats:
        request = gateway_pb2.GatewayLinkStatsRequest(top=top)
        stats = await reply_of(self._prefix, self._stub.GetLinkStats(request, timeout=deadline_s))
        return wire.link_stats(stats)

    async def route(self, src: str, dst: str, *, deadline_s: float | None) -> RouteInfo:
        request = gateway_pb2.RdmaRouteRequest(src=src, dst=dst)
        return wire.route(
            await reply_of(self._prefix, self._stub.Route(request, timeout=deadline_s))
        )

    async def inject_fault(
        self, fault: RdmaFault[Any], *, deadline_s: float | None
    ) -> RdmaFault[Any]:
        request = wire.fault_proto(fault)
        stored = await reply_of(self._prefix, self._stub.InjectFault(request, timeout=deadline_s))
        return wire.fault(stored)

    async def clear_fault(
        self, fault_id: str, *, all: bool, deadline_s: float | None
    ) -> list[RdmaFault[Any]]:
        request = gateway_pb2.ClearGatewayFaultRequest(id=fault_id, all=all)
        left = await reply_of(self._prefix, self._stub.ClearFault(request, timeout=deadline_s))
        return [wire.fault(f) for f in left.faults]

    async def list_faults(self, *, deadline_s: float | None) -> list[RdmaFault[Any]]:
        request = gateway_pb2.ListGatewayFaultsRequest()
        listed = await reply_of(self._prefix, self._stub.ListFaults(request, timeout=deadline_s))
        return [wire.fault(f) for f in listed.faults]

    async def destroy_qp(self, qpn: int, *, deadline_s: float | None = None) -> int:
        """Destroy a queue pair of this gateway: the number it had."""
        request = gateway_pb2.DestroyQpRequest(qpn=qpn)
        gone = await reply_of(self._prefix, self._stub.DestroyQp(request, timeout=deadline_s))
        return int(gone.qpn)

    async def list_qps(self, *, deadline_s: float | None = None) -> list[Qp]:
        request = gateway_pb2.ListQpsRequest()
        listed = await reply_of(self._prefix, self._stub.ListQps(request, timeout=deadline_s))
        return [wire.qp(q) for q in listed.qps]

    async def stats(self, *, deadline_s: float | None = None) -> GatewayStats:
        """The gateway's operations, bytes and failures so far."""
        request = gateway_pb2.GatewayStatsRequest()
        got = await reply_of(self._prefix, self._stub.GetStats(request, timeout=deadline_s))
        return wire.stats(got)


def gateway_of(clients: Clients, which: int | str | None = None) -> RemoteGateway:
    """The gateway of a supernode of the launch, by index (1) or id ("sn1-gw"); None: that of
    `clients`' own supernode. NotFoundError without a scale-out plane or for an unknown one.
    Its failures carry the server's message as is (see the module's docstring)."""
    address = clients.gateway_address(which)
    plane = clients.topology.scaleout
    assert plane is not None  # gateway_address refused a launch without a plane
    gateway_id = next(g.id for g in plane.gateways if g.address == address)
    return RemoteGateway(clients.channel_to(address), gateway_id, prefixed=False)
