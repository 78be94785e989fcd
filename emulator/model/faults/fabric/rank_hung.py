"""rank-hung: a hung rank (its NPU hangs, or is in an intermittent hang's window): a collective
it is part of never completes while it lasts (the caller's deadline ends the wait), and carries
on when it clears. Set by the device's own fault, like rank-down, whose target and effect it
shares."""

from __future__ import annotations

from cmemu.emulator.model.faults.fabric.base import Kind, NoParams
from cmemu.emulator.model.faults.fabric.rank_down import RANK, OnRanks

NAME = "rank-hung"

KIND = Kind(
    name=NAME,
    help="every collective the rank is part of waits while it lasts (its device hangs)",
    params=NoParams,
    effect=OnRanks[NoParams](),
    target=RANK,
    from_device=True,
)
