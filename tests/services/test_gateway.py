"""The RDMA gateway over real gRPC on cm-minix1 (one supernode with the plane): queue pairs,
WRITE / READ / SEND between two of its NPUs with real bytes landing in NPU memory (read back over
RDMA and over the NPU's own UB API), timing against the flow model, faults and health, every bad
input's status, and grpcurl."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from cmemu.emulator.client import faults, health
from cmemu.emulator.client.clock import held_time
from cmemu.emulator.client.errors import decode
from cmemu.emulator.client.status import error_details
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.flowsim import LiveFlows
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.rdmagraph import RdmaGraph
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, grpcurl, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, ub_pb2
from cmemu.v1 import gateway_pb2 as pb

if TYPE_CHECKING:  # the async stub type exists in the generated .pyi only
    from cmemu.v1.gateway_pb2_grpc import GatewayAsyncStub

PRESET = "cm-minix1"
SO = DEFAULT_PROFILE.scaleout
RATE = DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die * SO.efficiency
SRC, DST = "n00-npu0", "n01-npu3"  # two nodes: die -> leaf -> spine -> leaf -> die


@pytest.fixture(scope="module")
async def sn() -> AsyncIterator[Supernode]:
    async with running_supernode(PRESET) as supernode:
        yield supernode


@pytest.fixture(scope="module")
async def clients(sn: Supernode) -> AsyncIterator[Clients]:
    c = Clients(sn.topology)
    yield c
    await c.close()


@pytest.fixture(scope="module")
def gw(clients: Clients) -> GatewayAsyncStub:
    return clients.gateway()


async def _pair(
    gw: GatewayAsyncStub, src: str = SRC, dst: str = DST, *, die: int = 0
) -> tuple[pb.QueuePair, pb.QueuePair]:
    a = await gw.CreateQp(pb.CreateQpRequest(npu=src, die=die))
    b = await gw.CreateQp(pb.CreateQpRequest(npu=dst, die=1))
    a = await gw.ConnectQp(
        pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=b.qpn)
    )
    return a, b


async def _region(clients: Clients, npu: str = DST, size: int = 1 << 20) -> int:
    region = await clients.device(npu).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=size, label="rdma-test")
    )
    return region.offset


async def _fails(call: object) -> tuple[grpc.StatusCode, str | None, str]:
    """A raw stub's status, or the EmulatorError a typed client (faults) raises for one."""
    with pytest.raises((grpc.aio.AioRpcError, EmulatorError)) as err:
        await call  # type: ignore[misc]
    if isinstance(err.value, EmulatorError):
        info = error_details(err.value)
    else:
        assert isinstance(err.value, grpc.aio.AioRpcError)
        info = decode(err.value)
    return info.code, info.reason, info.message


# --- queue pairs ------------------------------------------------------------------------------


async def test_gateway_serves_with_health(clients: Clients, sn: Supernode) -> None:
    address = sn.topology.service(ServiceKind.GATEWAY).address
    assert await health.check(clients.channel_to(address), "cmemu.v1.Gateway") == "SERVING"


async def test_qp_lifecycle(gw: GatewayAsyncStub) -> None:
    a = await gw.CreateQp(pb.CreateQpRequest(npu="n00-npu2.d1"))
    assert (a.gateway, a.npu, a.die, a.state) == ("sn0-gw", "n00-npu2", 1, pb.QP_STATE_INIT)
    b = await gw.CreateQp(pb.CreateQpRequest(npu="n01-npu2"))
    connected = await gw.ConnectQp(
        pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=b.qpn)
    )
    assert connected.state == pb.QP_STATE_RTS
    assert (connected.remote_npu, connected.remote_die, connected.remote_qpn) == (
        "n01-npu2",
        0,
        b.qpn,
    )
    listed = {q.qpn: q for q in (await gw.ListQps(pb.ListQpsRequest())).qps}
    assert listed[b.qpn].state == pb.QP_STATE_RTS and listed[b.qpn].remote_qpn == a.qpn
    code, reason, _ = await _fails(
        gw.ConnectQp(pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=b.qpn))
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "QP_ALREADY_CONNECTED")
    await gw.DestroyQp(pb.DestroyQpRequest(qpn=a.qpn))
    assert a.qpn not in {q.qpn for q in (await gw.ListQps(pb.ListQpsRequest())).qps}
    code, reason, _ = await _fails(gw.DestroyQp(pb.DestroyQpRequest(qpn=a.qpn)))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "QP_NOT_FOUND")


# --- bytes -------------------------------------------------------------------------------------


async def test_written_bytes_read_back_over_rdma_and_ub(
    gw: GatewayAsyncStub, clients: Clients
) -> None:
    a, _ = await _pair(gw)
    offset = await _region(clients)
    payload = bytes(range(256)) * 4
    done = await gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset + 64, data=payload))
    assert (done.op, done.src, done.dst, done.size) == (
        pb.RDMA_OP_WRITE,
        "n00-npu0.d0",
        "n01-npu3.d1",
        len(payload),
    )
    assert list(done.path) == ["n00-npu0.d0", "n00-leaf", "spine0", "n01-leaf", "n01-npu3.d1"]
    assert done.paths == SO.spines_per_supernode
    back = await gw.Read(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset + 64, size=len(payload)))
    assert back.data == payload
    assert (back.src, back.dst) == ("n01-npu3.d1", "n00-npu0.d0")  # a READ's data comes back
    # the NPU's own UB API sees the same bytes (a UB read from a neighbour of its supernode)
    target = clients.topology.device(DST)
    ub = await clients.bus("n01-npu0").Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ,
            dst=ub_pb2.UbAddress(eid=target.eid, offset=offset + 64),
            size=len(payload),
        )
    )
    assert ub.data == payload


async def test_send_lands_in_the_receive_queue_naming_its_sender(
    gw: GatewayAsyncStub, clients: Clients
) -> None:
    a, _ = await _pair(gw, "n00-npu4", "n01-npu5")
    sent = await gw.Send(pb.RdmaRequest(qpn=a.qpn, data=b"kv-ready"))
    got = await clients.bus("n01-npu5").Receive(ub_pb2.ReceiveRequest(max_messages=1))
    (message,) = got.messages
    assert message.data == b"kv-ready" and message.src_device == "n00-npu4"
    assert message.src_eid == 0  # an RDMA sender has no EID of the target's bus
    assert (message.issue_ns, message.arrive_ns) == (sent.issue_ns, sent.complete_ns)


async def test_size_only_bulk_write(gw: GatewayAsyncStub, clients: Clients) -> None:
    a, _ = await _pair(gw, "n00-npu5", "n01-npu6")
    offset = await _region(clients, "n01-npu6", 64 << 20)
    done = await gw.Write(
        pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, size=64 << 20, size_only=True)
    )
    assert done.size == 64 << 20 and not done.data


# --- timing ------------------------------------------------------------------------------------


async def test_one_flow_takes_latency_plus_size_over_port_rate(
    gw: GatewayAsyncStub, clients: Clients
) -> None:
    a, _ = await _pair(gw, "n00-npu6", "n01-npu7")
    offset = await _region(clients, "n01-npu7", 32 << 20)
    size = 32 << 20
    done = await gw.Write(
        pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, size=size, size_only=True)
    )
    expected_ns = (SO.latency_s(3) + size / RATE) * 1e9
    assert done.complete_ns - done.issue_ns == pytest.approx(expected_ns, abs=2)
    info = await gw.Route(pb.RdmaRouteRequest(src="n00-npu6.d0", dst="n01-npu7.d1"))
    assert info.latency_ns == round(SO.latency_s(3) * 1e9)
    assert info.max_gb_s == pytest.approx(RATE / 1e9)
    assert (info.switches, info.paths) == (3, SO.spines_per_supernode)


async def test_a_slowed_port_slows_the_flow(gw: GatewayAsyncStub, clients: Clients) -> None:
    a, _ = await _pair(gw, "n00-npu7", "n01-npu1")
    offset = await _region(clients, "n01-npu1", 8 << 20)
    fault = await gw.InjectFault(
        pb.GatewayFault(
            kind="link-slow",
            target="n00-npu7.d0~n00-leaf",
            link_slow=faultparams_pb2.LinkDegradedParams(factor=0.5),
        )
    )
    try:
        size = 8 << 20
        done = await gw.Write(
            pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, size=size, size_only=True)
        )
        expected_ns = (SO.latency_s(3) + size / (RATE * 0.5)) * 1e9
        assert done.complete_ns - done.issue_ns == pytest.approx(expected_ns, abs=2)
    finally:
        await gw.ClearFault(pb.ClearGatewayFaultRequest(id=fault.id))


async def test_two_flows_on_a_shared_leaf_uplink_get_max_min_shares() -> None:
    """An oversubscribed leaf (uplinks a sixteenth of the node's rate): two dies' flows share
    the uplink; their completions are those of the same two flows replayed on the model."""
    so = dataclasses.replace(SO, leaf_oversubscription=16.0)
    profile: HardwareProfile = dataclasses.replace(DEFAULT_PROFILE, scaleout=so)
    async with running_supernode(PRESET, profile=profile) as sn:
        clients = Clients(sn.topology)
        try:
            gw = clients.gateway()
            qps = [(await _pair(gw, f"n00-npu{i}", f"n01-npu{i}"))[0] for i in (0, 1)]
            size = 256 << 20  # long enough that the two overlap for most of their lives
            offsets = [await _region(clients, f"n01-npu{i}", size) for i in (0, 1)]
            # emulated time all but stopped while both are issued: at time scale 1 a loaded
            # host's wall skew between the two calls (6 ms seen in CI) is as much emulated skew
            async with held_time(sn.topology, name="two-flows") as held:
                assert held
                done = await asyncio.gather(
                    *(
                        gw.Write(
                            pb.RdmaRequest(qpn=q.qpn, remote_offset=o, size=size, size_only=True)
                        )
                        for q, o in zip(qps, offsets, strict=True)
                    )
                )
            assert sn.topology.scaleout is not None
            graph = RdmaGraph(sn.topology.scaleout, profile)
            flows = LiveFlows(res_cap=graph.link_cap())
            routes = [graph.route(d.src, d.dst) for d in done]
            order = sorted(range(2), key=lambda i: done[i].issue_ns)
            ends: dict[int, float] = {}
            ids = {}
            for i in order:
                ids[i], finished = flows.add(
                    done[i].issue_ns / 1e9, routes[i].resources, routes[i].cap, float(size)
                )
                ends.update(finished)
            while flows.flows:
                next_s = flows.next_event_s()
                assert next_s is not None
                ends.update(flows.advance(next_s))
            for i in range(2):
                expected = (ends[ids[i]] + routes[i].latency_s) * 1e9
                assert done[i].complete_ns == pytest.approx(expected, abs=2)
            # both overlapped: each got less than its port, the uplink shared
            uplink = (
                graph.link_cap()[graph.names.index("n00-leaf>spine0")] * so.spines_per_supernode
            )
            alone_ns = size / uplink * 1e9
            assert max(d.complete_ns - d.issue_ns for d in done) > 1.5 * alone_ns
            stats = await gw.GetLinkStats(pb.GatewayLinkStatsRequest(top=64))
            up = {s.link: s for s in stats.links}
            assert up["n00-leaf>spine0"].bytes == pytest.approx(
                2 * size / so.spines_per_supernode, rel=1e-6
            )
        finally:
            await clients.close()


# --- bad inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("npu", "code", "reason"),
    [
        ("n00-cpu0", grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_NPU"),
        ("n00-mem", grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_NPU"),
        ("n09-npu0", grpc.StatusCode.NOT_FOUND, "DEVICE_NOT_FOUND"),
        ("sn1-n00-npu0", grpc.StatusCode.INVALID_ARGUMENT, "OTHER_SUPERNODE"),
        ("not an id", grpc.StatusCode.INVALID_ARGUMENT, None),
        ("", grpc.StatusCode.INVALID_ARGUMENT, None),
    ],
)
async def test_qps_only_on_this_supernodes_npus(
    gw: GatewayAsyncStub, npu: str, code: grpc.StatusCode, reason: str | None
) -> None:
    got_code, got_reason, _ = await _fails(gw.CreateQp(pb.CreateQpRequest(npu=npu)))
    assert got_code == code
    if reason is not None:
        assert got_reason == reason


async def test_bad_die_and_bad_peers(gw: GatewayAsyncStub) -> None:
    code, reason, _ = await _fails(gw.CreateQp(pb.CreateQpRequest(npu="n00-npu0", die=2)))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NO_SUCH_DIE")
    a = await gw.CreateQp(pb.CreateQpRequest(npu="n00-npu3"))
    code, reason, _ = await _fails(
        gw.ConnectQp(pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn1-gw", remote_qpn=1))
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "GATEWAY_NOT_FOUND")
    code, reason, _ = await _fails(
        gw.ConnectQp(pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=999))
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "QP_NOT_FOUND")
    code, _, _ = await _fails(
        gw.ConnectQp(pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=a.qpn))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (await gw.ListQps(pb.ListQpsRequest())).qps  # the gateway still serves
    code, reason, _ = await _fails(gw.Write(pb.RdmaRequest(qpn=a.qpn, data=b"x")))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "QP_NOT_CONNECTED")
    code, reason, _ = await _fails(gw.Write(pb.RdmaRequest(qpn=4242, data=b"x")))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "QP_NOT_FOUND")


async def test_bad_operations(gw: GatewayAsyncStub, clients: Clients) -> None:
    a, _ = await _pair(gw, "n00-npu1", "n01-npu4")
    offset = await _region(clients, "n01-npu4")
    limit = DEFAULT_PROFILE.limits.inline_payload_max_bytes
    cases = [
        (gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset)), "INVALID_ARGUMENT"),
        (gw.Read(pb.RdmaRequest(qpn=a.qpn, data=b"x")), "INVALID_ARGUMENT"),
        (gw.Write(pb.RdmaRequest(qpn=a.qpn, size=limit + 1)), "INVALID_ARGUMENT"),
        (gw.Write(pb.RdmaRequest(qpn=a.qpn, data=b"abc", size=4)), "INVALID_ARGUMENT"),
        (gw.Write(pb.RdmaRequest(qpn=a.qpn, data=b"abc", size_only=True)), "INVALID_ARGUMENT"),
    ]
    for call, code_name in cases:
        code, _, _ = await _fails(call)
        assert code.name == code_name
    code, reason, _ = await _fails(
        gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, data=b"x" * (limit + 1)))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE")
    code, reason, _ = await _fails(
        gw.Write(pb.RdmaRequest(qpn=a.qpn, size=2**62, size_only=True, remote_offset=0))
    )
    assert code in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION)
    # an address nobody allocated fails before any time passes, and the QP stays connected
    code, reason, _ = await _fails(
        gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset + (8 << 20), data=b"x"))
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "REGION_NOT_ALLOCATED")
    code, reason, _ = await _fails(
        gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, size=2**40, size_only=True))
    )
    assert code == grpc.StatusCode.OUT_OF_RANGE
    listed = {q.qpn: q for q in (await gw.ListQps(pb.ListQpsRequest())).qps}
    assert listed[a.qpn].state == pb.QP_STATE_RTS
    stats = await gw.GetStats(pb.GatewayStatsRequest())
    assert stats.failed_ops >= 3


async def test_route_bad_ends(gw: GatewayAsyncStub) -> None:
    code, reason, _ = await _fails(gw.Route(pb.RdmaRouteRequest(src="n00-cpu0", dst="n01-npu0")))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_NPU")
    code, reason, _ = await _fails(gw.Route(pb.RdmaRouteRequest(src="n00-npu0", dst="n07-npu0")))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NO_RDMA_PORT")
    code, _, _ = await _fails(gw.Route(pb.RdmaRouteRequest(src="", dst="n01-npu0")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_ub_refuses_another_supernodes_device(clients: Clients) -> None:
    """UB never crosses supernodes: the fabric knows no device of another supernode."""
    code, reason, _ = await _fails(
        clients.fabric().Route(fabric_pb2.RouteRequest(src="n00-npu0", dst="sn1-n00-npu0"))
    )
    assert code == grpc.StatusCode.NOT_FOUND and reason == "DEVICE_NOT_FOUND"


# --- faults ------------------------------------------------------------------------------------


async def test_link_down_cuts_the_route_and_errors_the_qp(
    gw: GatewayAsyncStub, clients: Clients
) -> None:
    a, _ = await _pair(gw, "n00-npu2", "n01-npu0")
    offset = await _region(clients, "n01-npu0")
    fault = await gw.InjectFault(pb.GatewayFault(kind="link-down", target="n00-npu2.d0~n00-leaf"))
    assert fault.id and fault.since_ns > 0
    assert fault.id in {f.id for f in (await gw.ListFaults(pb.ListGatewayFaultsRequest())).faults}
    code, reason, _ = await _fails(
        gw.Write(pb.RdmaRequest(qpn=a.qpn, remote_offset=offset, data=b"x"))
    )
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "ROUTE_CUT")
    listed = {q.qpn: q for q in (await gw.ListQps(pb.ListQpsRequest())).qps}
    assert listed[a.qpn].state == pb.QP_STATE_ERROR
    stats = await gw.GetLinkStats(pb.GatewayLinkStatsRequest(top=1000))
    assert not {s.link: s for s in stats.links}["n00-npu2.d0>n00-leaf"].up
    left = await gw.ClearFault(pb.ClearGatewayFaultRequest(id=fault.id))
    assert fault.id not in {f.id for f in left.faults}
    reconnected = await gw.ConnectQp(
        pb.ConnectQpRequest(qpn=a.qpn, remote_gateway="sn0-gw", remote_qpn=listed[a.qpn].remote_qpn)
    )
    assert reconnected.state == pb.QP_STATE_RTS


async def test_a_fault_clears_itself_after_its_duration(gw: GatewayAsyncStub) -> None:
    fault = await gw.InjectFault(pb.GatewayFault(kind="switch-down", target="spine2", for_s=0.05))
    assert fault.until_ns == fault.since_ns + 50_000_000
    for _ in range(100):
        ids = {f.id for f in (await gw.ListFaults(pb.ListGatewayFaultsRequest())).faults}
        if fault.id not in ids:
            break
        await asyncio.sleep(0.02)
    assert fault.id not in ids


async def test_fault_bad_inputs(gw: GatewayAsyncStub) -> None:
    cases = [
        (pb.GatewayFault(kind="meltdown", target="spine0"), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GatewayFault(kind="link-down", target="n00-l1s0~l2-p0-s0"), grpc.StatusCode.NOT_FOUND),
        (pb.GatewayFault(kind="switch-down", target="spine99"), grpc.StatusCode.NOT_FOUND),
        (
            pb.GatewayFault(kind="link-slow", target="n00-leaf~spine0"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (pb.GatewayFault(kind="gateway-down", target="sn7-gw"), grpc.StatusCode.NOT_FOUND),
    ]
    for fault, code in cases:
        got, _, _ = await _fails(gw.InjectFault(fault))
        assert got == code, fault
    for request in (pb.ClearGatewayFaultRequest(), pb.ClearGatewayFaultRequest(id="x", all=True)):
        got, _, _ = await _fails(gw.ClearFault(request))
        assert got == grpc.StatusCode.INVALID_ARGUMENT
    got, reason, _ = await _fails(gw.ClearFault(pb.ClearGatewayFaultRequest(id="r999")))
    assert (got, reason) == (grpc.StatusCode.NOT_FOUND, "FAULT_NOT_FOUND")


async def test_gateway_down_refuses_and_is_not_serving(
    gw: GatewayAsyncStub, clients: Clients, sn: Supernode
) -> None:
    a, _ = await _pair(gw, "n00-npu3", "n01-npu3")
    channel = clients.channel_to(sn.topology.service(ServiceKind.GATEWAY).address)
    fault = await gw.InjectFault(pb.GatewayFault(kind="gateway-down"))
    try:
        assert fault.target == "sn0-gw"
        assert await health.check(channel, "cmemu.v1.Gateway") == "NOT_SERVING"
        code, reason, _ = await _fails(gw.Send(pb.RdmaRequest(qpn=a.qpn, data=b"x")))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "GATEWAY_DOWN")
        code, _, _ = await _fails(gw.CreateQp(pb.CreateQpRequest(npu="n00-npu0")))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert (await gw.GetStats(pb.GatewayStatsRequest())).down
        code, reason, _ = await _fails(gw.InjectFault(pb.GatewayFault(kind="gateway-down")))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "FAULT_ACTIVE")
    finally:
        await gw.ClearFault(pb.ClearGatewayFaultRequest(id=fault.id))
    assert await health.check(channel, "cmemu.v1.Gateway") == "SERVING"
    assert not (await gw.GetStats(pb.GatewayStatsRequest())).down


# --- grpcurl -----------------------------------------------------------------------------------


async def test_grpcurl_reaches_the_gateway(sn: Supernode) -> None:
    address = sn.topology.service(ServiceKind.GATEWAY).address
    code, out, err = await grpcurl(address, "list")
    assert code == 0, err
    assert "cmemu.v1.Gateway" in out.split()
    body = json.dumps({"npu": "n00-npu6", "die": 1})
    code, out, err = await grpcurl("-d", body, address, "cmemu.v1.Gateway/CreateQp")
    assert code == 0, err
    assert json.loads(out)["state"] == "QP_STATE_INIT"
    code, out, err = await grpcurl(address, "cmemu.v1.Gateway/GetStats")
    assert code == 0, err
    assert json.loads(out)["gateway"] == "sn0-gw"
    code, _, err = await grpcurl(
        "-d", json.dumps({"npu": "n00-cpu1"}), address, "cmemu.v1.Gateway/CreateQp"
    )
    assert code != 0 and "InvalidArgument" in err and "NOT_AN_NPU" in err


# --- the fault catalogue -----------------------------------------------------------------------


async def test_catalogue_kinds_reach_the_gateway(gw: GatewayAsyncStub, clients: Clients) -> None:
    slow = await faults.inject(clients, "rdma-link-slow", "n01-leaf~spine4", {"factor": 0.5})
    assert slow.id.startswith("rdma:r") and slow.kind == "rdma-link-slow"
    down = await faults.inject(clients, "gateway-down", "sn0-gw", duration_s=30.0)
    assert (down.id, down.kind, down.until_ns > 0) == ("rdma:sn0-gw-down", "gateway-down", True)
    listed = {f.id: f for f in await faults.list_all(clients)}
    assert {slow.id, down.id} <= set(listed)
    assert listed[slow.id].detail == "factor=0.5"
    assert (await gw.GetStats(pb.GatewayStatsRequest())).down
    await faults.clear(clients, down.id)
    assert not (await gw.GetStats(pb.GatewayStatsRequest())).down
    with pytest.raises(Exception, match="no fault"):
        await faults.clear(clients, "rdma:r999")
    cleared = await faults.remove_all(clients)
    assert slow.id in {f.id for f in cleared}
    assert not (await gw.ListFaults(pb.ListGatewayFaultsRequest())).faults
