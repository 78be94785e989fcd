"""l1-board: a node's L1 switch board fails (its power, its controller): the node's L1 chips
and every link of theirs go down at once, one fault cleared as one. Its NPUs and CPUs stay up
and answer their callers, but are cut off the unified bus, each other included (traffic inside
a node crosses the L1 chips too): every transfer to or from them finds no route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind, NoParams
from cmemu.emulator.model.naming import l1_switch_id, parse_node

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


def l1_board_links(graph: LinkGraph, node: str) -> list[int]:
    """Both directions of every link of a node's L1 chips: what its L1 switch board carries."""
    try:
        parse_node(node)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{exc}: an L1 board is a node's (n03)", field="target", subject=node
        ) from None
    if node not in graph.topology.nodes:
        raise NotFoundError(
            f"no node {quote(node)} (nodes: {', '.join(graph.topology.nodes[:4])}...)",
            subject=node,
            reason="NODE_NOT_FOUND",
        )
    chips = range(graph.profile.node.l1_chips)
    return [i for chip in chips for i in graph.switch_links(l1_switch_id(node, chip))]


@dataclass(frozen=True)
class L1Board:
    def validate(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        l1_board_links(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[NoParams]) -> None:
        graph.up[l1_board_links(graph, spec.target)] = False


KIND = Kind(
    name="l1-board",
    help="a node's L1 switch board fails: its L1 chips and all their links go down at once "
    "(its devices stay up, cut off the unified bus, each other included)",
    params=NoParams,
    effect=L1Board(),
    target="a node id (e.g. n03)",
)
