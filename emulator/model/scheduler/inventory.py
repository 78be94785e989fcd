"""What the scheduler hands out: the supernode's NPUs, grouped by node and by rack.

A rack here is the index of a run of `nodes_per_rack` consecutive nodes, as the compute racks of
CloudMatrix384 hold 4 nodes each (rack 2 is naming.py's `rack02`, emulator/model/racks.py). An
inventory is built from a topology (the running emulator) or from counts (the allocation
benchmark replays systems no preset describes, such as a 224-NPU one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import (
    DeviceKind,
    device_id,
    die_id,
    node_id,
    parse_device,
    parse_node,
)
from cmemu.emulator.model.topology import Topology


@dataclass(frozen=True, kw_only=True)
class NodeSlots:
    """One node's NPUs, in id order, and the rack it stands in."""

    id: str
    rack: int
    npus: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """Every node's NPU slots, looked up by node and by NPU."""

    nodes: tuple[NodeSlots, ...]
    dies_per_npu: int
    _node: dict[str, NodeSlots] = field(init=False, repr=False, compare=False)
    _npu_node: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_node", {n.id: n for n in self.nodes})
        object.__setattr__(self, "_npu_node", {p: n.id for n in self.nodes for p in n.npus})

    @classmethod
    def from_topology(cls, topology: Topology, profile: HardwareProfile) -> Inventory:
        npus: dict[str, list[str]] = {node: [] for node in topology.nodes}
        for device in topology.of_kind(DeviceKind.NPU):
            npus[device.node].append(device.id)
        return cls._build(npus, profile)

    @classmethod
    def from_counts(cls, *, nodes: int, profile: HardwareProfile = DEFAULT_PROFILE) -> Inventory:
        """`nodes` nodes of `profile.node.npus` NPUs each, named as a preset would name them."""
        npus = {
            node_id(i): [device_id(node_id(i), DeviceKind.NPU, j) for j in range(profile.node.npus)]
            for i in range(nodes)
        }
        return cls._build(npus, profile)

    @classmethod
    def _build(cls, npus: dict[str, list[str]], profile: HardwareProfile) -> Inventory:
        per_rack = profile.node.nodes_per_rack
        if per_rack < 1:
            raise InvalidArgumentError(f"nodes_per_rack must be >= 1, got {per_rack}")
        slots = tuple(
            NodeSlots(
                id=node,
                rack=parse_node(node).index // per_rack,
                npus=tuple(sorted(ids, key=lambda i: parse_device(i).index)),
            )
            for node, ids in sorted(npus.items(), key=lambda item: parse_node(item[0]).index)
            if ids
        )
        return cls(nodes=slots, dies_per_npu=profile.npu.dies)

    # --- lookups ---------------------------------------------------------------------------------

    @property
    def npus(self) -> list[str]:
        return [p for n in self.nodes for p in n.npus]

    @property
    def size(self) -> int:
        return len(self._npu_node)

    @property
    def racks(self) -> list[int]:
        return sorted({n.rack for n in self.nodes})

    def node(self, node: str) -> NodeSlots:
        found = self._node.get(node)
        if found is None:
            parse_node(node)  # a malformed id is INVALID_ARGUMENT, a missing one NOT_FOUND
            raise NotFoundError(
                f"no node {quote(node)} with NPUs here", subject=node, reason="NODE_NOT_FOUND"
            )
        return found

    def node_of(self, npu: str) -> str:
        found = self._npu_node.get(npu)
        if found is None:
            parse_device(npu)
            raise NotFoundError(f"no NPU {quote(npu)} here", subject=npu, reason="NPU_NOT_FOUND")
        return found

    def rack_of(self, npu: str) -> int:
        return self._node[self.node_of(npu)].rack

    def dies(self, npu: str) -> list[str]:
        return [die_id(npu, d) for d in range(self.dies_per_npu)]
