"""The heap trimmer (emulator/runtime/heap.py): what glibc keeps freed inside its heaps goes back to
the kernel, and the trimming task ends with its supernode."""

from __future__ import annotations

import asyncio

import pytest

from cmemu.emulator.runtime import heap

MIB = 2**20
glibc = pytest.mark.skipif(heap.malloc_info() is None, reason="needs glibc 2.33+")


def fragment(pages: int) -> list[bytearray]:
    """The soak's pattern in small: 4 KiB pages and payloads freed, one page in eight kept, so
    that the heap's top never frees and glibc keeps the rest. Returns what is kept."""
    kept: list[bytearray] = []
    dropped: list[bytearray] = []
    for i in range(pages):
        (kept if i % 8 == 0 else dropped).append(bytearray(4096))
        if i % 3 == 0:
            dropped.append(bytearray(600 + i % 4000))
    del dropped
    return kept


@glibc
def test_a_trim_gives_back_what_the_heap_kept_for_nothing() -> None:
    kept = fragment(40_000)  # ~190 MB allocated, ~170 MB of it freed
    info = heap.malloc_info()
    assert info is not None and info["fordblks"] > 100 * MIB  # freed, yet held by the heap
    before = heap.rss_bytes()
    assert heap.malloc_trim()
    assert heap.rss_bytes() < before - 80 * MIB
    assert len(kept) == 5000


@glibc
def test_arenas_are_listed() -> None:
    arenas = heap.malloc_arenas()
    assert arenas and arenas[0][0] == 0  # the main thread's
    assert all(held >= free >= 0 for _, held, free in arenas)


async def test_the_trimmer_ends_when_its_owner_stops() -> None:
    stopping = asyncio.Event()
    task = asyncio.create_task(heap.trim_every(0.01, stopping))
    await asyncio.sleep(0.05)  # a few trims
    assert not task.done()
    stopping.set()
    async with asyncio.timeout(5):
        await task


@glibc
async def test_the_first_trim_is_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the start freed goes back when the servers serve, not an interval later; and the
    next trim waits for the interval (an hour here: never within the test)."""
    trims: list[float] = []
    trimmed = asyncio.Event()

    def counted() -> bool:  # on the trimmer's thread
        trims.append(1.0)
        loop.call_soon_threadsafe(trimmed.set)
        return True

    loop = asyncio.get_running_loop()

    monkeypatch.setattr(heap, "malloc_trim", counted)
    stopping = asyncio.Event()
    task = asyncio.create_task(heap.trim_every(3600.0, stopping))
    async with asyncio.timeout(10):
        await trimmed.wait()
    await asyncio.sleep(0.1)
    assert len(trims) == 1
    stopping.set()
    async with asyncio.timeout(5):
        await task


async def test_no_interval_no_trimmer() -> None:
    async with asyncio.timeout(5):
        await heap.trim_every(0.0, asyncio.Event())  # returns at once
