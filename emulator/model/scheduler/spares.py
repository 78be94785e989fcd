"""The spare NPUs: a reserved set of a target size, spread over the racks, from which Replace
takes the nearest one (the same node, else the same rack, else any).

The pool shares the scheduler's free NPUs per node (`free`): topping the set up takes from them
and shrinking it gives back, so an NPU is always in exactly one of the two (or neither).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping

from cmemu.emulator.model.scheduler.inventory import Inventory


class SparePool:
    def __init__(
        self, inventory: Inventory, *, free: Mapping[str, set[str]], order: Mapping[str, int]
    ) -> None:
        self.inventory = inventory
        self.npus: set[str] = set()
        self.target = 0
        self._free = free
        self._order = order

    def __len__(self) -> int:
        return len(self.npus)

    def discard(self, npu: str) -> None:
        self.npus.discard(npu)

    def retarget(self, count: int) -> None:
        """A new target size (checked by the caller against what is free): excess spares go
        back to the free NPUs, then the set is topped up."""
        self.target = count
        while len(self.npus) > count:
            self._drop()
        self.refill()

    def refill(self) -> None:
        """Up to the target, as far as the free NPUs allow (after every change of them)."""
        while len(self.npus) < self.target and any(self._free.values()):
            self._add()

    def take_nearest(self, npu: str, used_nodes: Collection[str]) -> str:
        """The spare nearest `npu` (the same node, else the same rack; among equals a node of
        `used_nodes`, those its job already uses), out of the pool."""
        inv = self.inventory
        node, rack = inv.node_of(npu), inv.rack_of(npu)

        def distance(spare: str) -> tuple[int, int, int]:
            there = inv.node_of(spare)
            near = 0 if there == node else 1 if inv.rack_of(spare) == rack else 2
            return (near, there not in used_nodes, self._order[spare])

        best = min(self.npus, key=distance)
        self.npus.discard(best)  # not handed out twice within one replacement
        return best

    def _per_rack(self) -> Counter[int]:
        return Counter(self.inventory.rack_of(p) for p in self.npus)

    def _add(self) -> None:
        """In the rack with the fewest spares, from its most used node (its last NPU): spares
        spread over racks, and no whole node is broken while a fragment can serve."""
        have = self._per_rack()
        candidates = [n for n in self.inventory.nodes if self._free[n.id]]
        order: Callable[[str], int] = self._order.__getitem__
        node = min(
            candidates,
            key=lambda n: (have[n.rack], n.rack, len(self._free[n.id]), -order(n.npus[0])),
        )
        npu = max(self._free[node.id], key=order)
        self._free[node.id].discard(npu)
        self.npus.add(npu)

    def _drop(self) -> None:
        have = self._per_rack()
        npu = max(self.npus, key=lambda p: (have[self.inventory.rack_of(p)], self._order[p]))
        self.npus.discard(npu)
        self._free[self.inventory.node_of(npu)].add(npu)
