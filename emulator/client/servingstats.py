"""The router's serving aggregates as plain values (cmemu.v1.ServingStats read back from the
wire): what RouterClient.stats returns, for the web view and the chaos runner's dropped-request
count, so neither reads a protobuf."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.v1 import router_pb2


@dataclass(frozen=True, kw_only=True)
class LatencyNs:
    """A latency's distribution over the requests it was measured on, emulated ns."""

    count: int
    mean_ns: int
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int


@dataclass(frozen=True, kw_only=True)
class ServingStats:
    """See cmemu.v1.ServingStats for each figure."""

    requests_completed: int
    requests_cancelled: int
    requests_in_flight: int
    prompt_tokens: int
    completion_tokens: int
    ttft: LatencyNs
    tpot: LatencyNs
    queueing: LatencyNs
    prefix_hit_tokens: int
    prefix_lookup_tokens: int
    output_tokens_per_s: float
    window_ns: int
    kv_slots_held: int
    kv_slots: int
    requests_failed: int
    requests_retried: int
    requests_dropped: int  # lost without a finish or an error: must stay 0


def serving_stats(m: router_pb2.ServingStats) -> ServingStats:
    return ServingStats(
        requests_completed=m.requests_completed,
        requests_cancelled=m.requests_cancelled,
        requests_in_flight=m.requests_in_flight,
        prompt_tokens=m.prompt_tokens,
        completion_tokens=m.completion_tokens,
        ttft=_latency(m.ttft),
        tpot=_latency(m.tpot),
        queueing=_latency(m.queueing),
        prefix_hit_tokens=m.prefix_hit_tokens,
        prefix_lookup_tokens=m.prefix_lookup_tokens,
        output_tokens_per_s=m.output_tokens_per_s,
        window_ns=m.window_ns,
        kv_slots_held=m.kv_slots_held,
        kv_slots=m.kv_slots,
        requests_failed=m.requests_failed,
        requests_retried=m.requests_retried,
        requests_dropped=m.requests_dropped,
    )


def _latency(p: router_pb2.Percentiles) -> LatencyNs:
    return LatencyNs(
        count=p.count,
        mean_ns=p.mean_ns,
        p50_ns=p.p50_ns,
        p90_ns=p.p90_ns,
        p99_ns=p.p99_ns,
        max_ns=p.max_ns,
    )
