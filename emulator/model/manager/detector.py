"""Detection as a state machine per device, and incidents with their timeline.

A device is ok, suspect (not answering, not failed yet) or failed (the liveness watch decides:
emulator/engines/manager/liveness.py). An answer makes it ok again. An NPU that answers but
arrives last at its collectives is degraded (a straggler: emulator/model/manager/straggler.py);
answering does not make it ok, only a diagnosis at full speed does (`recovered`). Each failure
or degradation opens an incident, which the controller moves on: isolated, replaced, restored
(or unrecoverable). Times are emulated nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.errors import NotFoundError

OK, SUSPECT, FAILED, DEGRADED = "ok", "suspect", "failed", "degraded"
STATES = (OK, SUSPECT, FAILED, DEGRADED)
STRAGGLER = "straggler"  # an incident's detected_by for a degraded NPU
ECC = "ecc"  # ... for a device reporting uncorrectable memory errors (alive, its data lost)
DEGRADING = (STRAGGLER, ECC)  # what makes a device degraded: alive, out of service
DETECTED, ISOLATED, REPLACED, RESTORED = "detected", "isolated", "replaced", "restored"
UNRECOVERABLE = "unrecoverable"
CLOSED = frozenset({RESTORED, UNRECOVERABLE})


@dataclass(kw_only=True)
class Incident:
    """One failed device's story: detected, isolated, replaced, each at its emulated instant."""

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
    """The manager's view of each device (ok, suspect, failed) and the incidents it opened."""

    devices: dict[str, str] = field(default_factory=dict)  # id -> ok | suspect | failed
    incidents: list[Incident] = field(default_factory=list)
    folded: dict[str, set[str]] = field(default_factory=dict)  # a failed device: its parts
    degraded_by: dict[str, str] = field(default_factory=dict)  # a degraded device: why

    def watch(self, devices: list[str]) -> None:
        for d in devices:
            self.devices.setdefault(d, OK)

    def count(self, state: str) -> int:
        return sum(1 for s in self.devices.values() if s == state)

    def answered(self, device: str) -> bool:
        """A SERVING answer; True when a failed device is back (and the parts that failed with
        it, which never answer on their own: a part still down fails again by its own report).
        A degraded one stays degraded: it answered all along."""
        was = self.devices.get(device)
        if was != DEGRADED:
            self.devices[device] = OK
        if was == FAILED:
            self.degraded_by.pop(device, None)
            for part in self.folded.pop(device, ()):
                if self.devices.get(part) == FAILED:
                    self.devices[part] = OK
        return was == FAILED

    def degraded(
        self, device: str, now_ns: int, detail: str, *, since_ns: int = 0, by: str = STRAGGLER
    ) -> Incident | None:
        """A straggler: alive, but slowing every collective it is in (since `since_ns`, as its
        collectives show). None when it is already known degraded or failed (the failure's
        incident covers it)."""
        if self.devices.get(device) in (DEGRADED, FAILED):
            return None
        incident = self._fail(device, by, now_ns, detail)
        incident.fault_ns = since_ns
        self.devices[device] = DEGRADED
        self.degraded_by[device] = by
        return incident

    def recovered(self, device: str, by: str = STRAGGLER) -> bool:
        """A device degraded for `by` is well again (a straggler diagnosed at full speed, an
        ECC report gone); True when it was degraded for that reason, and only for it."""
        if self.devices.get(device) != DEGRADED or self.degraded_by.get(device) != by:
            return False
        self.devices[device] = OK
        del self.degraded_by[device]
        return True

    def suspect(self, device: str) -> None:
        """Not answering, not failed yet."""
        if self.devices.get(device) == OK:
            self.devices[device] = SUSPECT

    def unhealthy(self, device: str, by: str, now_ns: int, detail: str) -> Incident | None:
        """A health report of NOT_SERVING or a broken stream (`by`: health, event)."""
        if self.devices.get(device) == FAILED:
            return None
        return self._fail(device, by, now_ns, detail)

    def fold(self, device: str, parts: list[str]) -> None:
        """Parts of a failed device (an NPU's dies) fail with it, without incidents of their
        own: their health reports follow the device's, and they answer when it does. A part
        already failed on its own stays its own incident's."""
        for part in parts:
            if self.devices.get(part) != FAILED:
                self.devices[part] = FAILED
                self.folded.setdefault(device, set()).add(part)

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
