"""A transfer's plan (engines/fabric/plans.py) is remembered per live state of the link graph:
a stream of transactions between two devices is planned once, and a fault (which moves the live
state) is met by the very next transaction, never by a stale plan. Through the fabric engine
of a running supernode, with real faults: a partition cuts the route, a one-way partition
loses only the acknowledgement, and cleared, the same transaction goes through again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.faults.fabric.partition import PartitionParams
from cmemu.emulator.model.linkfaults import FaultSpec
from cmemu.emulator.model.ub import Op, Transaction
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[InProcessSupernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode.local


def _write(target: DeviceEngine, offset: int) -> Transaction:
    return Transaction(op=Op.WRITE, dst_eid=target.device.eid, dst_offset=offset, data=b"p" * 64)


async def test_a_plan_is_made_once_per_live_state_and_a_fault_is_met_at_once(
    local: InProcessSupernode,
) -> None:
    fabric = local.fabric
    assert fabric is not None
    src, dst = local.devices["n00-npu0"], local.devices["n01-npu1"]
    offset = dst.allocate(4096, "plans").offset
    write = _write(dst, offset)
    await src.bus.submit(write, None)
    issued = Transaction(
        op=Op.WRITE, dst_eid=dst.device.eid, dst_offset=offset, src_eid=src.device.eid, size=64
    )
    plan = fabric.plans.plan(fabric.graph, issued)
    assert fabric.plans.plan(fabric.graph, issued) is plan  # remembered: one lookup
    for one_way, reason in ((False, "ROUTE_CUT"), (True, "ACK_LOST")):
        params = PartitionParams(side_a="n01-npu1", side_b="n00-npu0", one_way=one_way)
        fault = fabric.add_fault(FaultSpec(kind="partition", params=params))
        try:
            with pytest.raises(UnavailableError) as refused:
                await src.bus.submit(write, None)
            assert refused.value.reason == reason
        finally:
            fabric.clear_fault(fault.id)
        done = await src.bus.submit(write, None)  # cleared: through again, at once
        assert done.path[0] == "n00-npu0.d0" and done.path[-1] == "n01-npu1.d0"
    assert fabric.plans.plan(fabric.graph, issued) is not plan  # planned again since
