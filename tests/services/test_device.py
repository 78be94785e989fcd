"""The Device service of every kind, over real gRPC against an in-process cm-mini."""

from __future__ import annotations

import grpc
import pytest

from cmemu.emulator.client import health
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients
from cmemu.services.kinds import DEVICE_SERVICE, UB_SERVICE
from cmemu.v1 import device_pb2, ub_pb2

PROFILE = DEFAULT_PROFILE
KIND_SERVICES = {"npu": "cmemu.v1.Npu", "cpu": "cmemu.v1.Cpu", "mempool": "cmemu.v1.MemoryPool"}


async def _code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_every_device_and_every_service_is_serving(mini: Supernode, clients: Clients) -> None:
    statuses = await health.check_many([d.address for d in mini.topology.devices], timeout_s=60)
    assert set(statuses.values()) == {"SERVING"}
    assert len(statuses) == 26
    for device in (mini.topology.devices[0], mini.topology.devices[8], mini.topology.devices[12]):
        for service in ("", DEVICE_SERVICE, UB_SERVICE, KIND_SERVICES[device.kind.value]):
            assert await clients.health(device.id, service) == "SERVING"


async def test_info_of_each_kind(clients: Clients) -> None:
    npu = await clients.device("n01-npu3").GetInfo(device_pb2.GetInfoRequest())
    assert (npu.id, npu.kind, npu.node, npu.supernode) == (
        "n01-npu3",
        device_pb2.DEVICE_KIND_NPU,
        "n01",
        "sn0",
    )
    assert npu.memory_bytes == 128 * 2**30
    assert npu.npu.dies == 2 and npu.npu.cube_cores_per_die == 24
    assert dict(npu.npu.peak_tflops_per_die) == {"BF16": 354.0, "FP16": 376.0, "INT8": 752.0}
    cpu = await clients.device("n00-cpu2").GetInfo(device_pb2.GetInfoRequest())
    assert cpu.cpu.cores == PROFILE.cpu.cores
    assert cpu.cpu.local_dram_bytes + cpu.cpu.pooled_dram_bytes == 512 * 2**30
    assert cpu.memory_bytes == cpu.cpu.local_dram_bytes
    pool = await clients.device("n00-mem").GetInfo(device_pb2.GetInfoRequest())
    assert pool.mempool.capacity_bytes == 4 * cpu.cpu.pooled_dram_bytes
    assert list(pool.mempool.member_cpus) == [f"n00-cpu{i}" for i in range(4)]


async def test_regions_allocate_list_free(clients: Clients) -> None:
    dev = clients.device("n00-npu1")
    region = await dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=10_000, label="kv"))
    assert region.size == 12_288 and region.eid == 17  # rounded to 4 KiB pages
    listing = await dev.ListRegions(device_pb2.ListRegionsRequest())
    assert [r.label for r in listing.regions] == ["kv"]
    assert listing.used_bytes == 12_288
    assert listing.free_bytes == 128 * 2**30 - 12_288
    freed = await dev.FreeRegion(device_pb2.FreeRegionRequest(region_id=region.region_id))
    assert freed.freed_bytes == 12_288
    assert not (await dev.ListRegions(device_pb2.ListRegionsRequest())).regions


async def test_capacity_is_enforced_to_the_byte(clients: Clients) -> None:
    dev = clients.device("n01-npu0")
    whole = await dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=128 * 2**30))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=1))
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "0 bytes free" in (err.value.details() or "")
    await dev.FreeRegion(device_pb2.FreeRegionRequest(region_id=whole.region_id))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await dev.AllocateRegion(device_pb2.AllocateRegionRequest(size=128 * 2**30 + 1))
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{128 * 2**30} bytes free" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("method", "request_", "code"),
    [
        ("AllocateRegion", device_pb2.AllocateRegionRequest(size=0), "INVALID_ARGUMENT"),
        (
            "AllocateRegion",
            device_pb2.AllocateRegionRequest(size=8, label="x" * 300),
            "INVALID_ARGUMENT",
        ),
        ("FreeRegion", device_pb2.FreeRegionRequest(region_id=0), "INVALID_ARGUMENT"),
        ("FreeRegion", device_pb2.FreeRegionRequest(region_id=987654), "NOT_FOUND"),
        ("SetFaultState", device_pb2.FaultState(reason="y" * 300), "INVALID_ARGUMENT"),
    ],
)
async def test_bad_requests_get_a_status_and_the_device_keeps_serving(
    clients: Clients, method: str, request_: object, code: str
) -> None:
    dev = clients.device("n00-cpu0")
    assert (await _code_of(getattr(dev, method)(request_))).name == code
    assert await clients.health("n00-cpu0") == "SERVING"
    assert (await dev.GetInfo(device_pb2.GetInfoRequest())).id == "n00-cpu0"


async def test_fault_turns_health_and_ub_off_until_cleared(clients: Clients) -> None:
    dev = clients.device("n01-mem")
    state = await dev.SetFaultState(device_pb2.FaultState(faulted=True, reason="DIMM failure"))
    assert state.faulted and state.reason == "DIMM failure"
    for service in ("", DEVICE_SERVICE, UB_SERVICE, "cmemu.v1.MemoryPool"):
        assert await clients.health("n01-mem", service) == "NOT_SERVING"
    read = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_READ,
        dst=ub_pb2.UbAddress(eid=clients.topology.device("n01-mem").eid),
        size=8,
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.bus("n00-npu0").Submit(read)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "DIMM failure" in (err.value.details() or "")
    assert (await dev.GetTelemetry(device_pb2.GetTelemetryRequest())).faulted
    cleared = await dev.SetFaultState(device_pb2.FaultState(faulted=False))
    assert not cleared.faulted and cleared.since_ns >= state.since_ns
    assert await clients.health("n01-mem") == "SERVING"


async def test_telemetry_counts_ub_traffic(clients: Clients) -> None:
    target = clients.topology.device("n01-cpu1")
    region = await clients.device(target.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=64)
    )
    before = await clients.device(target.id).GetTelemetry(device_pb2.GetTelemetryRequest())
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=target.eid, offset=region.offset),
        data=b"z" * 40,
    )
    await clients.bus("n00-npu5").Submit(write)
    after = await clients.device(target.id).GetTelemetry(device_pb2.GetTelemetryRequest())
    assert after.ub_rx_count == before.ub_rx_count + 1
    assert after.ub_rx_bytes == before.ub_rx_bytes + 40
    assert after.stored_bytes >= 40
    assert after.emulated_ns > before.emulated_ns
    sender = await clients.device("n00-npu5").GetTelemetry(device_pb2.GetTelemetryRequest())
    assert sender.ub_tx_count >= 1
