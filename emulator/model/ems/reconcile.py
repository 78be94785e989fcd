"""What a pool's regions say against what the index believes: after a restart (every pool) and
when a pool that was suspect or dead answers again (that pool). The newest generation of a key
wins; a tombstone at least as new as a copy deletes it; a copy the index knows is re-attached
while the object has fewer copies than the factor, else freed; an unknown or newer copy is
adopted; an indexed copy that the pool's listing lacks is proven gone."""

from __future__ import annotations

from dataclasses import dataclass, field

from emulator.model.ems.index import (
    Index,
    ObjectMeta,
    Replica,
    Tier,
    Tombstone,
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


def reconcile(index: Index, pool: str, listed: list[Listed], factor: int) -> Reconciled:
    """Bring the index in line with one pool's regions (tombstones absorbed first)."""
    out = Reconciled(free=absorb_tombstones(index, pool, listed, set()))
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
        if (tombstone is not None and tombstone.gen >= meta.gen) or (
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
    for tombstone in index.tombstones.values():
        tombstone.pending.discard(pool)
    index.detached.pop(pool, None)
    return out
