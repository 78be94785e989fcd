"""Where copies go and what makes room: the pools' health and usage, the replication factor, the
victims of eviction, the copy a reader reads, and the plan that restores the factor after a pool
dies. Decisions only; the service carries them out over UB.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from cmemu.emulator.model.ems.index import Index, ObjectMeta, Replica, Tier
from cmemu.emulator.model.ems.ring import HashRing
from cmemu.emulator.model.errors import CapacityError, UnavailableError

REBUILD_POLL_S = 0.2  # emulated seconds between asks of pools that did not answer a rebuild


class Health(StrEnum):
    """UP: read and written. SUSPECT: missed sweeps (or failed a call): avoided, its copies kept.
    DEAD: silent past the dead threshold: its copies are replaced, then forgotten."""

    UP = "up"
    SUSPECT = "suspect"
    DEAD = "dead"


class ReadPlan(NamedTuple):
    """The copies of an object a reader tries, in order, and the pools with a copy that are down.
    (A named tuple: a frozen dataclass's init cost every get ~0.8 us.)"""

    copies: list[tuple[str, Replica]]
    down: list[str]


@dataclass(frozen=True)
class RepairPlan:
    """Restoring one object's replication factor: the dead copies to forget, the live copy to
    read from (None: the object is lost) and the pools that receive a new copy, in order."""

    dead: list[str]
    source: str | None
    targets: list[str]


_RANK = {Health.UP: 0, Health.SUSPECT: 1, Health.DEAD: 2}
# the members as module constants: an enum member read off its class costs ~0.15 us (a
# descriptor), so a put's walk over cm384's 48 pools spent 11 us on `Health.UP` alone
_UP, _DEAD = Health.UP, Health.DEAD


class _Up:
    """`pool in _Up(health)`: the pool is up (Placement.up)."""

    __slots__ = ("health",)

    def __init__(self, health: dict[str, Health]) -> None:
        self.health = health

    def __contains__(self, pool: object) -> bool:
        return self.health.get(pool) is _UP  # type: ignore[call-overload]


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
        suspect_after_sweeps: int = 2,
        dead_after_ns: int = 30 * 10**9,
    ) -> None:
        self.nodes = dict(pools)  # pool id -> its node
        self.ring = ring
        self.capacity_per_pool = capacity_per_pool
        self.replication_factor = replication_factor
        self.index = index if index is not None else Index()
        self.suspect_after_sweeps = suspect_after_sweeps
        self.dead_after_ns = dead_after_ns
        self.health = dict.fromkeys(self.nodes, Health.UP)
        self.missed = dict.fromkeys(self.nodes, 0)  # sweeps missed in a row
        self.silent_since_ns: dict[str, int] = {}  # pool -> its first missed sweep
        self.reserved: dict[str, int] = {}  # pool -> bytes of puts still writing their copies

    # --- health and usage ----------------------------------------------------------------------

    @property
    def healthy(self) -> dict[str, bool]:
        return {p: h is _UP for p, h in self.health.items()}

    def mark(self, pool: str, *, healthy: bool) -> bool:
        """Record a pool's health outright (UP, or DEAD); True when that changed it."""
        new = Health.UP if healthy else Health.DEAD
        changed = self.health[pool] is not new
        self.health[pool] = new
        if healthy:
            self.missed[pool] = 0
            self.silent_since_ns.pop(pool, None)
        return changed

    def suspect(self, pool: str, now_ns: int) -> bool:
        """A call to the pool failed: avoid it until a sweep hears from it. True when newly so."""
        self.silent_since_ns.setdefault(pool, now_ns)
        if self.health[pool] is _UP:
            self.health[pool] = Health.SUSPECT
            return True
        return False

    def observe(self, pool: str, *, answered: bool, now_ns: int) -> Health | None:
        """One sweep's probe of a pool; the pool's new health when it changed."""
        old = self.health[pool]
        if answered:
            self.missed[pool] = 0
            self.silent_since_ns.pop(pool, None)
            new = Health.UP
        else:
            self.missed[pool] += 1
            since = self.silent_since_ns.setdefault(pool, now_ns)
            if now_ns - since >= self.dead_after_ns:
                new = Health.DEAD
            elif self.missed[pool] >= self.suspect_after_sweeps:
                new = max(old, Health.SUSPECT, key=_RANK.__getitem__)
            else:
                new = old
        self.health[pool] = new
        return new if new is not old else None

    def usable(self) -> list[str]:
        return [p for p, h in self.health.items() if h is _UP]

    def up(self) -> Container[str]:
        """The usable pools as a view (`pool in up()`), for a ring walk that asks about two or
        three pools: not a list of every pool made per put, as usable() is."""
        return _Up(self.health)

    def kept(self, meta: ObjectMeta) -> list[str]:
        """The pools of an object's copies that are not dead (up or suspect)."""
        return [p for p in meta.replicas if self.health[p] is not _DEAD]

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
        return [p for p in meta.replicas if self.health[p] is _UP]

    def needs_repair(self, meta: ObjectMeta) -> bool:
        """An indexed DRAM object with fewer copies than wanted outside dead pools (a suspect
        pool's copies still count: it may only be stalled)."""
        return (
            meta.tier is Tier.DRAM
            and self.index.get(meta.key) is meta
            and len(self.kept(meta)) < self.wanted()
        )

    def to_repair(self) -> list[ObjectMeta]:
        return [m for m in self.index.objects.values() if self.needs_repair(m)]

    def under_replicated(self) -> list[ObjectMeta]:
        """Indexed DRAM objects with fewer readable copies than wanted (what Stat reports)."""
        wanted = self.wanted()
        return [
            m
            for m in self.index.objects.values()
            if m.tier is Tier.DRAM and len(self.live(m)) < wanted
        ]

    # --- decisions -----------------------------------------------------------------------------

    def targets(self, key: str) -> list[str]:
        """The pools that get the copies of a new object: its ring owners among the usable."""
        owners = self.ring.owners(key, self.replication_factor, usable=self.up())
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

    def check_room(self, puts: list[tuple[int, list[str]]]) -> None:
        """Refuse, before anything is evicted, puts of (size, target pools) that could not all
        fit at once, even with every unpinned object evicted."""
        need: dict[str, int] = {}
        for size, targets in puts:
            for pool in targets:
                need[pool] = need.get(pool, 0) + size
        for pool, size in need.items():
            self.victims(pool, size)

    def read_order(self, meta: ObjectMeta, node: str | None) -> ReadPlan:
        """The copies a reader on `node` (None: anywhere) should try, its own node's first."""
        items = meta.replicas.items()
        # no node: the order as held (the sort is stable and every key equal), unsorted: a get
        # from no device on every call
        copies = (
            list(items) if node is None else sorted(items, key=lambda kv: self.nodes[kv[0]] != node)
        )
        health = self.health
        for pool in meta.replicas:  # a loop, not a comprehension's frame, when all are up
            if health[pool] is not _UP:
                break
        else:
            return ReadPlan(copies, [])
        up = [(p, r) for p, r in copies if health[p] is _UP]
        return ReadPlan(up, [p for p, _ in copies if health[p] is not _UP])

    def repair_plan(self, meta: ObjectMeta) -> RepairPlan:
        """How to bring one object back to the wanted number of copies."""
        dead = [p for p in meta.replicas if self.health[p] is _DEAD]
        live = self.live(meta)
        if not live:
            return RepairPlan(dead=dead, source=None, targets=[])
        missing = max(0, self.wanted() - len(self.kept(meta)))
        candidates = self.ring.owners(meta.key, len(self.nodes), usable=self.up())
        targets = [p for p in candidates if p not in meta.replicas][:missing]
        return RepairPlan(dead=dead, source=live[0], targets=targets)
