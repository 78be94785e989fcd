"""The typed gateway client as `cmemu rdma` uses it (emulator/client/gateway.py `gateway_of`),
against a real cm-minix1 in this process (one supernode with its RDMA plane): queue pairs,
an operation, the counters, and refusals as the EmulatorError their status names, with the
server's message unprefixed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client.gateway import gateway_of
from cmemu.emulator.client.remote import RemoteDevice
from cmemu.emulator.engines.gateway.types import OpRequest, QpState, RdmaOp
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def plane() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-minix1") as supernode:
        yield supernode


async def test_queue_pairs_an_op_and_the_counters(plane: Supernode) -> None:
    gateway = gateway_of(plane.clients)
    assert gateway.id == gateway_of(plane.clients, 0).id == "sn0-gw"
    a = await gateway.create_qp("n00-npu0", 0, deadline_s=None)
    b = await gateway.create_qp("n01-npu1", 1, deadline_s=None)
    assert (a.state, b.local_die) == (QpState.INIT, "n01-npu1.d1")
    await gateway.connect_qp(a.qpn, "sn0-gw", b.qpn, deadline_s=None)
    target = RemoteDevice(plane.clients.channel("n01-npu1"), plane.clients.find("n01-npu1"))
    region = await target.allocate(64, "landing", deadline_s=None)
    request = OpRequest(qpn=a.qpn, remote_offset=region.offset, data=b"hello")
    done = await gateway.op(RdmaOp.WRITE, request, deadline_s=None)
    assert (done.op, done.size, done.src) == (RdmaOp.WRITE, 5, "n00-npu0.d0")
    assert done.complete_ns > done.issue_ns
    listed = {q.qpn: q for q in await gateway.list_qps()}
    assert listed[a.qpn].state is QpState.RTS and listed[a.qpn].ops == 1
    stats = await gateway.stats()
    assert stats.gateway == "sn0-gw" and stats.write_ops >= 1 and not stats.down
    assert await gateway.destroy_qp(b.qpn) == b.qpn
    assert b.qpn not in {q.qpn for q in await gateway.list_qps()}


async def test_refusals_are_emulator_errors_with_the_servers_message(plane: Supernode) -> None:
    gateway = gateway_of(plane.clients)
    with pytest.raises(NotFoundError) as unknown:
        await gateway.destroy_qp(9999)
    assert str(unknown.value).startswith("no queue pair 9999")  # as the server said it
    assert unknown.value.reason == "QP_NOT_FOUND"
    with pytest.raises(NotFoundError) as no_gateway:
        gateway_of(plane.clients, "sn7-gw")
    assert no_gateway.value.reason == "GATEWAY_NOT_FOUND"


async def test_a_launch_without_the_plane_has_no_gateway() -> None:
    async with running_supernode("cm-mini") as mini:
        with pytest.raises(NotFoundError) as refused:
            gateway_of(mini.clients)
    assert refused.value.reason == "NO_SCALEOUT_PLANE"
