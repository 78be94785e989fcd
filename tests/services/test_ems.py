"""EMS over real gRPC against in-process supernodes: integrity, prefixes, LRU and SSD, faults."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from cmemu.emulator.client.clock import held_time
from cmemu.emulator.client.errors import decode
from cmemu.emulator.engines.ems import EmsState
from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.costmodel import UbOp, ub_point
from cmemu.emulator.model.ems import prefix_keys
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import DeviceKind, ServiceKind
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, ub_pb2

# A bound on a hang, not a timing: the checks run on emulated time, which a busy host slows
HANG_S = 180

KIB = 1024


def _ems(clients: Clients) -> ems_pb2_grpc.EmsAsyncStub:
    address = clients.topology.service(ServiceKind.EMS).address
    return ems_pb2_grpc.EmsStub(clients.channel_to(address))


async def _status(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code().name


def _profile(**ems: object) -> HardwareProfile:
    return replace(DEFAULT_PROFILE, ems=replace(DEFAULT_PROFILE.ems, **ems))  # type: ignore[arg-type]


async def test_put_get_integrity_from_any_device(clients: Clients) -> None:
    ems = _ems(clients)
    for i, size in enumerate((1, 4096, 64 * KIB)):
        data = bytes((i * 7 + j) % 251 for j in range(size))
        put = await ems.Put(ems_pb2.PutRequest(key=f"obj-{i}", data=data, device="n00-npu1"))
        assert put.size == size and len(put.replicas) == 2
        assert put.complete_ns > put.issue_ns
        got = await ems.Get(ems_pb2.GetRequest(key=f"obj-{i}", device="n01-npu5"))
        assert got.data == data and got.tier == ems_pb2.TIER_DRAM
        assert got.served_by == "n01-mem"  # the copy on the reader's node
    exists = await ems.Exists(ems_pb2.ExistsRequest(key="obj-1"))
    assert exists.exists and exists.size == 4096
    await ems.Put(ems_pb2.PutRequest(key="obj-1", data=b"replaced"))
    assert (await ems.Get(ems_pb2.GetRequest(key="obj-1"))).data == b"replaced"
    assert (await ems.Delete(ems_pb2.DeleteRequest(key="obj-1"))).deleted
    assert not (await ems.Delete(ems_pb2.DeleteRequest(key="obj-1"))).deleted
    assert await _status(ems.Get(ems_pb2.GetRequest(key="obj-1"))) == "NOT_FOUND"


async def test_batches(clients: Clients) -> None:
    ems = _ems(clients)
    items = [ems_pb2.PutRequest(key=f"b{i}", data=bytes([i]) * 10) for i in range(5)]
    assert len((await ems.BatchPut(ems_pb2.BatchPutRequest(items=items))).items) == 5
    got = await ems.BatchGet(
        ems_pb2.BatchGetRequest(items=[ems_pb2.GetRequest(key=k) for k in ("b1", "nope", "b4")])
    )
    assert [g.data for g in got.items] == [b"\x01" * 10, b"\x04" * 10]
    assert list(got.missing) == ["nope"]
    exists = await ems.BatchExists(ems_pb2.BatchExistsRequest(keys=["b0", "zz", "b3"]))
    assert list(exists.exists) == [True, False, True]
    assert (await ems.BatchDelete(ems_pb2.BatchDeleteRequest(keys=["b0", "b1", "zz"]))).deleted == 2


async def test_size_only_objects_are_timed_over_the_fabric(clients: Clients) -> None:
    ems = _ems(clients)
    size = 61 * 576 * 4096  # the INT8 KV cache of a 4,096-token prefix: 144 MB
    await ems.Put(ems_pb2.PutRequest(key="kv-prefix", size=size, device="n00-npu0"))
    got = await ems.Get(ems_pb2.GetRequest(key="kv-prefix", device="n00-npu4"))
    assert got.size == size and got.data == b""
    seconds = (got.complete_ns - got.issue_ns) / 1e9
    # a read of CPU memory (the pool's) at one die's UB bandwidth
    read = ub_point(UbOp.READ, DeviceKind.MEMPOOL).bytes_per_s
    assert size / seconds == pytest.approx(read, rel=0.01)


async def test_prefix_matching(clients: Clients) -> None:
    ems = _ems(clients)
    tokens = list(range(1000, 1000 + 128 * 5))
    keys = (await ems.PrefixKeys(ems_pb2.PrefixRequest(tokens=tokens, block_tokens=128))).keys
    assert list(keys) == prefix_keys(tokens, 128) and len(keys) == 5
    for key in keys[:3]:
        await ems.Put(ems_pb2.PutRequest(key=key, size=128 * 35_136))
    turn2 = tokens[: 128 * 3] + [7] * 300  # shares three blocks, then diverges
    match = await ems.MatchPrefix(ems_pb2.PrefixRequest(tokens=turn2, block_tokens=128))
    assert (match.matched_blocks, match.matched_tokens) == (3, 384)
    other = await ems.MatchPrefix(
        ems_pb2.PrefixRequest(tokens=turn2, block_tokens=128, namespace="another-model")
    )
    assert other.matched_blocks == 0
    shifted = [0, *tokens]  # the same tokens one place later share no prefix
    assert (
        await ems.MatchPrefix(ems_pb2.PrefixRequest(tokens=shifted, block_tokens=128))
    ).matched_blocks == 0
    for bad in (64, 1024):
        assert (
            await _status(ems.MatchPrefix(ems_pb2.PrefixRequest(tokens=tokens, block_tokens=bad)))
            == "OUT_OF_RANGE"
        )


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (ems_pb2.PutRequest(key="", data=b"x"), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="a|b", data=b"x"), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="k" * 201, data=b"x"), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="big", data=bytes(2**20 + 1)), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="huge", size=65 * 2**30), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="nothing"), "INVALID_ARGUMENT"),
        (ems_pb2.PutRequest(key="x", data=b"x", device="n09-npu0"), "NOT_FOUND"),
    ],
)
async def test_bad_puts(clients: Clients, request_: ems_pb2.PutRequest, code: str) -> None:
    ems = _ems(clients)
    assert await _status(ems.Put(request_)) == code
    assert (await ems.Stat(ems_pb2.StatRequest())).replication_factor == 2  # still serving


async def test_bad_reads_and_stats(clients: Clients) -> None:
    ems = _ems(clients)
    assert await _status(ems.Get(ems_pb2.GetRequest(key=""))) == "INVALID_ARGUMENT"
    assert await _status(ems.Get(ems_pb2.GetRequest(key="never-put"))) == "NOT_FOUND"
    assert await _status(ems.Stat(ems_pb2.StatRequest(pool="n07-mem"))) == "NOT_FOUND"
    one = await ems.Stat(ems_pb2.StatRequest(pool="n00-mem"))
    assert [p.pool for p in one.pools] == ["n00-mem"] and one.misses >= 1


async def test_corrupt_copy_is_data_loss_on_that_copy_and_served_from_the_other(
    clients: Clients,
) -> None:
    ems = _ems(clients)
    await ems.Put(ems_pb2.PutRequest(key="fragile", data=b"precious bytes"))
    for pool in ("n00-mem", "n01-mem"):
        regions = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
        region = next(r for r in regions.regions if r.label.endswith("|fragile"))
        await clients.bus(pool).Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=region.eid, offset=region.offset),
                data=b"XX",
            )
        )
        if pool == "n00-mem":
            got = await ems.Get(ems_pb2.GetRequest(key="fragile", device="n00-npu0"))
            assert got.data == b"precious bytes" and got.corrupt_copies == 1
            assert got.served_by == "n01-mem"
    assert await _status(ems.Get(ems_pb2.GetRequest(key="fragile"))) == "DATA_LOSS"
    assert (await ems.Stat(ems_pb2.StatRequest())).corrupt_copies >= 2


@pytest.fixture
async def small() -> AsyncIterator[Supernode]:
    """cm-mini whose EMS may use 12 KiB of each pool and 4 KiB of SSD in all (2 KiB a node)."""
    pool_bytes = DEFAULT_PROFILE.node.cpus * DEFAULT_PROFILE.cpu.pooled_bytes
    profile = _profile(dram_share=12 * KIB / pool_bytes, ssd_bytes_per_node=2 * KIB)
    async with running_supernode("cm-mini", profile=profile) as supernode:
        yield supernode


async def test_lru_eviction_demotes_to_ssd_then_drops(small: Supernode) -> None:
    clients = Clients(small.topology)
    ems = _ems(clients)
    page = 4 * KIB
    for key in ("a", "b", "c"):
        await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * page))
    await ems.Get(ems_pb2.GetRequest(key="a"))  # a is now the most recently used
    put = await ems.Put(ems_pb2.PutRequest(key="d", data=b"d" * page))
    assert put.evicted == 1
    assert (await ems.Exists(ems_pb2.ExistsRequest(key="b"))).tier == ems_pb2.TIER_SSD
    got = await ems.Get(ems_pb2.GetRequest(key="b"))
    assert got.served_by == "ssd" and got.data == b"b" * page
    assert got.complete_ns - got.issue_ns >= 100_000  # the SSD's latency
    await ems.Put(ems_pb2.PutRequest(key="e", data=b"e" * page))  # evicts c: the SSD is full
    assert not (await ems.Exists(ems_pb2.ExistsRequest(key="c"))).exists
    for key in ("a", "d", "e"):
        assert (await ems.Get(ems_pb2.GetRequest(key=key))).data == key.encode() * page
    stat = await ems.Stat(ems_pb2.StatRequest())
    assert (stat.evictions, stat.ssd_objects) == (2, 1)
    await clients.close()


async def test_pinned_objects_are_never_evicted(small: Supernode) -> None:
    clients = Clients(small.topology)
    ems = _ems(clients)
    for key in ("p1", "p2", "p3"):
        await ems.Put(ems_pb2.PutRequest(key=key, data=bytes(4 * KIB), pinned=True))
    assert await _status(ems.Put(ems_pb2.PutRequest(key="p4", data=b"x"))) == "RESOURCE_EXHAUSTED"
    assert (
        await _status(ems.Put(ems_pb2.PutRequest(key="p5", size=1 << 20))) == "RESOURCE_EXHAUSTED"
    )
    for key in ("p1", "p2", "p3"):
        assert (await ems.Exists(ems_pb2.ExistsRequest(key=key))).tier == ems_pb2.TIER_DRAM
    await clients.close()


async def test_a_dead_pool_loses_nothing_and_the_factor_is_restored() -> None:
    profile = _profile(check_interval_s=0.1, dead_after_s=0.3)
    async with running_supernode("cm192", profile=profile) as supernode:
        clients = Clients(supernode.topology)
        ems = _ems(clients)
        keys = [f"kv-{i}" for i in range(40)]
        for key in keys:
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * 50))
        victim = (await ems.Put(ems_pb2.PutRequest(key="probe", data=b"p"))).replicas[0]
        await clients.device(victim).SetFaultState(
            device_pb2.FaultState(faulted=True, reason="dead")
        )
        for key in [*keys, "probe"]:
            assert (await ems.Get(ems_pb2.GetRequest(key=key))).served_by != victim
        async with asyncio.timeout(HANG_S):
            # polling a server in another task: no event to wait on
            while (stat := await ems.Stat(ems_pb2.StatRequest())).under_replicated:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        dead = next(p for p in stat.pools if p.pool == victim)
        assert not dead.healthy and dead.objects == 0
        assert stat.objects == 41 and stat.dram_used_bytes == 2 * stat.dram_bytes
        await clients.close()


async def test_a_restarted_ems_rebuilds_its_index_from_the_pools(
    mini: Supernode, clients: Clients
) -> None:
    ems = _ems(clients)
    data = {f"r{i}": bytes([i]) * (i + 1) for i in range(10)}
    for key, value in data.items():
        await ems.Put(ems_pb2.PutRequest(key=key, data=value, kind=ems_pb2.OBJECT_KIND_WEIGHTS))
    assert mini.local.ems is not None
    # objects with a copy left (a copy that failed its checksum was freed: see "fragile")
    before = sum(1 for m in mini.local.ems.index.objects.values() if m.replicas)
    mini.local.ems.index = type(
        mini.local.ems.index
    )()  # the metadata is gone, as with a new process
    assert await _status(ems.Get(ems_pb2.GetRequest(key="r3"))) == "NOT_FOUND"
    await mini.local.ems.rebuild()
    assert len(mini.local.ems.index) == before
    for key, value in data.items():
        got = await ems.Get(ems_pb2.GetRequest(key=key))
        assert got.data == value and got.kind == ems_pb2.OBJECT_KIND_WEIGHTS


async def test_a_rebuild_reads_every_page_of_a_pools_regions() -> None:
    """More regions than one ListRegions page: the rebuild follows next_page_token."""
    profile = replace(
        DEFAULT_PROFILE, limits=replace(DEFAULT_PROFILE.limits, list_regions_page_max=3)
    )
    async with running_supernode("cm-mini", profile=profile) as sn:
        clients = Clients(sn.topology)
        ems = _ems(clients)
        for i in range(10):
            await ems.Put(ems_pb2.PutRequest(key=f"p{i}", data=bytes([i]) * 8))
        state = sn.local.ems
        assert state is not None
        state.index = type(state.index)()
        await state.rebuild()
        assert sorted(state.index.objects) == [f"p{i}" for i in range(10)]
        assert all(len(m.replicas) == 2 for m in state.index.objects.values())
        await clients.close()


async def test_concurrent_puts_of_one_key_leave_one_object_and_no_stray_copies(
    small: Supernode,
) -> None:
    clients = Clients(small.topology)
    ems = _ems(clients)
    values = [bytes([i]) * 1000 for i in range(10)]
    await asyncio.gather(*(ems.Put(ems_pb2.PutRequest(key="race", data=v)) for v in values))
    assert (await ems.Get(ems_pb2.GetRequest(key="race"))).data in values
    stat = await ems.Stat(ems_pb2.StatRequest())
    assert (stat.objects, stat.dram_used_bytes) == (1, 2000)
    for pool in ("n00-mem", "n01-mem"):
        regions = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
        assert sum(r.label.endswith("|race") for r in regions.regions) == 1
    await clients.close()


async def test_list_filters_by_prefix_and_pages(clients: Clients) -> None:
    ems = _ems(clients)
    for i in range(7):
        await ems.Put(ems_pb2.PutRequest(key=f"ls/a{i}", data=b"x" * (i + 1)))
    await ems.Put(ems_pb2.PutRequest(key="ls/b", size=4096, kind=ems_pb2.OBJECT_KIND_WEIGHTS))
    await ems.Put(ems_pb2.PutRequest(key="other", data=b"y", pinned=True))
    seen: list[ems_pb2.ObjectInfo] = []
    token = ""
    pages = 0
    while True:
        page = await ems.List(ems_pb2.ListRequest(prefix="ls/a", page_size=3, page_token=token))
        seen += page.objects
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert [o.key for o in seen] == [f"ls/a{i}" for i in range(7)] and pages == 3
    assert [o.size for o in seen] == list(range(1, 8))
    assert all(o.tier == ems_pb2.TIER_DRAM and len(o.replicas) == 2 for o in seen)
    listed = await ems.List(ems_pb2.ListRequest(prefix="ls/b"))
    (b,) = listed.objects
    assert (b.size, b.kind, b.pinned, listed.next_page_token) == (
        4096,
        ems_pb2.OBJECT_KIND_WEIGHTS,
        False,
        "",
    )
    (other,) = (await ems.List(ems_pb2.ListRequest(prefix="oth"))).objects
    assert other.pinned and other.kind == ems_pb2.OBJECT_KIND_KV_BLOCK
    assert not (await ems.List(ems_pb2.ListRequest(prefix="nothing-here"))).objects
    bad = ems.List(ems_pb2.ListRequest(page_token="not-a-token"))
    assert await _status(bad) == "INVALID_ARGUMENT"


# --- issue 9: EMS never forgets ----------------------------------------------------------------

MIB = 2**20


async def _regions(clients: Clients, pool: str, key: str) -> list[device_pb2.Region]:
    listed = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
    return [r for r in listed.regions if r.label.endswith(f"|{key}")]


async def _fault(clients: Clients, pool: str, faulted: bool) -> None:
    await clients.device(pool).SetFaultState(device_pb2.FaultState(faulted=faulted, reason="test"))


async def test_batch_put_and_delete_are_all_or_nothing(small: Supernode) -> None:
    clients = Clients(small.topology)
    ems = _ems(clients)
    bad_batches = [
        [ems_pb2.PutRequest(key="a", data=b"1"), ems_pb2.PutRequest(key="", data=b"2")],
        [
            ems_pb2.PutRequest(key="a", data=b"1"),
            ems_pb2.PutRequest(key="b", data=b"2", kind=cast(Any, 99)),
        ],
        [ems_pb2.PutRequest(key="a", data=b"1"), ems_pb2.PutRequest(key="a", data=b"2")],
    ]
    for items in bad_batches:
        put = ems.BatchPut(ems_pb2.BatchPutRequest(items=items))
        assert await _status(put) == "INVALID_ARGUMENT"
        assert not (await ems.Exists(ems_pb2.ExistsRequest(key="a"))).exists
    single = ems.Put(ems_pb2.PutRequest(key="k", data=b"1", kind=cast(Any, 99)))
    assert await _status(single) == "INVALID_ARGUMENT"
    # a later item that cannot fit (12 KiB of each pool, all pinned): the earlier ones go too
    await ems.Put(ems_pb2.PutRequest(key="old", data=b"o" * 4 * KIB))
    items = [ems_pb2.PutRequest(key=f"p{i}", data=bytes(4 * KIB), pinned=True) for i in range(4)]
    assert await _status(ems.BatchPut(ems_pb2.BatchPutRequest(items=items))) == (
        "RESOURCE_EXHAUSTED"
    )
    for i in range(4):
        assert not (await ems.Exists(ems_pb2.ExistsRequest(key=f"p{i}"))).exists
    assert (await ems.Get(ems_pb2.GetRequest(key="old"))).data == b"o" * 4 * KIB
    stat = await ems.Stat(ems_pb2.StatRequest())
    assert (stat.objects, stat.dram_used_bytes) == (1, 8 * KIB)
    for pool in ("n00-mem", "n01-mem"):
        listed = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
        assert len(listed.regions) == 1
    bad_delete = ems.BatchDelete(ems_pb2.BatchDeleteRequest(keys=["old", ""]))
    assert await _status(bad_delete) == "INVALID_ARGUMENT"
    assert (await ems.Exists(ems_pb2.ExistsRequest(key="old"))).exists
    await clients.close()


def _restarted(old: EmsState) -> EmsState:
    """A new EMS over the same pools, as a restarted process is (nothing kept in memory)."""
    return EmsState(
        topology=old.topology,
        profile=old.profile,
        clock=old.clock,
        peers=old.peers,
        ssd_dir=old.ssd.directory,
    )


async def test_deleted_keys_stay_deleted_when_a_faulted_pool_returns() -> None:
    """Deletes and overwrites while a pool is faulted: its stale copies are freed when it returns
    (by the sweep) or by a restarted EMS, and the deleted keys never come back."""
    profile = _profile(check_interval_s=0.05)
    async with running_supernode("cm-mini", profile=profile) as sn:
        assert sn.local.ems is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        for key in ("gone", "kept", "over"):
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * 100))
        await _fault(clients, "n01-mem", True)
        assert (await ems.Delete(ems_pb2.DeleteRequest(key="gone"))).deleted
        await ems.Put(ems_pb2.PutRequest(key="over", data=b"new"))
        assert await _status(ems.Get(ems_pb2.GetRequest(key="gone"))) == "NOT_FOUND"
        await _fault(clients, "n01-mem", False)
        async with asyncio.timeout(HANG_S):
            while await _regions(clients, "n01-mem", "gone"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert len(await _regions(clients, "n01-mem", "over")) == 1
        assert (await ems.Get(ems_pb2.GetRequest(key="over", device="n01-npu0"))).data == b"new"
        restarted = _restarted(sn.local.ems)
        await restarted.rebuild(5)
        assert restarted.lookup("gone") is None
        assert restarted.lookup("kept") is not None
        assert (await restarted.get("over")).data == b"new"
        await clients.close()


async def test_a_restarted_ems_does_not_resurrect_keys_deleted_while_a_pool_was_away() -> None:
    profile = _profile(check_interval_s=3600.0)  # no sweep: only the restarted EMS reconciles
    async with running_supernode("cm-mini", profile=profile) as sn:
        assert sn.local.ems is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        for key in ("gone", "over"):
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * 100))
        await _fault(clients, "n01-mem", True)
        await ems.BatchDelete(ems_pb2.BatchDeleteRequest(keys=["gone"]))
        await ems.Put(ems_pb2.PutRequest(key="over", data=b"new"))
        await _fault(clients, "n01-mem", False)
        restarted = _restarted(sn.local.ems)
        await restarted.rebuild(5)
        assert restarted.lookup("gone") is None
        assert (await restarted.get("over", "n01-npu0")).data == b"new"
        for pool in ("n00-mem", "n01-mem"):
            assert not await _regions(clients, pool, "gone")
            assert len(await _regions(clients, pool, "over")) == (pool == "n00-mem")
        await restarted.sweep()  # everything reconciled: the tombstones go too
        for pool in ("n00-mem", "n01-mem"):
            listed = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
            assert all("|gone" not in r.label for r in listed.regions)
        await clients.close()


async def test_a_stalled_pool_is_suspect_and_its_copies_come_back() -> None:
    """A pool that misses sweeps is suspect (reads avoid it) but keeps its copies; when it
    answers again every copy is readable, with no restart."""
    profile = _profile(check_interval_s=0.05, suspect_after_sweeps=2, dead_after_s=3600.0)
    async with running_supernode("cm192", profile=profile) as sn:
        clients = Clients(sn.topology)
        ems = _ems(clients)
        keys = [f"s{i}" for i in range(20)]
        for key in keys:
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * 10))
        victim = (await ems.Put(ems_pb2.PutRequest(key="probe", data=b"p"))).replicas[0]
        held = [
            o.key for o in (await ems.List(ems_pb2.ListRequest())).objects if victim in o.replicas
        ]
        await _fault(clients, victim, True)
        async with asyncio.timeout(HANG_S):
            while next(  # noqa: ASYNC110
                p for p in (await ems.Stat(ems_pb2.StatRequest())).pools if p.pool == victim
            ).healthy:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # several sweeps: suspect, not dead
        for key in held:
            got = await ems.Get(ems_pb2.GetRequest(key=key))
            assert got.served_by != victim
            (info,) = (await ems.List(ems_pb2.ListRequest(prefix=key, page_size=1))).objects
            assert victim in info.replicas  # kept while suspect
        await _fault(clients, victim, False)
        async with asyncio.timeout(HANG_S):
            while not next(  # noqa: ASYNC110
                p for p in (await ems.Stat(ems_pb2.StatRequest())).pools if p.pool == victim
            ).healthy:
                await asyncio.sleep(0.05)
        for key in held:  # the other copies fault: the victim's serve
            (info,) = (await ems.List(ems_pb2.ListRequest(prefix=key, page_size=1))).objects
            others = [p for p in info.replicas if p != victim]
            for p in others:
                await _fault(clients, p, True)
            got = await ems.Get(ems_pb2.GetRequest(key=key))
            assert got.served_by == victim
            for p in others:
                await _fault(clients, p, False)
        await clients.close()


async def test_a_dead_pool_that_returns_is_reconciled() -> None:
    profile = _profile(check_interval_s=0.05, suspect_after_sweeps=1, dead_after_s=0.3)
    async with running_supernode("cm192", profile=profile) as sn:
        clients = Clients(sn.topology)
        ems = _ems(clients)
        for i in range(20):
            await ems.Put(ems_pb2.PutRequest(key=f"d{i}", data=b"x" * 100))
        victim = (await ems.Put(ems_pb2.PutRequest(key="probe", data=b"p"))).replicas[0]
        await _fault(clients, victim, True)
        async with asyncio.timeout(HANG_S):
            while (await ems.Stat(ems_pb2.StatRequest())).under_replicated:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await ems.Delete(ems_pb2.DeleteRequest(key="probe"))
        await _fault(clients, victim, False)
        async with asyncio.timeout(HANG_S):
            while not next(  # noqa: ASYNC110
                p for p in (await ems.Stat(ems_pb2.StatRequest())).pools if p.pool == victim
            ).healthy:
                await asyncio.sleep(0.05)
        async with asyncio.timeout(HANG_S):  # reconciled: the deleted key's copy freed
            while True:
                stat = await ems.Stat(ems_pb2.StatRequest())
                if stat.objects == 20 and stat.dram_used_bytes == 2 * stat.dram_bytes:
                    break
                await asyncio.sleep(0.05)
        pool = next(p for p in stat.pools if p.pool == victim)
        listed = await clients.device(victim).ListRegions(device_pb2.ListRegionsRequest())
        assert len([r for r in listed.regions if r.label.startswith("ems")]) == pool.objects
        assert not await _regions(clients, victim, "probe")
        await clients.close()


def _pattern(size: int) -> bytes:
    block = bytes(range(251)) * (MIB // 251 + 1)
    return b"".join(block[i % 251 : i % 251 + MIB] for i in range(size // MIB + 1))[:size]


async def _put_stream(ems: ems_pb2_grpc.EmsAsyncStub, key: str, data: bytes, **head: Any) -> Any:
    async def chunks() -> AsyncIterator[ems_pb2.PutChunk]:
        yield ems_pb2.PutChunk(head=ems_pb2.PutRequest(key=key, size=len(data), **head))
        for start in range(0, len(data), 3 * MIB // 2):  # pieces need not be the store's chunks
            yield ems_pb2.PutChunk(data=data[start : start + 3 * MIB // 2])

    return await ems.PutStream(chunks())


async def _get_stream(ems: ems_pb2_grpc.EmsAsyncStub, key: str, device: str = "") -> Any:
    parts = []
    done = None
    async for chunk in ems.GetStream(ems_pb2.GetRequest(key=key, device=device)):
        parts.append(chunk.data)
        if chunk.HasField("done"):
            done = chunk.done
    assert done is not None
    return b"".join(parts), done


async def test_a_64_mib_object_streams_with_a_crc_per_chunk(clients: Clients) -> None:
    ems = _ems(clients)
    data = _pattern(64 * MIB)
    put = await _put_stream(ems, "big", data, device="n00-npu0")
    assert put.size == 64 * MIB and len(put.replicas) == 2
    got, done = await _get_stream(ems, "big", "n00-npu1")
    assert got == data and done.served_by == "n00-mem" and done.size == 64 * MIB
    assert done.complete_ns - done.issue_ns > 64 * MIB / 200e9 * 1e9
    assert await _status(ems.Get(ems_pb2.GetRequest(key="big"))) == "FAILED_PRECONDITION"
    # one chunk of the local copy goes bad: DATA_LOSS there, the read moves to the other copy
    (region,) = await _regions(clients, "n00-mem", "big")
    await clients.bus("n00-mem").Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=region.eid, offset=region.offset + 5 * MIB + 7),
            data=b"XX",
        )
    )
    got, done = await _get_stream(ems, "big", "n00-npu1")
    assert got == data and done.corrupt_copies == 1 and done.served_by == "n01-mem"
    small_stream = await _put_stream(ems, "small-streamed", b"tiny")
    assert small_stream.size == 4
    assert (await ems.Get(ems_pb2.GetRequest(key="small-streamed"))).data == b"tiny"
    assert (await _get_stream(ems, "small-streamed"))[0] == b"tiny"
    too_big = _put_stream(ems, "too-big", b"", device="")
    assert await _status(too_big) == "INVALID_ARGUMENT"  # no data
    assert await _status(ems.Put(ems_pb2.PutRequest(key="u", data=bytes(MIB + 1)))) == (
        "INVALID_ARGUMENT"
    )
    await ems.Delete(ems_pb2.DeleteRequest(key="big"))
    await ems.Delete(ems_pb2.DeleteRequest(key="small-streamed"))


async def test_real_bytes_over_the_cap_are_resource_exhausted() -> None:
    limits = replace(DEFAULT_PROFILE.limits, stored_bytes_cap_per_device=4 * MIB)
    profile = replace(DEFAULT_PROFILE, limits=limits)
    async with running_supernode("cm-mini", profile=profile) as sn:
        clients = Clients(sn.topology)
        ems = _ems(clients)
        assert await _status(_put_stream(ems, "big", _pattern(8 * MIB))) == "RESOURCE_EXHAUSTED"
        stat = await ems.Stat(ems_pb2.StatRequest())
        assert (stat.objects, stat.dram_used_bytes) == (0, 0)
        for pool in ("n00-mem", "n01-mem"):
            assert not await _regions(clients, pool, "big")
        await clients.close()


@pytest.mark.slow
async def test_procs_a_stalled_node_and_a_restarted_ems_forget_nothing_and_resurrect_nothing(
    tmp_path: Path,
) -> None:
    """Processes, as `cmemu up --mode procs` runs them: a node process stopped past the suspect
    threshold serves its copies again once continued, with no EMS restart; keys deleted while a
    pool is faulted stay deleted after the pool returns and the EMS process is restarted."""
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=41), run_dir=tmp_path / "run"),
        broker="none",
    )
    async with Supernode.start(options) as sn:
        assert sn.supervisor is not None
        clients = sn.clients
        ems = _ems(clients)
        keys = [f"p{i}" for i in range(10)]
        for key in keys:
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * 64))
        node = sn.supervisor.running["n01"].proc
        node.send_signal(signal.SIGSTOP)
        try:
            # past the suspect threshold (2 sweeps of 0.5 emulated s): the sweeps say when,
            # not a wall wait, which a busy host's slowed clock outlasts
            await _wait_pool(ems, "n01-mem", healthy=False)
            for key in keys:  # served by n00-mem meanwhile
                assert (await ems.Get(ems_pb2.GetRequest(key=key), timeout=HANG_S)).served_by == (
                    "n00-mem"
                )
        finally:
            node.send_signal(signal.SIGCONT)
        await _wait_healthy(ems, "n01-mem")
        await _fault(clients, "n00-mem", True)
        for key in keys:  # every object readable from the pool that stalled: no restart
            assert (await ems.Get(ems_pb2.GetRequest(key=key))).served_by == "n01-mem"
        await _fault(clients, "n00-mem", False)
        await _wait_healthy(ems, "n00-mem")

        await _fault(clients, "n01-mem", True)
        deleted = keys[:5]
        assert (await ems.BatchDelete(ems_pb2.BatchDeleteRequest(keys=deleted))).deleted == 5
        await _fault(clients, "n01-mem", False)
        process = sn.supervisor.running["ems"]
        process.proc.kill()
        await process.proc.wait()
        await sn.supervisor.start([process.spec])
        async with asyncio.timeout(HANG_S):
            while True:
                try:
                    await ems.Stat(ems_pb2.StatRequest(), timeout=2)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.2)
        for key in deleted:
            assert not (await ems.Exists(ems_pb2.ExistsRequest(key=key))).exists
            assert await _status(ems.Get(ems_pb2.GetRequest(key=key))) == "NOT_FOUND"
        for key in keys[5:]:
            assert (await ems.Get(ems_pb2.GetRequest(key=key))).data == key.encode() * 64
        for pool in ("n00-mem", "n01-mem"):
            for key in deleted:
                assert not await _regions(clients, pool, key)


async def _wait_healthy(ems: ems_pb2_grpc.EmsAsyncStub, pool: str) -> None:
    async with asyncio.timeout(HANG_S):
        while not next(  # noqa: ASYNC110
            p for p in (await ems.Stat(ems_pb2.StatRequest())).pools if p.pool == pool
        ).healthy:
            await asyncio.sleep(0.1)


async def _pool_healthy(ems: ems_pb2_grpc.EmsAsyncStub, pool: str) -> bool:
    stat = await ems.Stat(ems_pb2.StatRequest())
    return next(p for p in stat.pools if p.pool == pool).healthy


async def _wait_pool(ems: ems_pb2_grpc.EmsAsyncStub, pool: str, *, healthy: bool) -> None:
    async with asyncio.timeout(HANG_S):
        while await _pool_healthy(ems, pool) != healthy:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def _objects(regions: list[device_pb2.Region]) -> list[device_pb2.Region]:
    """Object copies only (not tombstones)."""
    return [r for r in regions if r.label.startswith("ems2|")]


FAST = {"check_interval_s": 0.05, "suspect_after_sweeps": 1, "dead_after_s": 3600.0}


async def test_a_key_overwritten_then_deleted_while_a_pool_is_suspect_stays_deleted() -> None:
    """The soak's resurrection: the old copy on a suspect pool cannot be freed by the overwrite,
    so it is owed a tombstone (at its generation), and the delete that follows keeps it owed:
    when the pool returns the stale copy is freed, not adopted."""
    async with running_supernode("cm192", profile=_profile(**FAST)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        victim = (await ems.Put(ems_pb2.PutRequest(key="k", data=b"old value"))).replicas[0]
        also = [f"d{i}" for i in range(20)]  # deleted outright: those with a copy on the victim
        for key in also:
            await ems.Put(ems_pb2.PutRequest(key=key, data=b"d"))
        also = [k for k in also if victim in state.index.objects[k].replicas]
        assert also
        await _fault(clients, victim, True)
        await _wait_pool(ems, victim, healthy=False)  # suspect: its copy cannot be freed
        put = await ems.Put(ems_pb2.PutRequest(key="k", data=b"new value"))
        assert victim not in put.replicas
        assert (await ems.Delete(ems_pb2.DeleteRequest(key="k"))).deleted
        await ems.BatchDelete(ems_pb2.BatchDeleteRequest(keys=also))
        await _fault(clients, victim, False)
        await _wait_pool(ems, victim, healthy=True)
        await state.sweep()  # after the sweep that saw it return has reconciled it
        for key in ["k", *also]:
            assert await _status(ems.Get(ems_pb2.GetRequest(key=key))) == "NOT_FOUND"
            assert not _objects(await _regions(clients, victim, key))
        await state.sweep()  # nothing owed any more: the tombstones go too
        assert not state.index.tombstones
        for pool in state.pools:
            for key in ["k", *also]:
                assert not await _regions(clients, pool, key)
        await clients.close()


async def test_a_key_overwritten_while_a_pool_is_suspect_keeps_the_new_value() -> None:
    """No delete: when the pool returns the new value wins, the stale copy is freed, and a
    restarted EMS agrees."""
    async with running_supernode("cm192", profile=_profile(**FAST)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        victim = (await ems.Put(ems_pb2.PutRequest(key="k", data=b"old value"))).replicas[0]
        await _fault(clients, victim, True)
        await _wait_pool(ems, victim, healthy=False)
        put = await ems.Put(ems_pb2.PutRequest(key="k", data=b"new value"))
        await _fault(clients, victim, False)
        await _wait_pool(ems, victim, healthy=True)
        await state.sweep()
        await state.sweep()
        assert (await ems.Get(ems_pb2.GetRequest(key="k"))).data == b"new value"
        assert not _objects(await _regions(clients, victim, "k"))
        for pool in put.replicas:
            assert len(_objects(await _regions(clients, pool, "k"))) == 1
        assert "k" not in state.index.tombstones
        restarted = _restarted(state)
        await restarted.rebuild(5)
        assert (await restarted.get("k")).data == b"new value"
        await clients.close()


async def test_a_chunked_object_rebuilt_from_the_pools_streams_and_is_repaired() -> None:
    """A rebuilt object knows no chunk size until its table is read: GetStream and the sweep's
    repair read the table first (this was INTERNAL, and "sweep failed" on every pass)."""
    async with running_supernode("cm192", profile=_profile(**FAST)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        data = _pattern(2 * MIB + 5)
        put = await _put_stream(ems, "big", data)
        state.index = type(state.index)()
        await state.rebuild(5)
        got, done = await _get_stream(ems, "big")
        assert got == data and done.size == len(data)
        state.index = type(state.index)()  # again, and this time the sweep reads it first
        await state.rebuild(5)
        await state.sweep()  # nothing to repair: a no-op that must not fail
        victim = put.replicas[0]
        await _fault(clients, victim, True)
        await _wait_pool(ems, victim, healthy=False)
        state.placement.dead_after_ns = 0  # dead at once: its copy is replaced from the other
        async with asyncio.timeout(HANG_S):
            while (await ems.Stat(ems_pb2.StatRequest())).under_replicated:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        (info,) = (await ems.List(ems_pb2.ListRequest(prefix="big"))).objects
        assert victim not in info.replicas and len(info.replicas) == 2
        await _fault(clients, put.replicas[1], True)  # only the repaired copy is left to read
        got, _ = await _get_stream(ems, "big")
        assert got == data
        await clients.close()


async def test_one_object_failing_its_repair_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_supernode("cm192", profile=_profile(**FAST)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        victim = (await ems.Put(ems_pb2.PutRequest(key="bad", data=b"b"))).replicas[0]
        keys = [f"r{i}" for i in range(30)]
        for key in keys:
            await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode()))
        held = [k for k in keys if victim in state.index.objects[k].replicas]
        assert held
        repair = state.recovery.repair

        async def failing(meta: Any) -> None:
            if meta.key == "bad":
                raise RuntimeError("a bug in one object's repair")
            await repair(meta)

        monkeypatch.setattr(state.recovery, "repair", failing)
        state.placement.dead_after_ns = 0
        await _fault(clients, victim, True)
        async with asyncio.timeout(HANG_S):
            while (await ems.Stat(ems_pb2.StatRequest())).under_replicated != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        for key in held:
            assert victim not in state.index.objects[key].replicas
            assert len(state.index.objects[key].replicas) == 2
        await clients.close()


def _fault_when_written(
    monkeypatch: pytest.MonkeyPatch, state: EmsState, clients: Clients, victim: str
) -> None:
    """The victim pool faults (for real) once a put has its region and starts writing to it:
    the write then fails, and the region cannot be freed while the pool is away."""
    write = state.write_copy

    async def faulting(issuer: Any, pool: str, replica: Any, meta: Any, data: bytes) -> Any:
        if pool == victim:
            await _fault(clients, victim, True)
        return await write(issuer, pool, replica, meta, data)

    monkeypatch.setattr(state, "write_copy", faulting)


async def _fail_a_put_mid_way(
    monkeypatch: pytest.MonkeyPatch, state: EmsState, clients: Clients
) -> tuple[str, str]:
    """ "k" holds "old value" on two pools; a batch overwriting it and adding a new key (both
    with a copy on the victim) fails when the victim faults mid-put. (victim, the new key)."""
    ems = _ems(clients)
    victim = (await ems.Put(ems_pb2.PutRequest(key="k", data=b"old value"))).replicas[1]
    fresh = next(f"new{i}" for i in range(1000) if victim in state.placement.targets(f"new{i}"))
    _fault_when_written(monkeypatch, state, clients, victim)
    items = [
        ems_pb2.PutRequest(key="k", data=b"failed value"),
        ems_pb2.PutRequest(key=fresh, data=b"never stored"),
    ]
    assert await _status(ems.BatchPut(ems_pb2.BatchPutRequest(items=items))) == "UNAVAILABLE"
    monkeypatch.undo()
    assert (await ems.Get(ems_pb2.GetRequest(key="k"))).data == b"old value"
    assert await _status(ems.Get(ems_pb2.GetRequest(key=fresh))) == "NOT_FOUND"
    return victim, fresh


async def _no_abort_markers(clients: Clients, state: EmsState) -> None:
    assert not state.index.aborted
    for pool in state.pools:
        listed = await clients.device(pool).ListRegions(device_pb2.ListRegionsRequest())
        assert not [r.label for r in listed.regions if r.label.startswith("ems2a|")]


async def test_a_put_that_failed_when_a_pool_died_mid_put_never_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The failed put's copies on the dead pool could not be freed and are newer than the
    stored object: when the pool returns they are freed (an abort marker says so), not adopted."""
    async with running_supernode("cm192", profile=_profile(**FAST)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        ems = _ems(clients)
        victim, fresh = await _fail_a_put_mid_way(monkeypatch, state, clients)
        assert {m.key for m in state.index.aborted.values()} == {"k", fresh}
        assert all(m.pending == {victim} for m in state.index.aborted.values())
        await _fault(clients, victim, False)
        await _wait_pool(ems, victim, healthy=True)
        await state.sweep()  # after the sweep that saw it return has reconciled it
        assert (await ems.Get(ems_pb2.GetRequest(key="k"))).data == b"old value"
        assert (await ems.Get(ems_pb2.GetRequest(key="k", device=f"{victim[:3]}-npu0"))).data == (
            b"old value"
        )
        assert await _status(ems.Get(ems_pb2.GetRequest(key=fresh))) == "NOT_FOUND"
        assert len(_objects(await _regions(clients, victim, "k"))) == 1  # the old copy only
        assert not await _regions(clients, victim, fresh)
        await state.sweep()
        await _no_abort_markers(clients, state)
        await clients.close()


async def test_a_put_that_failed_stays_failed_across_an_ems_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The abort markers are in regions of the pools that are up: a restarted EMS learns them,
    and frees the failed put's copies when the pool that holds them returns."""
    async with running_supernode("cm192", profile=_profile(check_interval_s=3600.0)) as sn:
        state = sn.local.ems
        assert state is not None
        clients = Clients(sn.topology)
        victim, fresh = await _fail_a_put_mid_way(monkeypatch, state, clients)
        restarted = _restarted(state)
        await restarted.rebuild(0.2)  # the victim is still away: reconciled by a sweep later
        assert victim in restarted.unreconciled
        assert {m.key for m in restarted.index.aborted.values()} == {"k", fresh}
        assert all(m.pending == {victim} for m in restarted.index.aborted.values())
        await _fault(clients, victim, False)
        await restarted.sweep()
        assert (await restarted.get("k")).data == b"old value"
        assert restarted.lookup(fresh) is None
        assert len(_objects(await _regions(clients, victim, "k"))) == 1
        assert not await _regions(clients, victim, fresh)
        await restarted.sweep()
        await _no_abort_markers(clients, restarted)
        await clients.close()


async def test_of_two_racing_puts_of_one_key_the_newer_generation_wins(
    mini: Supernode, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The older put (its generation drawn first) commits last: it is acknowledged, as if it
    came just before the newer one (they overlapped), and its copies go: the index agrees with
    what a restart or a returning pool would decide."""
    state = mini.local.ems
    assert state is not None
    ems = _ems(clients)
    entered, gate = asyncio.Event(), asyncio.Event()
    write = state.write_copy

    async def held(issuer: Any, pool: str, replica: Any, meta: Any, data: bytes) -> Any:
        if data == b"older":
            entered.set()
            await gate.wait()
        return await write(issuer, pool, replica, meta, data)

    monkeypatch.setattr(state, "write_copy", held)
    older = asyncio.ensure_future(ems.Put(ems_pb2.PutRequest(key="race", data=b"older")))
    async with asyncio.timeout(HANG_S):
        await entered.wait()
    await ems.Put(ems_pb2.PutRequest(key="race", data=b"newer"))
    gate.set()
    assert len((await older).replicas) == 2  # acknowledged
    assert (await ems.Get(ems_pb2.GetRequest(key="race"))).data == b"newer"
    meta = state.index.get("race")
    assert meta is not None
    for pool in ("n00-mem", "n01-mem"):
        (copy,) = _objects(await _regions(clients, pool, "race"))
        assert int(copy.label.split("|")[1], 16) == meta.gen
    restarted = _restarted(state)
    await restarted.rebuild(5)
    assert (await restarted.get("race")).data == b"newer"


async def test_a_copy_whose_pool_lost_its_region_is_skipped_and_another_serves(
    clients: Clients,
) -> None:
    """A pool back empty (a pool-loss, a wiped restart) before EMS's sweep has seen it: its copy's
    region is gone (FAILED_PRECONDITION REGION_NOT_ALLOCATED from the pool), and the Get used to
    answer that, so a loaded chaos run counted half of its objects lost (mempool-loss: 35 of 64).
    Now the other copy serves. Twin: with every copy's region gone the Get is DATA_LOSS
    COPIES_GONE, not a relayed FAILED_PRECONDITION. Emulated time is held, so no sweep runs."""
    ems = _ems(clients)
    async with held_time(clients.topology, name="ems gone-copy test"):
        pools: dict[str, list[str]] = {}
        for key in ("gone-a", "gone-b", "gone-all"):
            put = await ems.Put(ems_pb2.PutRequest(key=key, data=b"kept " + key.encode()))
            pools[key] = list(put.replicas)
            assert len(pools[key]) == 2

        async def lose(key: str, pool: str) -> None:
            for region in _objects(await _regions(clients, pool, key)):
                await clients.device(pool).FreeRegion(
                    device_pb2.FreeRegionRequest(region_id=region.region_id)
                )

        # one copy lost each, a different pool each: whichever copy a read tries first, one of
        # the two reads meets a gone region first
        await lose("gone-a", pools["gone-a"][0])
        await lose("gone-b", pools["gone-b"][1])
        for key in ("gone-a", "gone-b"):
            got = await ems.Get(ems_pb2.GetRequest(key=key))
            assert got.data == b"kept " + key.encode()
        for pool in pools["gone-all"]:
            await lose("gone-all", pool)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ems.Get(ems_pb2.GetRequest(key="gone-all"))
        refused = decode(err.value)
        assert (refused.code, refused.reason) == (grpc.StatusCode.DATA_LOSS, "COPIES_GONE")
