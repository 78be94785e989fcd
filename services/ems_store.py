"""EMS's orchestration: carrying out the model's decisions (emulator/model/ems) over the pools.

Every copy of an object is a region of a memory pool, written and read with UB transactions
issued by the device that owns or wants the data, so the fabric times them. The region's label
carries the object's metadata: a restarted EMS rebuilds its index by listing the pools. A
background sweep, every check interval of emulated time, watches the pools' health and restores
the replication factor when one dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from cmemu.v1 import device_pb2, ub_pb2
from emulator.model.clock import Clock
from emulator.model.costmodel import ems_ssd_ns
from emulator.model.ems import (
    REBUILD_POLL_S,
    Counters,
    HashRing,
    Index,
    ObjectMeta,
    Page,
    Placement,
    Replica,
    StoreStats,
    Tier,
    Timing,
    check_block_tokens,
    check_key,
    decode_label,
    encode_label,
    prefix_keys,
    summarize,
)
from emulator.model.errors import (
    CapacityError,
    DataLossError,
    NotFoundError,
    UnavailableError,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import Device, DeviceKind, Topology
from services.ems_ssd import SsdTier
from services.peers import Peers
from services.status import RemoteError

MIN_PAUSE_S = 0.01  # wall floor of a periodic pause: a fast time_scale stretches the period
# lazy: `.bind()` here would build the logger at import, before logging is configured (stdout)
log = structlog.get_logger("cmemu.ems", device="ems")


@dataclass(frozen=True, kw_only=True)
class Stored:
    meta: ObjectMeta
    replicas: list[str]
    timing: Timing
    evicted: int


@dataclass(frozen=True, kw_only=True)
class Fetched:
    meta: ObjectMeta
    data: bytes
    served_by: str  # a pool, or "ssd"
    corrupt_copies: int
    issue_ns: int
    complete_ns: int


class EmsState:
    name = "ems"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Clock,
        peers: Peers,
        ssd_dir: Path,
    ) -> None:
        self.topology = topology
        self.profile = profile
        self.ems = profile.ems
        self.clock = clock
        self.peers = peers
        self.pools = {d.id: d for d in topology.of_kind(DeviceKind.MEMPOOL)}
        pool_bytes = profile.pool_bytes
        self.placement = Placement(
            pools={p: d.node for p, d in self.pools.items()},
            ring=HashRing(list(self.pools), self.ems.vnodes_per_pool),
            capacity_per_pool=int(pool_bytes * self.ems.dram_share),
            replication_factor=self.ems.replication_factor,
        )
        self.ssd = SsdTier(ssd_dir, len(topology.nodes) * self.ems.ssd_bytes_per_node)
        self.counters = Counters()
        self.lock = asyncio.Lock()
        self._closing = asyncio.Event()

    @property
    def index(self) -> Index:
        return self.placement.index

    @index.setter
    def index(self, index: Index) -> None:
        self.placement.index = index

    def _pause_s(self, emulated_s: float) -> float:
        return max(self.clock.wall_delay_s(emulated_s), MIN_PAUSE_S)

    # --- device access -------------------------------------------------------------------------

    async def _call(self, device: Device, service: str, method: str, request: Any) -> Any:
        """A method of a device (in this process directly, else over gRPC); a pool that does not
        answer is marked down at once, ahead of the next sweep."""
        call = self.peers.device_call if service == "device" else self.peers.bus_call
        try:
            return await call(device, method, request)
        except RemoteError as exc:
            if exc.code is grpc.StatusCode.UNAVAILABLE and device.id in self.pools:
                self._mark(device.id, healthy=False)
            raise

    def _mark(self, pool: str, *, healthy: bool) -> None:
        if self.placement.mark(pool, healthy=healthy):
            log.warning("pool up" if healthy else "pool down", pool=pool)

    async def _transfer(
        self,
        issuer: Device,
        op: ub_pb2.UbOp.ValueType,
        *,
        pool: str,
        meta: ObjectMeta,
        replica: Replica,
        data: bytes = b"",
    ) -> ub_pb2.UbCompletion:
        tx = ub_pb2.UbTransaction(
            op=op,
            dst=ub_pb2.UbAddress(eid=self.pools[pool].eid, offset=replica.offset),
            size=meta.size,
            data=data if op == ub_pb2.UB_OP_WRITE and meta.real else b"",
            size_only=not meta.real,
        )
        completion: ub_pb2.UbCompletion = await self._call(issuer, "bus", "Submit", tx)
        return completion

    async def _place(self, meta: ObjectMeta, pool: str) -> Replica:
        request = device_pb2.AllocateRegionRequest(size=meta.size, label=encode_label(meta))
        region = await self._call(self.pools[pool], "device", "AllocateRegion", request)
        return Replica(region_id=region.region_id, offset=region.offset)

    async def _free_region(self, pool: str, region_id: int) -> None:
        if self.placement.healthy[pool]:  # a dead pool's regions went with its process
            with contextlib.suppress(RemoteError):
                request = device_pb2.FreeRegionRequest(region_id=region_id)
                await self._call(self.pools[pool], "device", "FreeRegion", request)

    # --- room ----------------------------------------------------------------------------------

    async def _make_room(self, pool: str, size: int) -> int:
        victims = self.placement.victims(pool, size)
        for victim in victims:
            await self._evict(victim)
        return len(victims)

    async def _evict(self, meta: ObjectMeta) -> None:
        """To SSD when it has room, else out of the store."""
        self.counters.evictions += 1
        data = await self._read_bytes(meta) if meta.real else b""
        if self.ssd.fits(meta.size):
            await asyncio.to_thread(self.ssd.write, meta, data)
            await self._free_copies(meta)
            meta.tier = Tier.SSD
            log.info("evicted to ssd", key=meta.key, size=meta.size)
        else:
            await self._free_copies(meta)
            self.index.remove(meta.key)
            log.info("evicted", key=meta.key, size=meta.size)

    async def _read_bytes(self, meta: ObjectMeta) -> bytes:
        for pool, replica in self.placement.read_order(meta, None).copies:
            done = await self._transfer(
                self.pools[pool], ub_pb2.UB_OP_READ, pool=pool, replica=replica, meta=meta
            )
            if zlib.crc32(done.data) == meta.crc:
                return done.data
        raise DataLossError(f"no good copy of {meta.key!r} left to move")

    async def _free_copies(self, meta: ObjectMeta) -> None:
        for pool, replica in list(meta.replicas.items()):
            self.index.drop_replica(meta, pool)
            await self._free_region(pool, replica.region_id)

    async def _abandon(self, size: int, placed: dict[str, Replica], pools: list[str]) -> None:
        """A put that failed half way: its reservations and regions go."""
        self.placement.reserve(pools, -size)
        for pool, replica in placed.items():  # never indexed: only the regions to give back
            await self._free_region(pool, replica.region_id)

    async def _drop(self, meta: ObjectMeta) -> None:
        await self._free_copies(meta)
        if meta.tier is Tier.SSD:
            await asyncio.to_thread(self.ssd.remove, meta)
        self.index.remove(meta.key)

    # --- operations ----------------------------------------------------------------------------

    def _requester(self, device_id: str) -> Device | None:
        return self.topology.device(device_id) if device_id else None

    async def put(self, meta: ObjectMeta, data: bytes, device: str = "") -> Stored:
        """Store a new object (checked by the model: see object_size) from `device`'s memory."""
        requester = self._requester(device)
        size = meta.size
        async with self.lock:  # placement and room; the copies are written outside the lock
            targets = self.placement.targets(meta.key)
            evicted = 0
            for pool in targets:
                evicted += await self._make_room(pool, size)
            self.placement.reserve(targets, size)
            placed: dict[str, Replica] = {}
            try:
                for pool in targets:
                    placed[pool] = await self._place(meta, pool)
            except Exception:
                await self._abandon(size, placed, targets)
                raise
        try:
            done = await asyncio.gather(
                *(
                    self._transfer(
                        requester or self.pools[pool],
                        ub_pb2.UB_OP_WRITE,
                        pool=pool,
                        replica=replica,
                        meta=meta,
                        data=data,
                    )
                    for pool, replica in placed.items()
                )
            )
        except Exception:
            async with self.lock:
                await self._abandon(size, placed, targets)
            raise
        timing = Timing()
        for completion in done:
            timing.add(completion.issue_ns, completion.complete_ns)
        async with self.lock:
            self.placement.reserve(targets, -size)
            old = self.index.get(meta.key)
            if old is not None:  # the new copies are in: only now let the old ones go
                await self._drop(old)
            meta.replicas.update(placed)
            self.index.add(meta)
        return Stored(meta=meta, replicas=list(placed), timing=timing, evicted=evicted)

    async def get(self, key: str, device: str = "") -> Fetched:
        check_key(key)
        requester = self._requester(device)
        meta = self.index.get(key)
        if meta is None:
            self.counters.misses += 1
            raise NotFoundError(f"no object {key!r}")
        if meta.tier is Tier.SSD:
            fetched = await self._read_ssd(meta)
        else:
            fetched = await self._read_dram(meta, requester)
        self.counters.hits += 1
        if meta.key in self.index.objects:
            self.index.touch(meta.key)
        return fetched

    async def _read_ssd(self, meta: ObjectMeta) -> Fetched:
        data = await asyncio.to_thread(self.ssd.read, meta.key)
        if meta.real and zlib.crc32(data) != meta.crc:
            self.counters.corrupt += 1
            raise DataLossError(f"the SSD copy of {meta.key!r} fails its checksum")
        now = self.clock.now_ns()
        return Fetched(
            meta=meta,
            data=data if meta.real else b"",
            served_by="ssd",
            corrupt_copies=0,
            issue_ns=now,
            complete_ns=now + ems_ssd_ns(meta.size, self.profile),
        )

    async def _read_dram(self, meta: ObjectMeta, requester: Device | None) -> Fetched:
        plan = self.placement.read_order(meta, requester.node if requester is not None else None)
        unavailable = list(plan.down)
        corrupt = 0
        for pool, replica in plan.copies:
            try:
                done = await self._transfer(
                    requester or self.pools[pool],
                    ub_pb2.UB_OP_READ,
                    pool=pool,
                    replica=replica,
                    meta=meta,
                )
            except RemoteError as exc:
                if exc.code is not grpc.StatusCode.UNAVAILABLE:
                    raise
                unavailable.append(pool)
                continue
            if meta.real and zlib.crc32(done.data) != meta.crc:
                corrupt += 1
                self.counters.corrupt += 1
                log.warning("DATA_LOSS on a copy; reading another", key=meta.key, pool=pool)
                self.index.drop_replica(meta, pool)  # the sweep restores the factor
                continue
            return Fetched(
                meta=meta,
                data=done.data,
                served_by=pool,
                corrupt_copies=corrupt,
                issue_ns=done.issue_ns,
                complete_ns=done.complete_ns,
            )
        if corrupt:
            raise DataLossError(f"every reachable copy of {meta.key!r} fails its checksum")
        raise UnavailableError(f"no copy of {meta.key!r} is reachable: {', '.join(unavailable)}")

    async def delete(self, key: str) -> bool:
        check_key(key)
        async with self.lock:
            meta = self.index.get(key)
            if meta is None:
                return False
            await self._drop(meta)
            return True

    def lookup(self, key: str) -> ObjectMeta | None:
        check_key(key)
        return self.index.get(key)

    def keys_for(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        check_block_tokens(block_tokens, self.ems.block_tokens_min, self.ems.block_tokens_max)
        return prefix_keys(tokens, block_tokens, namespace)

    def match(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        """The keys of the longest stored prefix of `tokens` (each counts as a use)."""
        matched = []
        for key in self.keys_for(tokens, block_tokens, namespace):
            if key not in self.index.objects:
                break
            self.index.touch(key)
            matched.append(key)
        return matched

    def listing(self, prefix: str, page_size: int, token: str) -> Page:
        return self.index.page(prefix=prefix, page_size=page_size, token=token)

    def stats(self, pool: str) -> StoreStats:
        return summarize(
            self.placement,
            self.counters,
            ssd_used_bytes=self.ssd.used,
            ssd_capacity_bytes=self.ssd.capacity,
            pool_filter=pool,
        )

    # --- rebuild, health, re-replication --------------------------------------------------------

    async def rebuild(self, wait_s: float = 60.0) -> None:
        """The index from the pools' region labels and the SSD tier's files. Pools that do not
        answer are asked again every REBUILD_POLL_S of emulated time for up to wait_s wall
        seconds (they may still be starting: processes start in wall time), then counted down."""

        async def listing(pool: Device) -> tuple[str, device_pb2.ListRegionsResponse | None]:
            try:
                request = device_pb2.ListRegionsRequest()
                return pool.id, await self.peers.device_call(pool, "ListRegions", request)
            except RemoteError:
                return pool.id, None

        pending = list(self.pools.values())
        deadline = self.clock.wall() + wait_s
        while pending:
            results = await asyncio.gather(*(listing(p) for p in pending))
            for pool_id, found in results:
                if found is not None:
                    self._index_pool(pool_id, found)
            pending = [self.pools[pool_id] for pool_id, found in results if found is None]
            if pending and self.clock.wall() >= deadline:
                for pool in pending:
                    self._mark(pool.id, healthy=False)
                break
            if pending:
                await asyncio.sleep(self._pause_s(REBUILD_POLL_S))
        for meta in await asyncio.to_thread(self.ssd.load):
            if meta.key not in self.index.objects:
                self.index.add(meta)
        log.info("index rebuilt", objects=len(self.index), ssd=self.ssd.used)

    def _index_pool(self, pool_id: str, found: device_pb2.ListRegionsResponse) -> None:
        for region in found.regions:
            meta = decode_label(region.label)
            if meta is None:
                continue
            known = self.index.get(meta.key)
            if known is None:
                self.index.add(meta)
                known = meta
            self.index.add_replica(known, pool_id, Replica(region.region_id, region.offset))

    async def run(self) -> None:
        """The sweep, a task of its host's TaskGroup until close(): pool health, then the
        replication factor, every check interval of emulated time."""
        while not await self._closed_within(self._pause_s(self.ems.check_interval_s)):
            try:
                await self.sweep()
            except Exception:  # a bug in one sweep must not stop the next, nor the process
                log.exception("sweep failed")

    async def _closed_within(self, wall_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wall_s):
                await self._closing.wait()
        return self._closing.is_set()

    async def close(self) -> None:
        """End the sweep loop (after the sweep in progress, if any)."""
        self._closing.set()

    async def sweep(self) -> None:
        async def probe(pool: Device) -> tuple[str, bool]:
            """Up means reachable and not faulted: what its health says, without a health RPC
            per pool per sweep when the pool shares this process."""
            try:
                fault = await self.peers.device_call(
                    pool, "GetFaultState", device_pb2.GetFaultStateRequest(), 1.0
                )
            except RemoteError:
                return pool.id, False
            return pool.id, not fault.faulted

        for pool_id, up in await asyncio.gather(*(probe(p) for p in self.pools.values())):
            self._mark(pool_id, healthy=up)
        async with self.lock:
            for meta in self.placement.under_replicated():
                if not self.placement.needs_repair(meta):
                    continue  # evicted to make room for an earlier repair
                with contextlib.suppress(
                    RemoteError, DataLossError, CapacityError, UnavailableError
                ):
                    await self._repair(meta)

    async def _repair(self, meta: ObjectMeta) -> None:
        plan = self.placement.repair_plan(meta)
        for dead in plan.dead:
            self.index.drop_replica(meta, dead)  # its region is gone with its pool's process
        if plan.source is None:
            log.error("object lost: no live copy", key=meta.key)
            return
        data = await self._read_bytes(meta) if meta.real else b""
        source = self.pools[plan.source]
        for pool in plan.targets:
            await self._make_room(pool, meta.size)
            replica = await self._place(meta, pool)
            await self._transfer(
                source, ub_pb2.UB_OP_WRITE, pool=pool, replica=replica, meta=meta, data=data
            )
            self.index.add_replica(meta, pool, replica)
            log.info("re-replicated", key=meta.key, source=source.id, copy=pool)
