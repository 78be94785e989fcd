"""The consistent-hash ring that names the pools owning a key."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Container, Iterator, Sequence


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing over pools: adding or losing a pool moves only its share of keys."""

    def __init__(self, pools: Sequence[str], vnodes: int) -> None:
        self.pools = list(pools)
        self._pool_set = frozenset(self.pools)
        self._points = sorted(
            (_point(f"{pool}#{v}"), pool) for pool in pools for v in range(vnodes)
        )
        self._hashes = [h for h, _ in self._points]

    def walk(self, key: str) -> Iterator[str]:
        """Every pool once, in ring order from the key's point."""
        start = bisect.bisect(self._hashes, _point(key))
        seen: set[str] = set()
        for i in range(len(self._points)):
            pool = self._points[(start + i) % len(self._points)][1]
            if pool not in seen:
                seen.add(pool)
                yield pool

    def owners(self, key: str, count: int, *, usable: Container[str] | None = None) -> list[str]:
        """The first `count` pools of the key's walk among `usable`: the walk stops there (a
        put's placement; cm384's ring has thousands of points, walked whole it cost most of a
        Put). `usable` is only asked about the pools walked (Placement passes a view of its
        health, not a set of every pool made per put)."""
        allowed = self._pool_set if usable is None else usable
        found: list[str] = []
        if count <= 0:
            return found
        for pool in self.walk(key):
            if pool in allowed:
                found.append(pool)
                if len(found) == count:
                    break
        return found
