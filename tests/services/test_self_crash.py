"""A device told to crash itself answers before its server goes: the stop waits for the call's
end (services/kinds.py DeviceServer.answer_first), not only a fixed delay, which a busy host
outlasted (the answer was lost with the server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds.crash import CrashParams
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.services import kinds
from cmemu.services.device import DeviceServicer
from cmemu.services.rpc import Context
from cmemu.v1 import device_pb2

BUSY_S = 0.3  # how much later than the fault's effect its answer goes out: a busy host


@pytest.fixture(scope="module")
async def late() -> AsyncIterator[Supernode]:
    """cm-mini whose every InjectFault answers BUSY_S after the fault took effect."""
    inject = DeviceServicer.InjectFault

    async def answering_late(
        self: DeviceServicer, request: device_pb2.FaultState, context: Context
    ) -> device_pb2.FaultState:
        reply = await inject(self, request, context)
        await asyncio.sleep(BUSY_S)
        return reply

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeviceServicer, "InjectFault", answering_late)  # bound as servers build
        async with running_supernode("cm-mini", time_scale=10.0) as sn:
            yield sn


async def _crash_itself(sn: Supernode, device: str) -> device_pb2.FaultState:
    stub = sn.clients.device(device)
    request = fault_request("crash", CrashParams(), for_s=600.0, device=device)
    async with asyncio.timeout(60):  # a bound only
        reply = await stub.InjectFault(request)
    with pytest.raises(grpc.aio.AioRpcError) as gone:  # and then it is gone
        await stub.GetInfo(device_pb2.GetInfoRequest(), timeout=10)
    assert gone.value.code() is grpc.StatusCode.UNAVAILABLE
    return reply


async def test_a_device_crashing_itself_answers_first_however_late(late: Supernode) -> None:
    reply = await _crash_itself(late, "n00-npu1")
    assert (reply.faulted, reply.kind, reply.device) == (True, "crash", "n00-npu1")


async def test_its_twin_a_stop_that_does_not_wait_for_the_answer_loses_it(
    late: Supernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kinds, "SELF_STOP_WAIT_S", 0.0)  # only the fixed delay, as before
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await _crash_itself(late, "n00-npu2")
    assert lost.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
