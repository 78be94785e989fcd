"""Faulty memory of a device: address ranges whose bytes a fault touched.

`Poison`: an uncorrectable ECC error lost the bytes. A read that touches a poisoned range fails
(DATA_LOSS at the service); a write over part of a range heals that part, as rewriting a line
clears its poison on real HBM.

`Corruption`: silent data corruption (sdc). Bit flips that ECC does not catch (a multi-bit
upset past SECDED, or a defective cell or lane): every read of the range SUCCEEDS with its bytes
XORed with `mask`, and nothing at the device notices. A write does not heal it (the defect is
in the cells); only end-to-end checksums kept above the device (EMS's CRCs) find it. It lasts
until the fault clears (the part replaced).

The ranges are kept sorted and disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Ranges:
    """Byte ranges of a device's memory, kept merged: where a memory fault lies."""

    ranges: list[tuple[int, int]] = field(default_factory=list)  # [start, end)

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
        """The first range [start, start+size) touches, if any."""
        end = start + size
        for a, b in self.ranges:
            if a < end and start < b:
                return a, b
        return None

    def heal(self, start: int, size: int) -> None:
        """Forget the ranges under [start, start+size)."""
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


@dataclass
class Poison(Ranges):
    """Uncorrectable ranges: a read that touches them is refused and counted."""

    reads_refused: int = 0  # uncorrectable errors reported (telemetry's ECC counter)


@dataclass
class Corruption(Ranges):
    """Silently corrupted ranges: a read returns their bytes flipped by the mask."""

    mask: int = 0x01  # XORed into every corrupted byte a read returns

    def flip(self, start: int, data: bytes) -> bytes:
        """`data`, read from `start`, as the faulty cells return it."""
        if not self.ranges or not data:
            return data
        end = start + len(data)
        out: bytearray | None = None
        for a, b in self.ranges:
            lo, hi = max(a, start), min(b, end)
            if lo >= hi:
                continue
            out = bytearray(data) if out is None else out
            for i in range(lo - start, hi - start):
                out[i] ^= self.mask
        return data if out is None else bytes(out)
