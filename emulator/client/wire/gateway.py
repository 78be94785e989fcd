"""The Gateway service's messages <-> the RDMA gateway's domain types
(emulator/engines/gateway/types.py; faults: emulator/model/rdmafault.py `RdmaFault`)."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.engines.gateway.types import (
    GatewayStats,
    Landing,
    LinkStat,
    LinkStats,
    OpRequest,
    OpResult,
    Qp,
    QpState,
    RdmaOp,
    RouteInfo,
    TimedFlow,
)
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults import gateway as gateway_kinds
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.v1 import gateway_pb2

OP_OF = {
    gateway_pb2.RDMA_OP_WRITE: RdmaOp.WRITE,
    gateway_pb2.RDMA_OP_READ: RdmaOp.READ,
    gateway_pb2.RDMA_OP_SEND: RdmaOp.SEND,
}
WIRE_OP = {op: wire for wire, op in OP_OF.items()}
STATE_OF = {
    gateway_pb2.QP_STATE_INIT: QpState.INIT,
    gateway_pb2.QP_STATE_RTR: QpState.RTR,
    gateway_pb2.QP_STATE_RTS: QpState.RTS,
    gateway_pb2.QP_STATE_ERROR: QpState.ERROR,
}
WIRE_STATE = {state: wire for wire, state in STATE_OF.items()}


def op_of(value: int) -> RdmaOp:
    op: RdmaOp | None = OP_OF.get(value)  # type: ignore[call-overload]
    if op is None:
        raise InvalidArgumentError("op must be WRITE, READ or SEND", field="op")
    return op


def qp_proto(qp: Qp) -> gateway_pb2.QueuePair:
    return gateway_pb2.QueuePair(
        gateway=qp.gateway,
        qpn=qp.qpn,
        npu=qp.npu,
        die=qp.die,
        state=WIRE_STATE[qp.state],
        remote_gateway=qp.remote_gateway,
        remote_qpn=qp.remote_qpn,
        remote_npu=qp.remote_npu,
        remote_die=qp.remote_die,
        created_ns=qp.created_ns,
        ops=qp.ops,
        bytes=qp.bytes,
    )


def qp(m: gateway_pb2.QueuePair) -> Qp:
    return Qp(
        gateway=m.gateway,
        qpn=m.qpn,
        npu=m.npu,
        die=m.die,
        created_ns=m.created_ns,
        state=STATE_OF.get(m.state, QpState.INIT),
        remote_gateway=m.remote_gateway,
        remote_qpn=m.remote_qpn,
        remote_npu=m.remote_npu,
        remote_die=m.remote_die,
        ops=m.ops,
        bytes=m.bytes,
    )


def op_request(m: gateway_pb2.RdmaRequest) -> OpRequest:
    return OpRequest(
        qpn=m.qpn,
        id=m.id,
        remote_offset=m.remote_offset,
        data=m.data,
        size=m.size,
        size_only=m.size_only,
    )


def op_request_proto(r: OpRequest) -> gateway_pb2.RdmaRequest:
    return gateway_pb2.RdmaRequest(
        qpn=r.qpn,
        id=r.id,
        remote_offset=r.remote_offset,
        data=r.data,
        size=r.size,
        size_only=r.size_only,
    )


def op_result_proto(r: OpResult) -> gateway_pb2.RdmaCompletion:
    return gateway_pb2.RdmaCompletion(
        id=r.id,
        op=WIRE_OP[r.op],
        qpn=r.qpn,
        src=r.src,
        dst=r.dst,
        size=r.size,
        data=r.data,
        issue_ns=r.issue_ns,
        complete_ns=r.complete_ns,
        path=r.path,
        paths=r.paths,
    )


def op_result(m: gateway_pb2.RdmaCompletion) -> OpResult:
    return OpResult(
        id=m.id,
        op=op_of(m.op),
        qpn=m.qpn,
        src=m.src,
        dst=m.dst,
        size=m.size,
        data=m.data,
        issue_ns=m.issue_ns,
        complete_ns=m.complete_ns,
        path=tuple(m.path),
        paths=m.paths,
    )


def landing(m: gateway_pb2.LandRequest) -> Landing:
    return Landing(
        op=op_of(m.op),
        npu=m.npu,
        offset=m.offset,
        data=m.data,
        size=m.size,
        size_only=m.size_only,
        check_only=m.check_only,
        src=m.src,
        id=m.id,
        issue_ns=m.issue_ns,
        complete_ns=m.complete_ns,
    )


def landing_proto(land: Landing) -> gateway_pb2.LandRequest:
    return gateway_pb2.LandRequest(
        op=WIRE_OP[land.op],
        npu=land.npu,
        offset=land.offset,
        data=land.data,
        size=land.size,
        size_only=land.size_only,
        check_only=land.check_only,
        src=land.src,
        id=land.id,
        issue_ns=land.issue_ns,
        complete_ns=land.complete_ns,
    )


def timed_flow_proto(t: TimedFlow) -> gateway_pb2.TimeFlowResponse:
    return gateway_pb2.TimeFlowResponse(complete_ns=t.complete_ns, path=t.path, paths=t.paths)


def timed_flow(m: gateway_pb2.TimeFlowResponse) -> TimedFlow:
    return TimedFlow(complete_ns=m.complete_ns, path=tuple(m.path), paths=m.paths)


def route_proto(r: RouteInfo) -> gateway_pb2.RdmaRouteInfo:
    return gateway_pb2.RdmaRouteInfo(
        path=r.path,
        paths=r.paths,
        switches=r.switches,
        latency_ns=r.latency_ns,
        max_gb_s=r.max_gb_s,
    )


def route(m: gateway_pb2.RdmaRouteInfo) -> RouteInfo:
    return RouteInfo(
        path=tuple(m.path),
        paths=m.paths,
        switches=m.switches,
        latency_ns=m.latency_ns,
        max_gb_s=m.max_gb_s,
    )


def link_stats_proto(s: LinkStats) -> gateway_pb2.GatewayLinkStats:
    return gateway_pb2.GatewayLinkStats(
        emulated_ns=s.emulated_ns,
        links=[
            gateway_pb2.GatewayLinkStat(
                link=x.link,
                kind=x.kind,
                capacity_gb_s=x.capacity_gb_s,
                bytes=x.bytes,
                utilization=x.utilization,
                active_flows=x.active_flows,
                up=x.up,
            )
            for x in s.links
        ],
        active_flows=s.active_flows,
        completed_flows=s.completed_flows,
        authority=s.authority,
    )


def link_stats(m: gateway_pb2.GatewayLinkStats) -> LinkStats:
    return LinkStats(
        emulated_ns=m.emulated_ns,
        links=tuple(
            LinkStat(
                link=x.link,
                kind=x.kind,
                capacity_gb_s=x.capacity_gb_s,
                bytes=x.bytes,
                utilization=x.utilization,
                active_flows=x.active_flows,
                up=x.up,
            )
            for x in m.links
        ),
        active_flows=m.active_flows,
        completed_flows=m.completed_flows,
        authority=m.authority,
    )


def stats_proto(s: GatewayStats) -> gateway_pb2.GatewayStats:
    return gateway_pb2.GatewayStats(
        gateway=s.gateway,
        down=s.down,
        qps=s.qps,
        write_ops=s.write_ops,
        read_ops=s.read_ops,
        send_ops=s.send_ops,
        bytes_out=s.bytes_out,
        bytes_in=s.bytes_in,
        failed_ops=s.failed_ops,
        emulated_ns=s.emulated_ns,
    )


def stats(m: gateway_pb2.GatewayStats) -> GatewayStats:
    return GatewayStats(
        gateway=m.gateway,
        down=m.down,
        qps=m.qps,
        write_ops=m.write_ops,
        read_ops=m.read_ops,
        send_ops=m.send_ops,
        bytes_out=m.bytes_out,
        bytes_in=m.bytes_in,
        failed_ops=m.failed_ops,
        emulated_ns=m.emulated_ns,
    )


def fault_proto(fault: RdmaFault[Any]) -> gateway_pb2.GatewayFault:
    m = gateway_pb2.GatewayFault(
        id=fault.id,
        kind=fault.kind,
        target=fault.target,
        for_s=fault.for_s,
        since_ns=round(fault.since_s * 1e9),
        until_ns=round(fault.until_s * 1e9),
    )
    known = fault.kind in gateway_kinds.PARAMS  # an unknown kind's: none (the gateway names it)
    return faultparams.pack(m, fault.kind, fault.params if known else None)


def fault_request(m: gateway_pb2.GatewayFault) -> RdmaFault[Any]:
    """A fault as asked for: what it is, where and for how long (its id and instants are the
    holder's to set), its oneof unpacked into its kind's params and checked (an unknown kind
    carries NoParams, for the plane to name)."""
    params = faultparams.unpack(m, gateway_kinds.PARAMS)
    return RdmaFault(
        kind=m.kind,
        params=NoParams() if params is None else params,
        target=m.target,
        for_s=m.for_s,
    )


def fault(m: gateway_pb2.GatewayFault) -> RdmaFault[Any]:
    """A fault as its holder reports it (a kind this side does not know: NoParams)."""
    params = faultparams.unpack(m, gateway_kinds.PARAMS)
    return RdmaFault(
        kind=m.kind,
        params=NoParams() if params is None else params,
        target=m.target,
        for_s=m.for_s,
        since_s=m.since_ns / 1e9,
        id=m.id,
    )


def fault_list_proto(faults: list[RdmaFault[Any]]) -> gateway_pb2.GatewayFaultList:
    return gateway_pb2.GatewayFaultList(faults=[fault_proto(f) for f in faults])
