"""Replies are paced to emulated time: at time_scale 0.01 a 1 ms transfer takes 0.1 s of wall time.

Only lower bounds on wall time are asserted (a slow machine can only make them later); the
emulated timestamps are asserted exactly.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2

SCALE = 0.01


@pytest.fixture(scope="module")
async def slow() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=SCALE) as supernode:
        yield supernode


async def test_transfer_reply_waits_for_emulated_completion(slow: Supernode) -> None:
    clients = Clients(slow.topology)
    try:
        dst = slow.topology.device("n00-npu1")
        region = await clients.device(dst.id).AllocateRegion(
            device_pb2.AllocateRegionRequest(size=167_000_000)
        )
        started = time.perf_counter()
        done = await clients.bus("n00-npu0").Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
                size=137_000_000,
                size_only=True,
            )
        )
        wall = time.perf_counter() - started
        emulated_s = (done.complete_ns - done.issue_ns) / 1e9
        assert emulated_s == pytest.approx(1e-3, rel=0.01)  # 137 MB written at 137 GB/s
        assert wall >= emulated_s / SCALE * 0.95  # 0.1 s: never answered before its time

        started = time.perf_counter()
        result = await clients.fabric().Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH,
                ranks=[f"n00-npu{i}" for i in range(4)],
                tokens_per_rank=128,
            )
        )
        assert time.perf_counter() - started >= result.duration_ns / 1e9 / SCALE * 0.95
    finally:
        await clients.close()


async def test_receive_waits_in_emulated_time(slow: Supernode) -> None:
    clients = Clients(slow.topology)
    try:
        started = time.perf_counter()
        empty = await clients.bus("n00-cpu0").Receive(ub_pb2.ReceiveRequest(wait_ms=2))
        assert not empty.messages
        assert time.perf_counter() - started >= 0.19  # 2 emulated ms at 0.01 are 0.2 s of wall
    finally:
        await clients.close()
