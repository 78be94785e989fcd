"""The EMS service: the elastic memory store over the nodes' memory pools.

Every copy of an object is a region of a memory pool, written and read with UB transactions
issued by the device that owns or wants the data, so the fabric times them. The region's label
carries the object's metadata: a restarted EMS rebuilds its index by listing the pools. A
background sweep watches the pools' health and restores the replication factor when one dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from pathlib import Path
from typing import Any, cast

import grpc
import structlog

from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, ub_pb2
from emulator.model.clock import Clock
from emulator.model.ems import (
    HashRing,
    Index,
    ObjectMeta,
    Replica,
    Tier,
    check_block_tokens,
    check_key,
    decode_label,
    encode_label,
    prefix_keys,
)
from emulator.model.errors import (
    CapacityError,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import Device, DeviceKind, Topology
from services.ems_ssd import SsdTier
from services.host import ServiceHost
from services.peers import Peers
from services.status import Context, RemoteError, rpc

SERVICE = "cmemu.v1.Ems"
TIERS: dict[Tier, ems_pb2.Tier.ValueType] = {
    Tier.DRAM: ems_pb2.TIER_DRAM,
    Tier.SSD: ems_pb2.TIER_SSD,
}
log = structlog.get_logger("cmemu.ems").bind(device="ems")


class Timing:
    """Copies written in parallel: the operation starts with the first and lasts as long as the
    slowest (their issue stamps differ only by the wall time between the RPCs)."""

    def __init__(self) -> None:
        self.issue_ns = 0
        self.duration_ns = 0

    def add(self, issue_ns: int, complete_ns: int) -> None:
        self.issue_ns = min(self.issue_ns or issue_ns, issue_ns)
        self.duration_ns = max(self.duration_ns, complete_ns - issue_ns)

    @property
    def complete_ns(self) -> int:
        return self.issue_ns + self.duration_ns


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
        self.ring = HashRing(list(self.pools), self.ems.vnodes_per_pool)
        self.index = Index()
        self.healthy = dict.fromkeys(self.pools, True)
        pool_bytes = profile.node.cpus * profile.cpu.pooled_bytes
        self.capacity_per_pool = int(pool_bytes * self.ems.dram_share)
        self.ssd = SsdTier(ssd_dir, len(topology.nodes) * self.ems.ssd_bytes_per_node)
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "corrupt": 0}
        self.lock = asyncio.Lock()
        self.reserved: dict[str, int] = {}  # pool -> bytes of puts still writing their copies
        self._sweeper: asyncio.Task[None] | None = None

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
        if self.healthy[pool] != healthy:
            self.healthy[pool] = healthy
            log.warning("pool up" if healthy else "pool down", pool=pool)

    async def _transfer(
        self,
        issuer: Device,
        op: ub_pb2.UbOp.ValueType,
        *,
        pool: str,
        replica: Replica,
        meta: ObjectMeta,
        data: bytes = b"",
    ) -> ub_pb2.UbCompletion:
        target = self.pools[pool]
        tx = ub_pb2.UbTransaction(
            op=op,
            dst=ub_pb2.UbAddress(eid=target.eid, offset=replica.offset),
            size=meta.size,
            data=data if op == ub_pb2.UB_OP_WRITE and meta.real else b"",
            size_only=not meta.real,
        )
        completion: ub_pb2.UbCompletion = await self._call(issuer, "bus", "Submit", tx)
        return completion

    # --- placement and room --------------------------------------------------------------------

    def _usable(self) -> list[str]:
        return [p for p, up in self.healthy.items() if up]

    def _used(self, pool: str) -> int:
        """Bytes of the pool's EMS share held by objects and by puts still writing."""
        return self.index.pool_bytes.get(pool, 0) + self.reserved.get(pool, 0)

    def _reserve(self, pools: list[str], size: int) -> None:
        for pool in pools:
            self.reserved[pool] = self.reserved.get(pool, 0) + size

    async def _abandon(
        self, meta: ObjectMeta, placed: dict[str, Replica], pools: list[str]
    ) -> None:
        """A put that failed half way: its reservations and regions go."""
        self._reserve(pools, -meta.size)
        for pool, replica in placed.items():  # never indexed: only the regions to give back
            if self.healthy[pool]:
                with contextlib.suppress(RemoteError):
                    await self._free_region(self.pools[pool], replica.region_id)

    async def _make_room(self, pool: str, size: int) -> int:
        """Evict least-recently-used objects with a copy on `pool` until `size` fits."""
        if size > self.capacity_per_pool:
            raise CapacityError(f"EMS share of {pool}", size, self.capacity_per_pool)
        evicted = 0
        victims = self.index.lru_victims(pool)
        while self._used(pool) + size > self.capacity_per_pool:
            victim = next(victims, None)
            if victim is None:
                free = self.capacity_per_pool - self._used(pool)
                raise CapacityError(f"EMS share of {pool} (the rest is pinned)", size, free)
            await self._evict(victim)
            evicted += 1
        return evicted

    async def _evict(self, meta: ObjectMeta) -> None:
        """To SSD when it has room, else out of the store."""
        self.stats["evictions"] += 1
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
        for pool, replica in list(meta.replicas.items()):
            if not self.healthy[pool]:
                continue
            done = await self._transfer(
                self.pools[pool], ub_pb2.UB_OP_READ, pool=pool, replica=replica, meta=meta
            )
            if zlib.crc32(done.data) == meta.crc:
                return done.data
        raise DataLossError(f"no good copy of {meta.key!r} left to move")

    async def _free_copies(self, meta: ObjectMeta) -> None:
        for pool, replica in list(meta.replicas.items()):
            self.index.drop_replica(meta, pool)
            if self.healthy[pool]:
                with contextlib.suppress(RemoteError):
                    await self._free_region(self.pools[pool], replica.region_id)

    async def _free_region(self, pool: Device, region_id: int) -> None:
        request = device_pb2.FreeRegionRequest(region_id=region_id)
        await self._call(pool, "device", "FreeRegion", request)

    async def _place(self, meta: ObjectMeta, pool: str) -> Replica:
        request = device_pb2.AllocateRegionRequest(size=meta.size, label=encode_label(meta))
        region = await self._call(self.pools[pool], "device", "AllocateRegion", request)
        return Replica(region_id=region.region_id, offset=region.offset)

    # --- operations ----------------------------------------------------------------------------

    def _requester(self, device_id: str) -> Device | None:
        return self.topology.device(device_id) if device_id else None

    async def put(self, request: ems_pb2.PutRequest) -> ems_pb2.PutResponse:
        check_key(request.key)
        ems = self.ems
        if request.data:
            if len(request.data) > ems.real_object_max_bytes:
                raise InvalidArgumentError(
                    f"objects over {ems.real_object_max_bytes} bytes are size-only: send size"
                )
            if request.size not in (0, len(request.data)):
                raise InvalidArgumentError("size differs from len(data)")
        elif not request.size:
            raise InvalidArgumentError("an object needs data or a size")
        size = len(request.data) or request.size
        if size > ems.object_max_bytes:
            raise InvalidArgumentError(
                f"oversize object: {size} bytes, at most {ems.object_max_bytes}"
            )
        requester = self._requester(request.device)
        meta = ObjectMeta(
            key=request.key,
            kind=request.kind or ems_pb2.OBJECT_KIND_KV_BLOCK,
            size=size,
            crc=zlib.crc32(request.data) if request.data else None,
            pinned=request.pinned,
        )
        async with self.lock:  # placement and room; the copies are written outside the lock
            targets = self.ring.owners(meta.key, ems.replication_factor, usable=self._usable())
            if not targets:
                raise UnavailableError("no memory pool is healthy")
            evicted = 0
            for pool in targets:
                evicted += await self._make_room(pool, size)
            self._reserve(targets, size)
            placed: dict[str, Replica] = {}
            try:
                for pool in targets:
                    placed[pool] = await self._place(meta, pool)
            except Exception:
                await self._abandon(meta, placed, targets)
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
                        data=request.data,
                    )
                    for pool, replica in placed.items()
                )
            )
        except Exception:
            async with self.lock:
                await self._abandon(meta, placed, targets)
            raise
        timing = Timing()
        for completion in done:
            timing.add(completion.issue_ns, completion.complete_ns)
        async with self.lock:
            self._reserve(targets, -size)
            old = self.index.get(meta.key)
            if old is not None:  # the new copies are in: only now let the old ones go
                await self._drop(old)
            meta.replicas.update(placed)
            self.index.add(meta)
        return ems_pb2.PutResponse(
            key=meta.key,
            size=size,
            replicas=list(placed),
            issue_ns=timing.issue_ns,
            complete_ns=timing.complete_ns,
            evicted=evicted,
        )

    async def _drop(self, meta: ObjectMeta) -> None:
        await self._free_copies(meta)
        if meta.tier is Tier.SSD:
            await asyncio.to_thread(self.ssd.remove, meta)
        self.index.remove(meta.key)

    async def get(self, request: ems_pb2.GetRequest) -> ems_pb2.GetResponse:
        check_key(request.key)
        requester = self._requester(request.device)
        meta = self.index.get(request.key)
        if meta is None:
            self.stats["misses"] += 1
            raise NotFoundError(f"no object {request.key!r}")
        reply = ems_pb2.GetResponse(
            key=meta.key,
            size=meta.size,
            kind=cast(ems_pb2.ObjectKind.ValueType, meta.kind),
            tier=TIERS[meta.tier],
        )
        if meta.tier is Tier.SSD:
            data = await asyncio.to_thread(self.ssd.read, meta.key)
            if meta.real and zlib.crc32(data) != meta.crc:
                self.stats["corrupt"] += 1
                raise DataLossError(f"the SSD copy of {meta.key!r} fails its checksum")
            now = self.clock.now_ns()
            cost = self.ems.ssd_latency_s + meta.size / self.ems.ssd_bytes_per_s_per_node
            reply.data, reply.served_by = data if meta.real else b"", "ssd"
            reply.issue_ns, reply.complete_ns = now, now + round(cost * 1e9)
        else:
            await self._read_dram(meta, requester, reply)
        self.stats["hits"] += 1
        if meta.key in self.index.objects:
            self.index.touch(meta.key)
        return reply

    async def _read_dram(
        self, meta: ObjectMeta, requester: Device | None, reply: ems_pb2.GetResponse
    ) -> None:
        near = requester.node if requester is not None else None
        order = sorted(meta.replicas.items(), key=lambda kv: self.pools[kv[0]].node != near)
        unavailable = []
        for pool, replica in order:
            if not self.healthy[pool]:
                unavailable.append(pool)
                continue
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
                reply.corrupt_copies += 1
                self.stats["corrupt"] += 1
                log.warning("DATA_LOSS on a copy; reading another", key=meta.key, pool=pool)
                self.index.drop_replica(meta, pool)  # the sweep restores the factor
                continue
            reply.data, reply.served_by = done.data, pool
            reply.issue_ns, reply.complete_ns = done.issue_ns, done.complete_ns
            return
        if reply.corrupt_copies:
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

    def exists(self, key: str) -> ems_pb2.ExistsResponse:
        check_key(key)
        meta = self.index.get(key)
        if meta is None:
            return ems_pb2.ExistsResponse(exists=False)
        return ems_pb2.ExistsResponse(exists=True, size=meta.size, tier=TIERS[meta.tier])

    def keys_for(self, request: ems_pb2.PrefixRequest) -> list[str]:
        check_block_tokens(
            request.block_tokens, self.ems.block_tokens_min, self.ems.block_tokens_max
        )
        return prefix_keys(list(request.tokens), request.block_tokens, request.namespace)

    def match(self, request: ems_pb2.PrefixRequest) -> ems_pb2.MatchPrefixResponse:
        matched = []
        for key in self.keys_for(request):
            if key not in self.index.objects:
                break
            self.index.touch(key)
            matched.append(key)
        return ems_pb2.MatchPrefixResponse(
            matched_blocks=len(matched),
            matched_tokens=len(matched) * request.block_tokens,
            keys=matched,
        )

    def stat(self, pool_filter: str) -> ems_pb2.StatResponse:
        if pool_filter and pool_filter not in self.pools:
            raise NotFoundError(f"no memory pool {pool_filter!r}; pools: {', '.join(self.pools)}")
        objects = list(self.index.objects.values())
        dram = [m for m in objects if m.tier is Tier.DRAM]
        pools = [
            ems_pb2.PoolStat(
                pool=p,
                healthy=self.healthy[p],
                objects=sum(1 for m in dram if p in m.replicas),
                bytes=self.index.pool_bytes.get(p, 0),
                capacity_bytes=self.capacity_per_pool,
            )
            for p in self.pools
            if not pool_filter or p == pool_filter
        ]
        return ems_pb2.StatResponse(
            objects=len(objects),
            dram_bytes=sum(m.size for m in dram),
            dram_capacity_bytes=self.capacity_per_pool * len(self.pools),
            dram_used_bytes=sum(self.index.pool_bytes.values()),
            ssd_objects=len(objects) - len(dram),
            ssd_used_bytes=self.ssd.used,
            ssd_capacity_bytes=self.ssd.capacity,
            replication_factor=self.ems.replication_factor,
            under_replicated=sum(1 for m in dram if len(self._live(m)) < self._wanted()),
            hits=self.stats["hits"],
            misses=self.stats["misses"],
            evictions=self.stats["evictions"],
            corrupt_copies=self.stats["corrupt"],
            pools=pools,
        )

    # --- rebuild, health, re-replication --------------------------------------------------------

    def _live(self, meta: ObjectMeta) -> list[str]:
        return [p for p in meta.replicas if self.healthy[p]]

    def _wanted(self) -> int:
        return min(self.ems.replication_factor, len(self._usable()) or 1)

    async def rebuild(self, wait_s: float = 60.0) -> None:
        """The index from the pools' region labels and the SSD tier's files. Pools that do not
        answer are asked again for up to wait_s (they may still be starting), then counted down."""

        async def listing(pool: Device) -> tuple[str, device_pb2.ListRegionsResponse | None]:
            try:
                found = await self.peers.device_call(
                    pool, "ListRegions", device_pb2.ListRegionsRequest()
                )
                return pool.id, found
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
                await asyncio.sleep(0.2)
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

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop(), name="ems-sweep")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep_loop(self) -> None:
        """Owned task: pool health, then the replication factor, every check interval."""
        while True:
            await asyncio.sleep(self.ems.check_interval_s)
            await self.sweep()

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
            for meta in list(self.index.objects.values()):
                if meta.tier is Tier.DRAM and len(self._live(meta)) < self._wanted():
                    with contextlib.suppress(
                        RemoteError, DataLossError, CapacityError, UnavailableError
                    ):
                        await self._repair(meta)

    async def _repair(self, meta: ObjectMeta) -> None:
        for dead in [p for p in meta.replicas if not self.healthy[p]]:
            self.index.drop_replica(meta, dead)  # its region is gone with its pool's process
        live = self._live(meta)
        if not live:
            log.error("object lost: no live copy", key=meta.key)
            return
        data = await self._read_bytes(meta) if meta.real else b""
        source = self.pools[live[0]]
        for pool in self.ring.owners(meta.key, len(self.pools), usable=self._usable()):
            if len(self._live(meta)) >= self._wanted():
                break
            if pool in meta.replicas:
                continue
            await self._make_room(pool, meta.size)
            replica = await self._place(meta, pool)
            await self._transfer(
                source, ub_pb2.UB_OP_WRITE, pool=pool, replica=replica, meta=meta, data=data
            )
            self.index.add_replica(meta, pool, replica)
            log.info("re-replicated", key=meta.key, source=source.id, copy=pool)


class EmsServicer(ems_pb2_grpc.EmsServicer):
    def __init__(self, state: EmsState) -> None:
        self.state = state

    @rpc
    async def Put(self, request: ems_pb2.PutRequest, context: Context) -> ems_pb2.PutResponse:
        return await self.state.put(request)

    @rpc
    async def Get(self, request: ems_pb2.GetRequest, context: Context) -> ems_pb2.GetResponse:
        return await self.state.get(request)

    @rpc
    async def Delete(
        self, request: ems_pb2.DeleteRequest, context: Context
    ) -> ems_pb2.DeleteResponse:
        return ems_pb2.DeleteResponse(deleted=await self.state.delete(request.key))

    @rpc
    async def Exists(
        self, request: ems_pb2.ExistsRequest, context: Context
    ) -> ems_pb2.ExistsResponse:
        return self.state.exists(request.key)

    @rpc
    async def BatchPut(
        self, request: ems_pb2.BatchPutRequest, context: Context
    ) -> ems_pb2.BatchPutResponse:
        return ems_pb2.BatchPutResponse(
            items=[await self.state.put(item) for item in request.items]
        )

    @rpc
    async def BatchGet(
        self, request: ems_pb2.BatchGetRequest, context: Context
    ) -> ems_pb2.BatchGetResponse:
        reply = ems_pb2.BatchGetResponse()
        for item in request.items:
            try:
                reply.items.append(await self.state.get(item))
            except NotFoundError:
                reply.missing.append(item.key)
        return reply

    @rpc
    async def BatchDelete(
        self, request: ems_pb2.BatchDeleteRequest, context: Context
    ) -> ems_pb2.BatchDeleteResponse:
        deleted = [await self.state.delete(key) for key in request.keys]
        return ems_pb2.BatchDeleteResponse(deleted=sum(deleted))

    @rpc
    async def BatchExists(
        self, request: ems_pb2.BatchExistsRequest, context: Context
    ) -> ems_pb2.BatchExistsResponse:
        return ems_pb2.BatchExistsResponse(
            exists=[self.state.exists(k).exists for k in request.keys]
        )

    @rpc
    async def PrefixKeys(
        self, request: ems_pb2.PrefixRequest, context: Context
    ) -> ems_pb2.PrefixKeysResponse:
        return ems_pb2.PrefixKeysResponse(keys=self.state.keys_for(request))

    @rpc
    async def MatchPrefix(
        self, request: ems_pb2.PrefixRequest, context: Context
    ) -> ems_pb2.MatchPrefixResponse:
        return self.state.match(request)

    @rpc
    async def Stat(self, request: ems_pb2.StatRequest, context: Context) -> ems_pb2.StatResponse:
        return self.state.stat(request.pool)


def create_ems(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Clock,
    peers: Peers,
    ssd_dir: Path,
) -> tuple[EmsState, ServiceHost]:
    state = EmsState(topology=topology, profile=profile, clock=clock, peers=peers, ssd_dir=ssd_dir)
    servicer = EmsServicer(state)
    host = ServiceHost(
        name="ems",
        address=address,
        services=[(SERVICE, lambda s: ems_pb2_grpc.add_EmsServicer_to_server(servicer, s))],
    )
    return state, host
