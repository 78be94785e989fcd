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

The parts, one module each, share `Store` (store.py: the state and the way to a pool): the write
path (writes.py), the read path (reads.py), tombstones and abort markers (markers.py), the
rebuild and the sweep (recovery.py), and the SSD tier (ssd.py). `EmsState` joins them for the
servicer (services/ems.py, which only translates protobuf and maps errors) and answers the
index queries itself; local.py hands it to the serving and training engines of its process.
Pools and devices are reached through their typed peers (`Devices`), so the store is
wire-free: domain types in and out, EmulatorErrors whichever process a pool is in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.ems.markers import Markers
from cmemu.emulator.engines.ems.reads import Fetched, Reading, Reads
from cmemu.emulator.engines.ems.recovery import Recovery
from cmemu.emulator.engines.ems.store import Devices, Store, log
from cmemu.emulator.engines.ems.writes import Stored, Writes
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.outage import Outage
from cmemu.emulator.model.ems import (
    KV_BLOCK,
    ObjectMeta,
    Page,
    StoreStats,
    Tier,
    check_block_tokens,
    check_key,
    check_kind,
    object_size,
    prefix_keys,
    summarize,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology

__all__ = ["Devices", "EmsState", "Fetched", "Reading", "Stored"]


class EmsState(Store):
    """The store as the servicer and the runtime see it (its shared state is `Store`'s)."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Devices,
        ssd_dir: Path,
        events: EventSink | None = None,
    ) -> None:
        super().__init__(
            topology=topology,
            profile=profile,
            clock=clock,
            peers=peers,
            ssd_dir=ssd_dir,
            events=events,
        )
        self.markers = Markers(self)
        self.reads = Reads(self)
        self.writes = Writes(self, self.markers, self.reads)
        self.recovery = Recovery(self, self.markers, self.writes, self.reads)
        # its service down, as the callers of this process meet it (engines/ems/local.py)
        self.outage = Outage("ems", "EMS_DOWN")

    # --- writes --------------------------------------------------------------------------------

    def new_object(
        self,
        key: str,
        data_bytes: int,
        *,
        size: int,
        kind: int,
        device: str,
        pinned: bool = False,
        streamed: bool = False,
    ) -> ObjectMeta:
        """A put's object, checked whole before anything is stored: its key, kind (0: a KV
        block), issuing device and size (`data_bytes` real bytes, or `size` alone). The one
        check of the servicer and of the in-process peer (engines/ems/local.py)."""
        check_key(key)
        check_kind(kind)
        if device:
            self.topology.device(device)
        return ObjectMeta(
            key=key,
            kind=kind or KV_BLOCK,
            size=object_size(data_bytes, size, self.ems, streamed=streamed),
            crc=None,
            pinned=pinned,
        )

    def prepare(self, meta: ObjectMeta, data: bytes) -> None:
        self.writes.prepare(meta, data)

    async def put(self, meta: ObjectMeta, data: bytes, device: str = "") -> Stored:
        """Store a new object (checked by the model: see object_size) from `device`'s memory."""
        self.serving()
        (stored,) = await self.writes.put_all([(meta, data, device)])
        return stored

    async def put_all(self, items: Sequence[tuple[ObjectMeta, bytes, str]]) -> list[Stored]:
        return await self.writes.put_all(items)

    async def delete(self, key: str) -> bool:
        self.serving()
        check_key(key)
        (deleted,) = await self.writes.delete_all([key])
        return deleted

    async def delete_all(self, keys: Sequence[str]) -> list[bool]:
        return await self.writes.delete_all(keys)

    # --- reads ---------------------------------------------------------------------------------

    # the read path's coroutines themselves, not one more around each
    def read(self, key: str, device: str = "") -> Coroutine[Any, Any, Reading]:
        return self.reads.read(key, device)

    def get(
        self, key: str, device: str = "", limit: int | None = None
    ) -> Coroutine[Any, Any, Fetched]:
        return self.reads.get(key, device, limit)

    def lookup(self, key: str) -> ObjectMeta | None:
        self.serving()
        check_key(key)
        return self.index.get(key)

    def keys_for(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        self.serving()
        check_block_tokens(block_tokens, self.ems.block_tokens_min, self.ems.block_tokens_max)
        return prefix_keys(tokens, block_tokens, namespace)

    def match(self, tokens: list[int], block_tokens: int, namespace: str) -> list[str]:
        """The keys of the longest stored prefix of `tokens` (each counts as a use)."""
        self.serving()
        matched = []
        for key in self.keys_for(tokens, block_tokens, namespace):
            if key not in self.index.objects:
                break
            self.index.touch(key)
            matched.append(key)
        return matched

    def listing(self, prefix: str, page_size: int, token: str) -> Page:
        self.serving()
        return self.index.page(prefix=prefix, page_size=page_size, token=token)

    def stats(self, pool: str) -> StoreStats:
        return summarize(
            self.placement,
            self.counters,
            ssd_used_bytes=self.ssd.used,
            ssd_capacity_bytes=self.ssd.capacity,
            pool_filter=pool,
        )

    # --- the SSD tier as a fault target (ssd-loss) --------------------------------------------

    async def lose_ssd(self) -> int:
        """The SSD tier's drives fail: the objects only it held are gone from the store (a get
        finds none: NOT_FOUND), and until `replace_ssd()` evictions drop objects instead of
        demoting them. The objects lost."""
        async with self.lock:
            held = [m for m in self.index.objects.values() if m.tier is Tier.SSD]
            for meta in held:
                self.index.remove(meta.key)
            await asyncio.to_thread(self.ssd.lose)
        self.counters.ssd_lost += len(held)
        lost_bytes = sum(m.size for m in held)
        log.warning("ssd tier lost", objects=len(held), bytes=lost_bytes)
        self.publish("ssd-lost", objects=len(held), bytes=lost_bytes)
        return len(held)

    def replace_ssd(self) -> None:
        """New, empty drives: evictions demote to SSD again."""
        self.ssd.replace()
        log.warning("ssd tier replaced")
        self.publish("ssd-replaced")

    # --- recovery ------------------------------------------------------------------------------

    async def rebuild(self, wait_s: float = 60.0) -> None:
        await self.recovery.rebuild(wait_s)

    async def run(self) -> None:
        await self.recovery.run()

    async def close(self) -> None:
        await self.recovery.close()

    async def sweep(self) -> None:
        await self.recovery.sweep()
