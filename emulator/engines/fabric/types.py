"""What the fabric answers about its links, as plain values: no numpy here, so that a process
that only reads them (a client, the wire translation) needs none of what computes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LinkStat:
    """What one directed link carries: bytes, utilisation, flows and whether it is up."""

    link: str
    kind: str
    capacity_bytes_per_s: float
    bytes: int
    utilization: float
    active_flows: int
    up: bool


@dataclass(frozen=True, kw_only=True)
class LinkStats:
    """The busiest links at an emulated instant, and the fabric's flows in flight and done."""

    emulated_ns: int
    links: tuple[LinkStat, ...]
    active_flows: int
    completed_flows: int
