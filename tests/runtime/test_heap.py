"""The heap trimmer (emulator/runtime/heap.py): what glibc keeps freed inside its heaps goes back to
the kernel, and the trimming task ends with its supernode."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

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


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def _cycle_alive_after_collect() -> bool:
    """Whether a cycle made now and dropped survives a full collection."""
    import weakref

    ref = weakref.ref(_Cycle())
    gc.collect()
    return ref() is not None


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """Whatever a test does to the collector, the next test finds it on and nothing frozen."""
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.usefixtures("collector_restored")
def test_a_start_pauses_the_collector_then_freezes_what_it_built() -> None:
    import weakref

    assert gc.isenabled()
    with heap.starting():
        assert not gc.isenabled()
        built = weakref.ref(_Cycle())  # a start's garbage cycle: kept while frozen
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.collect()
    assert built() is not None  # frozen: the collections while it serves never walk it
    assert not _cycle_alive_after_collect()  # what is made after the start is collected
    heap.stopped()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert built() is None  # unfrozen at the stop: a run of many starts keeps none of them


@pytest.mark.usefixtures("collector_restored")
def test_nested_starts_resume_once_and_a_failed_one_still_resumes() -> None:
    with heap.starting():
        with heap.starting():
            pass
        assert not gc.isenabled()  # another supernode of the process is still starting
        heap.stopped()  # a failed start's stop, inside the outer start: nothing unfrozen yet
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.unfreeze()
    with pytest.raises(RuntimeError), heap.starting():
        raise RuntimeError("a start that raises")
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_restored")
def test_a_collector_switched_off_by_the_caller_stays_off() -> None:
    gc.disable()
    with heap.starting():
        pass
    assert not gc.isenabled() and gc.get_freeze_count() == 0
