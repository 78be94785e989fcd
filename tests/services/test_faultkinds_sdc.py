"""sdc (silent data corruption) through real gRPC against one in-process cm-mini with the
embedded MQTT broker: the device returns flipped bytes and says nothing; EMS finds the bad copy
by the CRC-32 it kept at put, serves the other replica, counts it and publishes an event, and
with no good copy left answers DATA_LOSS naming the checksum."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, ub_pb2
from tests.runtime.test_mqtt import Listener, listening
from tests.services.test_faultkinds import _refused, _until

POOL, OTHER = "n00-mem", "n01-mem"


@pytest.fixture(scope="module")
async def broker() -> AsyncIterator[Broker]:
    async with Broker() as running:
        yield running


@pytest.fixture(scope="module")
async def mini(broker: Broker) -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=10.0, broker=broker.url) as sn:
        yield sn


@pytest.fixture
async def listener(broker: Broker) -> AsyncIterator[Listener]:
    async with listening(broker.url) as subscribed:
        yield subscribed


def _ems(clients: Clients) -> ems_pb2_grpc.EmsAsyncStub:
    address = clients.topology.service(ServiceKind.EMS).address
    return ems_pb2_grpc.EmsStub(clients.channel_to(address))


async def _region(clients: Clients, device: str, label_end: str) -> device_pb2.Region:
    listed = await clients.device(device).ListRegions(device_pb2.ListRegionsRequest())
    return next(r for r in listed.regions if r.label.endswith(label_end))


async def _read(clients: Clients, device: str, offset: int, size: int) -> bytes:
    eid = clients.topology.device(device).eid
    done = await clients.bus(device).Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=eid, offset=offset), size=size
        )
    )
    return bytes(done.data)


async def _write(clients: Clients, device: str, offset: int, data: bytes) -> None:
    eid = clients.topology.device(device).eid
    await clients.bus(device).Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE, dst=ub_pb2.UbAddress(eid=eid, offset=offset), data=data
        )
    )


async def test_sdc_reads_succeed_with_flipped_bits_and_nothing_at_the_device_notices(
    clients: Clients,
) -> None:
    stub = clients.device(POOL)
    bad = await stub.AllocateRegion(device_pb2.AllocateRegionRequest(size=64, label="sdc-bad"))
    good = await stub.AllocateRegion(device_pb2.AllocateRegionRequest(size=64, label="sdc-good"))
    data = bytes(range(64))
    for region in (bad, good):
        await _write(clients, POOL, region.offset, data)
    before = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())  # the module's own faults
    fault = await faults.inject(clients, "sdc", POOL, {"offset": bad.offset + 8, "size": 16,
                                                      "mask": "0x80"})  # fmt: skip
    assert fault.id == f"dev:{POOL}:sdc" and "mask=128" in fault.detail
    got = await _read(clients, POOL, bad.offset, 64)  # succeeds: silent
    assert got[:8] == data[:8] and got[24:] == data[24:]
    assert got[8:24] == bytes(b ^ 0x80 for b in data[8:24]) != data[8:24]
    assert await _read(clients, POOL, good.offset, 64) == data  # the other region is right
    await _write(clients, POOL, bad.offset, data)  # a rewrite does not heal bad cells
    assert (await _read(clients, POOL, bad.offset + 8, 1)) == bytes([8 ^ 0x80])
    telemetry = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())
    assert (telemetry.ecc_uncorrectable_errors, telemetry.fault_errors) == (
        before.ecc_uncorrectable_errors, before.fault_errors)  # fmt: skip
    await faults.clear(clients, fault.id)
    assert await _read(clients, POOL, bad.offset, 64) == data  # the part replaced
    for region in (bad, good):
        await stub.FreeRegion(device_pb2.FreeRegionRequest(region_id=region.region_id))


async def test_ems_finds_a_corrupt_copy_by_its_crc_and_serves_the_replica(
    clients: Clients, listener: Listener
) -> None:
    ems = _ems(clients)
    before = (await ems.Stat(ems_pb2.StatRequest())).corrupt_copies
    await ems.Put(ems_pb2.PutRequest(key="weights-7", data=b"layer seven weights"))
    await ems.Put(ems_pb2.PutRequest(key="weights-8", data=b"layer eight weights"))
    region = await _region(clients, POOL, "|weights-7")
    fault = await faults.inject(clients, "sdc", POOL, {"region": str(region.region_id)})
    try:
        raw = await _read(clients, POOL, region.offset, len(b"layer seven weights"))
        assert raw == bytes(b ^ 1 for b in b"layer seven weights")  # the device: no error at all
        got = await ems.Get(ems_pb2.GetRequest(key="weights-7", device="n00-npu0"))
        assert got.data == b"layer seven weights" and got.served_by == OTHER
        assert got.corrupt_copies == 1
        twin = await ems.Get(ems_pb2.GetRequest(key="weights-8", device="n00-npu0"))
        assert (twin.served_by, twin.corrupt_copies) == (POOL, 0)  # outside the corrupted region
        assert (await ems.Stat(ems_pb2.StatRequest())).corrupt_copies >= before + 1
        # this test's keys only: an event of the module's other tests, published as it ended,
        # can still be on its way through the broker when this listener subscribes
        mine = ("weights-7", "weights-8")

        def events() -> list[dict[str, Any]]:
            return [e for e in listener.events("corrupt-copy") if e["key"] in mine]

        await listener.wait_for(lambda: bool(events()))
        # one for the copy read, or more: a repair the sweep placed on POOL before the clear below
        # lands on the bad cells too and is found in turn; never another key, never the good pool
        seen = events()
        assert {(e["device"], e["key"], e["copy"]) for e in seen} == {("ems", "weights-7", POOL)}
        assert "CRC-32" in str(seen[0]["detail"]) and seen[0]["copies_left"] == 1
    finally:
        await faults.clear(clients, fault.id)  # the part replaced

    async def repaired() -> bool:  # the sweep copied the good replica back to POOL
        got = await ems.Get(ems_pb2.GetRequest(key="weights-7", device="n00-npu0"))
        return got.served_by == POOL

    await _until(repaired)
    again = await ems.Get(ems_pb2.GetRequest(key="weights-7", device="n00-npu0"))
    assert (again.data, again.served_by, again.corrupt_copies) == (
        b"layer seven weights", POOL, 0)  # fmt: skip


async def test_with_every_copy_corrupt_ems_answers_data_loss_naming_the_checksum(
    clients: Clients,
) -> None:
    ems = _ems(clients)
    await ems.Put(ems_pb2.PutRequest(key="ckpt-9", data=b"optimizer state"))
    injected = []
    for pool in (POOL, OTHER):
        region = await _region(clients, pool, "|ckpt-9")
        injected.append(await faults.inject(clients, "sdc", pool, {"region": region.region_id}))
    lost = await _refused(ems.Get(ems_pb2.GetRequest(key="ckpt-9")))
    assert (lost.code, lost.reason) == (grpc.StatusCode.DATA_LOSS, "CHECKSUM_MISMATCH")
    assert "fails its CRC-32 checksum (2 corrupt)" in lost.message
    for fault in injected:
        await faults.clear(clients, fault.id)


async def test_a_pools_own_data_loss_ends_a_get_and_is_no_corrupt_copy(clients: Clients) -> None:
    """An uncorrectable ECC error is the pool's answer (its status, relayed), not a copy that
    failed EMS's own checksum: the Get ends DATA_LOSS with the pool's reason, nothing counted
    corrupt, as when every pool was reached over gRPC (emulator/engines/ems/reads.py)."""
    ems = _ems(clients)
    await ems.Put(ems_pb2.PutRequest(key="ecc-1", data=b"poisoned cells"))
    before = (await ems.Stat(ems_pb2.StatRequest())).corrupt_copies
    region = await _region(clients, POOL, "|ecc-1")
    fault = await faults.inject(clients, "hbm-ecc", POOL, {"region": region.region_id})
    try:
        lost = await _refused(ems.Get(ems_pb2.GetRequest(key="ecc-1", device="n00-npu0")))
        assert (lost.code, lost.reason) == (grpc.StatusCode.DATA_LOSS, "HBM_UNCORRECTABLE_ECC")
        assert (await ems.Stat(ems_pb2.StatRequest())).corrupt_copies == before
    finally:
        await faults.clear(clients, fault.id)


async def test_sdc_checks_its_params_and_target(clients: Clients) -> None:
    for params, field in (({}, "params.region"), ({"region": 3, "size": 8}, "params.region"),
                          ({"size": 8, "mask": 256}, "params.mask"),
                          ({"size": 8, "mask": 0}, "params.mask")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as err:
            await faults.inject(clients, "sdc", POOL, params)
        assert err.value.field == field
    missing = await _refused(faults.inject(clients, "sdc", POOL, {"region": "999999"}))
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "REGION_NOT_FOUND")
    outside = await _refused(faults.inject(clients, "sdc", POOL, {"offset": 2**50, "size": 8}))
    assert outside.code is grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(NotFoundError):
        await faults.inject(clients, "sdc", "n09-mem", {"size": 8})
    assert not [f for f in await faults.list_all(clients) if f.kind == "sdc"]
