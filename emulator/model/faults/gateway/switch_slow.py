"""switch-slow (rdma-switch-slow): every link of an RDMA plane switch keeps `factor` of its
rate. Its params are the fabric's link-degraded's (one wire message, LinkDegradedParams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.gateway.base import SWITCH, Kind
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph


@dataclass(frozen=True)
class SwitchSlow:
    def validate(self, graph: RdmaGraph, fault: RdmaFault[LinkDegradedParams]) -> None:
        graph.switch_links(fault.target)

    def apply(self, graph: RdmaGraph, fault: RdmaFault[LinkDegradedParams]) -> None:
        graph.factor[graph.switch_links(fault.target)] *= fault.params.factor


KIND = Kind(
    name="switch-slow",
    catalogue="rdma-switch-slow",
    help="every link of an RDMA plane switch keeps a share of its rate",
    params=LinkDegradedParams,
    effect=SwitchSlow(),
    target=SWITCH,
)
