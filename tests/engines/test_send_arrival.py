"""A SEND's message is stamped with the arrival the fabric timed for it: under contention too, the
receiver's `arrive_ns` is the sender's completion (the issuer and the receiver read one time),
not the uncontended cost model's figure it kept before. The twin of "under contention": the
same SEND alone arrives at the uncontended figure, so the contended one must differ from it."""

from __future__ import annotations

import asyncio

from cmemu.emulator.model.costmodel import ub_transfer_ns
from cmemu.emulator.model.ub import PRICED, Op, Transaction
from cmemu.emulator.testing import running_supernode

SIZE = 64 << 20  # size-only: milliseconds on a link, long beside its latency


async def test_a_send_arrives_when_the_fabric_completed_it_under_contention_or_alone() -> None:
    async with running_supernode("cm-mini") as supernode:
        local = supernode.local
        fabric = local.fabric
        assert fabric is not None
        src, dst = local.devices["n00-npu0"], local.devices["n01-cpu0"]
        send = Transaction(op=Op.SEND, dst_eid=dst.device.eid, size=SIZE, size_only=True)
        alone = await src.bus.submit(send, None)
        (first,) = await dst.bus.receive(1, 0)
        uncontended = ub_transfer_ns(
            SIZE,
            src=src.device.kind,
            dst=dst.device.kind,
            cross_node=True,
            profile=src.profile,
            op=PRICED[Op.SEND],
        )
        assert first.arrive_ns == alone.complete_ns
        route = fabric.route(src.device.id, dst.device.id)
        hog = asyncio.create_task(fabric.run_flow(route, 10**18, fabric.flows.now_s()))
        try:
            await asyncio.sleep(0)  # its flow is in flight, sharing every link of the SEND's
            shared = await src.bus.submit(send, None)
            (second,) = await dst.bus.receive(1, 0)
        finally:
            hog.cancel()
        assert second.arrive_ns == shared.complete_ns
        took = shared.complete_ns - shared.issue_ns
        assert took > 1.5 * uncontended  # it shared: the cost model's figure was not its arrival
        assert abs((alone.complete_ns - alone.issue_ns) - uncontended) < 0.05 * uncontended
