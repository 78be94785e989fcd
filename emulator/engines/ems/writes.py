"""The store's write path: puts all or nothing (every copy of every object written before any is
indexed, and room for all checked before anything is evicted), the room they make (eviction to
SSD, or out of the store), and deletes. A copy that cannot be freed is owed a tombstone or an
abort marker (markers.py); the newest generation of a key wins, here as in a rebuild.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from cmemu.emulator.engines.eager import gather_eager
from cmemu.emulator.engines.ems.markers import Markers
from cmemu.emulator.engines.ems.reads import Reads
from cmemu.emulator.engines.ems.store import Store, log
from cmemu.emulator.model.ems import (
    Health,
    ObjectMeta,
    Replica,
    Tier,
    Timing,
    check_key,
    chunk_crcs,
    encode_label,
    encode_trailer,
)


@dataclass(frozen=True, kw_only=True)
class Stored:
    """An object written to EMS: where its copies went, when, and what it evicted."""

    meta: ObjectMeta
    replicas: list[str]
    timing: Timing
    evicted: int


@dataclass(kw_only=True)
class Staged:
    """A put whose copies are written but not yet indexed (nor the old version dropped)."""

    meta: ObjectMeta
    placed: dict[str, Replica]
    targets: list[str]
    timing: Timing
    evicted: int


class Writes:
    def __init__(self, store: Store, markers: Markers, reads: Reads) -> None:
        self.store = store
        self.markers = markers
        self.reads = reads

    def prepare(self, meta: ObjectMeta, data: bytes) -> None:
        """Fill in what the bytes imply: the CRC (one chunk) or the chunk table (more)."""
        if not data:
            meta.crc = None
            return
        chunk_bytes = self.store.ems.chunk_bytes
        if len(data) > chunk_bytes:
            meta.chunked = True
            meta.chunk_bytes = chunk_bytes
            meta.crcs = chunk_crcs(data, meta.chunk_bytes)
            meta.crc = zlib.crc32(encode_trailer(meta.chunk_bytes, meta.crcs))
        else:
            meta.crc = zlib.crc32(data)

    async def put_all(self, items: Sequence[tuple[ObjectMeta, bytes, str]]) -> list[Stored]:
        """Store objects all or nothing: every copy of every one is written before any is
        indexed, and room for all of them is checked before anything is evicted."""
        store = self.store
        store.serving()
        requesters = [store.requester(device) for _, _, device in items]
        for meta, data, _ in items:
            self.prepare(meta, data)
        staged: list[Staged] = []
        async with store.lock:  # placement and room; the copies are written outside the lock
            plans = [(meta, store.placement.targets(meta.key)) for meta, _, _ in items]
            store.placement.check_room([(meta.size, targets) for meta, targets in plans])
            try:
                for meta, targets in plans:
                    await self._stage(meta, targets, staged)
            except Exception:
                await self._abandon(staged)
                raise
        try:
            for s, (_, data, _), requester in zip(staged, items, requesters, strict=True):
                copies = s.placed.items()
                done = await gather_eager(
                    [
                        store.write_copy(requester or store.pools[p], p, replica, s.meta, data)
                        for p, replica in copies
                    ]
                )
                for t in done:
                    s.timing.add(t.issue_ns, t.complete_ns)
        except Exception:
            async with store.lock:
                await self._abandon(staged)
            raise
        async with store.lock:
            await self._commit(staged)
        return [
            Stored(meta=s.meta, replicas=list(s.placed), timing=s.timing, evicted=s.evicted)
            for s in staged
        ]

    async def _commit(self, staged: Sequence[Staged]) -> None:
        """Index the written puts (under the lock), each replacing the version it overwrites,
        unless a newer put or a delete of its key committed meanwhile."""
        index = self.store.index
        overtaken = []
        for s in staged:
            self.store.placement.reserve(s.targets, -s.meta.size)
            old = index.get(s.meta.key)
            tombstone = index.tombstones.get(s.meta.key)
            if (old is not None and old.gen > s.meta.gen) or (
                tombstone is not None and tombstone.gen >= s.meta.gen
            ):
                # a newer put (or a delete) of the key committed while this one wrote: the
                # newest generation wins, here as in a rebuild, so this one came just before
                overtaken.append(s)
                continue
            if old is not None:  # the new copies are in: only now let the old ones go
                kept = await self.drop(old)
                if kept and old.gen < s.meta.gen:
                    # a copy on a pool that cannot be told now is owed a tombstone at its
                    # generation (not the new one's): a delete before that pool returns
                    # must not find it unowed, and a restart must not take it for live
                    await self.markers.tombstone(s.meta.key, set(kept), old.gen)
            s.meta.replicas.update(s.placed)
            index.add(s.meta)
        await self._discard(overtaken)

    async def _stage(self, meta: ObjectMeta, targets: list[str], staged: list[Staged]) -> None:
        """Room, a reservation and a region on each target (appended to `staged` at once, so
        that a failure part way gives back what it holds)."""
        evicted = 0
        for pool in targets:
            evicted += await self.make_room(pool, meta.size)
        self.store.placement.reserve(targets, meta.size)
        meta.gen = self.store.new_gen()
        s = Staged(meta=meta, placed={}, targets=targets, timing=Timing(), evicted=evicted)
        staged.append(s)
        label = encode_label(meta)  # every copy's region carries the same
        for pool in targets:
            s.placed[pool] = await self.store.place(meta, pool, label)

    # --- room ----------------------------------------------------------------------------------

    async def make_room(self, pool: str, size: int) -> int:
        victims = self.store.placement.victims(pool, size)
        for victim in victims:
            await self._evict(victim)
        return len(victims)

    async def _evict(self, meta: ObjectMeta) -> None:
        """To SSD when it has room, else out of the store."""
        store = self.store
        store.counters.evictions += 1
        data = await self.reads.read_all(meta) if meta.real else b""
        if store.ssd.fits(meta.size):
            await asyncio.to_thread(store.ssd.write, meta, data)
            await self._free_copies(meta)
            meta.tier = Tier.SSD
            log.info("evicted to ssd", key=meta.key, size=meta.size)
        else:
            kept = await self._free_copies(meta)
            store.index.remove(meta.key)
            if kept:  # as an overwrite's: a copy left on a pool away must not come back
                await self.markers.tombstone(meta.key, set(kept), meta.gen)
            log.info("evicted", key=meta.key, size=meta.size)

    async def _free_copies(self, meta: ObjectMeta) -> list[str]:
        """Free every copy; the pools that could not be told (their copies may survive)."""
        kept = []
        for pool, replica in list(meta.replicas.items()):
            self.store.index.drop_replica(meta, pool)
            if not await self.store.free_region(pool, replica.region_id):
                kept.append(pool)
        return kept

    async def _abandon(self, staged: Sequence[Staged]) -> None:
        """Puts that failed half way: their reservations and regions go (never indexed)."""
        for s in staged:
            self.store.placement.reserve(s.targets, -s.meta.size)
        await self._discard(staged)

    async def _discard(self, staged: Sequence[Staged]) -> None:
        """Free the regions of puts that are not to be indexed. A pool that cannot be told now
        (or that did not answer an allocation: it may hold a region nobody heard of) is owed an
        abort marker for that generation, and is suspect until a sweep reconciles it."""
        health = self.store.placement.health
        for s in staged:
            owed = set()
            for pool, replica in s.placed.items():
                if not await self.store.free_region(pool, replica.region_id):
                    owed.add(pool)
            owed |= {p for p in s.targets if p not in s.placed and health[p] is not Health.UP}
            if owed:
                for pool in owed:
                    self.store.suspect(pool)
                await self.markers.abort(s.meta.key, s.meta.gen, owed)

    async def drop(self, meta: ObjectMeta) -> list[str]:
        """An object out of the store: the pools whose copies could not be freed."""
        kept = await self._free_copies(meta)
        if meta.tier is Tier.SSD:
            await asyncio.to_thread(self.store.ssd.remove, meta)
        self.store.index.remove(meta.key)
        return kept

    # --- deletes -------------------------------------------------------------------------------

    async def delete_all(self, keys: Sequence[str]) -> list[bool]:
        """Delete objects (their keys checked first, all of them). A copy that cannot be freed
        now, or a pool that may hold one unknown to this index, leaves a tombstone."""
        store = self.store
        store.serving()
        for key in keys:
            check_key(key)
        out = []
        async with store.lock:
            for key in keys:
                meta = store.index.get(key)
                if meta is None:
                    out.append(False)
                    continue
                owed = set(await self.drop(meta)) | store.unreconciled
                owed |= {p for p, held in store.index.detached.items() if key in held}
                if owed:
                    await self.markers.tombstone(key, owed)
                out.append(True)
        return out
