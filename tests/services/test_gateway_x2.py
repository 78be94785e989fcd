"""RDMA across supernodes on cm-minix2 (two supernodes in this process): a queue pair from an NPU
of sn0 to one of sn1, the bytes landing in sn1's NPU, the flow timed by sn0's gateway (the
plane's one timing authority) whichever gateway issues it, plane faults held there whichever
gateway is asked, and a gateway's own down fault."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from cmemu.emulator.client import faults, health
from cmemu.emulator.client.errors import decode
from cmemu.emulator.client.status import error_details
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import Clients, free_port_block
from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2
from cmemu.v1 import gateway_pb2 as pb

if TYPE_CHECKING:
    from cmemu.v1.gateway_pb2_grpc import GatewayAsyncStub

PRESET = "cm-minix2"
SO = DEFAULT_PROFILE.scaleout
RATE = DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die * SO.efficiency


@pytest.fixture(scope="module")
async def x2() -> AsyncIterator[Supernode]:
    # a port block for every supernode's servers (running_supernode's counts one supernode)
    ports = sum(server_count(t) for t in build_cluster(PRESET))
    options = LaunchOptions(
        preset=PRESET,
        mode=InProcess(plan=PortPlan(base_port=free_port_block(ports))),
        broker=NO_BROKER,
        drain_s=0.0,
    )
    async with Supernode.start(options) as supernode:
        yield supernode


@pytest.fixture(scope="module")
async def clients(x2: Supernode) -> AsyncIterator[Clients]:
    c = Clients(x2.supernodes[0], supernodes=x2.supernodes)
    yield c
    await c.close()


async def _fails(call: object) -> tuple[grpc.StatusCode, str | None]:
    """A raw stub's status, or the EmulatorError a typed client (faults) raises for one."""
    with pytest.raises((grpc.aio.AioRpcError, EmulatorError)) as err:
        await call  # type: ignore[misc]
    if isinstance(err.value, EmulatorError):
        info = error_details(err.value)
    else:
        assert isinstance(err.value, grpc.aio.AioRpcError)
        info = decode(err.value)
    return info.code, info.reason


async def _pair(
    clients: Clients, src: str, dst: str
) -> tuple[GatewayAsyncStub, pb.QueuePair, GatewayAsyncStub, pb.QueuePair]:
    g0, g1 = clients.gateway(0), clients.gateway(1)
    a = await g0.CreateQp(pb.CreateQpRequest(npu=src))
    b = await g1.CreateQp(pb.CreateQpRequest(npu=dst))
    a = await g0.ConnectQp(
        pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn1-gw", remote_qpn=b.qpn)
    )
    listed = {q.qpn: q for q in (await g1.ListQps(pb.ListQpsRequest())).qps}
    return g0, a, g1, listed[b.qpn]


async def _region(clients: Clients, npu: str, size: int = 1 << 20) -> int:
    region = await clients.device(npu).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=size, label="rdma-x2")
    )
    return region.offset


async def test_every_gateway_serves(x2: Supernode, clients: Clients) -> None:
    for i in (0, 1):
        channel = clients.channel_to(clients.gateway_address(i))
        assert await health.check(channel, "cmemu.v1.Gateway") == "SERVING"


async def test_bytes_cross_supernodes_both_ways(clients: Clients) -> None:
    g0, a, g1, b = await _pair(clients, "n00-npu0", "sn1-n01-npu3")
    assert (a.state, b.state) == (pb.QP_STATE_RTS, pb.QP_STATE_RTS)
    assert (b.remote_gateway, b.remote_npu) == ("sn0-gw", "n00-npu0")
    far = await _region(clients, "sn1-n01-npu3")
    payload = b"across the plane" * 8
    done = await g0.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, data=payload))
    assert list(done.path) == [
        "n00-npu0.d0",
        "n00-leaf",
        "spine0",
        "core0",
        "sn1-spine0",
        "sn1-n01-leaf",
        "sn1-n01-npu3.d0",
    ]
    assert done.paths == SO.spines_per_supernode**2 * SO.core_switches
    assert (
        await g0.Read(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, size=len(payload)))
    ).data == payload
    # the far NPU's own UB API, from a neighbour in its supernode, reads the same bytes
    target = clients.find("sn1-n01-npu3")
    ub = await clients.bus("sn1-n01-npu0").Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ,
            dst=ub_pb2.UbAddress(eid=target.eid, offset=far),
            size=len(payload),
        )
    )
    assert ub.data == payload
    # and back: sn1's QP writes into sn0's NPU, timed by sn0's gateway all the same
    near = await _region(clients, "n00-npu0")
    back = await g1.Write(pb.RdmaRequest(qpn=b.qpn, remote_offset=near, data=b"reply"))
    assert back.dst == "n00-npu0.d0"
    assert (await g0.GetStats(pb.GatewayStatsRequest())).bytes_in >= 5
    assert (await g1.GetStats(pb.GatewayStatsRequest())).bytes_in >= 2 * len(payload)
    sent = await g1.Send(pb.RdmaRequest(qpn=b.qpn, data=b"hi sn0"))
    (message,) = (
        await clients.bus("n00-npu0").Receive(ub_pb2.ReceiveRequest(max_messages=1))
    ).messages
    assert (message.data, message.src_device, message.src_eid) == (b"hi sn0", "sn1-n01-npu3", 0)
    assert message.arrive_ns == sent.complete_ns


async def test_one_flow_across_the_core(clients: Clients) -> None:
    g0, a, _, _ = await _pair(clients, "n01-npu1", "sn1-n00-npu2")
    size = 32 << 20
    far = await _region(clients, "sn1-n00-npu2", size)
    done = await g0.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, size=size, size_only=True))
    expected_ns = (SO.latency_s(5) + size / RATE) * 1e9
    assert done.complete_ns - done.issue_ns == pytest.approx(expected_ns, abs=2)
    stats = await clients.gateway(1).GetLinkStats(pb.GatewayLinkStatsRequest(top=4))
    assert stats.authority == "sn0-gw"  # sn1 asked sn0, which timed every flow


async def test_only_sn0_times_the_plane(clients: Clients) -> None:
    code, reason = await _fails(
        clients.gateway(1).TimeFlow(
            pb.TimeFlowRequest(src="n00-npu0.d0", dst="sn1-n00-npu0.d0", size=1)
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NOT_THE_AUTHORITY")


async def test_each_gateway_creates_qps_on_its_own_npus_only(clients: Clients) -> None:
    code, reason = await _fails(clients.gateway(0).CreateQp(pb.CreateQpRequest(npu="sn1-n00-npu0")))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "OTHER_SUPERNODE")
    code, reason = await _fails(clients.gateway(1).CreateQp(pb.CreateQpRequest(npu="n00-npu0")))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "OTHER_SUPERNODE")


async def test_ub_never_crosses_supernodes(clients: Clients) -> None:
    code, reason = await _fails(
        clients.fabric().Route(fabric_pb2.RouteRequest(src="n00-npu0", dst="sn1-n00-npu0"))
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "DEVICE_NOT_FOUND")


async def test_plane_faults_live_with_the_authority(clients: Clients) -> None:
    g0, g1 = clients.gateway(0), clients.gateway(1)
    fault = await g1.InjectFault(pb.GatewayFault(kind="switch-down", target="sn1-spine1"))
    try:
        assert fault.id in {
            f.id for f in (await g0.ListFaults(pb.ListGatewayFaultsRequest())).faults
        }
        info = await g1.Route(pb.RdmaRouteRequest(src="n00-npu0", dst="sn1-n00-npu0"))
        assert info.paths == SO.spines_per_supernode * SO.core_switches * (
            SO.spines_per_supernode - 1
        )
    finally:
        left = await g1.ClearFault(pb.ClearGatewayFaultRequest(id=fault.id))
    assert fault.id not in {f.id for f in left.faults}


async def test_a_down_gateway_refuses_its_npus_bytes(clients: Clients) -> None:
    g0, a, g1, _ = await _pair(clients, "n00-npu5", "sn1-n00-npu5")
    far = await _region(clients, "sn1-n00-npu5")
    fault = await g0.InjectFault(pb.GatewayFault(kind="gateway-down", target="sn1-gw"))
    try:
        assert fault.id == "sn1-gw-down"
        channel = clients.channel_to(clients.gateway_address(1))
        assert await health.check(channel, "cmemu.v1.Gateway") == "NOT_SERVING"
        code, reason = await _fails(
            g0.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, data=b"x"))
        )
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "GATEWAY_DOWN")
        state = {q.qpn: q.state for q in (await g0.ListQps(pb.ListQpsRequest())).qps}
        assert state[a.qpn] == pb.QP_STATE_ERROR
        own = [f.id for f in (await g1.ListFaults(pb.ListGatewayFaultsRequest())).faults]
        assert own == ["sn1-gw-down"]
    finally:
        await g1.ClearFault(pb.ClearGatewayFaultRequest(id="sn1-gw-down"))
    assert await health.check(channel, "cmemu.v1.Gateway") == "SERVING"


async def test_a_supernode_partition_cuts_the_plane_between_them_and_only_there(
    clients: Clients,
) -> None:
    g0, a, _, _ = await _pair(clients, "n01-npu6", "sn1-n01-npu6")
    far = await _region(clients, "sn1-n01-npu6")
    fault = await faults.inject(clients, "supernode-partition", "sn0~sn1")
    try:
        assert (fault.kind, fault.target) == ("supernode-partition", "sn0~sn1")
        assert fault.id in {f.id for f in await faults.list_all(clients)}
        code, reason = await _fails(
            g0.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, data=b"x"))
        )
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "ROUTE_CUT")
        state = {q.qpn: q.state for q in (await g0.ListQps(pb.ListQpsRequest())).qps}
        assert state[a.qpn] == pb.QP_STATE_ERROR  # as RDMA's retry-exceeded leaves it
        code, _ = await _fails(
            clients.gateway(1).Route(pb.RdmaRouteRequest(src="sn1-n00-npu0", dst="n00-npu0"))
        )
        assert code is grpc.StatusCode.UNAVAILABLE  # both ways
        inside = await g0.Route(pb.RdmaRouteRequest(src="n00-npu0", dst="n01-npu0"))
        assert inside.paths == SO.spines_per_supernode  # within a supernode: untouched
    finally:
        await faults.clear(clients, fault.id)
    g0, a, _, _ = await _pair(clients, "n01-npu6", "sn1-n01-npu6")
    done = await g0.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=far, data=b"back"))
    assert done.dst == "sn1-n01-npu6.d0"
    for bad, expected in (("sn0~sn5", "SUPERNODE_NOT_FOUND"), ("sn0~n01", "MALFORMED_ID")):
        code, reason = await _fails(faults.inject(clients, "supernode-partition", bad))
        assert reason == expected and code in (
            grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)  # fmt: skip
    assert not [f for f in await faults.list_all(clients) if f.kind == "supernode-partition"]
