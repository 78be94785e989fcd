"""The gateway service on its own (no devices started): its events, its token on state-changing
calls, and its metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import pytest

from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.client.errors import decode
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import build
from cmemu.emulator.testing import EventRecorder, free_port_block
from cmemu.services.auth import ServerSecurity
from cmemu.services.gateway import GatewayEngine, create_gateway
from cmemu.services.peers import Peers
from cmemu.v1 import faultparams_pb2, gateway_pb2_grpc
from cmemu.v1 import gateway_pb2 as pb

if TYPE_CHECKING:
    from cmemu.v1.gateway_pb2_grpc import GatewayAsyncStub

TOKEN = "gw-s3cret"


@dataclass
class Served:
    stub: GatewayAsyncStub
    anonymous: GatewayAsyncStub
    state: GatewayEngine
    events: EventRecorder


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[Served]:
    topology = build_cluster("cm-minix1")[0]
    address = f"127.0.0.1:{free_port_block(1)}"
    events = EventRecorder()
    peers = Peers(topology, Credentials(token=TOKEN))
    state, host = create_gateway(
        address=address,
        topology=topology,
        profile=DEFAULT_PROFILE,
        clock=Timeline(Clock()),
        peers=peers,
        events=events,
    )
    host.secure(ServerSecurity(token=TOKEN))
    await host.start()
    await host.set_serving(True)
    runner = asyncio.create_task(state.run())
    with_token, without = Channels(Credentials(token=TOKEN)), Channels(Credentials())
    try:
        yield Served(
            stub=gateway_pb2_grpc.GatewayStub(with_token.get(address)),
            anonymous=gateway_pb2_grpc.GatewayStub(without.get(address)),
            state=state,
            events=events,
        )
    finally:
        await state.close()
        await runner
        await host.stop(0)
        await with_token.close()
        await without.close()
        await peers.close()


async def test_a_topology_without_the_plane_has_no_gateway() -> None:
    with pytest.raises(PreconditionError, match="no RDMA scale-out plane"):
        GatewayEngine(
            topology=build("cm-mini"),
            profile=DEFAULT_PROFILE,
            clock=Timeline(Clock()),
            peers=Peers(build("cm-mini")),
        )


async def test_state_changes_need_the_token(served: Served) -> None:
    for call in (
        served.anonymous.CreateQp(pb.CreateQpRequest(npu="n00-npu0")),
        served.anonymous.InjectFault(pb.GatewayFault(kind="switch-down", target="core0")),
        served.anonymous.TimeFlow(pb.TimeFlowRequest(src="n00-npu0.d0", dst="n01-npu0.d0", size=1)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert decode(err.value).code == grpc.StatusCode.UNAUTHENTICATED
    # reads stay open
    assert (await served.anonymous.GetStats(pb.GatewayStatsRequest())).gateway == "sn0-gw"
    await served.anonymous.ListQps(pb.ListQpsRequest())
    await served.anonymous.Route(pb.RdmaRouteRequest(src="n00-npu0", dst="n01-npu0"))


async def test_events_of_connections_and_faults(served: Served) -> None:
    gw = served.stub
    a = await gw.CreateQp(pb.CreateQpRequest(npu="n00-npu1"))
    b = await gw.CreateQp(pb.CreateQpRequest(npu="n01-npu1", die=1))
    await gw.ConnectQp(pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=b.qpn))
    (connected,) = served.events.named("qp-connected")
    assert connected["local"] == "n00-npu1.d0" and connected["remote_die"] == "n01-npu1.d1"
    fault = await gw.InjectFault(
        pb.GatewayFault(
            kind="link-slow",
            target="n00-leaf~spine1",
            link_slow=faultparams_pb2.LinkDegradedParams(factor=0.5),
        )
    )
    injected = served.events.named("fault-injected")[-1]
    assert (injected["fault"], injected["kind"], injected["target"]) == (
        fault.id,
        "link-slow",
        "n00-leaf~spine1",
    )
    await gw.ClearFault(pb.ClearGatewayFaultRequest(id=fault.id))
    assert served.events.named("fault-cleared")[-1]["fault"] == fault.id
    await gw.InjectFault(pb.GatewayFault(kind="switch-down", target="core2", for_s=0.01))
    for _ in range(100):
        if any(e.get("expired") for e in served.events.named("fault-cleared")):
            break
        await asyncio.sleep(0.01)
    assert any(e.get("expired") == "true" for e in served.events.named("fault-cleared"))


async def test_metrics_families(served: Served) -> None:
    families = {f.name: f for f in served.state.metrics()}
    assert {
        "cmemu_gateway_ops_total",
        "cmemu_gateway_op_bytes_total",
        "cmemu_gateway_landed_bytes_total",
        "cmemu_gateway_queue_pairs",
        "cmemu_gateway_down",
        "cmemu_rdma_link_bytes_total",
        "cmemu_rdma_link_utilization_ratio",
    } <= set(families)
    ops = {labels["op"]: v for labels, v in families["cmemu_gateway_ops_total"].samples}
    assert set(ops) == {"write", "read", "send"}
    kinds = {labels["link_kind"] for labels, _ in families["cmemu_rdma_link_bytes_total"].samples}
    assert kinds == {"die-leaf", "leaf-spine", "spine-core"}
