"""link-down (rdma-link-down): an RDMA plane link ("a~b": die~leaf, leaf~spine, spine~core)
carries nothing, both directions; routes re-spread over the live ECMP paths or find none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.gateway.base import Kind, NoParams
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph


@dataclass(frozen=True)
class LinkDown:
    def validate(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.physical(fault.target)

    def apply(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.up[list(graph.physical(fault.target))] = False


KIND = Kind(
    name="link-down",
    catalogue="rdma-link-down",
    help="an RDMA plane link carries nothing",
    effect=LinkDown(),
    params=NoParams,
)
