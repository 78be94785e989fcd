"""The scale-out RDMA gateway of a supernode (`cmemu.v1.Gateway`, sn0-gw, sn1-gw, ...) behind
the wire: each RPC translates its request (emulator/client/wire/gateway.py), calls the gateway's
engine (emulator/engines/gateway/) and translates the answer back. The other gateways are the
engine's peers (services/peers.py `Peers.gateway`); AcceptQp, Land and TimeFlow are what they
ask of this one.
"""

from __future__ import annotations

from cmemu.emulator.client.wire import gateway as wire
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.gateway.engine import GatewayEngine
from cmemu.emulator.engines.gateway.types import RdmaOp
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import gateway_pb2, gateway_pb2_grpc

__all__ = ["SERVICE", "GatewayEngine", "GatewayServicer", "create_gateway"]

SERVICE = "cmemu.v1.Gateway"


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, engine: GatewayEngine) -> None:
        self.engine = engine

    # --- queue pairs ---------------------------------------------------------------------------

    @rpc
    async def CreateQp(
        self, request: gateway_pb2.CreateQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        return wire.qp_proto(await self.engine.create_qp(request.npu, request.die))

    @rpc
    async def ConnectQp(
        self, request: gateway_pb2.ConnectQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        qp = await self.engine.connect_qp(request.qpn, request.remote_gateway, request.remote_qpn)
        return wire.qp_proto(qp)

    @rpc
    async def AcceptQp(
        self, request: gateway_pb2.AcceptQpRequest, context: Context
    ) -> gateway_pb2.QueuePair:
        qp = await self.engine.accept_qp(
            request.qpn,
            peer_gateway=request.peer_gateway,
            peer_qpn=request.peer_qpn,
            peer_npu=request.peer_npu,
            peer_die=request.peer_die,
        )
        return wire.qp_proto(qp)

    @rpc
    async def DestroyQp(
        self, request: gateway_pb2.DestroyQpRequest, context: Context
    ) -> gateway_pb2.DestroyQpResponse:
        return gateway_pb2.DestroyQpResponse(qpn=await self.engine.destroy_qp(request.qpn))

    @rpc
    async def ListQps(
        self, request: gateway_pb2.ListQpsRequest, context: Context
    ) -> gateway_pb2.QpList:
        return gateway_pb2.QpList(qps=[wire.qp_proto(q) for q in await self.engine.list_qps()])

    # --- operations ----------------------------------------------------------------------------

    @rpc
    async def Write(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(RdmaOp.WRITE, request)

    @rpc
    async def Read(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(RdmaOp.READ, request)

    @rpc
    async def Send(
        self, request: gateway_pb2.RdmaRequest, context: Context
    ) -> gateway_pb2.RdmaCompletion:
        return await self._op(RdmaOp.SEND, request)

    async def _op(self, op: RdmaOp, request: gateway_pb2.RdmaRequest) -> gateway_pb2.RdmaCompletion:
        return wire.op_result_proto(await self.engine.op(op, wire.op_request(request)))

    @rpc
    async def Land(
        self, request: gateway_pb2.LandRequest, context: Context
    ) -> gateway_pb2.LandResponse:
        return gateway_pb2.LandResponse(data=await self.engine.land(wire.landing(request)))

    @rpc
    async def TimeFlow(
        self, request: gateway_pb2.TimeFlowRequest, context: Context
    ) -> gateway_pb2.TimeFlowResponse:
        timed = await self.engine.time_flow(
            request.src, request.dst, request.size, request.issue_ns
        )
        return wire.timed_flow_proto(timed)

    # --- plane views ---------------------------------------------------------------------------

    @rpc
    async def GetLinkStats(
        self, request: gateway_pb2.GatewayLinkStatsRequest, context: Context
    ) -> gateway_pb2.GatewayLinkStats:
        return wire.link_stats_proto(await self.engine.link_stats(request.top))

    @rpc
    async def Route(
        self, request: gateway_pb2.RdmaRouteRequest, context: Context
    ) -> gateway_pb2.RdmaRouteInfo:
        return wire.route_proto(await self.engine.route(request.src, request.dst))

    @rpc
    async def GetStats(
        self, request: gateway_pb2.GatewayStatsRequest, context: Context
    ) -> gateway_pb2.GatewayStats:
        return wire.stats_proto(self.engine.stats())

    # --- faults --------------------------------------------------------------------------------

    @rpc
    async def InjectFault(
        self, request: gateway_pb2.GatewayFault, context: Context
    ) -> gateway_pb2.GatewayFault:
        return wire.fault_proto(await self.engine.inject_fault(wire.fault_request(request)))

    @rpc
    async def ClearFault(
        self, request: gateway_pb2.ClearGatewayFaultRequest, context: Context
    ) -> gateway_pb2.GatewayFaultList:
        left = await self.engine.clear_fault(request.id, all=request.all)
        return wire.fault_list_proto(left)

    @rpc
    async def ListFaults(
        self, request: gateway_pb2.ListGatewayFaultsRequest, context: Context
    ) -> gateway_pb2.GatewayFaultList:
        return wire.fault_list_proto(await self.engine.list_faults())


def create_gateway(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None = None,
) -> tuple[GatewayEngine, ServiceHost]:
    """The gateway of this topology's supernode and its server (not started); the engine is
    this process's peer for whoever asks that gateway here (a KV transfer, another gateway)."""
    engine = GatewayEngine(
        topology=topology, profile=profile, clock=clock, peers=peers, events=events
    )
    servicer = GatewayServicer(engine)
    host = ServiceHost(
        name=engine.name,
        address=address,
        services=[(SERVICE, lambda s: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, s))],
    )
    engine.server = host
    peers.host_gateway(engine)
    return engine, host
