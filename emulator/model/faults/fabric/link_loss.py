"""link-loss: a link loses (or fails CRC on) a share `rate` of its frames, each resent by
link-layer retry: its goodput and its latency pay for it.

Model: selective-repeat ARQ with independent losses (Bertsekas & Gallager, Data Networks,
2nd ed., sec. 2.4): a frame crosses 1/(1-p) times on average, so the link's goodput is
C(1-p), and each crossing waits p/(1-p) replay round trips on average
(`switch.link_retry_s`, assumed). A go-back-N replay buffer loses more (every frame in
flight behind the lost one is resent): this is the optimistic bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import FRACTION, param

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class LinkLossParams:
    rate: float = param(
        help="share of the link's frames lost or failing CRC, in (0, 1); each is retransmitted",
        check=FRACTION,
    )


@dataclass(frozen=True)
class LinkLoss:
    def validate(self, graph: LinkGraph, spec: FaultSpec[LinkLossParams]) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[LinkLossParams]) -> None:
        links = list(graph.physical(spec.target))
        p = spec.params.rate
        graph.factor[links] *= 1 - p
        graph.extra_latency_s[links] += graph.profile.switch.link_retry_s * p / (1 - p)


def describe(params: LinkLossParams) -> str:
    return f"rate={params.rate:g}"


KIND = Kind(
    name="link-loss",
    help="a link loses (or fails CRC on) a share of its frames; resending costs bandwidth",
    params=LinkLossParams,
    effect=LinkLoss(),
    describe=describe,
)
