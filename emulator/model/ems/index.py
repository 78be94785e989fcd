"""The object index: objects by key in least-recently-used order, their copies and tiers, what
each pool holds, the region-label codec, and listing by pages.

Every copy's region carries its object's metadata in its label (`encode_label`), so a restarted
EMS rebuilds this index by listing the pools.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from cmemu.emulator.model.errors import InvalidArgumentError

LABEL_VERSION = "ems2"  # ems2|gen|kind|pinned|size|crc|key; "ems1" labels (no gen) still read
TOMBSTONE_VERSION = "ems2t"  # ems2t|gen|key: a key deleted at gen, while a copy may survive
ABORT_VERSION = "ems2a"  # ems2a|gen|pool,pool|key: a put of key at gen failed; those may hold it
PAGE_SIZE_DEFAULT = 1000
PAGE_SIZE_MAX = 10_000
_TOKEN_MARK = "ems-list1|"


class Tier(StrEnum):
    DRAM = "dram"
    SSD = "ssd"


@dataclass
class Replica:
    """One copy of an object: its region in a memory pool."""

    region_id: int
    offset: int


@dataclass
class ObjectMeta:
    """An EMS object's index entry: its key, size, checksum, tier and where its copies are."""

    key: str
    kind: int
    size: int
    crc: int | None  # None: a size-only object; chunked: the CRC-32 of the chunk table
    pinned: bool
    replicas: dict[str, Replica] = field(default_factory=dict)  # pool id -> its copy
    tier: Tier = Tier.DRAM
    gen: int = 0  # the version: a newer generation of a key supersedes an older one
    chunked: bool = False  # each copy holds its chunk table after the data (see chunks.py)
    crcs: tuple[int, ...] | None = None  # the chunk table once read (chunked objects)
    chunk_bytes: int = 0  # the chunk size of the table (chunked objects)

    @property
    def real(self) -> bool:
        return self.crc is not None


@dataclass
class Tombstone:
    """A key deleted at `gen` while a pool that may hold an older copy could not be told: kept
    in regions of its own (`regions`: pool -> region id) until every pool in `pending` has been
    reconciled, so that no restart or returning pool brings the key back."""

    key: str
    gen: int
    regions: dict[str, int] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)


@dataclass
class Aborted:
    """A put that failed (generation `gen` of `key`, never indexed) leaving a copy that could
    not be freed on each pool of `owed`: kept in regions of its own (`regions`: pool -> region
    id) until every pool in `pending` has been reconciled, so that no restart or returning pool
    adopts such a copy. It frees that generation only: older and newer copies are not its."""

    key: str
    gen: int
    owed: set[str] = field(default_factory=set)  # as its label lists them
    regions: dict[str, int] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)


def encode_label(meta: ObjectMeta) -> str:
    crc = "-" if meta.crc is None else f"{'t' if meta.chunked else ''}{meta.crc:08x}"
    return (
        f"{LABEL_VERSION}|{meta.gen:x}|{meta.kind}|{int(meta.pinned)}|{meta.size}|{crc}|{meta.key}"
    )


def encode_tombstone(key: str, gen: int) -> str:
    return f"{TOMBSTONE_VERSION}|{gen:x}|{key}"


def encode_abort(key: str, gen: int, owed: Iterable[str]) -> str:
    return f"{ABORT_VERSION}|{gen:x}|{','.join(sorted(owed))}|{key}"


def decode_label(label: str) -> ObjectMeta | None:
    """The object a region holds, or None for a region that is not an EMS copy."""
    if label.startswith("ems1|"):  # before generations: the oldest of all
        label = f"{LABEL_VERSION}|0|" + label[len("ems1|") :]
    parts = label.split("|", 6)
    if len(parts) != 7 or parts[0] != LABEL_VERSION:
        return None
    _, gen, kind, pinned, size, crc, key = parts
    chunked = crc.startswith("t")
    return ObjectMeta(
        key=key,
        kind=int(kind),
        size=int(size),
        crc=None if crc == "-" else int(crc.removeprefix("t"), 16),
        pinned=pinned == "1",
        gen=int(gen, 16),
        chunked=chunked,
    )


def decode_tombstone(label: str) -> Tombstone | None:
    parts = label.split("|", 2)
    if len(parts) != 3 or parts[0] != TOMBSTONE_VERSION:
        return None
    return Tombstone(key=parts[2], gen=int(parts[1], 16))


def decode_abort(label: str) -> Aborted | None:
    parts = label.split("|", 3)
    if len(parts) != 4 or parts[0] != ABORT_VERSION:
        return None
    _, gen, owed, key = parts
    return Aborted(key=key, gen=int(gen, 16), owed=set(filter(None, owed.split(","))))


@dataclass(frozen=True)
class Page:
    """One page of a listing of objects, and the token of the next."""

    objects: list[ObjectMeta]
    next_token: str  # empty on the last page


def _token(last_key: str) -> str:
    return base64.urlsafe_b64encode((_TOKEN_MARK + last_key).encode()).decode()


def _after(token: str, prefix: str) -> str:
    """The last key of the page a token continues from."""
    try:
        text = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    if not text.startswith(_TOKEN_MARK) or not text[len(_TOKEN_MARK) :].startswith(prefix):
        raise InvalidArgumentError("page_token is not one this listing returned")
    return text[len(_TOKEN_MARK) :]


class Index:
    """Objects by key in least-recently-used order, and what each pool holds."""

    def __init__(self) -> None:
        self.objects: OrderedDict[str, ObjectMeta] = OrderedDict()
        self.pool_bytes: dict[str, int] = {}
        self.tombstones: dict[str, Tombstone] = {}
        self.aborted: dict[tuple[str, int], Aborted] = {}  # (key, gen) -> its abort marker
        # pool -> keys whose copy there left the index while the pool was dead (replaced
        # elsewhere): a delete of one owes that pool a tombstone
        self.detached: dict[str, set[str]] = {}
        self.last_gen = 0  # the newest generation seen: new ones are later

    def next_gen(self, floor: int = 0) -> int:
        """A generation later than every one seen (and than `floor`, e.g. the wall clock in ns,
        which keeps generations rising across restarts even when the newest are out of sight)."""
        self.last_gen = max(self.last_gen + 1, floor)
        return self.last_gen

    def seen(self, gen: int) -> None:
        self.last_gen = max(self.last_gen, gen)

    def settle(self, pool: str) -> None:
        """The pool has been reconciled, every region it was told to free freed: it owes the
        tombstones and abort markers nothing more."""
        for tombstone in self.tombstones.values():
            tombstone.pending.discard(pool)
        for marker in self.aborted.values():
            marker.pending.discard(pool)
        self.detached.pop(pool, None)

    def owe(self, pool: str) -> None:
        """The pool was told to free regions it did not free: every tombstone and abort marker
        stays until it is reconciled again."""
        for tombstone in self.tombstones.values():
            tombstone.pending.add(pool)
        for marker in self.aborted.values():
            marker.pending.add(pool)

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

    def page(self, *, prefix: str = "", page_size: int = 0, token: str = "") -> Page:
        """Objects whose key starts with `prefix`, in key order, `page_size` at a time (0: the
        default; more than the maximum: the maximum). `token` continues after the page that
        returned it; objects put or deleted between pages show up or not, none repeats."""
        size = min(page_size or PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX)
        after = _after(token, prefix) if token else None
        keys = sorted(
            k for k in self.objects if k.startswith(prefix) and (after is None or k > after)
        )
        chosen = keys[:size]
        more = len(keys) > size
        return Page(
            objects=[self.objects[k] for k in chosen],
            next_token=_token(chosen[-1]) if more else "",
        )
