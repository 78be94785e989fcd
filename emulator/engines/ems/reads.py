"""The store's read path: an object's chunks from the first copy that serves each, checked
against their CRCs, or from the SSD tier. A copy that is unreachable or corrupt is passed by for
the next (a corrupt one is dropped for the sweep to replace); a reader that is itself down is
blamed, not the copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from cmemu.emulator.engines.ems.store import UNREACHABLE, Store, log
from cmemu.emulator.model.costmodel import ems_ssd_ns
from cmemu.emulator.model.ems import (
    TRAILER_HEAD_BYTES,
    ObjectMeta,
    Replica,
    Tier,
    Timing,
    check_key,
    chunk_crcs,
    decode_trailer,
    decode_trailer_head,
    spans,
    trailer_bytes,
)
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    DataLossError,
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    quote,
)
from cmemu.emulator.model.memory import NOT_ALLOCATED
from cmemu.emulator.model.topology import Device
from cmemu.emulator.model.ub import Op

CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"  # every copy read failed the CRC-32 kept at put


class CorruptCopy(DataLossError):
    """A copy's bytes (or its chunk table) fail their checksum here: the next copy may serve. A
    DataLossError a pool itself answers (an uncorrectable ECC error) is not this, and ends the
    read as it did over gRPC."""


@dataclass(kw_only=True)
class Fetched:
    """An object read from EMS: its bytes, the copy that served them and when."""

    meta: ObjectMeta
    data: bytes
    served_by: str  # a pool, or "ssd"
    corrupt_copies: int
    issue_ns: int
    complete_ns: int


@dataclass(kw_only=True)
class Reading:
    """A read in progress: `chunks()` yields the object's bytes in order (nothing for a size-only
    object); once it is exhausted the other fields say where they came from and when."""

    meta: ObjectMeta
    served_by: str = ""
    corrupt_copies: int = 0
    gone_copies: int = 0  # copies whose region their pool no longer has (it came back empty)
    timing: Timing = field(default_factory=Timing)
    source: AsyncIterator[bytes] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.source is not None:
            async for piece in self.source:
                yield piece


class Copies:
    """An object's chunks in order, from the first copy that serves each: a copy that is
    unreachable or fails a checksum is left for the next, from the chunk where it failed
    (Reads.piece reads one, Reads.failed passes a copy by). An iterator object, not an async
    generator: asyncio hooks the first step of every async generator (a WeakSet entry, taken
    out again by a weakref callback when it is gone), which every Get paid for its one chunk."""

    def __init__(
        self, reads: Reads, meta: ObjectMeta, requester: Device | None, reading: Reading
    ) -> None:
        self.reads = reads
        self.meta = meta
        self.requester = requester
        self.reading = reading
        self.copies: Iterator[tuple[str, Replica]] | None = None  # the plan, at the first step
        self.copy: tuple[str, Replica] | None = None  # the copy read from now
        self.unavailable: list[str] = []
        self.pieces: list[tuple[int, int]] = []  # once the chunk size is known (the table read)
        self.position = 0  # the next piece to deliver
        self.elapsed = 0
        self.ended = False

    def __aiter__(self) -> Copies:
        return self

    async def __anext__(self) -> bytes:
        meta, reads = self.meta, self.reads
        try:
            if self.copies is None:
                placement = reads.store.placement
                node = self.requester.node if self.requester is not None else None
                plan = placement.read_order(meta, node)
                self.unavailable = [f"{p} ({placement.health[p]})" for p in plan.down]
                self.copies = iter(plan.copies)
                self.copy = next(self.copies, None)
            while not self.ended:
                if self.copy is None:
                    raise _no_copy(meta, self.reading, self.unavailable)
                pool, replica = self.copy
                issuer = self.requester or reads.store.pools[pool]
                try:
                    data = await reads.piece(meta, issuer, pool, replica, self)
                except EmulatorError as exc:  # the pool's or the issuer's answer
                    await reads.failed(meta, pool, replica, self, exc)
                    self.copy = next(self.copies, None)
                    continue
                if data is None:  # this copy delivered the rest
                    break
                if meta.real:
                    return data
        except BaseException:
            self.ended = True  # as a generator that raised: done
            raise
        self.ended = True
        raise StopAsyncIteration


class Reads:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _find(self, key: str) -> ObjectMeta:
        check_key(key)
        meta = self.store.index.get(key)
        if meta is None:
            self.store.counters.misses += 1
            raise NotFoundError(f"no object {quote(key)}", subject=key, reason="OBJECT_NOT_FOUND")
        return meta

    async def read(self, key: str, device: str = "") -> Reading:
        """Start reading an object as `device`; the bytes come from the Reading's chunks()."""
        self.store.serving()
        requester = self.store.requester(device)
        meta = self._find(key)
        self.store.counters.hits += 1
        if meta.key in self.store.index.objects:
            self.store.index.touch(meta.key)
        if meta.tier is Tier.SSD:
            return await self._read_ssd(meta)
        return self.reading(meta, requester)

    async def get(self, key: str, device: str = "", limit: int | None = None) -> Fetched:
        """Read a whole object; one over `limit` bytes of real data goes by read() instead."""
        self.store.serving()
        reading = await self.read(key, device)
        meta = reading.meta
        if limit is not None and meta.real and meta.size > limit:
            raise PreconditionError(
                f"{quote(key)} has {meta.size} bytes: a Get returns at most {limit}; use GetStream",
                field="key",
                subject=key,
                reason="OBJECT_TOO_LARGE_FOR_GET",
            )
        source = reading.source  # chunks() without its own generator round per piece
        data = b"".join([piece async for piece in source]) if source is not None else b""
        return Fetched(
            meta=meta,
            data=data,
            served_by=reading.served_by,
            corrupt_copies=reading.corrupt_copies,
            issue_ns=reading.timing.issue_ns,
            complete_ns=reading.timing.complete_ns,
        )

    async def read_all(self, meta: ObjectMeta) -> bytes:
        """An object's bytes from its copies, as the store itself reads them (no requester)."""
        reading = self.reading(meta, None)
        return b"".join([piece async for piece in reading.chunks()])

    async def _read_ssd(self, meta: ObjectMeta) -> Reading:
        try:
            data = await asyncio.to_thread(self.store.ssd.read, meta.key)
        except FileNotFoundError:  # its drives failed under this read (ssd-loss)
            raise DataLossError(
                f"the SSD copy of {quote(meta.key)} is gone with the SSD tier",
                subject=meta.key,
                reason="SSD_LOST",
            ) from None
        if meta.real:
            if meta.chunked:
                good = meta.crcs is not None and chunk_crcs(data, meta.chunk_bytes) == meta.crcs
            else:
                good = zlib.crc32(data) == meta.crc
            if not good:
                self.store.counters.corrupt += 1
                self.store.publish("corrupt-copy", key=meta.key, copy="ssd", copies_left=0)
                raise DataLossError(
                    f"the SSD copy of {quote(meta.key)} fails its CRC-32 checksum",
                    subject=meta.key,
                    reason=CHECKSUM_MISMATCH,
                )
        now = self.store.clock.now_ns()
        reading = Reading(meta=meta, served_by="ssd")
        reading.timing.add(now, now + ems_ssd_ns(meta.size, self.store.profile))

        async def one() -> AsyncIterator[bytes]:
            if meta.real:
                yield data

        reading.source = one()
        return reading

    def reading(self, meta: ObjectMeta, requester: Device | None) -> Reading:
        reading = Reading(meta=meta)
        reading.source = Copies(self, meta, requester, reading)
        return reading

    async def piece(
        self, meta: ObjectMeta, issuer: Device, pool: str, replica: Replica, copies: Copies
    ) -> bytes | None:
        """The next piece of `meta` (b"" for a size-only object) from one copy, checked against
        its CRC, and counted in the reading's timing; None once every piece is delivered."""
        store = self.store
        if meta.chunked and meta.crcs is None:
            meta.chunk_bytes, meta.crcs = await self._table(issuer, pool, replica, meta)
        if not copies.pieces:
            chunked = meta.real and meta.chunked
            copies.pieces = spans(meta.size, meta.chunk_bytes) if chunked else [(0, meta.size)]
        position = copies.position
        if position >= len(copies.pieces):
            return None
        start, length = copies.pieces[position]
        done = await store.transfer(
            issuer, Op.READ, pool=pool, replica=replica, size=length,
            offset=start, size_only=not meta.real,
        )  # fmt: skip
        if meta.real and zlib.crc32(done.data) != (
            meta.crcs[position] if meta.crcs is not None else meta.crc
        ):
            raise CorruptCopy(f"chunk {position} of {quote(meta.key)} on {pool} fails its CRC-32")
        reading = copies.reading
        reading.timing.issue_ns = reading.timing.issue_ns or done.issue_ns
        copies.elapsed += done.complete_ns - done.issue_ns
        reading.timing.duration_ns = copies.elapsed
        reading.served_by = pool
        copies.position = position + 1
        return done.data

    async def failed(
        self, meta: ObjectMeta, pool: str, replica: Replica, copies: Copies, exc: EmulatorError
    ) -> None:
        """A copy that could not serve the next piece: passed by for the next copy (a corrupt one
        dropped and freed, a gone one dropped, an unreachable one noted), or the error raised
        (the pool's own answer, or a reader that is itself down)."""
        store = self.store
        reading = copies.reading
        if isinstance(exc, CorruptCopy):
            reading.corrupt_copies += 1
            store.counters.corrupt += 1
            if self._drop(meta, pool, "DATA_LOSS on a copy; reading another"):
                with contextlib.suppress(EmulatorError):
                    await store.free_region(pool, replica.region_id)
            store.publish("corrupt-copy", key=meta.key, copy=pool, detail=str(exc),
                          copies_left=len(meta.replicas))  # fmt: skip
            return
        if isinstance(exc, PreconditionError) and exc.reason == NOT_ALLOCATED:
            # its pool came back empty (a pool-loss, a wiped restart) and the sweep has not
            # reconciled it yet: this copy is gone, the next may serve
            reading.gone_copies += 1
            self._drop(meta, pool, "a copy's region is gone; reading another")
            return
        if not isinstance(exc, UNREACHABLE):
            raise exc
        if copies.requester is not None:
            await self._check_reader(copies.requester, exc)
        copies.unavailable.append(pool)

    def _drop(self, meta: ObjectMeta, pool: str, why: str) -> bool:
        """A copy that cannot serve is forgotten (the sweep restores the factor); False when the
        object changed meanwhile (its new copies are not this one)."""
        log.warning(why, key=meta.key, pool=pool)
        if self.store.index.get(meta.key) is not meta:
            return False
        self.store.index.drop_replica(meta, pool)
        return True

    async def _table(
        self, issuer: Device, pool: str, replica: Replica, meta: ObjectMeta
    ) -> tuple[int, tuple[int, ...]]:
        """A copy's chunk table, checked. An object rebuilt or adopted from a label does not know
        its chunk size (the label has no room for it): the trailer's head says, read first."""
        chunk_bytes = meta.chunk_bytes
        if not chunk_bytes:
            head = await self.store.transfer(
                issuer, Op.READ, pool=pool, replica=replica, size=TRAILER_HEAD_BYTES,
                offset=meta.size,
            )  # fmt: skip
            with _corrupt():
                chunk_bytes = decode_trailer_head(head.data, meta.size)
        done = await self.store.transfer(
            issuer, Op.READ, pool=pool, replica=replica,
            size=trailer_bytes(meta.size, chunk_bytes), offset=meta.size,
        )  # fmt: skip
        with _corrupt():
            return decode_trailer(done.data, meta.crc, meta.size)

    async def _check_reader(self, reader: Device, cause: EmulatorError) -> None:
        """A read that failed for want of a reachable device: blame the reader when it is the
        one that is down, not the copies."""
        try:
            fault = await self.store.fault_state(reader)
        except EmulatorError as exc:
            why = f"unreachable: {exc}"
        else:
            if not fault.faulted:
                return
            why = f"faulted: {quote(fault.reason)}"
        raise UnavailableError(
            f"the reading device {reader.id} is {why}",
            field="device",
            subject=reader.id,
            reason="READER_UNAVAILABLE",
            retry_after_s=RETRY_AFTER_S,
        ) from cause


@contextlib.contextmanager
def _corrupt() -> Iterator[None]:
    """A chunk table that fails its checks, read from a copy, is that copy's corruption."""
    try:
        yield
    except DataLossError as exc:
        raise CorruptCopy(str(exc)) from exc


def _no_copy(meta: ObjectMeta, reading: Reading, unavailable: list[str]) -> EmulatorError:
    """Why no copy served: all gone, all corrupt (DATA_LOSS), or some unreachable (UNAVAILABLE,
    worth a retry)."""
    if reading.gone_copies and not (unavailable or reading.corrupt_copies):
        return DataLossError(
            f"every copy of {quote(meta.key)} is gone with its pool's memory "
            f"({reading.gone_copies} gone)",
            subject=meta.key,
            reason="COPIES_GONE",
        )
    if reading.corrupt_copies and not unavailable:
        return DataLossError(
            f"every reachable copy of {quote(meta.key)} fails its CRC-32 checksum "
            f"({reading.corrupt_copies} corrupt)",
            subject=meta.key,
            reason=CHECKSUM_MISMATCH,
        )
    return UnavailableError(
        f"no copy of {quote(meta.key)} is reachable: {', '.join(unavailable) or 'none left'}",
        subject=meta.key,
        reason="NO_COPY_REACHABLE",
        retry_after_s=RETRY_AFTER_S,
    )
