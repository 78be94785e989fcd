"""Detection as a state machine per device, and incidents with their timeline.

A device is ok, suspect (missed at least one heartbeat) or failed: `misses_to_fail` missed
heartbeats in a row fail it (a hang), a health report of NOT_SERVING or a broken health stream
fails it at once (a crash, a device down). An answer of SERVING makes it ok again. Each failure
opens an incident, which the controller moves on: isolated, replaced, restored (or
unrecoverable). Times are emulated nanoseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emulator.model.errors import NotFoundError

OK, SUSPECT, FAILED = "ok", "suspect", "failed"
DETECTED, ISOLATED, REPLACED, RESTORED = "detected", "isolated", "replaced", "restored"
UNRECOVERABLE = "unrecoverable"
CLOSED = frozenset({RESTORED, UNRECOVERABLE})


@dataclass(kw_only=True)
class Incident:
    id: str
    device: str
    detected_by: str
    detected_ns: int
    fault_ns: int = 0
    state: str = DETECTED
    isolated_ns: int = 0
    replaced_ns: int = 0
    restored_ns: int = 0
    jobs: list[str] = field(default_factory=list)
    replacements: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def open(self) -> bool:
        return self.state not in CLOSED


@dataclass(kw_only=True)
class Detector:
    misses_to_fail: int
    devices: dict[str, str] = field(default_factory=dict)  # id -> ok | suspect | failed
    misses: dict[str, int] = field(default_factory=dict)
    incidents: list[Incident] = field(default_factory=list)

    def watch(self, devices: list[str]) -> None:
        for d in devices:
            self.devices.setdefault(d, OK)

    def count(self, state: str) -> int:
        return sum(1 for s in self.devices.values() if s == state)

    def answered(self, device: str) -> bool:
        """A SERVING answer; True when a failed device is back."""
        was = self.devices.get(device)
        self.devices[device] = OK
        self.misses[device] = 0
        return was == FAILED

    def missed(self, device: str, now_ns: int, detail: str) -> Incident | None:
        """A heartbeat missed; the incident when this miss fails the device."""
        if self.devices.get(device) == FAILED:
            return None
        n = self.misses[device] = self.misses.get(device, 0) + 1
        if n < self.misses_to_fail:
            self.devices[device] = SUSPECT
            return None
        return self._fail(device, "heartbeat", now_ns, f"{n} heartbeats missed: {detail}")

    def unhealthy(self, device: str, by: str, now_ns: int, detail: str) -> Incident | None:
        """A health report of NOT_SERVING or a broken stream (`by`: health, event)."""
        if self.devices.get(device) == FAILED:
            return None
        return self._fail(device, by, now_ns, detail)

    def fold(self, parts: list[str]) -> None:
        """Parts of a failed device (an NPU's dies) fail with it, without incidents of their
        own: their health reports follow the device's."""
        for part in parts:
            self.devices[part] = FAILED
            self.misses[part] = 0

    def _fail(self, device: str, by: str, now_ns: int, detail: str) -> Incident:
        self.devices[device] = FAILED
        incident = Incident(
            id=f"inc-{len(self.incidents) + 1:05d}",
            device=device,
            detected_by=by,
            detected_ns=now_ns,
            detail=detail,
        )
        self.incidents.append(incident)
        return incident

    def get(self, incident_id: str) -> Incident:
        for incident in self.incidents:
            if incident.id == incident_id:
                return incident
        raise NotFoundError(f"no incident {incident_id!r}", subject=incident_id)

    def open_for(self, device: str) -> list[Incident]:
        return [i for i in self.incidents if i.device == device and i.open]

    def since(self, since_ns: int) -> list[Incident]:
        return [i for i in self.incidents if i.detected_ns >= since_ns]


@dataclass(frozen=True, kw_only=True)
class HeartbeatPlan:
    """How the heartbeats of `devices` spread over one round, at most `max_per_s` per wall
    second: the round lasts the interval (in wall seconds) or longer when the cap demands, and
    is cut into `batches` evenly spaced batches of at most `batch` checks at once."""

    round_wall_s: float
    batches: int
    batch: int
    stretched: bool  # the cap made the round longer than the interval

    @property
    def rate_per_s(self) -> float:
        return self.batches * self.batch / self.round_wall_s if self.round_wall_s else 0.0


def heartbeat_plan(
    devices: int, *, interval_wall_s: float, max_per_s: float, min_gap_wall_s: float = 0.02
) -> HeartbeatPlan:
    if devices <= 0:
        return HeartbeatPlan(round_wall_s=interval_wall_s, batches=1, batch=0, stretched=False)
    needed = devices / max_per_s
    round_s = max(interval_wall_s, needed)
    batches = max(1, min(devices, math.floor(round_s / min_gap_wall_s)))
    return HeartbeatPlan(
        round_wall_s=round_s,
        batches=batches,
        batch=math.ceil(devices / batches),
        stretched=round_s > interval_wall_s,
    )
