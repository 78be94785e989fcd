"""partition: the devices of side_a cannot reach those of side_b (a route between the sides
finds none), every link staying up; `one_way` loses only side_a's frames to side_b (an
asymmetric partition). The sides are params, so it names no TARGET. The graph keeps each side
as a tuple of ids; the wire and the user give comma-separated text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class Partition:
    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        if not spec.side_a or not spec.side_b:
            raise InvalidArgumentError("a partition needs devices on both sides (side_a, side_b)")
        for device in (*spec.side_a, *spec.side_b):
            graph.topology.device(device)
        both = set(spec.side_a) & set(spec.side_b)
        if both:
            raise InvalidArgumentError(f"devices on both sides of a partition: {sorted(both)}")

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.partitions.append((frozenset(spec.side_a), frozenset(spec.side_b), spec.one_way))


def _sides(text: str) -> tuple[str, ...]:
    return tuple(s for s in (x.strip() for x in text.split(",")) if s)


def to_spec(params: PartitionParams) -> dict[str, Any]:
    return {"side_a": _sides(params.side_a), "side_b": _sides(params.side_b),
            "one_way": params.one_way}  # fmt: skip


def of_spec(spec: FaultSpec) -> dict[str, object]:
    return {"side_a": ",".join(spec.side_a), "side_b": ",".join(spec.side_b),
            "one_way": spec.one_way}  # fmt: skip


KIND = Kind(
    name="partition",
    help="devices of side_a cannot reach those of side_b",
    params=PartitionParams,
    effect=Partition(),
    target="none (the sides are params)",
    to_spec=to_spec,
    of_spec=of_spec,
)
