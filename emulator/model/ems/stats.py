"""The store's figures: counters, the timing of copies written in parallel, the Stat summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.ems.index import Tier
from cmemu.emulator.model.ems.placement import Placement
from cmemu.emulator.model.errors import NotFoundError


@dataclass
class Counters:
    """EMS's lookups and losses, counted since it started."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0
    ssd_lost: int = 0  # objects gone with the SSD tier (ssd-loss)


@dataclass
class Timing:
    """Copies written in parallel: the operation starts with the first and lasts as long as the
    slowest (their issue stamps differ only by the wall time between the RPCs)."""

    issue_ns: int = 0
    duration_ns: int = 0

    def add(self, issue_ns: int, complete_ns: int) -> None:
        self.issue_ns = min(self.issue_ns or issue_ns, issue_ns)
        self.duration_ns = max(self.duration_ns, complete_ns - issue_ns)

    @property
    def complete_ns(self) -> int:
        return self.issue_ns + self.duration_ns


@dataclass(frozen=True)
class PoolStats:
    """One memory pool as EMS sees it: its health, objects and room."""

    pool: str
    healthy: bool
    objects: int
    bytes: int
    capacity_bytes: int


@dataclass(frozen=True, kw_only=True)
class StoreStats:
    """The whole store: objects and bytes per tier, replication and capacity."""

    objects: int
    dram_bytes: int  # one copy of each object in DRAM
    dram_capacity_bytes: int  # EMS's share of every pool
    dram_used_bytes: int  # all copies
    ssd_objects: int
    ssd_used_bytes: int
    ssd_capacity_bytes: int
    replication_factor: int
    under_replicated: int
    counters: Counters
    pools: list[PoolStats] = field(default_factory=list)


def summarize(
    placement: Placement,
    counters: Counters,
    *,
    ssd_used_bytes: int,
    ssd_capacity_bytes: int,
    pool_filter: str = "",
) -> StoreStats:
    """The store's use, over every pool or only `pool_filter`."""
    pools = placement.nodes
    if pool_filter and pool_filter not in pools:
        raise NotFoundError(f"no memory pool {pool_filter!r}; pools: {', '.join(pools)}")
    index = placement.index
    objects = list(index.objects.values())
    dram = [m for m in objects if m.tier is Tier.DRAM]
    capacity = placement.capacity_per_pool
    return StoreStats(
        objects=len(objects),
        dram_bytes=sum(m.size for m in dram),
        dram_capacity_bytes=capacity * len(pools),
        dram_used_bytes=sum(index.pool_bytes.values()),
        ssd_objects=len(objects) - len(dram),
        ssd_used_bytes=ssd_used_bytes,
        ssd_capacity_bytes=ssd_capacity_bytes,
        replication_factor=placement.replication_factor,
        under_replicated=len(placement.under_replicated()),
        counters=counters,
        pools=[
            PoolStats(
                pool=p,
                healthy=placement.healthy[p],
                objects=sum(1 for m in dram if p in m.replicas),
                bytes=index.pool_bytes.get(p, 0),
                capacity_bytes=capacity,
            )
            for p in pools
            if not pool_filter or p == pool_filter
        ],
    )
