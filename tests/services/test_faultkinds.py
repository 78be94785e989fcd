"""The fault catalogue (issue 11), each kind through real gRPC against an in-process cm-mini: the
device behaves as a real one would (crash: port closed; hang: no answer, health included; slow;
HBM ECC: DATA_LOSS; die down: degraded), durations end faults in emulated time, and bad
parameters get a precise status. Each test clears what it injected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client import faults
from cmemu.emulator.client.errors import ErrorDetails, decode
from cmemu.emulator.client.status import error_details
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
)
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, npu_pb2, ub_pb2

KERNEL = npu_pb2.Kernel(flops=354e12 * 0.001, precision=npu_pb2.PRECISION_BF16)  # 1 ms on a die


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    """cm-mini, ten emulated seconds per wall second: durations end quickly."""
    async with running_supernode("cm-mini", time_scale=10.0) as supernode:
        yield supernode


async def _refused(call: Awaitable[Any]) -> ErrorDetails:
    """What a refused call's status says: a raw stub's AioRpcError, or the EmulatorError a
    typed client (faults.inject) raises for it."""
    with pytest.raises((grpc.aio.AioRpcError, EmulatorError)) as err:
        async with asyncio.timeout(30):  # a bound only: a busy host answers late
            await call
    if isinstance(err.value, grpc.aio.AioRpcError):
        return decode(err.value)
    assert isinstance(err.value, EmulatorError)
    return error_details(err.value)


async def _until(predicate: Any, timeout_s: float = 300.0) -> None:
    """Wait for a condition (polled), never for a fixed time: the bound only ends a hung test
    (a busy host may take long in wall time for what takes little emulated time)."""
    async with asyncio.timeout(timeout_s):
        while not await predicate():  # noqa: ASYNC110 (polled over gRPC, as a client does)
            await asyncio.sleep(0.02)


def _health(clients: Clients, device: str) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(clients.channel(device))


async def _ids(clients: Clients) -> set[str]:
    return {f.id for f in await faults.list_all(clients)}


# --- the table -----------------------------------------------------------------------------------


def test_the_catalogue_has_every_kind_with_typed_params() -> None:
    assert set(faults.KINDS) == {
        "crash", "hang", "slow", "hbm-ecc", "die-down", "link-flap", "node-power-off",
        "process-kill", "process-pause", "pool-loss", "broker-outage", "link-down",
        "link-degraded", "link-latency", "switch-down", "partition", "device-down",
        "rdma-link-down", "rdma-link-slow", "rdma-switch-down", "rdma-switch-slow", "gateway-down",
        "container-kill", "container-pause", "container-restart", "container-stop",
        "container-disconnect", "container-netem", "thermal-throttle", "intermittent-hang",
        "link-loss", "optical-module", "l1-board", "service-kill", "service-hang",
        "service-slow", "service-partition", "rack-power-off", "sdc", "ssd-loss",
        "supernode-partition", "checkpoint-corrupt", "clock-skew",
    }  # fmt: skip
    slow = faults.KINDS["slow"].params_from({"compute": "0.25"})
    assert (slow.compute, slow.link) == (0.25, 1.0)
    flap = faults.KINDS["link-flap"].params_from({"period_s": 4, "duty": "0.25"})
    assert (flap.period_s, flap.duty) == (4.0, 0.25)
    assert faults.KINDS["crash"].params_from({"wipe": "false"}).wipe is False


@pytest.mark.parametrize(
    ("kind", "params", "reason"),
    [
        ("crash", {"wipe": "maybe"}, "INVALID_FAULT_PARAM"),
        ("hang", {"for": "1"}, "UNKNOWN_FAULT_PARAM"),
        ("slow", {"compute": "0"}, "INVALID_FAULT_PARAM"),
        ("slow", {"compute": "1", "link": "1"}, "INVALID_FAULT_PARAM"),
        ("slow", {"compute": "nan"}, "INVALID_FAULT_PARAM"),
        ("hbm-ecc", {}, "INVALID_FAULT_PARAM"),
        ("hbm-ecc", {"region": "3", "size": "8"}, "INVALID_FAULT_PARAM"),
        ("die-down", {"die": "-1"}, "INVALID_FAULT_PARAM"),
        ("die-down", {"die": "one"}, "INVALID_FAULT_PARAM"),
        ("link-flap", {"duty": "1"}, "INVALID_FAULT_PARAM"),
        ("link-flap", {"period_s": "-2"}, "INVALID_FAULT_PARAM"),
        ("link-degraded", {}, "INVALID_FAULT_PARAM"),
        ("partition", {"side_a": "n00-npu0"}, "INVALID_FAULT_PARAM"),
    ],
)
def test_bad_params_are_refused_by_name(kind: str, params: dict[str, str], reason: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        faults.KINDS[kind].params_from(params)
    assert err.value.reason == reason
    assert (err.value.field or "").startswith("params.")


async def test_an_unknown_kind_or_a_missing_target_is_refused(clients: Clients) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown fault kind"):
        await faults.inject(clients, "meteor", "n00-npu0")
    with pytest.raises(InvalidArgumentError, match="needs a target"):
        await faults.inject(clients, "crash", "")
    with pytest.raises(InvalidArgumentError, match="duration"):
        await faults.inject(clients, "hang", "n00-npu0", duration_s=-1)


# --- crash, node power-off, pool loss ------------------------------------------------------------


async def test_a_crashed_device_is_gone_and_comes_back_empty(clients: Clients) -> None:
    device = "n00-npu1"
    region = await clients.device(device).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=4096)
    )
    assert region.region_id
    fault = await faults.inject(clients, "crash", device)
    assert fault.id == "dev:n00-npu1:crash"
    gone = await _refused(clients.device(device).GetInfo(device_pb2.GetInfoRequest(), timeout=5))
    assert gone.code is grpc.StatusCode.UNAVAILABLE  # connection refused: no server
    # a peer writing to it over the fabric gets UNAVAILABLE too, with the peer's reason
    target = clients.topology.device(device)
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE, dst=ub_pb2.UbAddress(eid=target.eid, offset=region.offset), data=b"x"
    )
    cut = await _refused(clients.bus("n00-npu0").Submit(write))
    assert (cut.code, cut.reason) == (grpc.StatusCode.UNAVAILABLE, "PEER_UNREACHABLE")
    assert fault.id in await _ids(clients)  # a sibling answers for it
    await faults.clear(clients, fault.id)
    listing = await clients.device(device).ListRegions(
        device_pb2.ListRegionsRequest(), wait_for_ready=True, timeout=10
    )
    assert listing.region_count == 0  # wiped: a reset reinitialises HBM
    assert await clients.health(device) == "SERVING"
    assert fault.id not in await _ids(clients)
    with pytest.raises(NotFoundError):
        await faults.clear(clients, fault.id)


async def test_a_crash_that_keeps_memory_and_ends_by_itself(clients: Clients) -> None:
    device = "n00-cpu1"
    stub = clients.device(device)
    await stub.AllocateRegion(device_pb2.AllocateRegionRequest(size=4096, label="kept"))
    fault = await faults.inject(clients, "crash", device, {"wipe": "false"}, duration_s=2.0)
    assert fault.until_ns - fault.since_ns == 2_000_000_000

    async def back() -> bool:
        try:
            got = await stub.ListRegions(device_pb2.ListRegionsRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
        return got.region_count == 1

    await _until(back)
    assert fault.id not in await _ids(clients)


async def test_node_power_off_crashes_every_device_of_the_node(clients: Clients) -> None:
    fault = await faults.inject(clients, "node-power-off", "n01")
    assert fault.id == "node:n01"
    node = [d.id for d in clients.topology.devices if d.node == "n01"]
    assert {f"dev:{d}:crash" for d in node} <= await _ids(clients)
    for device in (node[0], node[-1]):
        gone = await _refused(clients.device(device).GetInfo(device_pb2.GetInfoRequest()))
        assert gone.code is grpc.StatusCode.UNAVAILABLE
    await faults.clear(clients, fault.id)
    for device in node:
        await clients.device(device).GetInfo(
            device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=10
        )
    assert not any(i.startswith("dev:n01-") for i in await _ids(clients))
    with pytest.raises(NotFoundError):
        await faults.inject(clients, "node-power-off", "n99")


async def test_pool_loss_takes_a_pool_and_nothing_else(clients: Clients) -> None:
    pool = next(d.id for d in clients.topology.devices if d.kind.value == "mempool")
    wrong = await _refused(faults.inject(clients, "pool-loss", "n00-npu0"))
    assert (wrong.code, wrong.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "WRONG_DEVICE_KIND")
    fault = await faults.inject(clients, "pool-loss", pool)
    gone = await _refused(clients.device(pool).GetInfo(device_pb2.GetInfoRequest()))
    assert gone.code is grpc.StatusCode.UNAVAILABLE
    await faults.clear(clients, fault.id)
    await clients.device(pool).GetInfo(device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=10)


# --- hang ----------------------------------------------------------------------------------------


async def test_a_hung_device_accepts_and_never_answers_until_cleared(clients: Clients) -> None:
    device = "n00-npu2"
    fault = await faults.inject(clients, "hang", device)
    health = _health(clients, device)
    late = await _refused(health.Check(health_pb2.HealthCheckRequest(), timeout=0.3))
    assert late.code is grpc.StatusCode.DEADLINE_EXCEEDED  # a heartbeat deadline finds it
    late = await _refused(
        clients.device(device).GetTelemetry(device_pb2.GetTelemetryRequest(), timeout=0.3)
    )
    assert late.code is grpc.StatusCode.DEADLINE_EXCEEDED
    pending = asyncio.ensure_future(clients.npu(device).SubmitKernel(KERNEL, timeout=30))
    probe = clients.device(device).GetFaultState(device_pb2.GetFaultStateRequest(), timeout=0.3)
    assert (await _refused(probe)).code is grpc.StatusCode.DEADLINE_EXCEEDED
    listing = await clients.device(device).ListFaults(device_pb2.ListDeviceFaultsRequest())
    assert [f.kind for f in listing.faults] == ["hang"]  # the fault-control path answers
    assert fault.id in await _ids(clients)
    target = clients.topology.device(device)
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=target.eid), data=b"ping"
    )
    over_fabric = await _refused(clients.bus("n00-npu0").Submit(write, timeout=0.3))
    assert over_fabric.code is grpc.StatusCode.DEADLINE_EXCEEDED  # delivery never answered
    assert not pending.done()
    await faults.clear(clients, fault.id)
    assert (await clients.bus("n00-npu0").Submit(write, timeout=5)).size == 4
    assert (await pending).duration_ns == 1_000_000  # the call in flight proceeds
    ok = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert ok.status == health_pb2.HealthCheckResponse.SERVING


# --- slow ----------------------------------------------------------------------------------------


async def test_slow_kernels_and_ports(clients: Clients) -> None:
    device = "n00-npu4"
    fault = await faults.inject(clients, "slow", device, {"compute": "0.5", "link": "0.25"})
    slowed = await clients.npu(device).SubmitKernel(KERNEL)
    assert slowed.duration_ns == 2_000_000
    on_fabric = (await clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest())).faults
    ports = [f for f in on_fabric if f.kind == "ports-degraded" and f.target == device]
    assert len(ports) == 1 and ports[0].ports_degraded.factor == 0.25
    telemetry = await clients.device(device).GetTelemetry(device_pb2.GetTelemetryRequest())
    assert telemetry.compute_share == 0.5 and "slow" in telemetry.faults
    await faults.clear(clients, fault.id)
    assert (await clients.npu(device).SubmitKernel(KERNEL)).duration_ns == 1_000_000
    assert not (await clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest())).faults
    cpu = await _refused(faults.inject(clients, "slow", "n00-cpu0", {"compute": "0.5"}))
    assert cpu.reason == "WRONG_DEVICE_KIND"


# --- HBM ECC -------------------------------------------------------------------------------------


async def test_hbm_ecc_poisons_reads_counts_them_and_writes_heal(clients: Clients) -> None:
    device = "n00-npu5"
    stub = clients.device(device)
    region = await stub.AllocateRegion(device_pb2.AllocateRegionRequest(size=8192))
    eid = clients.topology.device(device).eid
    bus = clients.bus("n00-npu6")

    def read(offset: int, size: int) -> Awaitable[ub_pb2.UbCompletion]:
        return bus.Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=eid, offset=offset), size=size
            )
        )

    fault = await faults.inject(clients, "hbm-ecc", device, {"region": str(region.region_id)})
    lost = await _refused(read(region.offset + 100, 16))
    assert (lost.code, lost.reason) == (grpc.StatusCode.DATA_LOSS, "HBM_UNCORRECTABLE_ECC")
    telemetry = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())
    assert telemetry.ecc_uncorrectable_errors == 1
    assert telemetry.ecc_poisoned_bytes == 8192
    await bus.Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=eid, offset=region.offset),
            data=b"y" * 4096,
        )
    )
    healed = await read(region.offset, 4096)
    assert healed.data == b"y" * 4096
    assert (await _refused(read(region.offset + 4096, 8))).code is grpc.StatusCode.DATA_LOSS
    telemetry = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())
    assert (telemetry.ecc_uncorrectable_errors, telemetry.ecc_poisoned_bytes) == (2, 4096)
    await faults.clear(clients, fault.id)
    assert len((await read(region.offset + 4096, 8)).data) == 8
    missing = await _refused(faults.inject(clients, "hbm-ecc", device, {"region": "999999"}))
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "REGION_NOT_FOUND")
    outside = await _refused(
        faults.inject(clients, "hbm-ecc", device, {"offset": str(2**40), "size": "8"})
    )
    assert outside.code is grpc.StatusCode.OUT_OF_RANGE


# --- die down ------------------------------------------------------------------------------------


async def test_a_down_die_degrades_its_npu(clients: Clients) -> None:
    device = "n00-npu6"
    fault = await faults.inject(clients, "die-down", device, {"die": "1"})
    npu = clients.npu(device)
    down = await _refused(
        npu.SubmitKernel(npu_pb2.Kernel(flops=1e9, precision=npu_pb2.PRECISION_BF16, die=1))
    )
    assert (down.code, down.reason) == (grpc.StatusCode.UNAVAILABLE, "DIE_DOWN")
    assert (
        await npu.SubmitKernel(npu_pb2.Kernel(flops=1e9, precision=npu_pb2.PRECISION_BF16, die=0))
    ).die == 0
    assert await clients.health(device) == "SERVING"
    assert await clients.health(device, f"{device}.d1") == "NOT_SERVING"
    assert await clients.health(device, f"{device}.d0") == "SERVING"
    telemetry = await clients.device(device).GetTelemetry(device_pb2.GetTelemetryRequest())
    assert list(telemetry.dies_down) == [1]
    again = await _refused(faults.inject(clients, "die-down", device, {"die": "0"}))
    assert again.reason == "FAULT_ALREADY_ACTIVE"
    await faults.clear(clients, fault.id)
    assert await clients.health(device, f"{device}.d1") == "SERVING"
    no_die = await _refused(faults.inject(clients, "die-down", device, {"die": "5"}))
    assert no_die.code is grpc.StatusCode.INVALID_ARGUMENT
    cpu = await _refused(faults.inject(clients, "die-down", "n00-cpu0"))
    assert cpu.code is grpc.StatusCode.FAILED_PRECONDITION


# --- device-down with a duration, link flap, processes, broker -----------------------------------


async def test_device_down_keeps_its_id_and_can_end_by_itself(clients: Clients) -> None:
    device = "n00-npu7"
    fault = await faults.inject(clients, "device-down", device, {"reason": "test"}, duration_s=1.0)
    assert fault.id == "dev:n00-npu7" and "reason=test" in fault.detail
    assert await clients.health(device) == "NOT_SERVING"

    async def up() -> bool:
        return await clients.health(device) == "SERVING"

    await _until(up)
    assert fault.id not in await _ids(clients)


async def test_a_link_flaps_in_emulated_time_and_ends(clients: Clients) -> None:
    link = next(
        f"{a}~{b}"
        for a, b in ((lk.a, lk.b) for lk in clients.topology.links)
        if a.startswith("n00-npu0")
    )
    fault = await faults.inject(
        clients, "link-flap", link, {"period_s": "1", "duty": "0.5"}, duration_s=3.0
    )
    listed = {f.id: f for f in await faults.list_all(clients)}
    assert "period=1s duty=0.5" in listed[fault.id].detail

    async def gone() -> bool:
        return fault.id not in await _ids(clients)

    await _until(gone)
    bad = await _refused(
        clients.fabric().InjectFault(
            fabric_pb2.FabricFault(
                kind="link-flap",
                target=link,
                link_flap=faultparams_pb2.LinkFlapParams(period_s=1, duty=1.5),
            )
        )
    )
    assert bad.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_process_faults_need_the_procs_launcher(clients: Clients) -> None:
    for kind in ("process-kill", "process-pause"):
        with pytest.raises(PreconditionError) as err:
            await faults.inject(clients, kind, "n00-npu0")
        assert err.value.reason == "LAUNCHER_UNSUPPORTED"
        assert "procs" in str(err.value)


async def test_a_broker_outage_needs_a_broker(clients: Clients) -> None:
    refused = await _refused(faults.inject(clients, "broker-outage"))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NO_BROKER")


async def test_unknown_ids_and_bad_device_requests(clients: Clients) -> None:
    with pytest.raises(NotFoundError):
        await faults.clear(clients, "dev:n00-npu0:hang")
    for well_formed in ("f999", "node:n00:thermal-throttle", "node:n00:meteor", "rack:rack00"):
        with pytest.raises(NotFoundError):  # of a family, and nobody holds it
            await faults.clear(clients, well_formed)
    for malformed in ("meteor:x", "dev:", "proc:n00", "ckpt:job:x:n00-mem", "broker:x"):
        with pytest.raises(InvalidArgumentError) as err:  # no id at all: said so, naming it
            await faults.clear(clients, malformed)
        assert (err.value.reason, err.value.subject) == ("INVALID_FAULT_ID", malformed)
    bad = await _refused(
        clients.device("n00-npu0").InjectFault(device_pb2.FaultState(kind="meteor"))
    )
    assert (bad.code, bad.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_FAULT_KIND")
    bad = await _refused(
        clients.device("n00-npu0").InjectFault(device_pb2.FaultState(kind="hang", for_s=-1))
    )
    assert bad.code is grpc.StatusCode.INVALID_ARGUMENT
    bad = await _refused(
        clients.device("n00-npu0").InjectFault(
            device_pb2.FaultState(kind="slow", die_down=faultparams_pb2.DieDownParams(die=1))
        )
    )
    assert (bad.code, bad.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "WRONG_FAULT_PARAMS")
    bad = await _refused(
        clients.device("n00-npu0").InjectFault(device_pb2.FaultState(kind="hang", device="n99"))
    )
    assert bad.code is grpc.StatusCode.NOT_FOUND


async def test_a_device_down_for_two_reasons_comes_back_after_both(clients: Clients) -> None:
    pool = "n01-mem"
    node = await faults.inject(clients, "node-power-off", "n01")
    lost = await faults.inject(clients, "pool-loss", pool)
    await faults.clear(clients, node.id)
    await clients.device("n01-npu0").GetInfo(
        device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=10
    )
    still = await _refused(clients.device(pool).GetInfo(device_pb2.GetInfoRequest()))
    assert still.code is grpc.StatusCode.UNAVAILABLE  # the pool loss outlives the power-off
    await faults.clear(clients, lost.id)
    await clients.device(pool).GetInfo(device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=10)
