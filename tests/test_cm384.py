"""The full CloudMatrix384 in one process: every one of its 624 devices SERVING over gRPC."""

from __future__ import annotations

from collections import Counter

import pytest

from cmemu.emulator.client import health
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, ub_pb2

pytestmark = pytest.mark.slow


async def test_cm384_boots_in_process_and_every_device_serves() -> None:
    async with running_supernode("cm384") as supernode:
        topo = supernode.topology
        assert Counter(d.kind for d in topo.devices) == {
            DeviceKind.NPU: 384,
            DeviceKind.CPU: 192,
            DeviceKind.MEMPOOL: 48,
        }
        statuses = await health.check_many([d.address for d in topo.devices], timeout_s=60)
        assert Counter(statuses.values()) == {"SERVING": 624}
        clients = Clients(topo)
        try:
            # the two ends of the machine: first node's NPU writes, last node's pool holds it
            pool = topo.device("n47-mem")
            region = await clients.device(pool.id).AllocateRegion(
                device_pb2.AllocateRegionRequest(size=4096)
            )
            dst = ub_pb2.UbAddress(eid=pool.eid, offset=region.offset)
            await clients.bus("n00-npu0").Submit(
                ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=b"end to end")
            )
            back = await clients.bus("n23-cpu3").Submit(
                ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=10)
            )
            assert back.data == b"end to end"
        finally:
            await clients.close()
