"""The router's serving aggregates as plain values (cmemu.v1.ServingStats read back from the
wire into the model's values, emulator/model/serving/live.py): what RouterClient.stats returns,
for the web view and the chaos runner's dropped-request count, so neither reads a protobuf."""

from __future__ import annotations

from cmemu.emulator.model.serving.live import LatencyNs as LatencyNs  # noqa: PLC0414
from cmemu.emulator.model.serving.live import ServingStats as ServingStats  # noqa: PLC0414
from cmemu.v1 import router_pb2


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
