"""How the store recovers: the index rebuilt from the pools' region labels and the SSD tier at a
start, and the background sweep, every check interval of emulated time, that probes the pools
(suspect after missed sweeps, dead past the threshold), reconciles a pool that answers again
with the index, and restores the replication factor of what lost copies.
"""

from __future__ import annotations

import asyncio
import contextlib

from cmemu.emulator.engines.ems.markers import Markers
from cmemu.emulator.engines.ems.reads import Reads
from cmemu.emulator.engines.ems.store import MIN_PAUSE_S, Store, log
from cmemu.emulator.engines.ems.writes import Writes
from cmemu.emulator.model.ems import (
    REBUILD_POLL_S,
    Health,
    Listed,
    ObjectMeta,
    Tier,
    absorb_aborts,
    absorb_tombstones,
    reconcile,
)
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.topology import Device


class Recovery:
    def __init__(self, store: Store, markers: Markers, writes: Writes, reads: Reads) -> None:
        self.store = store
        self.markers = markers
        self.writes = writes
        self.reads = reads
        self._closing = asyncio.Event()

    # --- rebuild -------------------------------------------------------------------------------

    async def rebuild(self, wait_s: float = 60.0) -> None:
        """The index from the pools' region labels and the SSD tier's files. Pools that do not
        answer are asked again every REBUILD_POLL_S of emulated time for up to wait_s wall
        seconds (wall, not emulated: they may still be starting, and a process's start is the
        host's work, which emulated time does not count), then counted down
        and left to the sweep to reconcile when they answer. Until it ends the store is
        `recovering`: calls about keys answer UNAVAILABLE RECOVERING, and a pool not yet listed
        is not healthy (Stat says so)."""
        self.store.recovering = True
        try:
            await self._rebuild(wait_s)
        finally:
            self.store.recovering = False

    async def _rebuild(self, wait_s: float) -> None:
        store = self.store
        listings = await self._list_all(wait_s)
        store.unreconciled = set(store.pools) - set(listings)
        index = store.index
        async with store.lock:
            for meta in await asyncio.to_thread(store.ssd.load):  # SSD first: its copies win ties
                index.seen(meta.gen)
                if meta.key not in index.objects:
                    index.add(meta)
            for pool_id, listed in listings.items():
                redundant = absorb_tombstones(index, pool_id, listed, store.unreconciled)
                redundant += absorb_aborts(index, pool_id, listed, store.unreconciled)
                for region_id in redundant:
                    await store.free_region(pool_id, region_id)
            for pool_id, listed in listings.items():
                await self._apply(pool_id, listed)
            for meta in [m for m in index.objects.values() if m.tier is Tier.SSD]:
                tombstone = index.tombstones.get(meta.key)
                if tombstone is not None and tombstone.gen >= meta.gen:
                    await self.writes.drop(meta)
            await self.markers.expire()
        log.info("index rebuilt", objects=len(index), ssd=store.ssd.used)

    async def _list_all(self, wait_s: float) -> dict[str, list[Listed]]:
        store = self.store
        listings: dict[str, list[Listed]] = {}
        pending = list(store.pools.values())
        store.listed.clear()
        now = store.clock.now_ns()
        for pool in pending:  # unknown until it answers: not healthy meanwhile
            store.placement.suspect(pool.id, now)
        deadline = store.clock.clock.wall() + wait_s
        while pending:
            results = await asyncio.gather(*(store.list_regions(p) for p in pending))
            for pool, found in zip(pending, results, strict=True):
                if found is not None:
                    listings[pool.id] = found
                    store.listed.add(pool.id)
                    store.placement.mark(pool.id, healthy=True)
            pending = [p for p, found in zip(pending, results, strict=True) if found is None]
            if pending and store.clock.clock.wall() >= deadline:
                for pool in pending:
                    store.suspect(pool.id)
                break
            if pending:
                await asyncio.sleep(store.pause_s(REBUILD_POLL_S))
        return listings

    async def _apply(self, pool: str, listed: list[Listed]) -> None:
        """Reconcile one pool's listing with the index and free what it says to. The pool is
        settled (owes tombstones and abort markers nothing) only once all of that is freed: a
        pool that lists but does not free (faulted) stays owed, suspect and unreconciled."""
        store = self.store
        done = reconcile(
            store.index, pool, listed, store.placement.replication_factor, store.unreconciled
        )
        kept = [r for r in done.free if not await store.free_region(pool, r)]
        if kept:
            store.index.owe(pool)
            store.unreconciled.add(pool)
            store.suspect(pool)
            log.warning("pool not reconciled: regions not freed", pool=pool, kept=len(kept))
        else:
            store.index.settle(pool)
            store.unreconciled.discard(pool)
        for old in done.superseded:
            for other, replica in old.replicas.items():
                await store.free_region(other, replica.region_id)
            if old.tier is Tier.SSD:
                await asyncio.to_thread(store.ssd.remove, old)
        if done.free or done.superseded or done.adopted or done.attached or done.gone:
            log.info(
                "pool reconciled",
                pool=pool,
                freed=len(done.free),
                adopted=done.adopted,
                attached=done.attached,
                gone=done.gone,
            )

    # --- the sweep -----------------------------------------------------------------------------

    async def run(self) -> None:
        """The sweep, a task of its host's TaskGroup until close(): pool health, then the
        replication factor, every check interval of emulated time."""
        while not await self._closed_within(self.store.ems.check_interval_s):
            try:
                await self.sweep()
            except Exception:  # a bug in one sweep must not stop the next, nor the process
                log.exception("sweep failed")

    async def _closed_within(self, emulated_s: float) -> bool:
        """Whether close() came within `emulated_s` of emulated time, and MIN_PAUSE_S of wall
        time (at a fast time scale a check interval is a fraction of a wall millisecond: the
        sweeps would run back to back). Emulated, not the wall time the interval took at the
        rate of its start: a clock slowed meanwhile would bring the sweeps early in emulated
        time."""
        clock = self.store.clock
        due_ns = clock.now_ns() + round(emulated_s * 1e9)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(MIN_PAUSE_S):  # the wall floor first
                await self._closing.wait()
        return await clock.wait(self._closing, due_ns)

    async def close(self) -> None:
        """End the sweep loop (after the sweep in progress, if any)."""
        self._closing.set()

    async def sweep(self) -> None:
        store = self.store

        async def probe(pool: Device) -> tuple[str, bool]:
            """Up means reachable and not faulted: what its health says, without a health RPC
            per pool per sweep when the pool shares this process."""
            try:
                fault = await store.fault_state(pool)
            except EmulatorError:
                return pool.id, False
            return pool.id, not fault.faulted

        now = store.clock.now_ns()
        returned = []
        for pool_id, up in await asyncio.gather(*(probe(p) for p in store.pools.values())):
            changed = store.placement.observe(pool_id, answered=up, now_ns=now)
            if changed is not None:
                log.warning(f"pool {changed}", pool=pool_id)
            if up and (changed is Health.UP or pool_id in store.unreconciled):
                returned.append(pool_id)
        async with store.lock:
            for pool_id in returned:  # back: what it holds against what the index says
                listed = await store.list_regions(store.pools[pool_id])
                if listed is not None:
                    try:
                        await self._apply(pool_id, listed)
                    except Exception:  # a bug here must not stop the repairs below
                        log.exception("reconcile failed", pool=pool_id)
            await self.markers.expire()
            for meta in store.placement.to_repair():
                if not store.placement.needs_repair(meta):
                    continue  # evicted to make room for an earlier repair
                try:
                    await self.repair(meta)
                except EmulatorError:
                    pass  # unreachable or out of room now: the next sweep tries again
                except Exception:  # one object's bug must not stop the others' repairs
                    log.exception("repair failed", key=meta.key)

    async def repair(self, meta: ObjectMeta) -> None:
        """Copies of `meta` on live pools until it has its replication factor again; the dead
        pools' copies are then forgotten (and owed a tombstone if it is deleted)."""
        store = self.store
        plan = store.placement.repair_plan(meta)
        if plan.source is None:
            if not store.placement.kept(meta):
                log.error("object lost: no live copy", key=meta.key)
            return
        data = await self.reads.read_all(meta) if meta.real else b""
        source = store.pools[plan.source]
        for pool in plan.targets:
            await self.writes.make_room(pool, meta.size)
            replica = await store.place(meta, pool)
            await store.write_copy(source, pool, replica, meta, data)
            store.index.add_replica(meta, pool, replica)
            log.info("re-replicated", key=meta.key, source=source.id, copy=pool)
        if len(store.placement.kept(meta)) >= store.placement.wanted():
            for dead in plan.dead:  # replaced: forgotten, and owed a tombstone if deleted
                store.index.drop_replica(meta, dead)
                store.index.detached.setdefault(dead, set()).add(meta.key)
