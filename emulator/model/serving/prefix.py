"""The prefix cache as the simulator sees EMS: an LRU of KV blocks keyed by prefix-chained block
keys, its capacity the EMS DRAM share of the pools. A prompt hits on its longest cached run of
leading blocks (block i's key names blocks 0..i, so a later block never hits without the ones
before it)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile


class PrefixCache:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise InvalidArgumentError(
                f"capacity must be >= 0 blocks, got {capacity_blocks}", field="capacity"
            )
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[str, None] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, keys: Sequence[str]) -> int:
        """How many leading blocks are cached; those become the most recently used."""
        n = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            n += 1
        return n

    def peek(self, keys: Sequence[str]) -> int:
        """How many leading blocks are cached, leaving the recency as it is (a router's look)."""
        n = 0
        for key in keys:
            if key not in self._blocks:
                break
            n += 1
        return n

    def insert(self, keys: Sequence[str]) -> int:
        """Cache `keys` (most recently used), evicting the least recently used beyond capacity;
        returns how many were new."""
        new = 0
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                self._blocks[key] = None
                new += 1
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evicted += 1
        return new


def default_capacity_bytes(npus: int, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """EMS's DRAM share of the memory pools of the nodes the deployment uses, one copy's worth
    (EMS keeps replication_factor copies)."""
    nodes = math.ceil(npus / profile.node.npus)
    ems = profile.ems
    return int(nodes * profile.pool_bytes * ems.dram_share / ems.replication_factor)
