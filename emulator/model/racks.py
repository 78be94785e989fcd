"""Racks of a topology: which nodes stand in which rack.

A rack is a run of `topology.nodes_per_rack` consecutive nodes of one supernode (the hardware
profile's node.nodes_per_rack: 4 on CloudMatrix384, whose 12 compute racks hold 48 nodes), named
by naming.py (`rack02`, `sn1-rack02`). A rack shares a power distribution unit and its cooling,
so its nodes fail together (rack-power-off); the scheduler's inventory groups nodes the same way.
"""

from __future__ import annotations

from cmemu.emulator.model.errors import NotFoundError, quote
from cmemu.emulator.model.naming import parse_node, parse_rack, rack_id
from cmemu.emulator.model.topology import Topology


def rack_of(topology: Topology, node: str) -> str:
    name = parse_node(node)
    return rack_id(name.index // topology.nodes_per_rack, supernode=name.supernode)


def racks(topology: Topology) -> list[str]:
    """The topology's racks, in order."""
    return list(dict.fromkeys(rack_of(topology, n) for n in topology.nodes))


def rack_nodes(topology: Topology, rack: str) -> list[str]:
    """The nodes of `rack`: InvalidArgumentError for a malformed id, NotFoundError for a rack
    the topology does not have."""
    name = parse_rack(rack)
    nodes = [n for n in topology.nodes if name.holds(parse_node(n), topology.nodes_per_rack)]
    if not nodes:
        known = racks(topology)
        more = "..." if len(known) > 4 else ""
        raise NotFoundError(
            f"no rack {quote(rack)} in {topology.supernode} (its {len(known)}: "
            f"{', '.join(known[:4])}{more}; {topology.nodes_per_rack} nodes a rack)",
            field="target",
            subject=rack,
            reason="RACK_NOT_FOUND",
        )
    return nodes


def rack_devices(topology: Topology, rack: str) -> list[str]:
    nodes = set(rack_nodes(topology, rack))
    return [d.id for d in topology.devices if d.node in nodes]
