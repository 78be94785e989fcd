"""The fabric's and EMS's Prometheus families (emulator/runtime/metrics.py collects them): in a
module of their own, imported only by a process that hosts the fabric or EMS, since the fabric's
are worked out with numpy, which no device process imports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from emulator.model.instruments import Family, MetricType, Value
from services.ems import EmsState
from services.fabric import FabricState

__all__ = ["EmsState", "FabricState", "LinkGroups", "ems_families", "fabric_families"]
NO_PLANE = "none"  # links with no switch end (die to die, pool to CPU) belong to no UB plane


# --- the fabric -------------------------------------------------------------------------------


class LinkGroups:
    """Each directed link's (UB plane, link kind) group, worked out once per fabric."""

    def __init__(self, fabric: FabricState) -> None:
        planes = {s.id: str(s.plane) for s in fabric.topology.switches}
        g = fabric.graph
        keys: dict[tuple[str, str], int] = {}
        group = []
        for (a, b), kind in zip(g.ends, g.kinds, strict=True):
            key = (planes.get(b) or planes.get(a) or NO_PLANE, kind.value)
            group.append(keys.setdefault(key, len(keys)))
        self.keys = list(keys)
        self.of_link = np.array(group, dtype=np.int64)


def fabric_families(fabric: FabricState, groups: LinkGroups) -> list[Family]:
    fabric.sync()  # the flows up to the present, as GetLinkStats does
    g, live = fabric.graph, fabric.live
    n = len(groups.keys)
    trunk_cap, link_cap = g.trunk_cap(), g.link_cap()
    share = np.divide(
        link_cap[g.member_link],
        trunk_cap[g.member_trunk],
        out=np.zeros(len(g.member_link)),
        where=trunk_cap[g.member_trunk] > 0,
    )
    of_member = groups.of_link[g.member_link]
    carried = np.bincount(
        of_member,
        weights=(live.res_bytes + fabric.collective_bytes)[g.member_trunk] * share,
        minlength=n,
    )
    rate = np.bincount(of_member, weights=live.res_rate[g.member_trunk] * share, minlength=n)
    capacity = np.bincount(groups.of_link, weights=link_cap, minlength=n)
    down = np.bincount(groups.of_link, weights=~g.up, minlength=n)
    utilization = np.divide(rate, capacity, out=np.zeros(n), where=capacity > 0)
    per_group = [{"plane": p, "link_kind": k} for p, k in groups.keys]
    faults: dict[str, int] = {}
    for spec in fabric.faults.faults.values():
        faults[spec.kind] = faults.get(spec.kind, 0) + 1

    def grouped(values: Any) -> list[tuple[Mapping[str, str], Value]]:
        return [(labels, float(v)) for labels, v in zip(per_group, values, strict=True)]

    return [
        Family(
            name="cmemu_fabric_link_bytes_total",
            help="Bytes the links of a UB plane and kind carried (transfers and collectives)",
            type="counter",
            samples=grouped(carried),
        ),
        Family(
            name="cmemu_fabric_link_utilization_ratio",
            help="Rate of the flows in flight over the live capacity, per UB plane and link kind",
            type="gauge",
            samples=grouped(utilization),
        ),
        Family(
            name="cmemu_fabric_link_capacity_bytes_per_second",
            help="Live capacity (faults lower it) per UB plane and link kind, both directions",
            type="gauge",
            samples=grouped(capacity),
        ),
        Family(
            name="cmemu_fabric_links_down",
            help="Directed links down per UB plane and link kind",
            type="gauge",
            samples=grouped(down),
        ),
        Family(
            name="cmemu_fabric_flows_in_flight",
            help="UB transfers on the wire now",
            type="gauge",
            samples=[({}, len(live.flows))],
        ),
        Family(
            name="cmemu_fabric_flows_completed_total",
            help="UB transfers completed",
            type="counter",
            samples=[({}, live.completed)],
        ),
        Family(
            name="cmemu_fabric_collectives_in_progress",
            help="Collectives being timed or waiting for a worker",
            type="gauge",
            samples=[({}, fabric.collectives_pending)],
        ),
        Family(
            name="cmemu_fabric_faults",
            help="Active fabric faults by kind",
            type="gauge",
            samples=[({"fault_kind": k}, v) for k, v in sorted(faults.items())]
            or [({"fault_kind": "link-down"}, 0)],
        ),
    ]


# --- EMS --------------------------------------------------------------------------------------


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
