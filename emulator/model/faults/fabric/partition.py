"""partition: the devices of side_a cannot reach those of side_b (a route between the sides
finds none), every link staying up; `one_way` loses only side_a's frames to side_b (an
asymmetric partition). The sides are params, so it names no TARGET: comma-separated text, as
the wire and the user give them, kept in one spelling (no blanks, no empty ids) and split into
ids by the effect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import param

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class PartitionParams:
    side_a: str = param(help="comma-separated device ids on one side")
    side_b: str = param(help="comma-separated device ids on the other side")
    one_way: bool = param(
        False,
        "only side_a's frames to side_b are lost (an asymmetric partition): side_b's writes to "
        "side_a land but are never acknowledged, and side_a's requests never arrive",
    )

    def __post_init__(self) -> None:
        # one spelling, so that what the fabric lists is the same however the sides were typed
        for name in ("side_a", "side_b"):
            object.__setattr__(self, name, ",".join(ids(getattr(self, name))))


def ids(side: str) -> tuple[str, ...]:
    """The device ids of one side's text."""
    return tuple(s for s in (x.strip() for x in side.split(",")) if s)


@dataclass(frozen=True)
class Partition:
    def validate(self, graph: LinkGraph, spec: FaultSpec[PartitionParams]) -> None:
        side_a, side_b = ids(spec.params.side_a), ids(spec.params.side_b)
        if not side_a or not side_b:
            raise InvalidArgumentError(
                "a partition needs devices on both sides (side_a, side_b)", field="params.side_a"
            )
        for device in (*side_a, *side_b):
            graph.topology.device(device)
        both = set(side_a) & set(side_b)
        if both:
            raise InvalidArgumentError(
                f"devices on both sides of a partition: {sorted(both)}", field="params.side_a"
            )

    def apply(self, graph: LinkGraph, spec: FaultSpec[PartitionParams]) -> None:
        p = spec.params
        graph.partitions.append((frozenset(ids(p.side_a)), frozenset(ids(p.side_b)), p.one_way))


def describe(params: PartitionParams) -> str:
    sides = f"side_a={params.side_a} side_b={params.side_b}"
    return f"{sides} one-way (side_a to side_b lost)" if params.one_way else sides


KIND = Kind(
    name="partition",
    help="devices of side_a cannot reach those of side_b",
    params=PartitionParams,
    effect=Partition(),
    target="none (the sides are params)",
    describe=describe,
)
