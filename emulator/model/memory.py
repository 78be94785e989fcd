"""A device's UB memory: capacity accounted to the byte, bytes kept only where written.

An NPU has 128 GB of HBM and a memory pool terabytes of DRAM; the emulator accounts all of it but
stores only the bytes that were actually written with real payloads, page by page, up to a cap.
Reads return exactly what was written (zeros where nothing was). Nothing here knows of gRPC.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from cmemu.emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
)

WORD = 8  # atomics operate on aligned little-endian 64-bit words
WORD_MASK = (1 << 64) - 1

NOT_ALLOCATED = "REGION_NOT_ALLOCATED"  # an access outside every region (a wiped device's too)


@dataclass(frozen=True, kw_only=True)
class Region:
    """An allocated region of a device's memory: where it starts, its size and label."""

    region_id: int
    offset: int
    size: int
    label: str

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True, kw_only=True)
class RegionPage:
    """One page of a device's live regions by address, with what its memory holds in all: what a
    pool's listing says (EMS rebuilds its index from the labels)."""

    regions: tuple[Region, ...]
    next_page_token: str  # "" on the last page
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    largest_free_bytes: int
    region_count: int


class StoreBudget:
    """The real bytes every PageStore of one process holds together, against one cap
    (EmulatorLimits.process_stored_bytes_cap): devices in one process share its memory."""

    def __init__(self, *, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.used_bytes = 0

    def take(self, nbytes: int, requested: int) -> None:
        if self.used_bytes + nbytes > self.cap_bytes:
            raise CapacityError(
                "real bytes held by this process (raise the cap or send size-only)",
                requested,
                max(0, self.cap_bytes - self.used_bytes),
                reason="PROCESS_STORE_FULL",
            )
        self.used_bytes += nbytes

    def give(self, nbytes: int) -> None:
        self.used_bytes = max(0, self.used_bytes - nbytes)


class QueueBudget:
    """Messages queued in every inbox of one process, and their payload bytes, against caps
    (EmulatorLimits.process_inbox_max_messages and process_inbox_max_bytes)."""

    def __init__(self, *, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.messages = 0
        self.bytes = 0

    def check(self, nbytes: int) -> None:
        if self.messages + 1 > self.max_messages:
            raise CapacityError(
                "messages queued in this process",
                1,
                max(0, self.max_messages - self.messages),
                unit="messages",
                reason="RECEIVE_QUEUE_FULL",
            )
        if self.bytes + nbytes > self.max_bytes:
            raise CapacityError(
                "message bytes queued in this process",
                nbytes,
                max(0, self.max_bytes - self.bytes),
                reason="RECEIVE_QUEUE_FULL",
            )

    def take(self, nbytes: int) -> None:
        self.check(nbytes)
        self.messages += 1
        self.bytes += nbytes

    def give(self, nbytes: int) -> None:
        self.messages = max(0, self.messages - 1)
        self.bytes = max(0, self.bytes - nbytes)


class RegionAllocator:
    """First-fit allocation of aligned extents inside [0, capacity), with coalescing frees."""

    def __init__(self, *, capacity: int, alignment: int, max_regions: int | None = None) -> None:
        self.capacity = capacity
        self.alignment = alignment
        self.max_regions = max_regions
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity else []  # (offset, size)
        self._regions: dict[int, Region] = {}
        self._starts: list[int] = []  # sorted offsets of live regions, for lookup by address
        self._by_start: dict[int, Region] = {}
        self._next_id = 1
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return max((size for _, size in self._free), default=0)

    def regions(self, start: int = 0, limit: int | None = None) -> list[Region]:
        """Live regions by address; `start` and `limit` take a page of them (ListRegions)."""
        end = len(self._starts) if limit is None else start + limit
        return [self._by_start[s] for s in self._starts[start:end]]

    def index_at(self, offset: int) -> int:
        """The index in address order of the first region at or after `offset`."""
        return bisect.bisect_left(self._starts, offset)

    @property
    def count(self) -> int:
        return len(self._starts)

    def allocate(self, size: int, label: str = "") -> Region:
        if size <= 0:
            raise InvalidArgumentError(f"region size must be > 0, got {size}")
        if size > self.capacity:
            raise CapacityError("allocation", size, self.free, self.largest_free)
        if self.max_regions is not None and len(self._regions) >= self.max_regions:
            raise CapacityError(
                "regions of this device",
                1,
                0,
                unit="regions",
                reason="TOO_MANY_REGIONS",
            )
        rounded = -(-size // self.alignment) * self.alignment
        for i, (offset, extent) in enumerate(self._free):
            if extent >= rounded:
                if extent == rounded:
                    del self._free[i]
                else:
                    self._free[i] = (offset + rounded, extent - rounded)
                region = Region(region_id=self._next_id, offset=offset, size=rounded, label=label)
                self._next_id += 1
                self._regions[region.region_id] = region
                self._by_start[offset] = region
                bisect.insort(self._starts, offset)
                self._used += rounded
                return region
        # the size asked for, not the aligned one: the caller recognises its own figure
        raise CapacityError("allocation", size, self.free, self.largest_free)

    def release(self, region_id: int) -> Region:
        region = self._regions.pop(region_id, None)
        if region is None:
            raise NotFoundError(f"no region {region_id}")
        del self._by_start[region.offset]
        self._used -= region.size
        self._starts.pop(bisect.bisect_left(self._starts, region.offset))
        self._insert_free(region.offset, region.size)
        return region

    def _insert_free(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free, (offset, 0))
        self._free.insert(i, (offset, size))
        if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:  # merge right
            self._free[i] = (offset, size + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:  # merge left
            prev_offset, prev_size = self._free[i - 1]
            self._free[i - 1] = (prev_offset, prev_size + self._free.pop(i)[1])

    def containing(self, offset: int, size: int) -> Region:
        """The one region that holds [offset, offset+size); an access may not straddle regions."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            region = self._by_start[self._starts[i]]
            if offset + size <= region.end:
                return region
        raise PreconditionError(
            f"[{offset}, {offset + size}) is not inside one allocated region; allocate it first",
            reason=NOT_ALLOCATED,
        )


class PageStore:
    """Sparse bytes: fixed-size pages created on first write, up to a cap on pages held."""

    def __init__(
        self, *, page_bytes: int, cap_bytes: int, budget: StoreBudget | None = None
    ) -> None:
        self.page_bytes = page_bytes
        self.cap_pages = cap_bytes // page_bytes
        self.budget = budget
        self._pages: dict[int, bytearray] = {}

    @property
    def stored_bytes(self) -> int:
        return len(self._pages) * self.page_bytes

    def _span(self, offset: int, size: int) -> range:
        return range(offset // self.page_bytes, (offset + size - 1) // self.page_bytes + 1)

    def write(self, offset: int, data: bytes) -> None:
        if not data:
            return
        span = self._span(offset, len(data))
        new_pages = self.check_room(offset, len(data))
        if self.budget is not None and new_pages:
            self.budget.take(new_pages * self.page_bytes, len(data))
        view = memoryview(data)
        pages = self._pages
        for page in span:
            buf = pages.get(page)
            if buf is None:  # not setdefault: its default, a zeroed page, was made every time
                buf = pages[page] = bytearray(self.page_bytes)
            start = max(offset, page * self.page_bytes)
            end = min(offset + len(data), (page + 1) * self.page_bytes)
            base = page * self.page_bytes
            buf[start - base : end - base] = view[start - offset : end - offset]

    def check_room(self, offset: int, size: int) -> int:
        """The pages a write of `size` bytes at `offset` would add; CapacityError if the device's
        cap or the process's budget has no room for them. Changes nothing."""
        if size == 0:
            return 0
        new_pages = sum(1 for p in self._span(offset, size) if p not in self._pages)
        if len(self._pages) + new_pages > self.cap_pages:
            free = (self.cap_pages - len(self._pages)) * self.page_bytes
            raise CapacityError("real-byte store (raise the cap or send size-only)", size, free)
        budget = self.budget
        if (
            budget is not None
            and budget.used_bytes + new_pages * self.page_bytes > budget.cap_bytes
        ):
            budget.take(new_pages * self.page_bytes, size)  # raises, with the figures
        return new_pages

    def read(self, offset: int, size: int) -> bytes:
        first = offset - offset % self.page_bytes
        if size > 0 and offset + size <= first + self.page_bytes:
            # within one page (an EMS object of a chunk or less): a slice of the page, not a
            # zeroed buffer filled piece by piece and copied again
            held = self._pages.get(first // self.page_bytes)
            if held is None:
                return bytes(size)
            at = offset - first
            return bytes(held[at : at + size])
        out = bytearray(size)
        if size == 0:
            return bytes(out)
        for page in self._span(offset, size):
            buf = self._pages.get(page)
            if buf is None:
                continue
            start = max(offset, page * self.page_bytes)
            end = min(offset + size, (page + 1) * self.page_bytes)
            base = page * self.page_bytes
            out[start - offset : end - offset] = buf[start - base : end - base]
        return bytes(out)

    def discard(self, offset: int, size: int) -> None:
        """Forget the bytes of a range: whole pages are dropped, partial ones zeroed."""
        if size == 0:
            return
        span = self._span(offset, size)
        # A bulk range (a freed 128 GB region) may span millions of pages: walk the held ones.
        pages = span if len(span) <= len(self._pages) else [p for p in self._pages if p in span]
        for page in pages:
            base = page * self.page_bytes
            start, end = max(offset, base), min(offset + size, base + self.page_bytes)
            if start == base and end == base + self.page_bytes:
                if self._pages.pop(page, None) is not None and self.budget is not None:
                    self.budget.give(self.page_bytes)
            elif page in self._pages:
                self._pages[page][start - base : end - base] = bytes(end - start)


class DeviceMemory:
    """The UB memory of one device: regions, bounds checks, bytes and 64-bit atomics."""

    def __init__(
        self,
        *,
        capacity: int,
        alignment: int,
        page_bytes: int,
        cap_bytes: int,
        budget: StoreBudget | None = None,
        max_regions: int | None = None,
    ) -> None:
        self.allocator = RegionAllocator(
            capacity=capacity, alignment=alignment, max_regions=max_regions
        )
        self.store = PageStore(page_bytes=page_bytes, cap_bytes=cap_bytes, budget=budget)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def allocate(self, size: int, label: str = "") -> Region:
        return self.allocator.allocate(size, label)

    def free(self, region_id: int) -> Region:
        region = self.allocator.release(region_id)
        self.store.discard(region.offset, region.size)  # a later region must not see old bytes
        return region

    def check(self, offset: int, size: int) -> Region:
        allocator = self.allocator  # its capacity read once, not through the property thrice
        capacity = allocator.capacity
        if size > capacity:
            raise OutOfRangeError(
                f"{size} bytes are more than this device's {capacity} bytes",
                reason="TRANSFER_TOO_LARGE",
            )
        if offset >= capacity or offset + size > capacity:
            raise OutOfRangeError(
                f"[{offset}, {offset + size}) is outside this device's {capacity} bytes"
            )
        return allocator.containing(offset, size)

    def write(self, offset: int, data: bytes) -> None:
        self.check(offset, len(data))
        self.store.write(offset, data)

    def check_write(self, offset: int, size: int) -> None:
        """What `write` of `size` real bytes would check, without writing."""
        self.check(offset, size)
        self.store.check_room(offset, size)

    def check_word(self, offset: int) -> None:
        """What an atomic at `offset` would check, without touching the word."""
        if offset % WORD:
            raise InvalidArgumentError(f"atomic offset {offset} is not {WORD}-byte aligned")
        self.check(offset, WORD)

    def write_virtual(self, offset: int, size: int) -> None:
        """A size-only write: the range now holds unknown bytes, which read back as zeros."""
        self.check(offset, size)
        self.store.discard(offset, size)

    def read(self, offset: int, size: int) -> bytes:
        self.check(offset, size)
        return self.store.read(offset, size)

    def _word(self, offset: int) -> int:
        self.check_word(offset)
        return int.from_bytes(self.store.read(offset, WORD), "little")

    def compare_and_swap(self, offset: int, compare: int, swap: int) -> tuple[int, bool]:
        old = self._word(offset)
        if old == compare:
            self.store.write(offset, (swap & WORD_MASK).to_bytes(WORD, "little"))
            return old, True
        return old, False

    def fetch_add(self, offset: int, addend: int) -> int:
        old = self._word(offset)
        self.store.write(offset, ((old + addend) & WORD_MASK).to_bytes(WORD, "little"))
        return old
