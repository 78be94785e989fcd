"""Where copies go and what makes room: the pools' health and usage, the replication factor, the
victims of eviction, the copy a reader reads, and the plan that restores the factor after a pool
dies. Decisions only; the service carries them out over UB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from emulator.model.ems.index import Index, ObjectMeta, Replica, Tier
from emulator.model.ems.ring import HashRing
from emulator.model.errors import CapacityError, UnavailableError

REBUILD_POLL_S = 0.2  # emulated seconds between asks of pools that did not answer a rebuild


@dataclass(frozen=True)
class ReadPlan:
    """The copies of an object a reader tries, in order, and the pools with a copy that are down."""

    copies: list[tuple[str, Replica]]
    down: list[str]


@dataclass(frozen=True)
class RepairPlan:
    """Restoring one object's replication factor: the dead copies to forget, the live copy to
    read from (None: the object is lost) and the pools that receive a new copy, in order."""

    dead: list[str]
    source: str | None
    targets: list[str]


class Placement:
    """The pools as EMS sees them: up or down, bytes held and reserved, per pool."""

    def __init__(
        self,
        *,
        pools: Mapping[str, str],
        ring: HashRing,
        capacity_per_pool: int,
        replication_factor: int,
        index: Index | None = None,
    ) -> None:
        self.nodes = dict(pools)  # pool id -> its node
        self.ring = ring
        self.capacity_per_pool = capacity_per_pool
        self.replication_factor = replication_factor
        self.index = index if index is not None else Index()
        self.healthy = dict.fromkeys(self.nodes, True)
        self.reserved: dict[str, int] = {}  # pool -> bytes of puts still writing their copies

    # --- health and usage ----------------------------------------------------------------------

    def mark(self, pool: str, *, healthy: bool) -> bool:
        """Record a pool's health; True when that changed it."""
        changed = self.healthy[pool] != healthy
        self.healthy[pool] = healthy
        return changed

    def usable(self) -> list[str]:
        return [p for p, up in self.healthy.items() if up]

    def used(self, pool: str) -> int:
        """Bytes of the pool's EMS share held by objects and by puts still writing."""
        return self.index.pool_bytes.get(pool, 0) + self.reserved.get(pool, 0)

    def reserve(self, pools: list[str], size: int) -> None:
        """Hold `size` bytes on each pool for a put in flight (a negative size gives them back)."""
        for pool in pools:
            self.reserved[pool] = self.reserved.get(pool, 0) + size

    def wanted(self) -> int:
        """Copies every object should have: the factor, or fewer when fewer pools are up."""
        return min(self.replication_factor, len(self.usable()) or 1)

    def live(self, meta: ObjectMeta) -> list[str]:
        return [p for p in meta.replicas if self.healthy[p]]

    def needs_repair(self, meta: ObjectMeta) -> bool:
        """An indexed DRAM object with fewer live copies than wanted."""
        return (
            meta.tier is Tier.DRAM
            and self.index.get(meta.key) is meta
            and len(self.live(meta)) < self.wanted()
        )

    def under_replicated(self) -> list[ObjectMeta]:
        return [m for m in self.index.objects.values() if self.needs_repair(m)]

    # --- decisions -----------------------------------------------------------------------------

    def targets(self, key: str) -> list[str]:
        """The pools that get the copies of a new object: its ring owners among the usable."""
        owners = self.ring.owners(key, self.replication_factor, usable=self.usable())
        if not owners:
            raise UnavailableError("no memory pool is healthy")
        return owners

    def victims(self, pool: str, size: int) -> list[ObjectMeta]:
        """Least-recently-used objects with a copy on `pool` whose eviction lets `size` more
        bytes fit there; none when it fits already. Refuses, evicting nothing, when even every
        unpinned object would not make room."""
        capacity = self.capacity_per_pool
        if size > capacity:
            raise CapacityError(f"EMS share of {pool}", size, capacity)
        chosen: list[ObjectMeta] = []
        used = self.used(pool)
        victims = self.index.lru_victims(pool)
        while used + size > capacity:
            victim = next(victims, None)
            if victim is None:
                free = capacity - self.used(pool)
                raise CapacityError(f"EMS share of {pool} (the rest is pinned)", size, free)
            chosen.append(victim)
            used -= victim.size
        return chosen

    def read_order(self, meta: ObjectMeta, node: str | None) -> ReadPlan:
        """The copies a reader on `node` (None: anywhere) should try, its own node's first."""
        copies = sorted(meta.replicas.items(), key=lambda kv: self.nodes[kv[0]] != node)
        return ReadPlan(
            copies=[(p, r) for p, r in copies if self.healthy[p]],
            down=[p for p, _ in copies if not self.healthy[p]],
        )

    def repair_plan(self, meta: ObjectMeta) -> RepairPlan:
        """How to bring one object back to the wanted number of copies."""
        dead = [p for p in meta.replicas if not self.healthy[p]]
        live = self.live(meta)
        if not live:
            return RepairPlan(dead=dead, source=None, targets=[])
        missing = max(0, self.wanted() - len(live))
        candidates = self.ring.owners(meta.key, len(self.nodes), usable=self.usable())
        targets = [p for p in candidates if p not in meta.replicas][:missing]
        return RepairPlan(dead=dead, source=live[0], targets=targets)
