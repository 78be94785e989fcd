"""The process's heap: what malloc holds, and giving back what it holds for nothing.

A long run of the in-process supernode allocates and frees without pause: 4 KiB pages of the UB
byte stores (EMS objects come and go in the memory pools), payloads of up to 4 MiB, gRPC's
buffers on its own threads. glibc keeps what is freed inside its heaps for reuse and returns to
the kernel only the free top of a heap; pages that stay live scattered through the heaps hold the
rest in place. Measured on the soak (bench/soak: cm384 for 15 minutes, emulator/runtime/memdebug
reports every minute): malloc's heaps held 465 to 606 MiB, of which only 160-196 MiB was in use,
flat, while the free part grew from 270 to 416 MiB and RSS crept up with it; one malloc_trim(0)
gave back 43-99 MiB. malloc_trim(0) returns the free pages inside the heaps, not only the top
(MADV_DONTNEED); `trim_every` does that on a wall-clock interval, so that RSS follows what is
live. Where there is no glibc (musl, macOS) every function here says so and does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import time
from collections.abc import Callable, Iterator
from typing import ClassVar

import structlog

log = structlog.get_logger("cmemu.heap")


class _Starts:
    """The supernodes of this process inside `starting()` right now, and whether the first of
    them found the cyclic collector on (then the last one switches it back on); per event loop,
    its starts in progress and what waits for them to end (`after_starts`)."""

    count = 0
    resume = False
    loops: ClassVar[dict[asyncio.AbstractEventLoop, int]] = {}
    waiting: ClassVar[dict[asyncio.AbstractEventLoop, list[Callable[[], None]]]] = {}


def after_starts(then: Callable[[], None]) -> None:
    """Call `then` (on this event loop) once no start on this loop is in progress: now when
    none is. A server whose socket is bound before its process reports ready, but whose serving
    is not worth the ready moment's wait, starts serving here: the HTTP endpoints' aiohttp
    (0.2 s of CPU to import, a fifth of a cm384 boot) once `cmemu up` has written its state file
    (runtime/instance.py keeps its start open until then), while their sockets already queue
    whatever connects."""
    loop = asyncio.get_running_loop()
    if _Starts.loops.get(loop, 0) == 0:
        then()
    else:
        _Starts.waiting.setdefault(loop, []).append(then)


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """The cyclic garbage collector paused while a supernode builds and starts its servers, and
    what they built frozen (gc.freeze) once the last start of the process ends.

    Why: a cm384 start allocates about 370,000 objects that live as long as the servers do, and
    the collector's full collections, each walking all of them (about 0.1 s of CPU at the end),
    came four times in every start: a quarter of its CPU (measured, issue 18), to find about
    7,600 unreachable objects. Frozen, the servers' objects are never walked again by the
    collections that follow while they serve; what the start left unreachable (a few MB at
    most) stays until `stopped` unfreezes them. A start that raises resumes the collector
    all the same."""
    if _Starts.count == 0:
        _Starts.resume = gc.isenabled()
        gc.disable()
    _Starts.count += 1
    loop = _running_loop()
    if loop is not None:
        _Starts.loops[loop] = _Starts.loops.get(loop, 0) + 1
    try:
        yield
    finally:
        _Starts.count -= 1
        if _Starts.count == 0 and _Starts.resume:
            gc.freeze()
            gc.enable()
        if loop is not None:
            _Starts.loops[loop] -= 1
            if _Starts.loops[loop] == 0:
                del _Starts.loops[loop]
                for then in _Starts.waiting.pop(loop, []):
                    try:
                        then()
                    except Exception:  # what waited fails alone: the start it waited for is done
                        log.exception("after the starts: failed", call=repr(then))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a start outside any loop: nothing can wait for it
        return None


def stopped() -> None:
    """A supernode of this process stopped: the frozen objects (its servers' among them) are
    collectable again, so that a process that starts and stops many (a test run) frees each one's
    cycles instead of keeping them frozen for its whole life."""
    if _Starts.count == 0:
        gc.unfreeze()


def rss_bytes() -> int:
    """This process's resident set (VmRSS); 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as status:  # a few hundred bytes of procfs: no real I/O
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library this process runs on (dlopen of the process itself: no ldconfig)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def malloc_trim() -> bool:
    """glibc's malloc_trim(0): give the heap's free pages back to the kernel. False where there
    is no glibc (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


MALLINFO2 = (
    "arena",  # bytes the heaps (every arena) took from the kernel with sbrk/mmap
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",  # bytes in chunks mmapped one by one (above the mmap threshold)
    "usmblks",
    "fsmblks",
    "uordblks",  # bytes in use in the heaps
    "fordblks",  # bytes free in the heaps: fragmentation when large
    "keepcost",
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]


def malloc_info() -> dict[str, int] | None:
    """glibc's mallinfo2() summed over arenas: what malloc holds (not pymalloc's own arenas,
    which Python maps itself), in bytes; None without glibc 2.33 or later."""
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return {name: int(getattr(info, name)) for name in MALLINFO2}


def malloc_arenas() -> list[tuple[int, int, int]]:
    """Each malloc arena's (number, bytes it holds from the kernel, bytes free in it), from
    glibc's malloc_info(): the main thread's is 0, the others serve other threads (gRPC's,
    executors'). Empty without glibc."""
    from xml.etree import ElementTree  # (memdebug's reports only: not every process's import)

    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_info") or not hasattr(libc, "open_memstream"):
        return []
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return []
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode()
    libc.free(buf)
    out = []
    for heap in ElementTree.fromstring(text).iter("heap"):
        free = sum(int(t.get("size", 0)) for t in heap.findall("total"))
        held = sum(int(t.get("size", 0)) for t in heap.findall("system[@type='current']"))
        out.append((int(heap.get("nr", -1)), held, free))
    return out


async def trim_every(interval_s: float, stopping: asyncio.Event) -> None:
    """malloc_trim(0) every `interval_s` wall seconds until `stopping` is set (never, where there
    is no glibc or the interval is not positive). A trim walks every free chunk (tens of ms with
    hundreds of MB free, measured): on a thread (ctypes lets the GIL go), so that the loop runs on
    and waits only if it needs the arena being trimmed. The first trim is at once: what the start
    freed (the topology document's text and its parse, the imports' garbage) is given back when
    the servers serve, not an interval later (0.3-0.8 MB of a device process's PSS, issue 18)."""
    if interval_s <= 0 or getattr(_libc(), "malloc_trim", None) is None:
        return
    while not stopping.is_set():
        before, started = rss_bytes(), time.perf_counter()
        await asyncio.to_thread(malloc_trim)
        log.debug(
            "heap trimmed",
            rss_before=before,
            rss_after=rss_bytes(),
            ms=round((time.perf_counter() - started) * 1e3, 1),
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stopping.wait()
