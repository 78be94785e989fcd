"""rank-down: a dead rank (its device crashed, powered off or went down, or one die failed):
every collective it is part of fails at once, as a real one does when a rank's links drop.
Routes are left alone: a UB transfer reaches the device, which refuses it itself. Set at the
fabric by the device's own fault (emulator/engines/device/kinds/, faultbase.py `rank_fault`)
and cleared with it: no kind of the user's catalogue. FaultSet.ranks reads it when a
collective asks; the link graph is untouched. rank-hung and rank-slow share its target and its
effect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from cmemu.emulator.model.errors import InvalidArgumentError, quote
from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind, NoParams
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

NAME = "rank-down"
RANK = "an NPU id, or one of its dies (n00-npu3.d1)"

P = TypeVar("P")


def rank_target(graph: LinkGraph, target: str) -> None:
    """An NPU or one of its dies: what a collective ranks."""
    if "." in target:
        graph.endpoint(target)
        return
    device = graph.topology.device(target)
    if device.kind is not DeviceKind.NPU:
        raise InvalidArgumentError(
            f"{quote(target)} is a {device.kind.value}: collectives rank NPUs and their dies",
            subject=target,
        )


@dataclass(frozen=True)
class OnRanks(Generic[P]):
    """The rank kinds' effect, whatever their params: a valid rank, and nothing written to the
    link graph."""

    def validate(self, graph: LinkGraph, spec: FaultSpec[P]) -> None:
        rank_target(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[P]) -> None:
        pass  # FaultSet.ranks reads it; the link graph is untouched


KIND = Kind(
    name=NAME,
    help="every collective the rank is part of fails (its device or die is down)",
    params=NoParams,
    effect=OnRanks[NoParams](),
    target=RANK,
    from_device=True,
)
