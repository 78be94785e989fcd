"""The router's serving aggregates on the wire, both ways (cmemu.v1.ServingStats <-> the model's
values, emulator/model/serving/live.py), by field name: the router's servicer sends them
(services/serving/wire.py) and RouterClient.stats reads them back, for the web view and the
chaos runner's dropped-request count, so neither reads a protobuf. One mapping for both ends:
a field added to the values and the message travels without a line here
(tests/services/serving/test_wire.py round-trips every field)."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from cmemu.emulator.model.serving.live import LatencyNs as LatencyNs  # noqa: PLC0414
from cmemu.emulator.model.serving.live import ServingStats as ServingStats  # noqa: PLC0414
from cmemu.v1 import router_pb2


def serving_stats(m: router_pb2.ServingStats) -> ServingStats:
    values: dict[str, Any] = {f.name: _value(getattr(m, f.name)) for f in fields(ServingStats)}
    return ServingStats(**values)


def stats_message(s: ServingStats) -> router_pb2.ServingStats:
    values: dict[str, Any] = {
        f.name: _percentiles(v) if isinstance(v := getattr(s, f.name), LatencyNs) else v
        for f in fields(ServingStats)
    }
    return router_pb2.ServingStats(**values)


def _value(v: object) -> object:
    if isinstance(v, router_pb2.Percentiles):
        return LatencyNs(**{f.name: getattr(v, f.name) for f in fields(LatencyNs)})
    return v


def _percentiles(p: LatencyNs) -> router_pb2.Percentiles:
    return router_pb2.Percentiles(**asdict(p))
