"""The Prometheus text formats, written from the emulator's own families in the standard library.

Why not prometheus-client: every process serves /metrics, and a device process imports nothing
else of it; prometheus-client (with aiohttp to serve it) was about 15 MB and 0.3 s of CPU in each
of hundreds of processes and containers. The formats are small and fixed:
- text 0.0.4 (the default): `# HELP`, `# TYPE`, one line per sample;
- OpenMetrics 1.0 (asked for by Accept): the same lines, a counter's family named without its
  `_total`, and `# EOF` at the end.
Histograms are `_bucket{le=...}` (cumulative), `_count` and `_sum`. The process's own
`process_*` families (CPU, memory, file descriptors, start time) come from /proc, as
prometheus-client's process collector reads them.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from cmemu.emulator.model.instruments import Histogram, MetricType, Value

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
Sample = tuple[Mapping[str, str], Value]
RawFamily = tuple[str, str, MetricType, Sequence[Sample]]  # name, help, type, samples


class FamilyError(ValueError):
    """A family that breaks the rules (label names that differ, a histogram of numbers)."""


def content_type(accept: str) -> str:
    """The format a scraper asks for: OpenMetrics when its Accept names it, else text 0.0.4."""
    return OPENMETRICS if "application/openmetrics-text" in accept else TEXT


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str], extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels.items(), *([extra] if extra else [])]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in pairs) + "}"


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def family_lines(family: RawFamily, *, openmetrics: bool) -> list[str]:
    """One family's lines; FamilyError when it breaks the rules."""
    name, help, kind, samples = family
    names = set(samples[0][0])
    title = name.removesuffix("_total") if openmetrics and kind == "counter" else name
    lines = [f"# HELP {title} {_escape_help(help)}", f"# TYPE {title} {kind}"]
    for labels, value in samples:
        if set(labels) != names:
            raise FamilyError(f"{name}: label names {sorted(labels)} differ from {sorted(names)}")
        if kind == "histogram":
            if not isinstance(value, Histogram):
                raise FamilyError(f"{name}: a histogram family needs Histogram values")
            for bound, count in value.cumulative():
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                lines.append(f"{name}_bucket{_labels(labels, ('le', le))} {number(count)}")
            total = value.cumulative()[-1][1]
            lines.append(f"{name}_count{_labels(labels)} {number(total)}")
            lines.append(f"{name}_sum{_labels(labels)} {number(value.sum)}")
        elif isinstance(value, Histogram):
            raise FamilyError(f"{name}: a {kind} family takes numbers")
        else:
            lines.append(f"{name}{_labels(labels)} {number(float(value))}")
    return lines


def render(families: Iterable[RawFamily], *, openmetrics: bool = False) -> tuple[bytes, list[str]]:
    """The exposition of `families` and this process's own; the families it skipped (a bad
    family is left out, never the scrape), by name."""
    lines: list[str] = []
    skipped: list[str] = []
    for family in [*families, *process_families()]:
        if not family[3]:  # e.g. device families in a process that hosts no device
            continue
        try:
            lines += family_lines(family, openmetrics=openmetrics)
        except (FamilyError, KeyError, TypeError, ValueError):
            skipped.append(family[0])
    if openmetrics:
        lines.append("# EOF")
    return ("\n".join(lines) + "\n").encode(), skipped


# --- the process ---------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = resource.getpagesize()


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def process_families() -> Iterator[RawFamily]:
    """prometheus-client's process_* families, from /proc/self (none where there is no /proc)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    # after the ")": state is fields[0], so utime is fields[11], stime [12], starttime [19],
    # vsize [20], rss [21] (proc(5) numbers them from 1 with pid and comm first)
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    start = _boot_time() + int(fields[19]) / _TICKS
    soft_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    none: Mapping[str, str] = {}
    yield ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
           "counter", [(none, cpu)])  # fmt: skip
    yield ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
           [(none, float(fields[20]))])  # fmt: skip
    yield ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
           [(none, float(int(fields[21]) * _PAGE))])  # fmt: skip
    yield ("process_start_time_seconds",
           "Start time of the process since unix epoch in seconds.", "gauge",
           [(none, start or time.time())])  # fmt: skip
    yield ("process_open_fds", "Number of open file descriptors.", "gauge", [(none, fds)])
    yield ("process_max_fds", "Maximum number of open file descriptors.", "gauge",
           [(none, float(soft_fds))])  # fmt: skip
