"""The typed EMS client (emulator/client/ems.py) against a real cm-mini in this process: real
bytes round-trip (one Put, and the streamed path past one chunk), a size-only object keeps its
size, listing, stat and delete answer plain values, and refusals are EmulatorErrors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.ems import CHUNK, EmsClient, ObjectKind
from cmemu.emulator.model.ems.index import Tier
from cmemu.emulator.model.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
)
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode


async def test_real_bytes_round_trip_by_put_and_by_stream(mini: Supernode) -> None:
    ems = EmsClient(mini.clients)
    small = b"hello ems"
    big = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # past one chunk: PutStream
    put = await ems.put("rt-small", small, kind=ObjectKind.WEIGHTS, pinned=True)
    assert (put.key, put.size) == ("rt-small", len(small)) and put.replicas
    assert put.complete_ns > put.issue_ns
    assert (await ems.put("rt-big", big)).size == len(big)
    assert (await ems.get("rt-small")).data == small
    got = await ems.get("rt-big", device="n00-npu0")
    assert got.data == big and got.size == len(big) and got.served_by
    assert (await ems.get("rt-big", keep_data=False)).data == b""
    listed = {o.key: o for o in await ems.list("rt-")}
    assert set(listed) == {"rt-small", "rt-big"}
    assert listed["rt-small"].kind is ObjectKind.WEIGHTS and listed["rt-small"].pinned
    assert listed["rt-big"].tier is Tier.DRAM


async def test_size_only_objects_stat_and_delete(mini: Supernode) -> None:
    ems = EmsClient(mini.clients)
    await ems.put("so-1", size=1 << 30)
    got = await ems.get("so-1")
    assert (got.size, got.data) == (1 << 30, b"")
    stat = await ems.stat()
    assert stat.objects >= 1 and stat.replication_factor >= 1 and stat.pools
    assert not stat.recovering and stat.pools_listed == stat.pools_total
    assert await ems.exists("so-1")
    assert await ems.delete("so-1")
    assert not await ems.exists("so-1") and not await ems.delete("so-1")


async def test_refusals_are_emulator_errors(mini: Supernode) -> None:
    ems = EmsClient(mini.clients)
    with pytest.raises(NotFoundError) as missing:
        await ems.get("no-such-key")
    assert "no-such-key" in str(missing.value)
    with pytest.raises(InvalidArgumentError):
        await ems.put("mismatch", b"abc", size=5)
    with pytest.raises(NotFoundError):
        await ems.stat("no-such-pool")


async def test_batch_calls_and_a_one_call_load(mini: Supernode) -> None:
    ems = EmsClient(mini.clients)
    puts = await ems.put_sizes(["b-1", "b-2"], size=4096, kind=ObjectKind.KV, device="n00-npu0")
    assert [(p.key, p.size) for p in puts] == [("b-1", 4096), ("b-2", 4096)]
    assert await ems.exist(["b-1", "b-none", "b-2"]) == [True, False, True]
    await ems.put("b-manifest", b"the shards", kind=ObjectKind.CHECKPOINT)
    got = await ems.load("b-manifest", device="n00-npu0")
    assert (got.data, got.size) == (b"the shards", 10) and got.complete_ns >= got.issue_ns
    assert (await ems.load("b-1")).data == b""  # size-only
    await ems.delete_many(["b-1", "b-2", "b-manifest"])
    assert await ems.exist(["b-1", "b-2", "b-manifest"]) == [False, False, False]
    with pytest.raises(NotFoundError):
        await ems.load("b-manifest")


async def test_a_prefix_nothing_holds_matches_nothing(mini: Supernode) -> None:
    ems = EmsClient(mini.clients)
    match = await ems.match_prefix(list(range(256)), block_tokens=128, namespace="nobody")
    assert (match.matched_blocks, match.matched_tokens, match.keys) == (0, 0, ())
    with pytest.raises(OutOfRangeError, match="block_tokens must be"):
        await ems.match_prefix(list(range(256)), block_tokens=7)


async def test_over_a_channel_and_a_wall_deadline(mini: Supernode) -> None:
    """A service's own channel serves as well as the launch's clients; `timeout_s` ends a call
    the EMS does not answer (service-hang) as DeadlineExceededError, and only such a call."""
    address = mini.clients.topology.service(ServiceKind.EMS).address
    ems = EmsClient(mini.clients.channel_to(address), timeout_s=2.0)
    assert (await ems.stat()).pools
    hang = await faults.inject(mini.clients, "service-hang", "ems")
    try:
        with pytest.raises(DeadlineExceededError):
            await ems.stat()
    finally:
        await faults.clear(mini.clients, hang.id)
    async with asyncio.timeout(60):  # a bound only: the EMS answers again once cleared
        while True:
            try:
                await ems.stat()
                break
            except DeadlineExceededError:
                await asyncio.sleep(0.1)
