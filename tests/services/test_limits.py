"""Bounded memory and time (issue 9 item 1): every cap of EmulatorLimits answers
RESOURCE_EXHAUSTED or OUT_OF_RANGE through real servers, before anything changes."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest

from cmemu.emulator.client.errors import ErrorDetails, decode
from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.emulator.model.errors import AddressError, AddressInUseError, EmulatorError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, free_port_block, running_supernode
from cmemu.services.auth import ServerSecurity
from cmemu.services.host import ServiceHost
from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2

LIMITS = EmulatorLimits(
    regions_max_per_device=6,
    process_stored_bytes_cap=8 * 4096,
    process_inbox_max_messages=5,
    process_inbox_max_bytes=1 << 20,
    operation_max_s=0.05,
    list_regions_page_max=4,
)
PROFILE = dataclasses.replace(DEFAULT_PROFILE, limits=LIMITS)


@pytest.fixture(scope="module")
async def tight() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", profile=PROFILE) as supernode:
        yield supernode


@pytest.fixture(scope="module")
async def tc(tight: Supernode) -> AsyncIterator[Clients]:
    c = Clients(tight.topology)
    yield c
    await c.close()


async def _details(call: Awaitable[Any]) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(10):
            await call
    return decode(err.value)


def test_every_limit_is_a_figure_of_the_profile() -> None:
    names = {f.name for f in dataclasses.fields(EmulatorLimits)}
    assert {
        "operation_max_s",
        "process_stored_bytes_cap",
        "process_inbox_max_messages",
        "process_inbox_max_bytes",
        "regions_max_per_device",
        "list_regions_page_max",
        "engine_backlog_max_s",
    } <= names
    assert DEFAULT_PROFILE.limits.operation_max_s == 3600.0


async def test_regions_per_device_are_capped_and_listed_in_pages(tc: Clients) -> None:
    dev = tc.device("n00-npu0")
    made = [
        await dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=4096, label=f"r{i}"))
        for i in range(LIMITS.regions_max_per_device)
    ]
    got = await _details(dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=4096)))
    assert (got.code, got.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_REGIONS")
    seen: list[int] = []
    token = ""
    pages = 0
    while True:
        page = await dev.ListRegions(device_pb2.ListRegionsRequest(page_size=100, page_token=token))
        assert len(page.regions) <= LIMITS.list_regions_page_max
        seen += [r.region_id for r in page.regions]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [r.region_id for r in made] and pages == 2
    small = await dev.ListRegions(device_pb2.ListRegionsRequest(page_size=1))
    assert len(small.regions) == 1 and small.next_page_token
    for token in ("garbage", "\u00b2"):  # "²" passes str.isdigit() but not int() (the fuzzer's)
        request = device_pb2.ListRegionsRequest(page_token=token)
        bad = await _details(dev.ListRegions(request))
        assert bad.code is grpc.StatusCode.INVALID_ARGUMENT, token
    for r in made:
        await dev.FreeRegion(device_pb2.FreeRegionRequest(region_id=r.region_id))


async def test_real_bytes_are_capped_per_process(tc: Clients) -> None:
    """Two devices share the process's cap: what one holds the other cannot."""
    a, b = tc.topology.device("n00-cpu0"), tc.topology.device("n01-cpu0")
    ra = await tc.device(a.id).AllocateRegion(device_pb2.AllocateRegionRequest(size=1 << 20))
    rb = await tc.device(b.id).AllocateRegion(device_pb2.AllocateRegionRequest(size=1 << 20))
    page = b"y" * 4096
    bus = tc.bus("n00-npu1")
    for i in range(6):
        await bus.Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=a.eid, offset=ra.offset + i * 4096),
                data=page,
            )
        )
    got = await _details(
        bus.Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=b.eid, offset=rb.offset),
                data=page * 3,
            )
        )
    )
    assert got.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    read = await bus.Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=b.eid, offset=rb.offset), size=8
        )
    )
    assert read.data == bytes(8)  # the refused write applied nothing
    await tc.device(a.id).FreeRegion(device_pb2.FreeRegionRequest(region_id=ra.region_id))
    await bus.Submit(  # freeing gave the bytes back to the process
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=b.eid, offset=rb.offset),
            data=page * 3,
        )
    )
    await tc.device(b.id).FreeRegion(device_pb2.FreeRegionRequest(region_id=rb.region_id))


async def test_queued_messages_are_capped_per_process(tc: Clients) -> None:
    targets = [tc.topology.device(d) for d in ("n00-cpu2", "n01-cpu2", "n01-cpu3")]
    bus = tc.bus("n00-npu2")

    def send(eid: int) -> ub_pb2.UbTransaction:
        return ub_pb2.UbTransaction(op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=eid), data=b"m")

    for i in range(LIMITS.process_inbox_max_messages):
        await bus.Submit(send(targets[i % 3].eid))
    got = await _details(bus.Submit(send(targets[0].eid)))
    assert (got.code, got.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "RECEIVE_QUEUE_FULL")
    for t in targets:
        await tc.bus(t.id).Receive(ub_pb2.ReceiveRequest(max_messages=10))
    await bus.Submit(send(targets[0].eid))  # received messages free the room
    await tc.bus(targets[0].id).Receive(ub_pb2.ReceiveRequest(max_messages=10))


async def test_an_operation_longer_than_the_ceiling_is_refused(tc: Clients) -> None:
    dst = tc.topology.device("n01-npu4")
    region = await tc.device(dst.id).AllocateRegion(device_pb2.AllocateRegionRequest(size=32 << 30))
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
        size=32 << 30,  # 0.2 s emulated > 0.05
        size_only=True,
    )
    before = await tc.device("n00-npu3").GetTelemetry(device_pb2.GetTelemetryRequest())
    got = await _details(tc.bus("n00-npu3").Submit(write))
    assert (got.code, got.reason) == (grpc.StatusCode.OUT_OF_RANGE, "OPERATION_TOO_LONG")
    after = await tc.device("n00-npu3").GetTelemetry(device_pb2.GetTelemetryRequest())
    assert after.ub_tx_bytes == before.ub_tx_bytes
    gather = await _details(
        tc.fabric().Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER,
                ranks=["n00-npu0", "n01-npu0"],
                bytes=1 << 34,
            )
        )
    )
    assert gather.reason == "OPERATION_TOO_LONG"
    await tc.device(dst.id).FreeRegion(device_pb2.FreeRegionRequest(region_id=region.region_id))


async def test_an_unresolvable_host_is_not_an_address_in_use() -> None:
    host = ServiceHost(
        name="n00-npu0",
        address="no-such-host.invalid:50051",
        services=[],
        security=ServerSecurity(insecure=True),  # past the loopback check, to the resolver
    )
    with pytest.raises(AddressError) as err:
        await host.start()
    assert "cannot resolve no-such-host.invalid" in str(err.value)
    assert "in use" not in str(err.value)
    await host.stop(0)


@pytest.mark.parametrize("held", [True, False])
async def test_a_bind_that_fails_says_why_it_failed(held: bool) -> None:
    """grpc says only that a bind failed, for every cause: a port another listener holds is
    ADDRESS_IN_USE; an address that is not this machine's (192.0.2.1, TEST-NET-1) is not in
    use anywhere, and says what the system said (ADDRESS_UNUSABLE) instead."""
    port = free_port_block(1)
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if held:
            holder.bind(("127.0.0.1", port))
            holder.listen()
        host = ServiceHost(
            name="n00-npu0",
            address=f"127.0.0.1:{port}" if held else f"192.0.2.1:{port}",
            services=[],
            security=ServerSecurity(insecure=True),  # past the loopback check, to the bind
        )
        with pytest.raises(EmulatorError) as err:
            await host.start()
        await host.stop(0)
    finally:
        holder.close()
    if held:
        assert isinstance(err.value, AddressInUseError) and "address already in use" in str(
            err.value
        )
    else:
        assert isinstance(err.value, AddressError) and err.value.reason == "ADDRESS_UNUSABLE"
        assert "in use" not in str(err.value)
        assert os.strerror(errno.EADDRNOTAVAIL) in str(err.value)
