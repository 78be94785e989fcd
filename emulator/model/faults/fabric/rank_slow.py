"""rank-slow: a slowed rank (its NPU slowed or thermally throttled) computes at `factor` of its
speed. The collectives it is part of wait for it (their per-phase software overhead, run on
every rank, stretches by 1/factor) and report the slowest rank's share, so that a caller costs
the compute between them at the straggler's pace (a synchronous step runs at its slowest
member's). Set by the device's own fault, like rank-down, whose target and effect it shares."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.faults.fabric.base import Kind
from cmemu.emulator.model.faults.fabric.rank_down import RANK, OnRanks
from cmemu.emulator.model.faults.params import FRACTION, param

NAME = "rank-slow"


@dataclass(frozen=True, kw_only=True)
class RankSlowParams:
    """The fabric's rank-slow, set by an NPU's slow or thermal-throttle fault."""

    factor: float = param(help="share of the rank's compute speed left, in (0, 1)",
                          check=FRACTION)  # fmt: skip


def describe(params: RankSlowParams) -> str:
    return f"factor={params.factor:g}"


KIND = Kind(
    name=NAME,
    help="the collectives the rank is part of run at its compute share (its device is slowed)",
    params=RankSlowParams,
    effect=OnRanks[RankSlowParams](),
    target=RANK,
    from_device=True,
    describe=describe,
)
