"""link-flap: a link toggles down and up, down for duty*period_s of every period_s from the
instant it was added (emulated). FaultSet brings it to its phase (`flap_down`) and the fabric's
clock wakes at its next edge (`next_flip_s`); the effect only reads the phase kept in the spec
(`down`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import FRACTION, POSITIVE, param

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

NAME = "link-flap"


@dataclass(frozen=True, kw_only=True)
class LinkFlapParams:
    """link-flap's params: the period of one down+up cycle and the share of it spent down."""

    period_s: float = param(10.0, "emulated seconds of one down+up cycle", POSITIVE)
    duty: float = param(0.5, "share of each period the link is down, in (0, 1)", FRACTION)


@dataclass(frozen=True)
class LinkFlap:
    """link-flap's effect: the link down for its duty of every period (the fault clock flips it)."""

    def validate(self, graph: LinkGraph, spec: FaultSpec[LinkFlapParams]) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[LinkFlapParams]) -> None:
        if spec.down:
            graph.up[list(graph.physical(spec.target))] = False


def flap_down(spec: FaultSpec[LinkFlapParams], now_s: float) -> bool:
    """Whether a flapping link is in the down part of its cycle at `now_s`."""
    period, duty = spec.params.period_s, spec.params.duty
    return (now_s - spec.since_s) % period < duty * period


def next_flip_s(spec: FaultSpec[LinkFlapParams], now_s: float) -> float:
    """The emulated instant after `now_s` at which a flapping link next changes state."""
    period, duty = spec.params.period_s, spec.params.duty
    cycle = math.floor((now_s - spec.since_s) / period)
    start = spec.since_s + cycle * period
    for edge in (start + duty * period, start + period):
        if edge > now_s:
            return edge
    return start + period + duty * period


def describe(params: LinkFlapParams) -> str:
    return f"period={params.period_s:g}s duty={params.duty:g}"


KIND = Kind(
    name=NAME,
    help="a link toggles down and up: down duty*period_s of every period_s (emulated)",
    params=LinkFlapParams,
    effect=LinkFlap(),
    describe=describe,
)
