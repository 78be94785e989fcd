"""The server's resources over the run: its RSS (VmRSS) every SAMPLE_EVERY_S and EMS's size every
10 s, and the RSS figures. The store's contents swing by tens of MB as objects come and go, so the
warm and end figures are medians over RSS_WINDOW_S, not single samples (those are kept too)."""

from __future__ import annotations

import os
import signal
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.soak.config import RSS_WINDOW_S, SAMPLE_EVERY_S
from bench.soak.context import Soak
from cmemu.v1 import ems_pb2


def rss_mb(pid: int) -> float:
    """The resident set of a process, MiB (VmRSS); 0 once it has gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    ems_objects: list[tuple[float, int, int]] = field(default_factory=list)  # t, objects, bytes


async def sample(soak: Soak, pid: int, series: Series, proc_alive: Callable[[], bool]) -> None:
    """RSS of the server every SAMPLE_EVERY_S; EMS's size every 10 s. A dead server ends the run
    (the workers see it through `stop_at`)."""
    last_stat = -10.0
    while not soak.stopping.is_set():
        t = soak.figures.now()
        series.t.append(round(t, 2))
        series.rss_mb.append(rss_mb(pid))
        if t - last_stat >= 10.0:
            last_stat = t
            try:
                stat = await soak.ems.Stat(ems_pb2.StatRequest(), timeout=10)
                series.ems_objects.append((round(t, 1), stat.objects, stat.dram_used_bytes))
            except grpc.aio.AioRpcError:
                pass
        if not proc_alive():
            soak.figures.client_exceptions.append(f"t={t:.1f}s the cmemu up process died")
            soak.stop_at = 0.0
            soak.stopping.set()
            return
        await soak.pause(SAMPLE_EVERY_S)


async def warm_point(soak: Soak, pid: int, warm_s: float) -> float:
    """The single RSS sample at the end of the warm-up (or at the end of a shorter run)."""
    await soak.pause(warm_s)
    return rss_mb(pid)


async def memdebug(soak: Soak, pid: int, warm_s: float, every_s: float) -> None:
    """With --memdebug: SIGUSR2 to the server (emulator/runtime/memdebug.py) at the end of the
    warm-up, which starts its allocation tracing, then every `every_s` until the load ends, each
    writing a report of what it holds and what changed."""
    if await soak.pause(warm_s):
        return
    while True:
        os.kill(pid, signal.SIGUSR2)
        if await soak.pause(every_s):
            return


def rss_figures(
    series: Series, warm_s: float, wall: float, *, start: float, warm: float, end: float
) -> dict[str, float | list[float]]:
    """The RSS figures of the report: `start`, `warm` and `end` are the single samples before the
    load, after the warm-up and after the load; the warm and end figures are window medians."""
    window = min(RSS_WINDOW_S, warm_s)
    samples = list(zip(series.t, series.rss_mb, strict=True))
    warm_window = [r for t, r in samples if warm_s <= t <= warm_s + window]
    last = [r for t, r in samples if t >= wall - window] + [end]
    warm_median = statistics.median(warm_window or [warm])
    end_median = statistics.median(last)
    return {
        "rss_start_mb": round(start, 1),
        "rss_warm_mb": round(warm_median, 1),
        "rss_end_mb": round(end_median, 1),
        "rss_growth_after_warmup": round((end_median - warm_median) / warm_median * 100, 2),
        "rss_warm_point_mb": round(warm, 1),
        "rss_end_point_mb": round(end, 1),
        "rss_max_mb": round(max(series.rss_mb, default=0.0), 1),
        "rss_minute_medians_mb": minute_medians(samples, warm_s, wall),
    }


def minute_medians(samples: list[tuple[float, float]], warm_s: float, wall: float) -> list[float]:
    """The median RSS of each whole minute after the warm-up: the trend, without the swing of
    EMS's contents that the 10 s windows of the warm and end figures still carry."""
    out = []
    start = warm_s
    while start + 60.0 <= wall + 1e-9:
        minute = [r for t, r in samples if start <= t < start + 60.0]
        if minute:
            out.append(round(statistics.median(minute), 1))
        start += 60.0
    return out
