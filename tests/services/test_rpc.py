"""Error statuses carry google.rpc details a program can act on, through real servers (cm-mini in
process): an ErrorInfo (stable reason, domain, the offending field and id), a BadRequest on
INVALID_ARGUMENT, a RetryInfo only where retrying can succeed; grpcurl shows them too."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cmemu.emulator.client.errors import DOMAIN, ErrorDetails, decode, describe
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    blame,
)
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients
from cmemu.services.rpc import RemoteError, to_status
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, npu_pb2, ub_pb2

GRPCURL = str(Path(sys.executable).parent / "grpcurl")


async def _details(call: Awaitable[Any]) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return decode(err.value)


# --- the model side: reasons, blame, and the status they become --------------------------------


def test_reasons_default_per_class_and_raise_sites_override() -> None:
    assert NotFoundError("x").reason == "NOT_FOUND"
    assert NotFoundError("x", reason="DEVICE_NOT_FOUND").reason == "DEVICE_NOT_FOUND"
    assert UnavailableError("x").retry_after_s is None


def test_blame_fills_only_what_the_raise_left_unset() -> None:
    with pytest.raises(NotFoundError) as err, blame(field="dst.eid", subject="7", reason="R"):
        raise NotFoundError("no device", subject="n00-npu3")
    assert (err.value.field, err.value.subject, err.value.reason) == ("dst.eid", "n00-npu3", "R")
    with (
        pytest.raises(InvalidArgumentError) as bad,
        blame(reason="DEVICE_NOT_FOUND", on=NotFoundError),
    ):
        raise InvalidArgumentError("not mine")
    assert bad.value.reason == "INVALID_ARGUMENT"


def test_a_relayed_status_keeps_its_details() -> None:
    status = to_status(UnavailableError("down", reason="DEVICE_FAULTED", retry_after_s=2.0))
    relayed = RemoteError.from_error(UnavailableError("down", reason="DEVICE_FAULTED"), "n00-npu1")
    assert relayed.reason == "DEVICE_FAULTED" and str(relayed) == "n00-npu1: down"
    assert relayed.prefixed("fabric").details == relayed.details
    assert status.code is grpc.StatusCode.UNAVAILABLE


# --- through real servers -----------------------------------------------------------------------


async def test_unknown_destination_names_the_field_and_id(clients: Clients) -> None:
    tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=99999), size=8)
    got = await _details(clients.bus("n00-npu0").Submit(tx))
    assert got.code is grpc.StatusCode.NOT_FOUND
    assert got.reason == "DEVICE_NOT_FOUND" and got.domain == DOMAIN
    assert got.metadata == {"field": "dst.eid", "id": "99999"}
    assert got.retry_after_s is None and not got.violations
    assert describe_line(got) == f"NOT_FOUND (DEVICE_NOT_FOUND): {got.message}"


def describe_line(got: ErrorDetails) -> str:
    return f"{got.code.name} ({got.reason}): {got.message}"


async def test_invalid_argument_carries_a_bad_request(clients: Clients) -> None:
    tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, size=8)  # no dst.eid
    got = await _details(clients.bus("n00-npu0").Submit(tx))
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT and got.reason == "INVALID_ARGUMENT"
    assert got.metadata == {"field": "dst.eid"}
    assert got.violations == (("dst.eid", got.message),)
    kernel = npu_pb2.Kernel(name="k", flops=1e9)  # no precision
    got = await _details(clients.npu("n00-npu0").SubmitKernel(kernel))
    assert [field for field, _ in got.violations] == ["precision"]


async def test_a_region_that_does_not_exist(clients: Clients) -> None:
    request = device_pb2.FreeRegionRequest(region_id=424242)
    got = await _details(clients.device("n00-cpu0").FreeRegion(request))
    assert got.code is grpc.StatusCode.NOT_FOUND and got.reason == "REGION_NOT_FOUND"
    assert got.metadata == {"field": "region_id", "id": "424242"}
    assert got.retry_after_s is None


async def test_unallocated_memory_and_full_memory(clients: Clients) -> None:
    target = clients.topology.device("n01-cpu2")
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE, dst=ub_pb2.UbAddress(eid=target.eid, offset=1 << 20), data=b"x"
    )
    got = await _details(clients.bus("n00-npu0").Submit(write))
    assert got.code is grpc.StatusCode.FAILED_PRECONDITION
    assert got.reason == "REGION_NOT_ALLOCATED"
    assert got.metadata == {"field": "dst.offset", "id": target.id}
    huge = device_pb2.AllocateRegionRequest(size=1 << 60)
    got = await _details(clients.device(target.id).AllocateRegion(huge))
    assert got.code is grpc.StatusCode.RESOURCE_EXHAUSTED and got.reason == "OUT_OF_CAPACITY"
    assert got.metadata["field"] == "size" and int(got.metadata["requested"]) >= 1 << 60


async def test_a_faulted_device_is_retryable_directly_and_through_the_fabric(
    clients: Clients,
) -> None:
    victim = clients.topology.device("n01-npu6")
    dev = clients.device(victim.id)
    await dev.SetFaultState(device_pb2.FaultState(faulted=True, reason="HBM ECC"))
    try:
        kernel = npu_pb2.Kernel(name="k", flops=1e9, precision=npu_pb2.PRECISION_BF16)
        got = await _details(clients.npu(victim.id).SubmitKernel(kernel))
        assert got.code is grpc.StatusCode.UNAVAILABLE and got.reason == "DEVICE_FAULTED"
        assert got.metadata == {"id": victim.id}
        assert got.retry_after_s == pytest.approx(RETRY_AFTER_S)
        # relayed: n00-npu0 -> fabric -> the faulted target, whose details come back unchanged
        read = ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=victim.eid), size=8
        )
        got = await _details(clients.bus("n00-npu0").Submit(read))
        assert got.code is grpc.StatusCode.UNAVAILABLE and got.reason == "DEVICE_FAULTED"
        assert got.metadata == {"id": victim.id} and got.retry_after_s is not None
        assert got.message.startswith(f"{victim.id}: ")
    finally:
        await dev.SetFaultState(device_pb2.FaultState(faulted=False))


async def test_a_route_cut_by_a_fault_is_retryable(clients: Clients) -> None:
    fabric = clients.fabric()
    cut = await fabric.InjectFault(
        fabric_pb2.FabricFault(
            kind="partition",
            partition=faultparams_pb2.PartitionParams(side_a="n00-npu6", side_b="n01-npu5"),
        )
    )
    try:
        route = fabric_pb2.RouteRequest(src="n00-npu6", dst="n01-npu5")
        got = await _details(fabric.Route(route))
        assert got.code is grpc.StatusCode.UNAVAILABLE and got.reason == "ROUTE_CUT"
        assert got.metadata == {"id": "n00-npu6>n01-npu5"}
        assert got.retry_after_s == pytest.approx(RETRY_AFTER_S)
    finally:
        await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=cut.id))


async def test_clearing_every_fault_takes_the_all_flag(clients: Clients) -> None:
    fabric = clients.fabric()
    fault = await fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target="n01-l1s3"))
    try:
        got = await _details(fabric.ClearFault(fabric_pb2.ClearFaultRequest()))
        assert got.code is grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in got.violations] == ["id"]
        both = fabric_pb2.ClearFaultRequest(id=fault.id, all=True)
        got = await _details(fabric.ClearFault(both))
        assert got.code is grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in got.violations] == ["all"]
        listed = await fabric.ListFaults(fabric_pb2.ListFaultsRequest())
        assert fault.id in [f.id for f in listed.faults]  # nothing was cleared by mistake
    finally:
        await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id))
    got = await _details(fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id)))
    assert got.code is grpc.StatusCode.NOT_FOUND and got.reason == "FAULT_NOT_FOUND"
    assert got.metadata == {"field": "id", "id": fault.id} and got.retry_after_s is None


async def test_fault_requests_name_their_field(clients: Clients) -> None:
    fabric = clients.fabric()
    got = await _details(fabric.InjectFault(fabric_pb2.FabricFault(kind="meteor")))
    assert got.reason == "UNKNOWN_FAULT_KIND"
    assert got.metadata == {"field": "kind", "id": "meteor"}
    got = await _details(
        fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target="n09-l1s0"))
    )
    assert got.code is grpc.StatusCode.NOT_FOUND and got.reason == "SWITCH_NOT_FOUND"
    assert got.metadata == {"field": "target", "id": "n09-l1s0"}
    stream = fabric.WatchLinkStats(fabric_pb2.WatchLinkStatsRequest(interval_ms=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stream:
            pass
    assert decode(err.value).violations[0][0] == "interval_ms"


async def test_describe_is_what_the_cli_prints(clients: Clients) -> None:
    tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=99999), size=8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.bus("n00-npu0").Submit(tx)
    assert describe(err.value).startswith("NOT_FOUND (DEVICE_NOT_FOUND): no device with EID")


# --- grpcurl ------------------------------------------------------------------------------------


async def test_grpcurl_shows_the_details(mini: Supernode) -> None:
    """grpcurl prints a status's details on stderr (as JSON with -format-error), resolving the
    google.rpc types through the server's reflection."""
    address = mini.topology.device("n00-cpu1").address
    proc = await asyncio.create_subprocess_exec(
        GRPCURL,
        "-plaintext",
        "-format-error",
        "-d",
        json.dumps({"region_id": 777}),
        address,
        "cmemu.v1.Device/FreeRegion",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode != 0 and not out
    status = json.loads(err)
    assert status["code"] == grpc.StatusCode.NOT_FOUND.value[0]
    info = next(d for d in status["details"] if d["@type"].endswith("google.rpc.ErrorInfo"))
    assert info == {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "REGION_NOT_FOUND",
        "domain": DOMAIN,
        "metadata": {"field": "region_id", "id": "777"},
    }
