"""EMS's Prometheus families (emulator/runtime/metrics.py collects them): in a module of their
own, imported only by a process that hosts EMS (the fabric's are its engine's own `metrics()`)."""

from __future__ import annotations

from cmemu.emulator.engines.ems import EmsState
from cmemu.emulator.model.instruments import Family, MetricType

__all__ = ["EmsState", "ems_families"]


def ems_families(ems: EmsState) -> list[Family]:
    stats = ems.stats("")
    c = stats.counters
    dram = stats.objects - stats.ssd_objects
    tiers: list[tuple[str, int, int, int]] = [
        ("dram", dram, stats.dram_used_bytes, stats.dram_capacity_bytes),
        ("ssd", stats.ssd_objects, stats.ssd_used_bytes, stats.ssd_capacity_bytes),
    ]

    def one(name: str, kind: MetricType, help: str, value: float) -> Family:
        return Family(name=name, help=help, type=kind, samples=[({}, value)])

    return [
        Family(
            name="cmemu_ems_objects",
            help="Objects stored, by tier",
            type="gauge",
            samples=[({"tier": t}, n) for t, n, _, _ in tiers],
        ),
        Family(
            name="cmemu_ems_used_bytes",
            help="Bytes used, by tier (DRAM: every copy)",
            type="gauge",
            samples=[({"tier": t}, b) for t, _, b, _ in tiers],
        ),
        Family(
            name="cmemu_ems_capacity_bytes",
            help="EMS's capacity, by tier",
            type="gauge",
            samples=[({"tier": t}, b) for t, _, _, b in tiers],
        ),
        one("cmemu_ems_hits_total", "counter", "Reads of a key that was there", c.hits),
        one("cmemu_ems_misses_total", "counter", "Reads of a key that was not", c.misses),
        one("cmemu_ems_evictions_total", "counter", "Objects evicted to make room", c.evictions),
        one("cmemu_ems_corrupt_total", "counter", "Copies found corrupt", c.corrupt),
        one("cmemu_ems_ssd_lost_total", "counter", "Objects lost with the SSD tier", c.ssd_lost),
        one(
            "cmemu_ems_under_replicated_objects",
            "gauge",
            "Objects with fewer copies than the replication factor",
            stats.under_replicated,
        ),
        Family(
            name="cmemu_ems_pool_healthy",
            help="1 when EMS counts the memory pool up",
            type="gauge",
            samples=[({"pool": p.pool}, p.healthy) for p in stats.pools],
        ),
        Family(
            name="cmemu_ems_pool_used_bytes",
            help="Bytes of EMS copies in the memory pool",
            type="gauge",
            samples=[({"pool": p.pool}, p.bytes) for p in stats.pools],
        ),
    ]
