"""Tombstones and abort markers: what the store writes into the pools, as one-byte labelled
regions, so that a pool that comes back (or an EMS that restarts) cannot take a copy it missed the
end of for a live one. A tombstone says every copy of a key up to a generation is gone (a delete,
or the version an overwrite or eviction replaced); an abort marker says the copies of one
generation are not the key's (a put that failed, or lost to a newer one). Each is kept until every
pool it is owed to has been reconciled.
"""

from __future__ import annotations

from cmemu.emulator.engines.ems.store import Store, log
from cmemu.emulator.model.ems import Aborted, Tombstone, encode_abort, encode_tombstone
from cmemu.emulator.model.errors import EmulatorError


class Markers:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def tombstone(self, key: str, owed: set[str], gen: int | None = None) -> None:
        """Record in regions of the pools that are up, until `owed` are reconciled, that every
        copy of `key` up to `gen` is gone: a delete (a new generation, the default), or the
        version an overwrite replaced (its generation) while a copy of it could not be freed."""
        index = self.store.index
        if gen is None:
            gen = self.store.new_gen()
        tombstone = index.tombstones.setdefault(key, Tombstone(key=key, gen=gen))
        if gen <= tombstone.gen and tombstone.regions and owed <= tombstone.pending:
            return  # already recorded, as new or newer
        gen = tombstone.gen = max(tombstone.gen, gen)
        tombstone.pending |= owed
        await self._record(key, encode_tombstone(key, gen), tombstone.regions)
        log.info("tombstone", key=key, owed=sorted(owed), pools=sorted(tombstone.regions))

    async def abort(self, key: str, gen: int, owed: set[str]) -> None:
        """Record in regions of the pools that are up, until `owed` are reconciled, that the
        copies of `key` at `gen` (a put that failed, or lost to a newer one) are not the key's:
        the copies `owed` hold could not be freed."""
        marker = self.store.index.aborted.setdefault((key, gen), Aborted(key=key, gen=gen))
        marker.owed |= owed
        marker.pending |= owed
        await self._record(key, encode_abort(key, gen, marker.owed), marker.regions)
        log.warning(
            "put aborted", key=key, gen=gen, owed=sorted(owed), pools=sorted(marker.regions)
        )

    async def _record(self, key: str, label: str, regions: dict[str, int]) -> None:
        """A one-byte region labelled `label` on each of the key's ring owners that are up
        (`regions`: pool -> region id, each replacing the one it had there)."""
        placement = self.store.placement
        targets = placement.ring.owners(key, placement.replication_factor, usable=placement.up())
        for pool in targets:
            old = regions.get(pool)
            try:
                region = await self.store.allocate(pool, 1, label)
            except EmulatorError:
                log.exception("marker not written", key=key, label=label, pool=pool)
                continue
            regions[pool] = region.region_id
            if old is not None:
                await self.store.free_region(pool, old)

    async def expire(self) -> None:
        """Tombstones and abort markers no pool owes any more: their regions go."""
        index = self.store.index
        for key, tombstone in list(index.tombstones.items()):
            if not tombstone.pending and await self.store.free_all(tombstone.regions):
                del index.tombstones[key]
        for name, marker in list(index.aborted.items()):
            if not marker.pending and await self.store.free_all(marker.regions):
                del index.aborted[name]
