"""partition (supernode-partition): two supernodes ("sn0~sn1") cannot reach each other over the
RDMA plane, as a misconfigured core ACL or a cut inter-pod trunk would cut it: every route
between them is cut and no other, each still reaching the rest; every link stays up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.gateway.base import Kind, NoParams
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph


@dataclass(frozen=True)
class Partition:
    def validate(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.supernode_pair(fault.target)

    def apply(self, graph: RdmaGraph, fault: RdmaFault[NoParams]) -> None:
        graph.cut.add(graph.supernode_pair(fault.target))


KIND = Kind(
    name="partition",
    catalogue="supernode-partition",
    help="two supernodes' RDMA gateways cannot reach each other: the scale-out plane between "
    "them is cut (each still reaches the others)",
    effect=Partition(),
    params=NoParams,
    target="two supernodes 'sn0~sn1'",
)
