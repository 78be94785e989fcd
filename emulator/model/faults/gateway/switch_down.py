"""switch-down (rdma-switch-down): every link of an RDMA plane switch (a node's leaf, a
supernode's spine, a core switch) is down; routes re-spread over the other spines and cores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.gateway.base import SWITCH, Kind, NoParams
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph


@dataclass(frozen=True)
class SwitchDown:
    def validate(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.switch_links(fault.target)

    def apply(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.up[graph.switch_links(fault.target)] = False


KIND = Kind(
    name="switch-down",
    catalogue="rdma-switch-down",
    help="every link of an RDMA plane switch is down",
    effect=SwitchDown(),
    params=NoParams,
    target=SWITCH,
)
