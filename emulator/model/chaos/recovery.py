"""Time to recovery, per injection, credited by cause.

An incident of the manager is caused by one injection at most: the latest one (that went in) whose
devices cover the incident's device and that went in before the device's fault began (its
`fault_ns`, else its detection). A workload is affected by an injection when an incident that
injection caused names it among its jobs; its isolation and restore are its own reports after the
injection. Nothing is credited by overlap: a training job's "isolated" report lists every NPU of
the job, so a slow NPU of the job that nothing detected is not credited with a crash's recovery.

A fault recovered when every incident it caused with a job is restored and each affected workload
reported `restored` after it (without an affected workload: when each incident it caused is
restored, i.e. the device is back). A fault that nothing detected (it caused no incident) did not
recover: it lasted until the scenario cleared it (then it is over at the clearance, and the
verdict says it was never detected), or to the end (not recovered, "never detected"). A fault
that nothing detected while the cluster manager was killed or hung says so (CONTROLLER_DOWN);
a killed or hung service itself recovered when the scenario cleared it. A step
that says `tolerated: true` needs no recovery; the verdict holds the workload to its SLO
throughout it instead. `slo_back_ns` is the first request after the recovery that met the SLO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmemu.emulator.model.chaos.observed import (
    CORRUPT_CHECKPOINT,
    IncidentRecord,
    Injection,
    Observations,
    RequestSample,
    WorkloadEvent,
)
from cmemu.emulator.model.chaos.scenario import Slo
from cmemu.emulator.model.chaos.units import format_s

RESTORED = "restored"
UNRECOVERABLE = "unrecoverable"
# a device's clock and the runner's (it follows the fabric's) may differ by a beat's rounding:
# a fault the device dates this much before the runner's injection instant is still that one's
CAUSE_SLACK_NS = 1_000_000_000

NEVER_DETECTED = "never detected"
# the control plane as a target (service-kill, service-hang): a killed or hung service is back
# when the scenario clears it (nothing detects it); a fault nothing detected while the cluster
# manager was down says so: the controller's loss is part of the verdict
CONTROL_PLANE_KINDS = frozenset(
    {"service-kill", "service-hang", "service-slow", "service-partition"}
)
# a slow manager still detects; a partitioned one sees nothing
DOWN_KINDS = frozenset({"service-kill", "service-hang", "service-partition"})
CONTROLLER = "manager"
CONTROLLER_DOWN = "never detected: the cluster manager was down"
SERVICE_BACK = "back when the scenario cleared it"
SERVICE_NEVER_BACK = "never back: down to the end"
CLEARED_UNDETECTED = "never detected; over when the scenario cleared it"
TOLERATED = "tolerated (judged against the SLO throughout)"
# a corrupt checkpoint harms nothing until a restore reads it: the job's restore is what detects
# it (the manifest's checksum) and falls back to the one before; recovered at the job's first
# restore after that detection. No restore read it before the end: not proven recovered.
CHECKPOINT_KIND = "checkpoint-corrupt"
LATENT = "never detected: no restore of the job read the corrupt checkpoint before the end"


@dataclass(frozen=True, kw_only=True)
class Recovery:
    injection: Injection
    incidents: tuple[IncidentRecord, ...]  # the incidents this injection caused
    workloads: tuple[str, ...]  # affected workloads (the jobs of those incidents)
    detected_ns: int | None
    isolated_ns: int | None
    replaced_ns: int | None
    restored_ns: int | None  # None: not recovered by the end
    slo_back_ns: int | None = None
    unrecoverable: bool = False
    tolerated: bool = False  # the step said so: no recovery asked, the SLO throughout instead
    status: str = ""  # how it ended, in words (the verdict's reason when it did not recover)

    @property
    def detected(self) -> bool:
        return self.detected_ns is not None

    @property
    def name(self) -> str:
        """The fault as checks name it: its step's label, kind and target."""
        i = self.injection
        return f"{i.label} ({i.kind} {i.target})" if i.target else f"{i.label} ({i.kind})"

    @property
    def affected(self) -> bool:
        return bool(self.incidents or self.workloads)

    @property
    def settled(self) -> bool:
        """Nothing more to wait for: recovered, or tolerated (judged on the SLO instead)."""
        return self.tolerated or self.restored_ns is not None

    @property
    def recovery_s(self) -> float | None:
        if self.restored_ns is None:
            return None
        return max(0, self.restored_ns - self.injection.at_ns) / 1e9

    @property
    def slo_back_s(self) -> float | None:
        if self.slo_back_ns is None:
            return None
        return max(0, self.slo_back_ns - self.injection.at_ns) / 1e9

    def since(self, at_ns: int | None) -> str:
        """An instant of this fault's recovery as an offset from its injection, or "-"."""
        return "-" if at_ns is None else "+" + format_s(max(0, at_ns - self.injection.at_ns) / 1e9)

    def phases(self) -> str:
        """Its own detection, isolation and restore times: what did not happen says so."""
        if not self.detected:
            return self.status
        parts = [f"detected {self.since(self.detected_ns)}"]
        isolated = self.isolated_ns
        parts.append("never isolated" if isolated is None else f"isolated {self.since(isolated)}")
        parts.append(
            ("unrecoverable" if self.unrecoverable else "never restored")
            if self.restored_ns is None
            else f"restored {self.since(self.restored_ns)}"
        )
        return ", ".join(parts)


def _covers(injection: Injection, device: str) -> bool:
    """`device` (an NPU, a die, a node, a CPU...) is one the injection took down."""
    for d in injection.devices:
        if device == d or device.startswith(f"{d}.") or d.startswith(f"{device}."):
            return True
        if device.startswith(f"{d}-"):  # a node's devices
            return True
    return False


def _first(times: Sequence[int]) -> int | None:
    found = [t for t in times if t > 0]
    return min(found) if found else None


def cause_of(incident: IncidentRecord, injections: Sequence[Injection]) -> Injection | None:
    """The injection that caused `incident`: the latest one on its device before its fault."""
    seen = incident.fault_ns or incident.detected_ns
    causes = [
        j
        for j in injections
        if not j.error and _covers(j, incident.device) and j.at_ns <= seen + CAUSE_SLACK_NS
    ]
    return max(causes, key=lambda j: j.at_ns) if causes else None


def _is_controller(target: str) -> bool:
    return target == CONTROLLER or target.endswith(f"-{CONTROLLER}")


def controller_down(injection: Injection, obs: Observations) -> Injection | None:
    """The cluster manager's kill or hang (that went in) in force at some instant of
    `injection`'s life: from its start to its clearance or the end of the run."""
    until = injection.cleared_ns if injection.cleared_ns is not None else obs.end_ns
    for j in obs.injections:
        if j.error or j.kind not in DOWN_KINDS or not _is_controller(j.target):
            continue
        back = j.cleared_ns if j.cleared_ns is not None else obs.end_ns
        if j.at_ns <= max(until, injection.at_ns) and back > injection.at_ns:
            return j
    return None


def _down_span(down: Injection, obs: Observations) -> str:
    since = format_s(max(0, down.at_ns - obs.start_ns) / 1e9)
    if down.cleared_ns is None:
        return f"{down.label} {down.kind} from {since} to the end"
    back = format_s(max(0, down.cleared_ns - obs.start_ns) / 1e9)
    return f"{down.label} {down.kind} from {since} to {back}"


def caused(obs: Observations) -> dict[str, Injection]:
    """Each incident's cause, by incident id (incidents no injection caused are absent)."""
    out = {}
    for inc in obs.incidents:
        cause = cause_of(inc, obs.injections)
        if cause is not None:
            out[inc.id] = cause
    return out


def _first_event(
    events: Sequence[WorkloadEvent], workload: str, what: str, after_ns: int
) -> int | None:
    times = [e.at_ns for e in events if e.workload == workload and e.what == what]
    later = [t for t in times if t >= after_ns]
    return min(later) if later else None


def _meets(sample: RequestSample, slo: Slo) -> bool:
    if not sample.ok:
        return False
    if slo.tpot_ms is not None and sample.tpot_ms > slo.tpot_ms:
        return False
    return slo.ttft_ms is None or sample.ttft_ms <= slo.ttft_ms


def slo_back(requests: Sequence[RequestSample], after_ns: int, slo: Slo | None) -> int | None:
    """The first request ending after `after_ns` that met the SLO (any ok one without an SLO)."""
    ok = [r.done_ns for r in requests if r.done_ns >= after_ns and _meets(r, slo or Slo())]
    return min(ok) if ok else None


def misses(sample: RequestSample, slo: Slo | None) -> bool:
    """The request failed, or missed the SLO."""
    return not _meets(sample, slo or Slo())


def _recovery(
    injection: Injection, incidents: list[IncidentRecord], obs: Observations, slo: Slo | None
) -> Recovery:
    workloads = sorted({j for i in incidents for j in i.jobs})
    isolations = [_first_event(obs.events, w, "isolated", injection.at_ns) for w in workloads]
    detected = _first([i.detected_ns for i in incidents])
    isolated = _first([i.isolated_ns for i in incidents] + [t for t in isolations if t is not None])
    replaced = _first([i.replaced_ns for i in incidents])
    if injection.kind in CONTROL_PLANE_KINDS and not incidents:
        back = injection.cleared_ns
        return Recovery(
            injection=injection, incidents=(), workloads=(), restored_ns=back,
            slo_back_ns=slo_back(obs.requests, back, slo) if back is not None else None,
            tolerated=injection.tolerated, detected_ns=None, isolated_ns=None, replaced_ns=None,
            status=SERVICE_BACK if back is not None else SERVICE_NEVER_BACK,
        )  # fmt: skip
    if injection.kind == CHECKPOINT_KIND and not incidents and not injection.tolerated:
        return _checkpoint(injection, obs, slo)
    if not incidents:
        if injection.tolerated:
            restored, status = None, TOLERATED
        elif injection.cleared_ns is not None:
            restored, status = injection.cleared_ns, CLEARED_UNDETECTED
        else:
            restored, status = None, NEVER_DETECTED
        down = controller_down(injection, obs)
        if down is not None and not injection.tolerated:
            status = f"{CONTROLLER_DOWN} ({_down_span(down, obs)})"
        return Recovery(
            injection=injection, incidents=(), workloads=(), restored_ns=restored,
            slo_back_ns=slo_back(obs.requests, restored, slo) if restored is not None else None,
            tolerated=injection.tolerated, status=status, detected_ns=None, isolated_ns=isolated,
            replaced_ns=None,
        )  # fmt: skip
    # a workload's recovery is the recovery; a device's own (its incident without jobs) counts
    # only where no workload was affected: a node left powered off is recovered once its jobs run
    # again elsewhere
    judged = [i for i in incidents if i.jobs] if workloads else incidents
    restores: list[int | None] = [
        i.restored_ns if i.state == RESTORED or i.restored_ns > 0 else None for i in judged
    ]
    reporting = {e.workload for e in obs.events}
    restores += [
        _first_event(obs.events, w, RESTORED, injection.at_ns) for w in workloads if w in reporting
    ]
    unrecoverable = any(i.state == UNRECOVERABLE for i in judged)
    if unrecoverable or any(r is None for r in restores):
        restored = None
        status = "unrecoverable" if unrecoverable else (
            "detected, never isolated" if isolated is None else "never restored"
        )  # fmt: skip
    else:
        restored = max((r for r in restores if r is not None), default=injection.at_ns)
        status = "recovered"
    return Recovery(
        injection=injection, incidents=tuple(incidents), workloads=tuple(workloads),
        restored_ns=restored,
        slo_back_ns=slo_back(obs.requests, restored, slo) if restored is not None else None,
        unrecoverable=unrecoverable, tolerated=injection.tolerated, status=status,
        detected_ns=detected, isolated_ns=isolated, replaced_ns=replaced,
    )  # fmt: skip


def _checkpoint(injection: Injection, obs: Observations, slo: Slo | None) -> Recovery:
    """A checkpoint-corrupt fault: detected by the job's restore that found it, recovered at the
    job's restore after that (from the checkpoint before it)."""
    job = injection.target
    detected = _first_event(obs.events, job, CORRUPT_CHECKPOINT, injection.at_ns)
    restored = None if detected is None else _first_event(obs.events, job, RESTORED, detected)
    status = (
        LATENT if detected is None
        else "detected by the job's restore, never restored" if restored is None
        else "recovered (the job's restore found it and fell back to the checkpoint before)"
    )  # fmt: skip
    return Recovery(
        injection=injection, incidents=(), workloads=(job,) if detected is not None else (),
        restored_ns=restored,
        slo_back_ns=slo_back(obs.requests, restored, slo) if restored is not None else None,
        status=status, detected_ns=detected, isolated_ns=None, replaced_ns=None,
    )  # fmt: skip


def recoveries(obs: Observations, slo: Slo | None = None) -> list[Recovery]:
    """A Recovery for every injection that went in, each from the incidents it caused."""
    causes = caused(obs)
    out = []
    for injection in (i for i in obs.injections if not i.error):
        mine = [inc for inc in obs.incidents if causes.get(inc.id) is injection]
        out.append(_recovery(injection, mine, obs, slo))
    return out
