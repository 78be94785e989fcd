"""A device fault reaches the collectives its NPU is a rank of (issue 20, the data path), over real
gRPC against an in-process cm-mini: a crashed NPU or a down die fails every collective it is part
of at once, a hung one holds it until cleared, a slowed one stretches its software phases and is
reported as the straggler; collectives without it are untouched, and clearing the device's fault
clears the fabric's. Each test clears what it injected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.errors import decode
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.faults.fabric import PARAMS as FABRIC_PARAMS
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import fabric_pb2

ALL_REDUCE = fabric_pb2.COLLECTIVE_OP_ALL_REDUCE


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=10.0) as supernode:
        yield supernode


@pytest.fixture
def clients(mini: Supernode) -> Clients:
    return mini.clients


async def _collective(
    clients: Clients, ranks: list[str], deadline_s: float | None = 30.0
) -> fabric_pb2.CollectiveResult:
    return await clients.fabric().Collective(
        fabric_pb2.CollectiveRequest(op=ALL_REDUCE, ranks=ranks, bytes=1 << 20),
        timeout=deadline_s,
    )


async def _rank_faults(clients: Clients) -> list[tuple[str, str]]:
    listed = await clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest())
    return [(f.kind, f.target) for f in listed.faults if f.kind.startswith("rank-")]


async def _refused(clients: Clients, ranks: list[str]) -> tuple[grpc.StatusCode, str | None, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collective(clients, ranks)
    d = decode(err.value)
    return d.code, d.reason, err.value.details() or ""


async def test_a_crashed_npu_fails_the_collectives_it_is_in_and_no_other(clients: Clients) -> None:
    ok = await _collective(clients, ["n00-npu0", "n00-npu2"])
    assert ok.compute_share == 1.0
    fault = await faults.inject(clients, "crash", "n00-npu1")
    try:
        assert await _rank_faults(clients) == [("rank-down", "n00-npu1")]
        code, reason, details = await _refused(clients, ["n00-npu0", "n00-npu1"])
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "PEER_UNREACHABLE")
        assert "n00-npu1.d0 is unreachable" in details
        other = await _collective(clients, ["n00-npu0", "n00-npu2"])  # the twin: not a rank
        assert other.duration_ns == ok.duration_ns
    finally:
        await faults.clear(clients, fault.id)
    assert await _rank_faults(clients) == []
    back = await _collective(clients, ["n00-npu0", "n00-npu1"], deadline_s=None)
    assert back.duration_ns > 0


async def test_a_down_die_fails_only_the_collectives_with_that_die(clients: Clients) -> None:
    fault = await faults.inject(clients, "die-down", "n00-npu3", {"die": "1"})
    try:
        assert await _rank_faults(clients) == [("rank-down", "n00-npu3.d1")]
        code, _, details = await _refused(clients, ["n00-npu2.d0", "n00-npu3.d1"])
        assert code is grpc.StatusCode.UNAVAILABLE and "n00-npu3.d1" in details
        await _collective(clients, ["n00-npu2.d0", "n00-npu3.d0"])  # its other die serves
    finally:
        await faults.clear(clients, fault.id)
    await _collective(clients, ["n00-npu2.d0", "n00-npu3.d1"])


async def test_a_hung_npu_holds_its_collectives_until_it_is_cleared(clients: Clients) -> None:
    fault = await faults.inject(clients, "hang", "n00-npu4")
    cleared = False
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collective(clients, ["n00-npu4", "n00-npu5"], deadline_s=1.0)
        assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        await _collective(clients, ["n00-npu5", "n00-npu6"])  # the twin: not a rank
        waiting = asyncio.create_task(
            _collective(clients, ["n00-npu4", "n00-npu5"], deadline_s=None)
        )
        await asyncio.sleep(0.5)
        assert not waiting.done()  # held, not failed
        await faults.clear(clients, fault.id)
        cleared = True
        async with asyncio.timeout(60):  # a bound on a hung test only
            done = await waiting
        assert done.duration_ns > 0
    finally:
        if not cleared:
            await faults.clear(clients, fault.id)


async def test_a_slow_npu_is_the_straggler_of_its_collectives(clients: Clients) -> None:
    ranks = ["n00-npu5", "n00-npu6"]
    before = await _collective(clients, ranks)
    fault = await faults.inject(clients, "slow", "n00-npu6", {"compute": "0.25"})
    try:
        assert await _rank_faults(clients) == [("rank-slow", "n00-npu6")]
        slow = await _collective(clients, ranks)
        assert slow.compute_share == 0.25
        assert slow.overhead_ns == pytest.approx(4 * before.overhead_ns, abs=1)
        assert slow.duration_ns - before.duration_ns == pytest.approx(3 * before.overhead_ns, abs=2)
        twin = await _collective(clients, ["n00-npu5", "n00-npu7"])
        assert twin.compute_share == 1.0 and twin.overhead_ns == before.overhead_ns
    finally:
        await faults.clear(clients, fault.id)
    again = await _collective(clients, ranks)
    assert again.compute_share == 1.0 and again.duration_ns == before.duration_ns


@pytest.mark.parametrize(
    ("kind", "target", "factor", "field"),
    [
        ("rank-slow", "n00-npu0", 1.5, "params.factor"),
        ("rank-slow", "n00-npu0", 0.0, "params.factor"),
        ("rank-down", "n00-cpu0", 0.0, "target"),
        ("rank-hung", "n00-npu0.d7", 0.0, "target"),
    ],
)
async def test_bad_rank_faults_are_refused(
    clients: Clients, kind: str, target: str, factor: float, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.fabric().InjectFault(
            faultparams.pack(
                fabric_pb2.FabricFault(kind=kind, target=target),
                kind,
                FABRIC_PARAMS[kind](**({"factor": factor} if kind == "rank-slow" else {})),
            )
        )
    d = decode(err.value)
    assert d.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)
    assert field in {f for f, _ in d.violations} | {d.metadata.get("field")}, d
    assert await _rank_faults(clients) == []
