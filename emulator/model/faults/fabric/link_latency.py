"""link-latency: a link adds `latency_us` emulated microseconds per crossing (both directions);
its bandwidth is untouched. The graph keeps seconds (`extra_latency_s`): the effect converts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import POSITIVE, invalid, param

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

NAME = "link-latency"


@dataclass(frozen=True, kw_only=True)
class LinkLatencyParams:
    latency_us: float = param(
        help="emulated microseconds added per crossing, (0, 1e6]", check=POSITIVE
    )

    def check(self) -> None:
        if self.latency_us > 1e6:
            raise invalid(NAME, "latency_us", f"must be at most 1e6, got {self.latency_us:g}")


@dataclass(frozen=True)
class LinkLatency:
    def validate(self, graph: LinkGraph, spec: FaultSpec[LinkLatencyParams]) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[LinkLatencyParams]) -> None:
        graph.extra_latency_s[list(graph.physical(spec.target))] += spec.params.latency_us / 1e6


def describe(params: LinkLatencyParams) -> str:
    return f"latency=+{params.latency_us:g}us"


KIND = Kind(
    name=NAME,
    help="a link adds latency per crossing",
    params=LinkLatencyParams,
    effect=LinkLatency(),
    describe=describe,
)
