"""Poisoned memory: the address ranges of a device whose bytes an uncorrectable ECC error lost.

A read that touches a poisoned range fails (DATA_LOSS at the service); a write over part of a
range heals that part, as rewriting a line clears its poison on real HBM. The ranges are kept
sorted and disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Poison:
    ranges: list[tuple[int, int]] = field(default_factory=list)  # [start, end)
    reads_refused: int = 0  # uncorrectable errors reported (telemetry's ECC counter)

    @property
    def bytes(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def add(self, start: int, end: int) -> None:
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.ranges, (start, end)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.ranges = merged

    def hit(self, start: int, size: int) -> tuple[int, int] | None:
        """The first poisoned range [start, start+size) touches, if any."""
        end = start + size
        for a, b in self.ranges:
            if a < end and start < b:
                return a, b
        return None

    def heal(self, start: int, size: int) -> None:
        """Forget the poison under [start, start+size): the bytes there were rewritten."""
        end = start + size
        kept: list[tuple[int, int]] = []
        for a, b in self.ranges:
            if b <= start or end <= a:
                kept.append((a, b))
                continue
            if a < start:
                kept.append((a, start))
            if end < b:
                kept.append((end, b))
        self.ranges = kept

    def clear(self) -> None:
        self.ranges = []
