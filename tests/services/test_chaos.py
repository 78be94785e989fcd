"""Issue 9: a chaos tool must survive chaos itself. Each test is one finding, through real servers
(cm-mini in process): absurd sizes, names, bodies and timings get a precise status at once, and
nothing the emulator acknowledged changes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from cmemu.emulator.client.errors import ErrorDetails, decode
from cmemu.emulator.client.status import MESSAGE_MAX
from cmemu.emulator.model.errors import QUOTE_MAX
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients
from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, fabric_pb2, faultparams_pb2, npu_pb2, ub_pb2

U64 = 2**64 - 1
HUGE = "x" * 20_000  # more than grpc's 16 KiB metadata limit once echoed


async def _details(call: Awaitable[Any]) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(10):  # a refusal comes at once, never after pacing
            await call
    return decode(err.value)


def _bounded(got: ErrorDetails) -> None:
    assert len(got.message) <= MESSAGE_MAX
    assert all(len(v) <= QUOTE_MAX + 40 for v in got.metadata.values())
    assert all(len(d) <= MESSAGE_MAX for _, d in got.violations)


# --- finding 1: kernels -------------------------------------------------------------------------


async def test_an_absurd_kernel_is_refused_and_the_die_keeps_working(clients: Clients) -> None:
    npu = clients.npu("n01-npu2")
    huge = await _details(
        npu.SubmitKernel(npu_pb2.Kernel(flops=1e30, precision=npu_pb2.PRECISION_BF16))
    )
    assert (huge.code, huge.reason) == (grpc.StatusCode.OUT_OF_RANGE, "OPERATION_TOO_LONG")
    moved = await _details(
        npu.SubmitKernel(npu_pb2.Kernel(flops=1, bytes_moved=U64, precision=npu_pb2.PRECISION_BF16))
    )
    assert moved.reason == "OPERATION_TOO_LONG"
    precision = await _details(npu.SubmitKernel(npu_pb2.Kernel(flops=1, precision=99)))  # type: ignore[arg-type]
    assert precision.code is grpc.StatusCode.INVALID_ARGUMENT
    ok = await npu.SubmitKernel(
        npu_pb2.Kernel(flops=354e12 * 0.001, precision=npu_pb2.PRECISION_BF16)
    )
    assert ok.duration_ns == 1_000_000 and ok.start_ns - ok.issue_ns < 10**9


# --- finding 2: collectives ---------------------------------------------------------------------


async def test_an_absurd_collective_is_refused_before_it_counts(clients: Clients) -> None:
    fabric = clients.fabric()
    before = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=3))
    gather = await _details(
        fabric.Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu0", "n00-npu1"], bytes=U64
            )
        )
    )
    assert gather.code is grpc.StatusCode.OUT_OF_RANGE
    moe = await _details(
        fabric.Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH,
                ranks=["n00-npu0", "n00-npu1"],
                tokens_per_rank=2**32 - 1,
                top_k=2**32 - 1,
            )
        )
    )
    assert moe.code is grpc.StatusCode.OUT_OF_RANGE
    pairs = await _details(
        fabric.Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL,
                ranks=["n00-npu0.d0", "n00-npu0.d1"],
                pair_bytes=[0, U64, U64, 0],
            )
        )
    )
    assert pairs.code is grpc.StatusCode.OUT_OF_RANGE
    after = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=3))
    assert [s.bytes for s in after.links] == [s.bytes for s in before.links]  # nothing counted


# --- finding 3: sends ---------------------------------------------------------------------------


async def test_an_absurd_send_is_refused_and_telemetry_stays_readable(clients: Clients) -> None:
    target = clients.topology.device("n01-cpu1")
    send = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=target.eid), size=U64, size_only=True
    )
    got = await _details(clients.bus("n00-npu3").Submit(send))
    assert got.code is grpc.StatusCode.OUT_OF_RANGE
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE, dst=ub_pb2.UbAddress(eid=target.eid), size=U64, size_only=True
    )
    assert (await _details(clients.bus("n00-npu3").Submit(write))).code is (
        grpc.StatusCode.OUT_OF_RANGE
    )
    small = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=target.eid), data=b"hi"
    )
    await clients.bus("n00-npu3").Submit(small)
    telemetry = await clients.device(target.id).GetTelemetry(device_pb2.GetTelemetryRequest())
    assert telemetry.ub_rx_bytes < 2**40
    await clients.bus(target.id).Receive(ub_pb2.ReceiveRequest(max_messages=10))


async def test_an_issue_time_from_the_future_does_not_move_the_fabric_clock(
    clients: Clients,
) -> None:
    """A direct Fabric/Transfer names its own issue_ns: one in the far future is the present."""
    src, dst = clients.topology.device("n00-npu4"), clients.topology.device("n00-cpu0")
    region = await clients.device(dst.id).AllocateRegion(device_pb2.AllocateRegionRequest(size=64))
    tx = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        src_eid=src.eid,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
        data=b"now",
        issue_ns=2**63 - 1,
    )
    async with asyncio.timeout(10):
        done = await clients.fabric().Transfer(tx)
    assert done.complete_ns - done.issue_ns < 10**6
    assert done.complete_ns < 10**15


# --- finding 4: duplicate ranks -----------------------------------------------------------------


async def test_many_copies_of_one_rank_are_refused_at_once(clients: Clients) -> None:
    started = time.perf_counter()
    got = await _details(
        clients.fabric().Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu0.d0"] * 32_000, bytes=1
            )
        )
    )
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT
    assert time.perf_counter() - started < 1.0
    _bounded(got)


# --- finding 5: long names ----------------------------------------------------------------------


async def test_long_names_are_quoted_short(clients: Clients) -> None:
    fabric = clients.fabric()
    cases: list[Awaitable[Any]] = [
        fabric.Route(fabric_pb2.RouteRequest(src=HUGE, dst="n00-npu0")),
        fabric.Route(fabric_pb2.RouteRequest(src="n00-npu0", dst=HUGE + ".d1")),
        fabric.InjectFault(fabric_pb2.FabricFault(kind="link-down", target=HUGE)),
        fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target=HUGE)),
        fabric.InjectFault(fabric_pb2.FabricFault(kind=HUGE, target="x")),
        fabric.InjectFault(
            fabric_pb2.FabricFault(
                kind="partition",
                partition=faultparams_pb2.PartitionParams(side_a=HUGE, side_b="n00-npu0"),
            )
        ),
        fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=HUGE)),
        fabric.Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=[HUGE, "n00-npu0"], bytes=1
            )
        ),
    ]
    for call in cases:
        got = await _details(call)
        assert got.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), got
        _bounded(got)
        assert "x" * (QUOTE_MAX + 1) not in got.message


# --- finding 6: corrupt bodies and unexpected exceptions ----------------------------------------


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("/cmemu.v1.Npu/SubmitKernel", b"\xff\xff\xff"),
        ("/cmemu.v1.Npu/SubmitKernel", b"\x0a\x02\xff\xfe"),  # name: invalid UTF-8
        ("/cmemu.v1.Device/AllocateRegion", b"\x08"),  # a truncated varint
        ("/cmemu.v1.UnifiedBus/Submit", b"\x22\x05\x08"),  # a truncated sub-message
    ],
)
async def test_a_corrupt_body_is_invalid_argument(
    clients: Clients, method: str, body: bytes
) -> None:
    call = clients.channel("n00-npu1").unary_unary(
        method, request_serializer=None, response_deserializer=None
    )
    got = await _details(call(body))
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT
    assert got.reason == "MALFORMED_REQUEST"
    assert await clients.health("n00-npu1") == "SERVING"


async def test_a_corrupt_body_on_a_stream_and_on_the_fabric(
    mini: Supernode, clients: Clients
) -> None:
    channel = clients.channel_to(mini.topology.services[0].address)
    stream = channel.unary_stream(
        "/cmemu.v1.Fabric/WatchLinkStats", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stream(b"\xff"):
            pass
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


CORRUPT = [b"\x0a\xff", b"\x12\x05\x61\x62", b"\xff\xff\xff"]  # issue 21, finding 4


@pytest.mark.parametrize("body", CORRUPT)
async def test_a_corrupt_message_in_a_client_stream_is_invalid_argument(
    mini: Supernode, clients: Clients, body: bytes
) -> None:
    """Every request-streaming method (Ems/PutStream, Fabric/SyncClock) refuses a message that
    does not decode as the unary methods do, not as INTERNAL, and keeps serving."""
    ems = clients.channel_to(mini.topology.service(ServiceKind.EMS).address)
    unary = ems.unary_unary(
        "/cmemu.v1.Ems/Put", request_serializer=None, response_deserializer=None
    )
    put = await _details(unary(body))
    assert (put.code, put.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
    streamed = ems.stream_unary(
        "/cmemu.v1.Ems/PutStream", request_serializer=None, response_deserializer=None
    )
    got = await _details(streamed(iter([body])))
    assert (got.code, got.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
    head = ems_pb2.PutChunk(head=ems_pb2.PutRequest(key="k", size=2)).SerializeToString()
    late = await _details(streamed(iter([head, body])))  # a corrupt message after a good one
    assert (late.code, late.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
    fabric = clients.channel_to(mini.topology.services[0].address)
    clock = fabric.stream_stream(
        "/cmemu.v1.Fabric/SyncClock", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(60):  # a hang bound: the suite's load slows the abort
            async for _ in clock(iter([body])):
                pass
    assert (decode(err.value).code, decode(err.value).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MALFORMED_REQUEST",
    )
    ok = await ems_pb2_grpc.EmsStub(ems).PutStream(
        iter([ems_pb2.PutChunk(head=ems_pb2.PutRequest(key="k", size=2, data=b"ok"))])
    )
    assert ok.size == 2


async def test_an_unexpected_exception_is_internal_and_logged(
    clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cmemu.emulator.engines.fabric.engine import FabricEngine
    from cmemu.emulator.engines.fabric.types import LinkStats
    from cmemu.services import rpc as rpc_module

    logged: list[tuple[str, str, dict[str, Any]]] = []

    class Recorder:
        def error(self, event: str, **fields: Any) -> None:
            logged.append(("error", event, fields))

        def info(self, event: str, **fields: Any) -> None:
            logged.append(("info", event, fields))

    def broken(engine: FabricEngine, top: int) -> LinkStats:
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(FabricEngine, "link_stats", broken)  # what the servicer calls
    monkeypatch.setattr(rpc_module, "log", Recorder())
    got = await _details(clients.fabric().GetLinkStats(fabric_pb2.LinkStatsRequest()))
    assert got.code is grpc.StatusCode.INTERNAL
    assert "a bug of ours" not in got.message and len(got.message) < 200
    [(level, event, fields)] = logged
    assert (level, event) == ("error", "internal error")
    assert isinstance(fields["exc_info"], ZeroDivisionError)  # rendered as its traceback
    assert fields["device"] == "fabric"


# --- finding 8: a failed write applies nothing --------------------------------------------------


async def test_a_write_cut_by_a_fault_applies_nothing(clients: Clients) -> None:
    dst = clients.topology.device("n01-npu7")
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=64 << 30)
    )
    at = ub_pb2.UbAddress(eid=dst.eid, offset=region.offset)
    bus = clients.bus("n00-npu5")
    await bus.Submit(ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=at, data=b"HELLO-WORLD"))
    bulk = asyncio.ensure_future(
        bus.Submit(
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=at, size=64 << 30, size_only=True)
        )
    )
    fabric = clients.fabric()
    async with asyncio.timeout(10):  # the bulk write is in flight
        while not (await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest())).active_flows:  # noqa: ASYNC110 - polling the server
            await asyncio.sleep(0.01)
    faults = [
        await fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target=f"n00-l1s{i}"))
        for i in range(DEFAULT_PROFILE.node.l1_chips)
    ]
    try:
        got = await _details(bulk)
        assert got.code is grpc.StatusCode.UNAVAILABLE
    finally:
        for fault in faults:
            await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id))
    read = await clients.bus("n01-cpu0").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=at, size=11)
    )
    assert read.data == b"HELLO-WORLD"
    await clients.device(dst.id).FreeRegion(
        device_pb2.FreeRegionRequest(region_id=region.region_id)
    )


async def test_a_bad_address_still_fails_at_once(clients: Clients) -> None:
    dst = clients.topology.device("n01-npu7")
    tx = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=3 << 30),
        size=32 << 30,
        size_only=True,
    )
    await clients.health("n00-npu5")  # the channel is up: what is timed is the refusal
    started = time.perf_counter()
    got = await _details(clients.bus("n00-npu5").Submit(tx))
    assert got.code is grpc.StatusCode.FAILED_PRECONDITION
    assert time.perf_counter() - started < 0.1  # not after the 0.2 s the bytes would take
