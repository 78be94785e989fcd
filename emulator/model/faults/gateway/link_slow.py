"""link-slow (rdma-link-slow): an RDMA plane link keeps `factor` of its rate, both directions.
Its params are the fabric's link-degraded's (one wire message, LinkDegradedParams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.gateway.base import Kind
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph


@dataclass(frozen=True)
class LinkSlow:
    def validate(self, graph: RdmaGraph, fault: RdmaFault[LinkDegradedParams]) -> None:
        graph.physical(fault.target)

    def apply(self, graph: RdmaGraph, fault: RdmaFault[LinkDegradedParams]) -> None:
        graph.factor[list(graph.physical(fault.target))] *= fault.params.factor


KIND = Kind(
    name="link-slow",
    catalogue="rdma-link-slow",
    help="an RDMA plane link keeps a share of its rate",
    params=LinkDegradedParams,
    effect=LinkSlow(),
)
