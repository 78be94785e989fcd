"""What a live deployment reports of itself, as plain values: its state, its dynamic PD's split
and switches, and the serving aggregates of its requests. The serving engine
(emulator/engines/serving/) makes them, the router service writes them to the wire
(services/serving/wire.py) and the typed client reads them back (emulator/client/)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DeploymentState(enum.StrEnum):
    LOADING = "loading"  # NPUs allocated, weights loading
    SERVING = "serving"
    FAILED = "failed"  # see `error`
    STOPPED = "stopped"  # undeployed; its NPUs released


@dataclass(frozen=True, kw_only=True)
class PdSwitch:
    """Instances switched between prefill and decode, and when they joined their new role."""

    at_ns: int
    to: str  # "prefill" or "decode"
    instances: tuple[str, ...]
    joined_ns: int  # 0: not yet


@dataclass(frozen=True, kw_only=True)
class PdStatus:
    """Live dynamic PD: the split now and every switch so far."""

    policy: str
    prefill_units: int
    decode_units: int
    switching_units: int
    switches: tuple[PdSwitch, ...]
    prefill_share: float


@dataclass(frozen=True, kw_only=True)
class LatencyNs:
    """A latency's distribution over the requests it was measured on, emulated ns."""

    count: int = 0
    mean_ns: int = 0
    p50_ns: int = 0
    p90_ns: int = 0
    p99_ns: int = 0
    max_ns: int = 0


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
