"""The ledger: what the emulator acknowledged, and so what a read may return. A failed operation
may or may not have happened, so after one the ledger keeps every value still possible (up to
MAX_POSSIBLE, then "unknown", which no read is checked against); operations on one region, word
or key are serialised by its lock, so the values are exact."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bench.soak.config import HISTORY_PER_KEY, INLINE_MAX, MAX_POSSIBLE
from cmemu.v1 import ub_pb2

Bytes = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]


@dataclass(eq=False)
class Region:
    """A region of real bytes: what the soak wrote (`shadow`) and which of its bytes an
    acknowledged write set (`known`); a failed write makes its range unknown until rewritten."""

    device: str
    eid: int
    offset: int
    size: int
    shadow: Bytes
    known: Mask
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def address(self, at: int = 0) -> ub_pb2.UbAddress:
        return ub_pb2.UbAddress(eid=self.eid, offset=self.offset + at)

    def differing(self, at: int, got: bytes, size: int) -> int:
        """Known bytes of region[at:at+size] that `got` disagrees with."""
        known = self.known[at : at + size]
        if len(got) != size:
            return int(np.count_nonzero(known))
        differ = np.frombuffer(got, np.uint8) != self.shadow[at : at + size]
        return int(np.count_nonzero(differ & known))


@dataclass(eq=False)
class Word:
    """An 8-byte counter and the values it may hold (None: unknown, after too many failures)."""

    device: str
    eid: int
    offset: int
    possible: set[int] | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def address(self) -> ub_pb2.UbAddress:
        return ub_pb2.UbAddress(eid=self.eid, offset=self.offset)

    def maybe(self, apply: Callable[[int], int]) -> None:
        """An atomic that failed: applied or not, so every value it may have made is possible."""
        if self.possible is not None:
            grown = self.possible | {apply(v) for v in self.possible}
            self.possible = grown if len(grown) <= MAX_POSSIBLE else None


Value = bytes | None  # an EMS object's contents; None: absent


@dataclass
class Objects:
    """Every EMS key the soak touched and the contents it may have: one value once a put or
    delete is acknowledged, old and new after a failed one (None in the list: absent)."""

    states: dict[str, list[Value] | None] = field(default_factory=dict)  # None: unknown
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # the last operations on each key, "t=12.3 put 4096 B -> n01-mem,n02-mem": for a reproduction
    history: dict[str, deque[str]] = field(default_factory=dict)
    bad: set[str] = field(default_factory=set)  # keys some read disagreed about: history reported
    now: Callable[[], float] = time.monotonic

    def note(self, key: str, what: str) -> None:
        self.history.setdefault(key, deque(maxlen=HISTORY_PER_KEY)).append(
            f"t={self.now():.2f} {what}"
        )

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def possible(self, key: str) -> list[Value] | None:
        return self.states.get(key, [None])

    def acknowledged(self, key: str, value: Value, what: str) -> None:
        self.note(key, what)
        self.states[key] = [value]

    def maybe(self, key: str, value: Value, what: str) -> None:
        self.note(key, what)
        now = self.possible(key)
        if now is None:
            return
        if not holds(now, value):
            now = [*now, value]
        self.states[key] = now if len(now) <= MAX_POSSIBLE else None


@dataclass
class Sends:
    """SENDs not yet received: id -> (dst, data, size of a size-only one); `acked` those of them
    acknowledged (a failed one may arrive or not); `mailboxes` every device sent to."""

    expected: dict[str, tuple[str, bytes, int]] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    mailboxes: set[str] = field(default_factory=set)


def holds(possible: list[Value], value: Value) -> bool:
    """Whether `value` is one the ledger allows."""
    return any(v == value for v in possible)


def streamed(possible: list[Value]) -> bool:
    """Whether some possible value is over one inline payload (read by GetStream only)."""
    return any(v is not None and len(v) > INLINE_MAX for v in possible)


def said(value: Value, absent: str = "NOT_FOUND") -> str:
    """What a read returned that the ledger does not allow, for the wrong-read report."""
    return absent if value is None else f"{len(value)} B not put"


def describe(possible: list[Value] | None) -> str:
    if possible is None:
        return "unknown"
    return " or ".join("absent" if v is None else f"{len(v)} B" for v in possible)
