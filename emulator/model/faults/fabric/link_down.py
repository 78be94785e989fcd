"""link-down: a link carries nothing, both directions, until cleared; routes spread over the
links left (another plane, another L2 chip) or find none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind, NoParams

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True)
class LinkDown:
    def validate(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        graph.up[list(graph.physical(spec.target))] = False


KIND = Kind(name="link-down", help="a link carries nothing", params=NoParams, effect=LinkDown())
