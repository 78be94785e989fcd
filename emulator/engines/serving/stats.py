"""Per-request serving metrics and their aggregates (what GetStats and the events report, as the
model's plain values: emulator/model/serving/live.py; the router service writes them to the wire).

TTFT is from arrival to the first output token; TPOT the mean gap between the later tokens of one
request; queueing from arrival to the start of its prefill batch. All emulated nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.instruments import SERVING_BUCKETS_S, Histogram
from cmemu.emulator.model.serving.live import LatencyNs, ServingStats


@dataclass(kw_only=True)
class RequestMetrics:
    request_id: str
    arrival_ns: int
    prompt_tokens: int
    prefill_start_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    completion_tokens: int = 0
    prefix_hit_tokens: int = 0
    cancelled: bool = False
    failed: bool = False  # finished with an error the client saw
    retries: int = 0
    error: str = ""

    @property
    def ttft_ns(self) -> int | None:
        return None if self.first_token_ns is None else self.first_token_ns - self.arrival_ns

    @property
    def tpot_ns(self) -> int | None:
        if self.first_token_ns is None or self.last_token_ns is None:
            return None
        if self.completion_tokens < 2:
            return None
        return round((self.last_token_ns - self.first_token_ns) / (self.completion_tokens - 1))

    @property
    def queueing_ns(self) -> int | None:
        return None if self.prefill_start_ns is None else self.prefill_start_ns - self.arrival_ns

    def detail(self) -> dict[str, int | str | bool]:
        """The fields of the `request` event."""
        out: dict[str, int | str | bool] = {
            "request": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "cancelled": self.cancelled,
        }
        if self.failed:
            out["failed"] = True
            out["error"] = self.error
        if self.retries:
            out["retries"] = self.retries
        for name in ("ttft_ns", "tpot_ns", "queueing_ns"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile (as serving benchmarks report them)."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def percentiles(values: list[int]) -> LatencyNs:
    if not values:
        return LatencyNs()
    ordered = sorted(values)
    return LatencyNs(
        count=len(ordered),
        mean_ns=round(sum(ordered) / len(ordered)),
        p50_ns=_percentile(ordered, 50),
        p90_ns=_percentile(ordered, 90),
        p99_ns=_percentile(ordered, 99),
        max_ns=ordered[-1],
    )


@dataclass
class DeploymentStats:
    """Every finished request of one deployment, and how many are in flight."""

    finished: list[RequestMetrics] = field(default_factory=list)
    in_flight: int = 0
    lookup_tokens: int = 0
    kv_slots_held: int = 0
    kv_slots: int = 0
    retried: int = 0  # requests retried at least once (in flight or finished)
    dropped: int = 0  # lost without a finish: the driver fails them visibly, and counts them
    # for /metrics: kept as requests finish, so a scrape never walks every request
    ttft_s: Histogram = field(default_factory=lambda: Histogram(SERVING_BUCKETS_S))
    tpot_s: Histogram = field(default_factory=lambda: Histogram(SERVING_BUCKETS_S))
    queueing_s: Histogram = field(default_factory=lambda: Histogram(SERVING_BUCKETS_S))

    completion_tokens: int = 0

    def record(self, m: RequestMetrics) -> None:
        """A request finished (completed, cancelled or failed)."""
        self.finished.append(m)
        self.completion_tokens += m.completion_tokens
        if m.cancelled or m.failed:
            return
        for hist, value in (
            (self.ttft_s, m.ttft_ns),
            (self.tpot_s, m.tpot_ns),
            (self.queueing_s, m.queueing_ns),
        ):
            if value is not None:
                hist.observe(value / 1e9)


def summarize(parts: list[DeploymentStats]) -> ServingStats:
    """The aggregates of deployments' requests (GetStats: one deployment's, or every one's)."""
    done = [m for p in parts for m in p.finished]
    completed = [m for m in done if not (m.cancelled or m.failed)]
    failed = sum(m.failed for m in done)

    def values(name: str) -> list[int]:
        return [v for m in completed if (v := getattr(m, name)) is not None]

    tokens = sum(m.completion_tokens for m in done)
    start = min((m.arrival_ns for m in done), default=0)
    end = max((m.last_token_ns or m.arrival_ns for m in done), default=0)
    window = end - start
    return ServingStats(
        requests_completed=len(completed),
        requests_cancelled=len(done) - len(completed) - failed,
        requests_in_flight=sum(p.in_flight for p in parts),
        prompt_tokens=sum(m.prompt_tokens for m in done),
        completion_tokens=tokens,
        ttft=percentiles(values("ttft_ns")),
        tpot=percentiles(values("tpot_ns")),
        queueing=percentiles(values("queueing_ns")),
        prefix_hit_tokens=sum(m.prefix_hit_tokens for m in done),
        prefix_lookup_tokens=sum(p.lookup_tokens for p in parts),
        output_tokens_per_s=tokens / (window / 1e9) if window > 0 else 0.0,
        window_ns=window,
        kv_slots_held=sum(p.kv_slots_held for p in parts),
        kv_slots=sum(p.kv_slots for p in parts),
        requests_failed=failed,
        requests_retried=sum(p.retried for p in parts),
        requests_dropped=sum(p.dropped for p in parts),
    )
