"""What the fabric shows at /metrics, per UB plane and link kind: bytes carried, utilisation,
capacity and links down, flows in flight and completed, collectives in progress, faults by kind.
Computed from the one link_usage (fabric/usage.py, the same as GetLinkStats), grouped here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from cmemu.emulator.engines.fabric.usage import link_usage
from cmemu.emulator.model.instruments import Family, Value

if TYPE_CHECKING:
    from cmemu.emulator.engines.fabric.engine import FabricEngine

NO_PLANE = "none"  # links with no switch end (die to die, pool to CPU) belong to no UB plane


class LinkGroups:
    """Each directed link's (UB plane, link kind) group, worked out once per fabric."""

    def __init__(self, fabric: FabricEngine) -> None:
        planes = {s.id: str(s.plane) for s in fabric.topology.switches}
        g = fabric.graph
        keys: dict[tuple[str, str], int] = {}
        group = []
        for (a, b), kind in zip(g.ends, g.kinds, strict=True):
            key = (planes.get(b) or planes.get(a) or NO_PLANE, kind.value)
            group.append(keys.setdefault(key, len(keys)))
        self.keys = list(keys)
        self.of_link = np.array(group, dtype=np.int64)


def fabric_families(fabric: FabricEngine, groups: LinkGroups) -> list[Family]:
    g = fabric.graph
    u = link_usage(fabric)
    n = len(groups.keys)
    of_member = groups.of_link[g.member_link]
    carried = np.bincount(of_member, weights=u.member_bytes, minlength=n)
    rate = np.bincount(of_member, weights=u.member_rate, minlength=n)
    capacity = np.bincount(groups.of_link, weights=u.link_cap, minlength=n)
    down = np.bincount(groups.of_link, weights=~g.up, minlength=n)
    utilization = np.divide(rate, capacity, out=np.zeros(n), where=capacity > 0)
    per_group = [{"plane": p, "link_kind": k} for p, k in groups.keys]
    faults: dict[str, int] = {}
    for spec in fabric.faults.faults.values():
        faults[spec.kind] = faults.get(spec.kind, 0) + 1

    def grouped(values: Any) -> list[tuple[Mapping[str, str], Value]]:
        return [(labels, float(v)) for labels, v in zip(per_group, values, strict=True)]

    live = fabric.flows.live
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
            help="UB transfers the fabric completed (a copy within one device is not its)",
            type="counter",
            samples=[({}, live.completed)],
        ),
        Family(
            name="cmemu_fabric_link_stats_total",
            help="Link-stats tables computed (GetLinkStats, WatchLinkStats): what watching costs",
            type="counter",
            samples=[({}, fabric.link_tables)],
        ),
        Family(
            name="cmemu_fabric_collectives_in_progress",
            help="Collectives being timed or waiting for a worker",
            type="gauge",
            samples=[({}, fabric.collectives.pending)],
        ),
        Family(
            name="cmemu_fabric_faults",
            help="Active fabric faults by kind",
            type="gauge",
            samples=[({"fault_kind": k}, v) for k, v in sorted(faults.items())]
            or [({"fault_kind": "link-down"}, 0)],
        ),
    ]
