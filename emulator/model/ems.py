"""The elastic memory store's core: placement, the object index, LRU order, prefix keys.

No I/O here. The service (services/ems.py) moves the bytes over UB and keeps this in step; the
index can be rebuilt from the pools because every copy's region carries its object's metadata in
its label (`encode_label`), which is how EMS survives its own restart.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from emulator.model.errors import InvalidArgumentError, OutOfRangeError

LABEL_VERSION = "ems1"
KEY_MAX_BYTES = 200  # the region label holds the key: 256 characters in all


class Tier(StrEnum):
    DRAM = "dram"
    SSD = "ssd"


@dataclass
class Replica:
    region_id: int
    offset: int


@dataclass
class ObjectMeta:
    key: str
    kind: int
    size: int
    crc: int | None  # None: a size-only object
    pinned: bool
    replicas: dict[str, Replica] = field(default_factory=dict)  # pool id -> its copy
    tier: Tier = Tier.DRAM

    @property
    def real(self) -> bool:
        return self.crc is not None


def check_key(key: str) -> None:
    if not key:
        raise InvalidArgumentError("key must not be empty")
    if len(key.encode()) > KEY_MAX_BYTES:
        raise InvalidArgumentError(f"key longer than {KEY_MAX_BYTES} bytes")
    if any(c in key for c in "|\n"):
        raise InvalidArgumentError("key must not contain '|' or a newline")


def encode_label(meta: ObjectMeta) -> str:
    crc = "-" if meta.crc is None else f"{meta.crc:08x}"
    return f"{LABEL_VERSION}|{meta.kind}|{int(meta.pinned)}|{meta.size}|{crc}|{meta.key}"


def decode_label(label: str) -> ObjectMeta | None:
    """The object a region holds, or None for a region that is not an EMS copy."""
    parts = label.split("|", 5)
    if len(parts) != 6 or parts[0] != LABEL_VERSION:
        return None
    _, kind, pinned, size, crc, key = parts
    return ObjectMeta(
        key=key,
        kind=int(kind),
        size=int(size),
        crc=None if crc == "-" else int(crc, 16),
        pinned=pinned == "1",
    )


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing over pools: adding or losing a pool moves only its share of keys."""

    def __init__(self, pools: Sequence[str], vnodes: int) -> None:
        self.pools = list(pools)
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

    def owners(self, key: str, count: int, *, usable: Iterable[str] | None = None) -> list[str]:
        allowed = set(self.pools if usable is None else usable)
        return [p for p in self.walk(key) if p in allowed][:count]


class Index:
    """Objects by key in least-recently-used order, and what each pool holds."""

    def __init__(self) -> None:
        self.objects: OrderedDict[str, ObjectMeta] = OrderedDict()
        self.pool_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.objects)

    def get(self, key: str) -> ObjectMeta | None:
        return self.objects.get(key)

    def touch(self, key: str) -> None:
        self.objects.move_to_end(key)

    def add(self, meta: ObjectMeta) -> None:
        self.objects[meta.key] = meta
        for pool in meta.replicas:
            self.pool_bytes[pool] = self.pool_bytes.get(pool, 0) + meta.size

    def drop_replica(self, meta: ObjectMeta, pool: str) -> None:
        if meta.replicas.pop(pool, None) is not None:
            self.pool_bytes[pool] -= meta.size

    def add_replica(self, meta: ObjectMeta, pool: str, replica: Replica) -> None:
        meta.replicas[pool] = replica
        self.pool_bytes[pool] = self.pool_bytes.get(pool, 0) + meta.size

    def remove(self, key: str) -> ObjectMeta | None:
        meta = self.objects.pop(key, None)
        if meta is not None:
            for pool in list(meta.replicas):
                self.pool_bytes[pool] -= meta.size
        return meta

    def lru_victims(self, pool: str) -> Iterator[ObjectMeta]:
        """Unpinned DRAM objects with a copy on `pool`, least recently used first."""
        for meta in list(self.objects.values()):
            if not meta.pinned and meta.tier is Tier.DRAM and pool in meta.replicas:
                yield meta


def check_block_tokens(block_tokens: int, low: int, high: int) -> None:
    if not low <= block_tokens <= high:
        raise OutOfRangeError(f"block_tokens must be {low} to {high}, got {block_tokens}")


def prefix_keys(tokens: Sequence[int], block_tokens: int, namespace: str = "") -> list[str]:
    """One key per full block; block i's key hashes every token of blocks 0..i (a chain), so two
    sequences share block keys exactly as long as they share a prefix."""
    keys = []
    digest = hashlib.sha256(f"cmemu-prefix|{namespace}|{block_tokens}".encode()).digest()
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = struct.pack(f"<{block_tokens}I", *tokens[start : start + block_tokens])
        digest = hashlib.sha256(digest + block).digest()
        keys.append(f"kv-{digest.hex()[:40]}")
    return keys
