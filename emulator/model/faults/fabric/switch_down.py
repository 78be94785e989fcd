"""switch-down: every link of a switch (an L1 chip of a node, an L2 chip of a sub-plane) is
down, both directions, until cleared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind, NoParams

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True)
class SwitchDown:
    def validate(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        graph.switch_links(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        graph.up[graph.switch_links(spec.target)] = False


KIND = Kind(
    name="switch-down",
    help="every link of a switch is down",
    params=NoParams,
    effect=SwitchDown(),
    target="a switch id (e.g. l2-p0-s3)",
)
