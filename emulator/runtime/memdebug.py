"""A memory probe for long runs, off by default: with $CMEMU_MEMDEBUG naming a directory, each
SIGUSR2 to an in-process supernode (`cmemu up`, `cmemu serve`) writes one report there,
`memdebug-<pid>-<n>.txt`.

A growing RSS has three possible owners, and each report tells them apart:
- Python objects that accumulate: live objects counted by type, and the change since the last
  report (a dict of per-operation records shows up as dicts and tuples rising together);
- where they were allocated: the first SIGUSR2 starts tracemalloc (with $CMEMU_MEMDEBUG_FRAMES
  frames, 8 by default), so that every later report lists what is still held of what was
  allocated since, by traceback, and its difference from the report before. Tracing only after
  the warm-up keeps start-up's allocations out and the steady state's cost (tracing slows every
  allocation) to the part of the run that matters;
- the allocator: what malloc's heaps hold in use and free (mallinfo2), and RSS before and after
  glibc's malloc_trim(0) ($CMEMU_MEMDEBUG_TRIM=0: none). Much free, or a large drop, means freed
  memory that the heap had kept (fragmentation), not objects anyone holds.

Producing a report stops the event loop for a second or two (a full collection, every object
counted, a snapshot): it is a diagnosis tool, never for a run whose latencies matter.

    CMEMU_MEMDEBUG=/tmp/md cmemu up --preset cm384 &
    kill -USR2 <pid>    # starts tracing; again a few minutes later, and compare

`python -m bench.soak --memdebug DIR` sends the signals itself (after the warm-up, then every
--memdebug-every seconds). The supernode trims its heap anyway (emulator/runtime/heap.py, every
EmulatorLimits.heap_trim_interval_s); set that to 0 to see the heap as glibc alone leaves it.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import linecache
import os
import signal
import time
import tracemalloc
from collections.abc import Mapping
from pathlib import Path

import structlog

from cmemu.emulator.runtime.heap import malloc_arenas, malloc_info, malloc_trim, rss_bytes

ENV = "CMEMU_MEMDEBUG"
FRAMES_ENV = "CMEMU_MEMDEBUG_FRAMES"  # 0: no tracing (the reports cost little then)
TRIM_ENV = "CMEMU_MEMDEBUG_TRIM"  # 0: no malloc_trim (RSS left as the run made it)
DEFAULT_FRAMES = 8
TOP = 25  # lines of each table

log = structlog.get_logger("cmemu.memdebug")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _malloc_lines() -> list[str]:
    info = malloc_info()
    if info is None:
        return ["mallinfo2: not available (no glibc 2.33+)"]
    lines = [
        f"malloc: heaps {_mb(info['arena'])} (in use {_mb(info['uordblks'])}, free "
        f"{_mb(info['fordblks'])}), mmapped chunks {_mb(info['hblkhd'])} in {info['hblks']}"
    ]
    arenas = sorted(malloc_arenas(), key=lambda a: -a[1])
    lines += [f"  arena {nr}: {_mb(held)}, free {_mb(free)}" for nr, held, free in arenas[:8]]
    return lines


class MemDebug:
    """The reports of one process, each compared with the one before."""

    def __init__(self, directory: Path, *, frames: int = DEFAULT_FRAMES, trim: bool = True) -> None:
        self.directory = directory
        self.frames = frames  # 0: no tracing
        self.trim = trim
        self.count = 0
        self._types: collections.Counter[str] | None = None
        self._snapshot: tracemalloc.Snapshot | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MemDebug | None:
        """The probe $CMEMU_MEMDEBUG asks for; None (the default) when it is unset."""
        directory = env.get(ENV)
        if not directory:
            return None
        frames = env.get(FRAMES_ENV, "")
        return cls(
            Path(directory),
            frames=int(frames) if frames.isdigit() else DEFAULT_FRAMES,
            trim=env.get(TRIM_ENV, "1") != "0",
        )

    def report(self) -> str:
        """One report (and the state the next one is compared with). Runs on the loop's thread:
        the objects must not change while they are counted."""
        self.count += 1
        lines = [f"memdebug report {self.count} of pid {os.getpid()} at {time.time():.1f}"]
        lines.append(f"rss {_mb(rss_bytes())}; gc.collect() freed {gc.collect()} objects")
        lines += _malloc_lines()
        lines += self._type_table()
        lines += ["", f"asyncio tasks: {_tasks()}"]
        lines += self._trace_tables()
        if self.trim:
            before = rss_bytes()
            trimmed = malloc_trim()
            lines += [
                "",
                f"malloc_trim(0): rss {_mb(before)} -> {_mb(rss_bytes())}"
                if trimmed
                else "malloc_trim: no glibc here",
            ]
        return "\n".join(lines) + "\n"

    def _type_table(self) -> list[str]:
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        lines = ["", f"live objects by type ({sum(types.values())} tracked by gc):"]
        lines += [f"  {n:>10}  {name}" for name, n in types.most_common(TOP)]
        if self._types is not None:
            grown = types.copy()
            grown.subtract(self._types)
            lines += ["", "change since the last report:"]
            lines += [f"  {n:>+10}  {name}" for name, n in grown.most_common(TOP) if n]
        self._types = types
        return lines

    def _trace_tables(self) -> list[str]:
        if not self.frames:
            return []
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
            return ["", f"tracemalloc started ({self.frames} frames): the next report lists it"]
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, linecache.__file__),
            )
        )
        traced, peak = tracemalloc.get_traced_memory()
        lines = ["", f"held of what was allocated since tracing started: {_mb(traced)}"]
        lines += [
            f"(peak {_mb(peak)}; tracemalloc's own {_mb(tracemalloc.get_tracemalloc_memory())},"
            " in the RSS too), by traceback:"
        ]
        lines += _stats(snapshot.statistics("traceback")[:TOP])
        if self._snapshot is not None:
            lines += ["", "change since the last report, by traceback:"]
            lines += _stats(snapshot.compare_to(self._snapshot, "traceback")[:TOP])
        self._snapshot = snapshot
        return lines

    async def write(self) -> Path:
        """A report, written whole under its final name (a reader never sees half of one)."""
        text = self.report()
        path = self.directory / f"memdebug-{os.getpid()}-{self.count}.txt"
        partial = path.with_suffix(".partial")
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(partial.write_text, text)
        await asyncio.to_thread(partial.replace, path)
        return path

    def start(self, tasks: asyncio.TaskGroup, stopping: asyncio.Event) -> None:
        """Handle SIGUSR2 from now on (a signal that came before the handler would end the
        process): a report at each, by a task of `tasks`, until `stopping` is set. Signals can
        only be handled on the main thread's loop: elsewhere the probe says so and is off."""
        loop = asyncio.get_running_loop()
        wanted = asyncio.Event()
        try:
            loop.add_signal_handler(signal.SIGUSR2, wanted.set)
        except (RuntimeError, ValueError) as exc:
            log.warning("memdebug needs the main thread's loop", error=str(exc))
            return
        log.warning("memdebug on: SIGUSR2 writes a report", directory=str(self.directory))
        tasks.create_task(self._serve(wanted, stopping), name="memdebug")

    async def _serve(self, wanted: asyncio.Event, stopping: asyncio.Event) -> None:
        try:
            while not stopping.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (wanted, stopping)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if wanted.is_set() and not stopping.is_set():
                    wanted.clear()
                    path = await self.write()
                    log.warning("memdebug report written", path=str(path))
        finally:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)
            if tracemalloc.is_tracing():
                tracemalloc.stop()


def _tasks() -> str:
    """The running loop's tasks, and the most common coroutines among them."""
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        return "no running loop"
    names = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in tasks)
    return f"{len(tasks)}; most: " + ", ".join(f"{n} {name}" for name, n in names.most_common(5))


def _stats(stats: list[tracemalloc.Statistic] | list[tracemalloc.StatisticDiff]) -> list[str]:
    lines: list[str] = []
    for stat in stats:
        if isinstance(stat, tracemalloc.StatisticDiff):
            head = f"  {stat.size_diff / 1024:+.1f} KiB ({stat.count_diff:+d} blocks), now "
        else:
            head = "  "
        lines.append(f"{head}{stat.size / 1024:.1f} KiB in {stat.count} blocks:")
        lines += [f"      {frame}" for frame in stat.traceback.format(most_recent_first=True)]
    return lines
