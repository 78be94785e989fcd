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

from cmemu.emulator.engines.ems.store import UNREACHABLE, Store, log
from cmemu.emulator.model.costmodel import ems_ssd_ns
from cmemu.emulator.model.ems import (
    TRAILER_HEAD_BYTES,
    ObjectMeta,
    Replica,
    Tier,
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


class Reading:
    """A read in progress: `chunks()` yields the object's bytes in order (nothing for a size-only
    object); once it is exhausted the other fields say where they came from and when. A get's
    result (`Fetched`) is the Reading read whole, its bytes in `data`. This one is the SSD
    tier's (its bytes read at once); a DRAM object's is `Copies`."""

    __slots__ = ("corrupt_copies", "data", "duration_ns", "gone_copies", "issue_ns", "meta",
                 "served_by")  # fmt: skip

    def __init__(self, meta: ObjectMeta, served_by: str = "", data: bytes = b"") -> None:
        self.meta = meta
        self.served_by = served_by  # a pool, or "ssd"
        self.data = data
        self.corrupt_copies = 0
        self.gone_copies = 0  # copies whose region their pool no longer has (it came back empty)
        self.issue_ns = 0
        self.duration_ns = 0

    @property
    def complete_ns(self) -> int:
        return self.issue_ns + self.duration_ns

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.meta.real:
            yield self.data


Fetched = Reading  # a get's: the Reading read whole, its bytes in `data`


class Copies(Reading):
    """A DRAM object's Reading: its chunks in order, from the first copy that serves each: a copy
    that is unreachable or fails a checksum is left for the next, from the chunk where it failed
    (Reads.failed passes a copy by). An iterator object, not an async generator: asyncio hooks
    the first step of every async generator (a WeakSet entry, taken out again by a weakref
    callback when it is gone), which every Get paid for its one chunk; and a get takes its
    pieces by `next()`, not `__anext__`, so that its end raises no StopAsyncIteration."""

    __slots__ = ("copies", "copy", "ended", "pieces", "position", "reads", "real", "requester",
                 "unavailable")  # fmt: skip

    def __init__(self, reads: Reads, meta: ObjectMeta, requester: Device | None) -> None:
        super().__init__(meta)
        self.reads = reads
        self.requester = requester
        self.real = meta.real  # read once
        self.copies: Iterator[tuple[str, Replica]] | None = None  # the plan, at the first step
        self.copy: tuple[str, Replica] | None = None  # the copy read from now
        self.unavailable: list[str] = []
        self.pieces: list[tuple[int, int]] | None = None  # once the chunk size is known
        self.position = 0  # the next piece to deliver
        self.ended = False

    def chunks(self) -> AsyncIterator[bytes]:
        return self

    def __aiter__(self) -> Copies:
        return self

    async def __anext__(self) -> bytes:
        piece = await self.next()
        if piece is None:
            raise StopAsyncIteration
        return piece

    def _plan(self) -> Iterator[tuple[str, Replica]]:
        placement = self.reads.store.placement
        node = self.requester.node if self.requester is not None else None
        copies, down = placement.read_order(self.meta, node)
        if down:
            self.unavailable = [f"{p} ({placement.health[p]})" for p in down]
        self.copies = plan = iter(copies)
        self.copy = next(plan, None)
        return plan

    async def next(self) -> bytes | None:
        """The next piece (none of a size-only object, whose pieces are read all the same),
        checked against its CRC; None once every piece is delivered (`ended`)."""
        if self.ended:
            return None
        meta, real, store = self.meta, self.real, self.reads.store
        try:
            copies = self.copies if self.copies is not None else self._plan()
            while True:
                if self.copy is None:
                    raise _no_copy(meta, self, self.unavailable)
                pool, replica = self.copy
                issuer = self.requester or store.pools[pool]
                try:
                    pieces = self.pieces
                    if pieces is None:
                        if meta.chunked and meta.crcs is None:
                            meta.chunk_bytes, meta.crcs = await self.reads._table(
                                issuer, pool, replica, meta
                            )
                        chunked = real and meta.chunked
                        pieces = spans(meta.size, meta.chunk_bytes) if chunked else [(0, meta.size)]
                        self.pieces = pieces
                    position = self.position
                    if position >= len(pieces):
                        self.ended = True
                        return None
                    done = await store.read_copy(issuer, pool, replica, pieces[position], not real)
                    data = done.data
                    if real and zlib.crc32(data) != (
                        meta.crc if meta.crcs is None else meta.crcs[position]
                    ):
                        raise CorruptCopy(
                            f"chunk {position} of {quote(meta.key)} on {pool} fails its CRC-32"
                        )
                except EmulatorError as exc:  # the pool's or the issuer's answer
                    await self.reads.failed(meta, pool, replica, self, exc)
                    self.copy = next(copies, None)
                    continue
                self.issue_ns = self.issue_ns or done.issue_ns
                self.duration_ns += done.complete_ns - done.issue_ns
                self.served_by = pool
                self.position = position = position + 1
                if position >= len(pieces):
                    self.ended = True
                    return data if real else None
                if real:
                    return data
        except BaseException:
            self.ended = True  # as a generator that raised: done
            raise


class Reads:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _find(self, key: str, device: str) -> tuple[ObjectMeta, Device | None]:
        """The object a read of `key` as `device` reads (a hit: touched), and that device."""
        store = self.store
        store.serving()
        requester = store.requester(device)
        check_key(key)
        index = store.placement.index
        meta = index.get(key)
        if meta is None:
            store.counters.misses += 1
            raise NotFoundError(f"no object {quote(key)}", subject=key, reason="OBJECT_NOT_FOUND")
        store.counters.hits += 1
        index.touch(key)
        return meta, requester

    async def read(self, key: str, device: str = "") -> Reading:
        """Start reading an object as `device`; the bytes come from the Reading's chunks()."""
        meta, requester = self._find(key, device)
        if meta.tier is Tier.SSD:
            return await self._read_ssd(meta)
        return Copies(self, meta, requester)

    async def get(self, key: str, device: str = "", limit: int | None = None) -> Fetched:
        """Read a whole object; one over `limit` bytes of real data goes by read() instead."""
        meta, requester = self._find(key, device)
        if limit is not None and meta.size > limit and meta.real:
            raise PreconditionError(
                f"{quote(key)} has {meta.size} bytes: a Get returns at most {limit}; use GetStream",
                field="key",
                subject=key,
                reason="OBJECT_TOO_LARGE_FOR_GET",
            )
        if meta.tier is Tier.SSD:  # refused over the limit before its bytes are read
            return await self._read_ssd(meta)
        copies = Copies(self, meta, requester)
        data = await copies.next()  # the first piece here: one chunk's get takes no more frames
        copies.data = (data or b"") if copies.ended else await _rest(copies, data)
        return copies

    async def read_all(self, meta: ObjectMeta) -> bytes:
        """An object's bytes from its copies, as the store itself reads them (no requester)."""
        return await _rest(Copies(self, meta, None), None)

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
        reading = Reading(meta, "ssd", data if meta.real else b"")
        reading.issue_ns = self.store.clock.now_ns()
        reading.duration_ns = ems_ssd_ns(meta.size, self.store.profile)
        return reading

    async def failed(
        self, meta: ObjectMeta, pool: str, replica: Replica, copies: Copies, exc: EmulatorError
    ) -> None:
        """A copy that could not serve the next piece: passed by for the next copy (a corrupt one
        dropped and freed, a gone one dropped, an unreachable one noted), or the error raised
        (the pool's own answer, or a reader that is itself down)."""
        store = self.store
        if isinstance(exc, CorruptCopy):
            copies.corrupt_copies += 1
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
            copies.gone_copies += 1
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


async def _rest(copies: Copies, first: bytes | None) -> bytes:
    """The pieces of `copies` after `first` (its first, if any), joined to it."""
    parts = [first] if first is not None else []
    while not copies.ended:
        piece = await copies.next()
        if piece is not None:
            parts.append(piece)
    return b"".join(parts)


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
