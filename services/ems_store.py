"""EMS's orchestration: carrying out the model's decisions (emulator/model/ems) over the pools.

Every copy of an object is a region of a memory pool, written and read with UB transactions
issued by the device that owns or wants the data, so the fabric times them; an object larger than
one chunk moves a chunk per transaction, each with its CRC-32 (the table follows the data in the
region). The region's label carries the object's metadata and generation: a restarted EMS
rebuilds its index by listing the pools, the newest generation of a key winning (a put that
commits after a newer one of its key, or after a delete that left a tombstone as new, is taken to
have come just before it: acknowledged, its copies freed). A delete (or an overwrite or eviction,
at the replaced version's generation) that cannot reach every copy leaves tombstone regions until
every pool that may hold a copy has been reconciled; a put that fails (or loses so) leaving a
copy it cannot free leaves abort-marker regions, for that generation alone, as long. A background
sweep, every check interval of emulated time, probes the pools: a pool that misses sweeps is
suspect (avoided, its copies kept), one silent past the dead threshold is dead (its copies
replaced), and one that answers again is reconciled (settled once it has freed what it must).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import structlog

from cmemu.v1 import device_pb2, ub_pb2
from emulator.engines.clock import Timeline
from emulator.model.costmodel import ems_ssd_ns
from emulator.model.ems import (
    REBUILD_POLL_S,
    TRAILER_HEAD_BYTES,
    Aborted,
    Counters,
    HashRing,
    Health,
    Index,
    Listed,
    ObjectMeta,
    Page,
    Placement,
    Replica,
    StoreStats,
    Tier,
    Timing,
    Tombstone,
    absorb_aborts,
    absorb_tombstones,
    check_block_tokens,
    check_key,
    chunk_crcs,
    decode_trailer,
    decode_trailer_head,
    encode_abort,
    encode_label,
    encode_tombstone,
    encode_trailer,
    prefix_keys,
    reconcile,
    spans,
    summarize,
    trailer_bytes,
)
from emulator.model.errors import (
    RETRY_AFTER_S,
    DataLossError,
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    quote,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import Device, DeviceKind, Topology
from services.ems_ssd import SsdTier
from services.peers import Peers
from services.status import RemoteError

MIN_PAUSE_S = 0.01  # wall floor of a periodic pause: a fast time_scale stretches the period
IO_TIMEOUT_S = 20.0  # wall seconds one UB transaction of EMS may take: a stalled pool is passed by
# (a bound on a hang: the transaction waits in emulated time, which a busy host slows; at 5 s a
# loaded machine failed whole weight loads with DEADLINE_EXCEEDED)
PROBE_TIMEOUT_S = 1.0  # wall seconds a sweep waits for a pool's answer
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# lazy: `.bind()` here would build the logger at import, before logging is configured (stdout)
log = structlog.get_logger("cmemu.ems", device="ems")


@dataclass(frozen=True, kw_only=True)
class Stored:
    meta: ObjectMeta
    replicas: list[str]
    timing: Timing
    evicted: int


@dataclass(kw_only=True)
class Fetched:
    meta: ObjectMeta
    data: bytes
    served_by: str  # a pool, or "ssd"
    corrupt_copies: int
    issue_ns: int
    complete_ns: int


@dataclass(kw_only=True)
class Reading:
    """A read in progress: `chunks()` yields the object's bytes in order (nothing for a size-only
    object); once it is exhausted the other fields say where they came from and when."""

    meta: ObjectMeta
    served_by: str = ""
    corrupt_copies: int = 0
    timing: Timing = field(default_factory=Timing)
    source: AsyncIterator[bytes] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.source is not None:
            async for piece in self.source:
                yield piece


@dataclass(kw_only=True)
class Staged:
    """A put whose copies are written but not yet indexed (nor the old version dropped)."""

    meta: ObjectMeta
    placed: dict[str, Replica]
    targets: list[str]
    timing: Timing
    evicted: int


def _region_size(meta: ObjectMeta) -> int:
    return meta.size + (trailer_bytes(meta.size, meta.chunk_bytes) if meta.chunked else 0)


class EmsState:
    name = "ems"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
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
            suspect_after_sweeps=self.ems.suspect_after_sweeps,
            dead_after_ns=int(self.ems.dead_after_s * 1e9),
        )
        self.ssd = SsdTier(ssd_dir, len(topology.nodes) * self.ems.ssd_bytes_per_node)
        self.counters = Counters()
        self.lock = asyncio.Lock()
        self.unreconciled: set[str] = set()  # pools not listed since this EMS started
        # Until rebuild() has read every pool (or given up on those that do not answer), the
        # index lacks keys a pool not yet listed holds: calls about keys answer UNAVAILABLE
        # RECOVERING (retryable), never NOT_FOUND for an acknowledged key (issue 21 finding 3).
        self.recovering = True
        self.listed: set[str] = set()  # pools the rebuild has read
        self._closing = asyncio.Event()

    @property
    def index(self) -> Index:
        return self.placement.index

    @index.setter
    def index(self, index: Index) -> None:
        self.placement.index = index

    def _pause_s(self, emulated_s: float) -> float:
        return max(self.clock.clock.wall_delay_s(emulated_s), MIN_PAUSE_S)

    def _serving(self) -> None:
        """Refuse a call about keys while the index is being rebuilt (see `recovering`)."""
        if self.recovering:
            raise UnavailableError(
                f"EMS is rebuilding its index after a start: {len(self.listed)} of "
                f"{len(self.pools)} memory pools listed; retry",
                reason="RECOVERING",
                retry_after_s=RETRY_AFTER_S,
            )

    # --- device access -------------------------------------------------------------------------

    async def _call(
        self,
        device: Device,
        service: str,
        method: str,
        request: Any,
        deadline_s: float | None = None,
    ) -> Any:
        """A method of a device (in this process directly, else over gRPC); a pool that does not
        answer is suspect at once, ahead of the next sweep."""
        call = self.peers.device_call if service == "device" else self.peers.bus_call
        try:
            if deadline_s is None:
                return await call(device, method, request)
            return await call(device, method, request, deadline_s)
        except RemoteError as exc:
            if exc.code in UNREACHABLE and device.id in self.pools:
                self._suspect(device.id)
            raise

    def _suspect(self, pool: str) -> None:
        if self.placement.suspect(pool, self.clock.now_ns()):
            log.warning("pool suspect", pool=pool)

    def _mark(self, pool: str, *, healthy: bool) -> None:
        if self.placement.mark(pool, healthy=healthy):
            log.warning("pool up" if healthy else "pool down", pool=pool)

    async def _transfer(
        self,
        issuer: Device,
        op: ub_pb2.UbOp.ValueType,
        *,
        pool: str,
        replica: Replica,
        size: int,
        offset: int = 0,
        data: bytes = b"",
        size_only: bool = False,
    ) -> ub_pb2.UbCompletion:
        tx = ub_pb2.UbTransaction(
            op=op,
            dst=ub_pb2.UbAddress(eid=self.pools[pool].eid, offset=replica.offset + offset),
            size=size,
            data=data if op == ub_pb2.UB_OP_WRITE and not size_only else b"",
            size_only=size_only,
        )
        completion: ub_pb2.UbCompletion = await self._call(
            issuer, "bus", "Submit", tx, IO_TIMEOUT_S
        )
        return completion

    async def _write_copy(
        self, issuer: Device, pool: str, replica: Replica, meta: ObjectMeta, data: bytes
    ) -> Timing:
        """One copy, a chunk per transaction (then the chunk table), one after another."""
        timing = Timing()
        if not meta.real:
            done = await self._transfer(
                issuer, ub_pb2.UB_OP_WRITE, pool=pool, replica=replica, size=meta.size,
                size_only=True,
            )  # fmt: skip
            timing.add(done.issue_ns, done.complete_ns)
            return timing
        pieces = [(s, data[s : s + n]) for s, n in spans(meta.size, meta.chunk_bytes or meta.size)]
        if meta.chunked:
            assert meta.crcs is not None
            pieces.append((meta.size, encode_trailer(meta.chunk_bytes, meta.crcs)))
        elapsed = 0
        for offset, piece in pieces:
            done = await self._transfer(
                issuer, ub_pb2.UB_OP_WRITE, pool=pool, replica=replica, size=len(piece),
                offset=offset, data=piece,
            )  # fmt: skip
            timing.issue_ns = timing.issue_ns or done.issue_ns
            elapsed += done.complete_ns - done.issue_ns
        timing.duration_ns = elapsed
        return timing

    async def _place(self, meta: ObjectMeta, pool: str) -> Replica:
        request = device_pb2.AllocateRegionRequest(
            size=_region_size(meta), label=encode_label(meta)
        )
        region = await self._call(self.pools[pool], "device", "AllocateRegion", request)
        return Replica(region_id=region.region_id, offset=region.offset)

    async def _free_region(self, pool: str, region_id: int) -> bool:
        """Give a region back; False when the pool cannot be told now (it is not up)."""
        if self.placement.health[pool] is not Health.UP:
            return False
        try:
            request = device_pb2.FreeRegionRequest(region_id=region_id)
            await self._call(self.pools[pool], "device", "FreeRegion", request)
        except RemoteError as exc:
            return exc.code is grpc.StatusCode.NOT_FOUND  # gone already
        return True

    # --- room ----------------------------------------------------------------------------------

    async def _make_room(self, pool: str, size: int) -> int:
        victims = self.placement.victims(pool, size)
        for victim in victims:
            await self._evict(victim)
        return len(victims)

    async def _evict(self, meta: ObjectMeta) -> None:
        """To SSD when it has room, else out of the store."""
        self.counters.evictions += 1
        data = await self._read_all(meta) if meta.real else b""
        if self.ssd.fits(meta.size):
            await asyncio.to_thread(self.ssd.write, meta, data)
            await self._free_copies(meta)
            meta.tier = Tier.SSD
            log.info("evicted to ssd", key=meta.key, size=meta.size)
        else:
            kept = await self._free_copies(meta)
            self.index.remove(meta.key)
            if kept:  # as an overwrite's: a copy left on a pool away must not come back
                await self._tombstone(meta.key, set(kept), meta.gen)
            log.info("evicted", key=meta.key, size=meta.size)

    async def _read_all(self, meta: ObjectMeta) -> bytes:
        reading = self._reading(meta, None)
        return b"".join([piece async for piece in reading.chunks()])

    async def _free_copies(self, meta: ObjectMeta) -> list[str]:
        """Free every copy; the pools that could not be told (their copies may survive)."""
        kept = []
        for pool, replica in list(meta.replicas.items()):
            self.index.drop_replica(meta, pool)
            if not await self._free_region(pool, replica.region_id):
                kept.append(pool)
        return kept

    async def _abandon(self, staged: Sequence[Staged]) -> None:
        """Puts that failed half way: their reservations and regions go (never indexed)."""
        for s in staged:
            self.placement.reserve(s.targets, -s.meta.size)
        await self._discard(staged)

    async def _discard(self, staged: Sequence[Staged]) -> None:
        """Free the regions of puts that are not to be indexed. A pool that cannot be told now
        (or that did not answer an allocation: it may hold a region nobody heard of) is owed an
        abort marker for that generation, and is suspect until a sweep reconciles it."""
        for s in staged:
            owed = set()
            for pool, replica in s.placed.items():
                if not await self._free_region(pool, replica.region_id):
                    owed.add(pool)
            owed |= {
                p
                for p in s.targets
                if p not in s.placed and self.placement.health[p] is not Health.UP
            }
            if owed:
                for pool in owed:
                    self._suspect(pool)
                await self._abort(s.meta.key, s.meta.gen, owed)

    async def _drop(self, meta: ObjectMeta) -> list[str]:
        kept = await self._free_copies(meta)
        if meta.tier is Tier.SSD:
            await asyncio.to_thread(self.ssd.remove, meta)
        self.index.remove(meta.key)
        return kept

    # --- operations ----------------------------------------------------------------------------

    def _requester(self, device_id: str) -> Device | None:
        return self.topology.device(device_id) if device_id else None

    def prepare(self, meta: ObjectMeta, data: bytes) -> None:
        """Fill in what the bytes imply: the CRC (one chunk) or the chunk table (more)."""
        if not data:
            meta.crc = None
            return
        if len(data) > self.ems.chunk_bytes:
            meta.chunked = True
            meta.chunk_bytes = self.ems.chunk_bytes
            meta.crcs = chunk_crcs(data, meta.chunk_bytes)
            meta.crc = zlib.crc32(encode_trailer(meta.chunk_bytes, meta.crcs))
        else:
            meta.crc = zlib.crc32(data)

    async def put(self, meta: ObjectMeta, data: bytes, device: str = "") -> Stored:
        """Store a new object (checked by the model: see object_size) from `device`'s memory."""
        self._serving()
        (stored,) = await self.put_all([(meta, data, device)])
        return stored

    async def put_all(self, items: Sequence[tuple[ObjectMeta, bytes, str]]) -> list[Stored]:
        """Store objects all or nothing: every copy of every one is written before any is
        indexed, and room for all of them is checked before anything is evicted."""
        self._serving()
        requesters = [self._requester(device) for _, _, device in items]
        for meta, data, _ in items:
            self.prepare(meta, data)
        staged: list[Staged] = []
        async with self.lock:  # placement and room; the copies are written outside the lock
            plans = [(meta, self.placement.targets(meta.key)) for meta, _, _ in items]
            self.placement.check_room([(meta.size, targets) for meta, targets in plans])
            try:
                for meta, targets in plans:
                    await self._stage(meta, targets, staged)
            except Exception:
                await self._abandon(staged)
                raise
        try:
            for s, (_, data, _), requester in zip(staged, items, requesters, strict=True):
                done = await asyncio.gather(
                    *(
                        self._write_copy(requester or self.pools[pool], pool, replica, s.meta, data)
                        for pool, replica in s.placed.items()
                    )
                )
                for t in done:
                    s.timing.add(t.issue_ns, t.complete_ns)
        except Exception:
            async with self.lock:
                await self._abandon(staged)
            raise
        async with self.lock:
            overtaken = []
            for s in staged:
                self.placement.reserve(s.targets, -s.meta.size)
                old = self.index.get(s.meta.key)
                tombstone = self.index.tombstones.get(s.meta.key)
                if (old is not None and old.gen > s.meta.gen) or (
                    tombstone is not None and tombstone.gen >= s.meta.gen
                ):
                    # a newer put (or a delete) of the key committed while this one wrote: the
                    # newest generation wins, here as in a rebuild, so this one came just before
                    overtaken.append(s)
                    continue
                if old is not None:  # the new copies are in: only now let the old ones go
                    kept = await self._drop(old)
                    if kept and old.gen < s.meta.gen:
                        # a copy on a pool that cannot be told now is owed a tombstone at its
                        # generation (not the new one's): a delete before that pool returns
                        # must not find it unowed, and a restart must not take it for live
                        await self._tombstone(s.meta.key, set(kept), old.gen)
                s.meta.replicas.update(s.placed)
                self.index.add(s.meta)
            await self._discard(overtaken)
        return [
            Stored(meta=s.meta, replicas=list(s.placed), timing=s.timing, evicted=s.evicted)
            for s in staged
        ]

    async def _stage(self, meta: ObjectMeta, targets: list[str], staged: list[Staged]) -> None:
        """Room, a reservation and a region on each target (appended to `staged` at once, so
        that a failure part way gives back what it holds)."""
        evicted = 0
        for pool in targets:
            evicted += await self._make_room(pool, meta.size)
        self.placement.reserve(targets, meta.size)
        meta.gen = self.index.next_gen(int(self.clock.clock.wall() * 1e9))
        s = Staged(meta=meta, placed={}, targets=targets, timing=Timing(), evicted=evicted)
        staged.append(s)
        for pool in targets:
            s.placed[pool] = await self._place(meta, pool)

    def _find(self, key: str) -> ObjectMeta:
        check_key(key)
        meta = self.index.get(key)
        if meta is None:
            self.counters.misses += 1
            raise NotFoundError(f"no object {quote(key)}", subject=key, reason="OBJECT_NOT_FOUND")
        return meta

    async def read(self, key: str, device: str = "") -> Reading:
        """Start reading an object as `device`; the bytes come from the Reading's chunks()."""
        self._serving()
        requester = self._requester(device)
        meta = self._find(key)
        self.counters.hits += 1
        if meta.key in self.index.objects:
            self.index.touch(meta.key)
        if meta.tier is Tier.SSD:
            return await self._read_ssd(meta)
        return self._reading(meta, requester)

    async def get(self, key: str, device: str = "", limit: int | None = None) -> Fetched:
        """Read a whole object; one over `limit` bytes of real data goes by read() instead."""
        self._serving()
        reading = await self.read(key, device)
        meta = reading.meta
        if limit is not None and meta.real and meta.size > limit:
            raise PreconditionError(
                f"{quote(key)} has {meta.size} bytes: a Get returns at most {limit}; use GetStream",
                field="key",
                subject=key,
                reason="OBJECT_TOO_LARGE_FOR_GET",
            )
        data = b"".join([piece async for piece in reading.chunks()])
        return Fetched(
            meta=meta,
            data=data,
            served_by=reading.served_by,
            corrupt_copies=reading.corrupt_copies,
            issue_ns=reading.timing.issue_ns,
            complete_ns=reading.timing.complete_ns,
        )

    async def _read_ssd(self, meta: ObjectMeta) -> Reading:
        data = await asyncio.to_thread(self.ssd.read, meta.key)
        if meta.real:
            if meta.chunked:
                good = meta.crcs is not None and chunk_crcs(data, meta.chunk_bytes) == meta.crcs
            else:
                good = zlib.crc32(data) == meta.crc
            if not good:
                self.counters.corrupt += 1
                raise DataLossError(f"the SSD copy of {quote(meta.key)} fails its checksum")
        now = self.clock.now_ns()
        reading = Reading(meta=meta, served_by="ssd")
        reading.timing.add(now, now + ems_ssd_ns(meta.size, self.profile))

        async def one() -> AsyncIterator[bytes]:
            if meta.real:
                yield data

        reading.source = one()
        return reading

    def _reading(self, meta: ObjectMeta, requester: Device | None) -> Reading:
        reading = Reading(meta=meta)
        reading.source = self._copies(meta, requester, reading)
        return reading

    async def _copies(
        self, meta: ObjectMeta, requester: Device | None, reading: Reading
    ) -> AsyncIterator[bytes]:
        """The object's chunks in order, from the first copy that serves each: a copy that is
        unreachable or fails a checksum is left for the next, from the chunk where it failed."""
        plan = self.placement.read_order(meta, requester.node if requester is not None else None)
        unavailable = [f"{p} ({self.placement.health[p]})" for p in plan.down]
        pieces: list[tuple[int, int]] = []  # once the chunk size is known (the table read)
        position = 0  # the next piece to deliver
        elapsed = 0
        for pool, replica in plan.copies:
            issuer = requester or self.pools[pool]
            try:
                if meta.chunked and meta.crcs is None:
                    meta.chunk_bytes, meta.crcs = await self._table(issuer, pool, replica, meta)
                if not pieces:
                    chunked = meta.real and meta.chunked
                    pieces = spans(meta.size, meta.chunk_bytes) if chunked else [(0, meta.size)]
                while position < len(pieces):
                    start, length = pieces[position]
                    done = await self._transfer(
                        issuer, ub_pb2.UB_OP_READ, pool=pool, replica=replica, size=length,
                        offset=start, size_only=not meta.real,
                    )  # fmt: skip
                    if meta.real and zlib.crc32(done.data) != (
                        meta.crcs[position] if meta.crcs is not None else meta.crc
                    ):
                        raise DataLossError(f"chunk {position} of {quote(meta.key)} on {pool}")
                    reading.timing.issue_ns = reading.timing.issue_ns or done.issue_ns
                    elapsed += done.complete_ns - done.issue_ns
                    reading.timing.duration_ns = elapsed
                    reading.served_by = pool
                    position += 1
                    if meta.real:
                        yield done.data
                return
            except RemoteError as exc:
                if exc.code not in UNREACHABLE:
                    raise
                if requester is not None:
                    await self._check_reader(requester, exc)
                unavailable.append(pool)
            except DataLossError:
                reading.corrupt_copies += 1
                self.counters.corrupt += 1
                log.warning("DATA_LOSS on a copy; reading another", key=meta.key, pool=pool)
                if self.index.get(meta.key) is meta:
                    self.index.drop_replica(meta, pool)  # the sweep restores the factor
                    with contextlib.suppress(RemoteError):
                        await self._free_region(pool, replica.region_id)
        if reading.corrupt_copies and not unavailable:
            raise DataLossError(f"every reachable copy of {quote(meta.key)} fails its checksum")
        raise UnavailableError(
            f"no copy of {quote(meta.key)} is reachable: {', '.join(unavailable) or 'none left'}",
            subject=meta.key,
            reason="NO_COPY_REACHABLE",
            retry_after_s=RETRY_AFTER_S,
        )

    async def _table(
        self, issuer: Device, pool: str, replica: Replica, meta: ObjectMeta
    ) -> tuple[int, tuple[int, ...]]:
        """A copy's chunk table, checked. An object rebuilt or adopted from a label does not know
        its chunk size (the label has no room for it): the trailer's head says, read first."""
        chunk_bytes = meta.chunk_bytes
        if not chunk_bytes:
            head = await self._transfer(
                issuer, ub_pb2.UB_OP_READ, pool=pool, replica=replica, size=TRAILER_HEAD_BYTES,
                offset=meta.size,
            )  # fmt: skip
            chunk_bytes = decode_trailer_head(head.data, meta.size)
        done = await self._transfer(
            issuer, ub_pb2.UB_OP_READ, pool=pool, replica=replica,
            size=trailer_bytes(meta.size, chunk_bytes), offset=meta.size,
        )  # fmt: skip
        return decode_trailer(done.data, meta.crc, meta.size)

    async def _check_reader(self, reader: Device, cause: RemoteError) -> None:
        """A read that failed for want of a reachable device: blame the reader when it is the
        one that is down, not the copies."""
        try:
            fault = await self.peers.device_call(
                reader, "GetFaultState", device_pb2.GetFaultStateRequest(), PROBE_TIMEOUT_S
            )
        except RemoteError as exc:
            why = f"unreachable: {exc}"
        else:
            if not fault.faulted:
                return
            why = f"faulted: {quote(fault.reason)}"
        raise UnavailableError(
            f"the reading device {reader.id} is {why}",
            field="device",
            subject=reader.id,
            reason="READER_UNAVAILABLE",
            retry_after_s=RETRY_AFTER_S,
        ) from cause

    async def delete(self, key: str) -> bool:
        self._serving()
        check_key(key)
        (deleted,) = await self.delete_all([key])
        return deleted

    async def delete_all(self, keys: Sequence[str]) -> list[bool]:
        """Delete objects (their keys checked first, all of them). A copy that cannot be freed
        now, or a pool that may hold one unknown to this index, leaves a tombstone."""
        self._serving()
        for key in keys:
            check_key(key)
        out = []
        async with self.lock:
            for key in keys:
                meta = self.index.get(key)
                if meta is None:
                    out.append(False)
                    continue
                owed = set(await self._drop(meta)) | self.unreconciled
                owed |= {p for p, held in self.index.detached.items() if key in held}
                if owed:
                    await self._tombstone(key, owed)
                out.append(True)
        return out

    async def _tombstone(self, key: str, owed: set[str], gen: int | None = None) -> None:
        """Record in regions of the pools that are up, until `owed` are reconciled, that every
        copy of `key` up to `gen` is gone: a delete (a new generation, the default), or the
        version an overwrite replaced (its generation) while a copy of it could not be freed."""
        if gen is None:
            gen = self.index.next_gen(int(self.clock.clock.wall() * 1e9))
        tombstone = self.index.tombstones.setdefault(key, Tombstone(key=key, gen=gen))
        if gen <= tombstone.gen and tombstone.regions and owed <= tombstone.pending:
            return  # already recorded, as new or newer
        gen = tombstone.gen = max(tombstone.gen, gen)
        tombstone.pending |= owed
        await self._record(key, encode_tombstone(key, gen), tombstone.regions)
        log.info("tombstone", key=key, owed=sorted(owed), pools=sorted(tombstone.regions))

    async def _abort(self, key: str, gen: int, owed: set[str]) -> None:
        """Record in regions of the pools that are up, until `owed` are reconciled, that the
        copies of `key` at `gen` (a put that failed, or lost to a newer one) are not the key's:
        the copies `owed` hold could not be freed."""
        marker = self.index.aborted.setdefault((key, gen), Aborted(key=key, gen=gen))
        marker.owed |= owed
        marker.pending |= owed
        await self._record(key, encode_abort(key, gen, marker.owed), marker.regions)
        log.warning(
            "put aborted", key=key, gen=gen, owed=sorted(owed), pools=sorted(marker.regions)
        )

    async def _record(self, key: str, label: str, regions: dict[str, int]) -> None:
        """A one-byte region labelled `label` on each of the key's ring owners that are up
        (`regions`: pool -> region id, each replacing the one it had there)."""
        targets = self.placement.ring.owners(
            key, self.placement.replication_factor, usable=self.placement.usable()
        )
        for pool in targets:
            old = regions.get(pool)
            try:
                request = device_pb2.AllocateRegionRequest(size=1, label=label)
                region = await self._call(self.pools[pool], "device", "AllocateRegion", request)
            except RemoteError:
                log.exception("marker not written", key=key, label=label, pool=pool)
                continue
            regions[pool] = region.region_id
            if old is not None:
                await self._free_region(pool, old)

    async def _expire_tombstones(self) -> None:
        """Tombstones and abort markers no pool owes any more: their regions go."""
        for key, tombstone in list(self.index.tombstones.items()):
            if not tombstone.pending and await self._free_all(tombstone.regions):
                del self.index.tombstones[key]
        for name, marker in list(self.index.aborted.items()):
            if not marker.pending and await self._free_all(marker.regions):
                del self.index.aborted[name]

    async def _free_all(self, regions: dict[str, int]) -> bool:
        """Free the regions (pool -> region id) that can be; True when none is left."""
        for pool, region_id in list(regions.items()):
            if await self._free_region(pool, region_id):
                del regions[pool]
        return not regions

    def lookup(self, key: str) -> ObjectMeta | None:
        self._serving()
        check_key(key)
        return self.index.get(key)

    def keys_for(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        self._serving()
        check_block_tokens(block_tokens, self.ems.block_tokens_min, self.ems.block_tokens_max)
        return prefix_keys(tokens, block_tokens, namespace)

    def match(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        """The keys of the longest stored prefix of `tokens` (each counts as a use)."""
        self._serving()
        matched = []
        for key in self.keys_for(tokens, block_tokens, namespace):
            if key not in self.index.objects:
                break
            self.index.touch(key)
            matched.append(key)
        return matched

    def listing(self, prefix: str, page_size: int, token: str) -> Page:
        self._serving()
        return self.index.page(prefix=prefix, page_size=page_size, token=token)

    def stats(self, pool: str) -> StoreStats:
        return summarize(
            self.placement,
            self.counters,
            ssd_used_bytes=self.ssd.used,
            ssd_capacity_bytes=self.ssd.capacity,
            pool_filter=pool,
        )

    # --- rebuild, health, reconciling, re-replication -------------------------------------------

    async def _list(self, pool: Device) -> list[Listed] | None:
        """Every region of a pool, page by page; None when the pool does not answer."""
        listed: list[Listed] = []
        token = ""
        while True:
            try:
                found = await self.peers.device_call(
                    pool,
                    "ListRegions",
                    device_pb2.ListRegionsRequest(page_token=token),
                    PROBE_TIMEOUT_S * 5,
                )
            except RemoteError:
                return None
            listed += [Listed(r.region_id, r.offset, r.label) for r in found.regions]
            token = found.next_page_token
            if not token:
                return listed

    async def rebuild(self, wait_s: float = 60.0) -> None:
        """The index from the pools' region labels and the SSD tier's files. Pools that do not
        answer are asked again every REBUILD_POLL_S of emulated time for up to wait_s wall
        seconds (they may still be starting: processes start in wall time), then counted down
        and left to the sweep to reconcile when they answer. Until it ends the store is
        `recovering`: calls about keys answer UNAVAILABLE RECOVERING, and a pool not yet listed
        is not healthy (Stat says so)."""
        self.recovering = True
        try:
            await self._rebuild(wait_s)
        finally:
            self.recovering = False

    async def _rebuild(self, wait_s: float) -> None:
        listings = await self._list_all(wait_s)
        self.unreconciled = set(self.pools) - set(listings)
        async with self.lock:
            for meta in await asyncio.to_thread(self.ssd.load):  # SSD first: its copies win ties
                self.index.seen(meta.gen)
                if meta.key not in self.index.objects:
                    self.index.add(meta)
            for pool_id, listed in listings.items():
                redundant = absorb_tombstones(self.index, pool_id, listed, self.unreconciled)
                redundant += absorb_aborts(self.index, pool_id, listed, self.unreconciled)
                for region_id in redundant:
                    await self._free_region(pool_id, region_id)
            for pool_id, listed in listings.items():
                await self._apply(pool_id, listed)
            for meta in [m for m in self.index.objects.values() if m.tier is Tier.SSD]:
                tombstone = self.index.tombstones.get(meta.key)
                if tombstone is not None and tombstone.gen >= meta.gen:
                    await self._drop(meta)
            await self._expire_tombstones()
        log.info("index rebuilt", objects=len(self.index), ssd=self.ssd.used)

    async def _list_all(self, wait_s: float) -> dict[str, list[Listed]]:
        listings: dict[str, list[Listed]] = {}
        pending = list(self.pools.values())
        self.listed.clear()
        now = self.clock.now_ns()
        for pool in pending:  # unknown until it answers: not healthy meanwhile
            self.placement.suspect(pool.id, now)
        deadline = self.clock.clock.wall() + wait_s
        while pending:
            results = await asyncio.gather(*(self._list(p) for p in pending))
            for pool, found in zip(pending, results, strict=True):
                if found is not None:
                    listings[pool.id] = found
                    self.listed.add(pool.id)
                    self.placement.mark(pool.id, healthy=True)
            pending = [p for p, found in zip(pending, results, strict=True) if found is None]
            if pending and self.clock.clock.wall() >= deadline:
                for pool in pending:
                    self._suspect(pool.id)
                break
            if pending:
                await asyncio.sleep(self._pause_s(REBUILD_POLL_S))
        return listings

    async def _apply(self, pool: str, listed: list[Listed]) -> None:
        """Reconcile one pool's listing with the index and free what it says to. The pool is
        settled (owes tombstones and abort markers nothing) only once all of that is freed: a
        pool that lists but does not free (faulted) stays owed, suspect and unreconciled."""
        done = reconcile(
            self.index, pool, listed, self.placement.replication_factor, self.unreconciled
        )
        kept = [r for r in done.free if not await self._free_region(pool, r)]
        if kept:
            self.index.owe(pool)
            self.unreconciled.add(pool)
            self._suspect(pool)
            log.warning("pool not reconciled: regions not freed", pool=pool, kept=len(kept))
        else:
            self.index.settle(pool)
            self.unreconciled.discard(pool)
        for old in done.superseded:
            for other, replica in old.replicas.items():
                await self._free_region(other, replica.region_id)
            if old.tier is Tier.SSD:
                await asyncio.to_thread(self.ssd.remove, old)
        if done.free or done.superseded or done.adopted or done.attached or done.gone:
            log.info(
                "pool reconciled",
                pool=pool,
                freed=len(done.free),
                adopted=done.adopted,
                attached=done.attached,
                gone=done.gone,
            )

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
                    pool, "GetFaultState", device_pb2.GetFaultStateRequest(), PROBE_TIMEOUT_S
                )
            except RemoteError:
                return pool.id, False
            return pool.id, not fault.faulted

        now = self.clock.now_ns()
        returned = []
        for pool_id, up in await asyncio.gather(*(probe(p) for p in self.pools.values())):
            changed = self.placement.observe(pool_id, answered=up, now_ns=now)
            if changed is not None:
                log.warning(f"pool {changed}", pool=pool_id)
            if up and (changed is Health.UP or pool_id in self.unreconciled):
                returned.append(pool_id)
        async with self.lock:
            for pool_id in returned:  # back: what it holds against what the index says
                listed = await self._list(self.pools[pool_id])
                if listed is not None:
                    try:
                        await self._apply(pool_id, listed)
                    except Exception:  # a bug here must not stop the repairs below
                        log.exception("reconcile failed", pool=pool_id)
            await self._expire_tombstones()
            for meta in self.placement.to_repair():
                if not self.placement.needs_repair(meta):
                    continue  # evicted to make room for an earlier repair
                try:
                    await self._repair(meta)
                except EmulatorError:
                    pass  # unreachable or out of room now: the next sweep tries again
                except Exception:  # one object's bug must not stop the others' repairs
                    log.exception("repair failed", key=meta.key)

    async def _repair(self, meta: ObjectMeta) -> None:
        plan = self.placement.repair_plan(meta)
        if plan.source is None:
            if not self.placement.kept(meta):
                log.error("object lost: no live copy", key=meta.key)
            return
        data = await self._read_all(meta) if meta.real else b""
        source = self.pools[plan.source]
        for pool in plan.targets:
            await self._make_room(pool, meta.size)
            replica = await self._place(meta, pool)
            await self._write_copy(source, pool, replica, meta, data)
            self.index.add_replica(meta, pool, replica)
            log.info("re-replicated", key=meta.key, source=source.id, copy=pool)
        if len(self.placement.kept(meta)) >= self.placement.wanted():
            for dead in plan.dead:  # replaced: forgotten, and owed a tombstone if deleted
                self.index.drop_replica(meta, dead)
                self.index.detached.setdefault(dead, set()).add(meta.key)
