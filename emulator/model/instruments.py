"""What a service state counts for the metrics, in plain data: no Prometheus types down here.

Counting happens on hot paths (every UB transaction, every kernel), so a histogram here is one
bisect and two additions over fixed buckets; everything else a metric shows is read from the
state when a scrape asks (emulator/runtime/metrics.py turns these into Prometheus families).

A service state that wants metrics of its own (the serving router: TTFT, TPOT, tokens) gives
itself a `metrics()` method returning `Family` values (the `Instrumented` protocol below); the
collector calls it at every scrape and adds the process's labels. Durations are emulated
seconds unless a family's name and help say otherwise.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from cmemu.emulator.model.errors import InvalidArgumentError

# Upper bounds (seconds) for emulated latencies: a 512-byte UB read is about 1 us, a kernel or a
# bulk transfer milliseconds, a long transfer seconds.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    1e-6,
    3e-6,
    1e-5,
    3e-5,
    1e-4,
    3e-4,
    1e-3,
    3e-3,
    0.01,
    0.03,
    0.1,
    0.3,
    1.0,
    3.0,
    10.0,
)
# Serving: time to first token and time per output token (emulated), milliseconds to a minute.
SERVING_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(eq=False)
class Histogram:
    """Counts per fixed bucket: `counts[i]` values in (bounds[i-1], bounds[i]], the last entry
    those above every bound (Prometheus' `le`, not cumulative here)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(init=False)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.bounds or any(not math.isfinite(b) for b in self.bounds):
            raise InvalidArgumentError("histogram bounds must be finite and at least one")
        if any(b >= c for b, c in zip(self.bounds, self.bounds[1:], strict=False)):
            raise InvalidArgumentError("histogram bounds must increase")
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> Histogram:
        """A copy that later observations leave alone (for reading on another thread)."""
        copy = Histogram(self.bounds, sum=self.sum)
        copy.counts = list(self.counts)
        return copy

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values <= it) for every bound and +Inf, as Prometheus exposes them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


Value = float | Histogram


@dataclass(frozen=True, kw_only=True)
class Family:
    """One metric: a Prometheus name (`cmemu_` first, the base unit last, a counter's ending in
    `_total`), its help, its type, and one value per label set. Every label set of a family has
    the same label names."""

    name: str
    help: str
    type: MetricType
    samples: Sequence[tuple[Mapping[str, str], Value]] = ()


class Instrumented(Protocol):
    """A service state with metrics of its own; read at every scrape, on the event loop that
    owns the state, so it must be quick and must not block."""

    def metrics(self) -> Iterable[Family]: ...
