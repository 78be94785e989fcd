"""What a pool's regions say against what the index believes: after a restart (every pool) and
when a pool that was suspect or dead answers again (that pool). The newest generation of a key
wins; a tombstone at least as new as a copy deletes it; a copy of a generation an abort marker
names (a put that failed) is freed, and only that generation; a copy the index knows is
re-attached while the object has fewer copies than the factor, else freed; an unknown or newer
copy is adopted; an indexed copy that the pool's listing lacks is proven gone. The pool owes the
tombstones and markers nothing once the regions it was told to free are freed (Index.settle)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from cmemu.emulator.model.ems.index import (
    Index,
    ObjectMeta,
    Replica,
    Tier,
    Tombstone,
    decode_abort,
    decode_label,
    decode_tombstone,
)


@dataclass(frozen=True)
class Listed:
    """One region a pool listed."""

    region_id: int
    offset: int
    label: str


@dataclass
class Reconciled:
    """What reconciling a pool's regions with the index found: what to free, adopt and drop."""

    free: list[int] = field(default_factory=list)  # this pool's regions to give back
    superseded: list[ObjectMeta] = field(default_factory=list)  # indexed, replaced by newer
    adopted: int = 0
    attached: int = 0
    gone: int = 0  # indexed copies the pool no longer has


def absorb_tombstones(
    index: Index, pool: str, listed: list[Listed], pending: set[str]
) -> list[int]:
    """Learn the tombstones a pool holds (each may still be owed by the pools in `pending`);
    returns tombstone regions made redundant by a newer tombstone of the same key there."""
    redundant = []
    for region in listed:
        found = decode_tombstone(region.label)
        if found is None:
            continue
        index.seen(found.gen)
        known = index.tombstones.setdefault(found.key, Tombstone(key=found.key, gen=found.gen))
        known.gen = max(known.gen, found.gen)
        if pool in known.regions and known.regions[pool] != region.region_id:
            redundant.append(region.region_id)
        else:
            known.regions[pool] = region.region_id
        known.pending |= pending
    return redundant


def absorb_aborts(index: Index, pool: str, listed: list[Listed], pending: set[str]) -> list[int]:
    """Learn the abort markers a pool holds (each still owed by the pools its label lists that
    are in `pending`); returns marker regions made redundant by another of the same marker."""
    redundant = []
    for region in listed:
        found = decode_abort(region.label)
        if found is None:
            continue
        index.seen(found.gen)
        known = index.aborted.setdefault((found.key, found.gen), found)
        known.owed |= found.owed
        if pool in known.regions and known.regions[pool] != region.region_id:
            redundant.append(region.region_id)
        else:
            known.regions[pool] = region.region_id
        known.pending |= found.owed & pending
    return redundant


def _unadopt(index: Index) -> list[ObjectMeta]:
    """Indexed objects of an aborted generation (adopted before the marker was seen): out."""
    out = []
    for key, gen in index.aborted:
        known = index.get(key)
        if known is not None and known.gen == gen:
            index.remove(key)
            out.append(known)
    return out


def reconcile(
    index: Index,
    pool: str,
    listed: list[Listed],
    factor: int,
    pending: AbstractSet[str] = frozenset(),
) -> Reconciled:
    """Bring the index in line with one pool's regions (tombstones and abort markers absorbed
    first, those found here owed by the pools of `pending`: those not reconciled yet)."""
    out = Reconciled(free=absorb_tombstones(index, pool, listed, set(pending)))
    out.free += absorb_aborts(index, pool, listed, set(pending))
    out.superseded += _unadopt(index)
    present: set[int] = set()
    for region in listed:
        meta = decode_label(region.label)
        if meta is None:
            continue
        present.add(region.region_id)
        index.seen(meta.gen)
        replica = Replica(region.region_id, region.offset)
        tombstone = index.tombstones.get(meta.key)
        known = index.get(meta.key)
        if (meta.key, meta.gen) in index.aborted:
            out.free.append(region.region_id)  # a put that failed: never to be seen
        elif (tombstone is not None and tombstone.gen >= meta.gen) or (
            known is not None and known.gen > meta.gen
        ):
            out.free.append(region.region_id)  # deleted or superseded while the pool was away
        elif known is None or known.gen < meta.gen:
            if known is not None:
                index.remove(known.key)
                out.superseded.append(known)
            index.add(meta)
            index.add_replica(meta, pool, replica)
            out.adopted += 1
        elif pool in known.replicas:
            if known.replicas[pool].region_id != region.region_id:
                out.free.append(region.region_id)  # a second copy on one pool
        elif known.tier is Tier.DRAM and len(known.replicas) < factor:
            index.add_replica(known, pool, replica)
            out.attached += 1
        else:
            out.free.append(region.region_id)  # replaced while the pool was away, or on SSD
    for meta in list(index.objects.values()):
        held = meta.replicas.get(pool)
        if held is not None and held.region_id not in present:
            index.drop_replica(meta, pool)
            out.gone += 1
    return out
