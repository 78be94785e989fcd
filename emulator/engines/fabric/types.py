"""What the fabric answers about its links, as plain values: no numpy here, so that a process
that only reads them (a client, the wire translation) needs none of what computes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LinkStat:
    link: str
    kind: str
    capacity_bytes_per_s: float
    bytes: int
    utilization: float
    active_flows: int
    up: bool


@dataclass(frozen=True, kw_only=True)
class LinkStats:
    emulated_ns: int
    links: tuple[LinkStat, ...]
    active_flows: int
    completed_flows: int
