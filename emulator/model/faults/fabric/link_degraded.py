"""link-degraded: a link keeps `factor` of its bandwidth (both directions); flows crossing it
share what is left max-min fairly. Its params message, LinkDegradedParams, is also the RDMA
plane's slow kinds' (emulator/model/faults/gateway/link_slow.py, switch_slow.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import FRACTION, param

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class LinkDegradedParams:
    factor: float = param(help="share of the link's bandwidth left, in (0, 1)", check=FRACTION)


@dataclass(frozen=True)
class LinkDegraded:
    def validate(self, graph: LinkGraph, spec: FaultSpec[LinkDegradedParams]) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[LinkDegradedParams]) -> None:
        graph.factor[list(graph.physical(spec.target))] *= spec.params.factor


def describe(params: LinkDegradedParams) -> str:
    return f"factor={params.factor:g}"


KIND = Kind(
    name="link-degraded",
    help="a link keeps a share of its bandwidth",
    params=LinkDegradedParams,
    effect=LinkDegraded(),
    describe=describe,
)
