"""What the fabric's links carry: one computation for GetLinkStats and the metrics collector.

The flow clock counts bytes and rates per trunk (what flows share); a link's part of its trunk's
is its share of the trunk's live capacity, since a transfer is sprayed over a trunk's live members
in proportion to what each can carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from cmemu.emulator.engines.fabric.types import LinkStat, LinkStats

if TYPE_CHECKING:
    from cmemu.emulator.engines.fabric.engine import FabricEngine

FloatArray = npt.NDArray[np.float64]
U64_MAX = 2**64 - 1


@dataclass(frozen=True, kw_only=True)
class LinkUsage:
    """Per member link (LinkGraph.member_link order): what it carried, its rate and live
    capacity; per trunk: utilisation and active flows."""

    member_bytes: FloatArray
    member_rate: FloatArray
    trunk_utilization: FloatArray
    trunk_active: npt.NDArray[np.int64]
    link_cap: FloatArray


def link_usage(fabric: FabricEngine) -> LinkUsage:
    """What every link carries, up to the present."""
    fabric.flows.sync()
    g = fabric.graph
    live = fabric.flows.live
    trunk_cap = g.trunk_cap()
    link_cap = g.link_cap()
    share = np.divide(
        link_cap[g.member_link],
        trunk_cap[g.member_trunk],
        out=np.zeros(len(g.member_link)),
        where=trunk_cap[g.member_trunk] > 0,
    )
    trunk_bytes = live.res_bytes + fabric.collectives.carried
    return LinkUsage(
        member_bytes=trunk_bytes[g.member_trunk] * share,
        member_rate=live.res_rate[g.member_trunk] * share,
        trunk_utilization=np.divide(
            live.res_rate, trunk_cap, out=np.zeros(len(trunk_cap)), where=trunk_cap > 0
        ),
        trunk_active=live.active_per_resource(),
        link_cap=link_cap,
    )


def link_stats(fabric: FabricEngine, top: int) -> LinkStats:
    """The `top` links that carried the most bytes."""
    fabric.link_tables += 1
    g = fabric.graph
    u = link_usage(fabric)
    order = np.argsort(-u.member_bytes, kind="stable")[:top]
    links = []
    for m in order:
        link, trunk = int(g.member_link[m]), int(g.member_trunk[m])
        links.append(
            LinkStat(
                link=g.names[link],
                kind=g.kinds[link].value,
                capacity_bytes_per_s=float(u.link_cap[link]),
                bytes=min(int(u.member_bytes[m]), U64_MAX),
                utilization=float(u.trunk_utilization[trunk]),
                active_flows=int(u.trunk_active[trunk]),
                up=bool(g.up[link]),
            )
        )
    return LinkStats(
        emulated_ns=fabric.clock.now_ns(),
        links=tuple(links),
        active_flows=len(fabric.flows.live.flows),
        completed_flows=fabric.flows.live.completed,
    )
