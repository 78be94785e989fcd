"""What the cluster manager says of itself: its mode and its status, as domain values (the
servicer turns them into cmemu.v1.ManagerStatus)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    ACTIVE = "active"  # detect, isolate, replace
    PASSIVE = "passive"  # detect and record only: another controller acts


@dataclass(frozen=True, kw_only=True)
class ManagerStatus:
    """What the manager watches and how: its mode, devices by health, heartbeats and incidents."""

    mode: Mode
    devices_watched: int
    devices_suspect: int
    devices_failed: int
    heartbeat_interval_s: float
    misses_to_fail: int
    open_incidents: int
    liveness_streams: int  # opened (one per process of the supernode)
    devices_covered: int  # devices a stream has reported on
