"""Time to recovery, per injection, from what was observed.

An injection affects the manager's incidents on its devices (reported at or after it) and the
workloads that reported an isolation of one of its devices' NPUs after it. It has recovered when
each affected workload reported `restored` after it and each incident of theirs is restored (when
no workload was affected: when each incident is restored, i.e. the device is back); then its
time to recovery is the last of those instants minus the injection's. An injection that
affected nothing (a link flap the fabric routed around) recovered at once. `slo_back_ns` is the
first request after the recovery that met the SLO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emulator.model.chaos.observed import (
    IncidentRecord,
    Injection,
    Observations,
    RequestSample,
    WorkloadEvent,
)
from emulator.model.chaos.scenario import Slo

RESTORED = "restored"
UNRECOVERABLE = "unrecoverable"


@dataclass(frozen=True, kw_only=True)
class Recovery:
    injection: Injection
    incidents: tuple[IncidentRecord, ...]
    workloads: tuple[str, ...]  # affected workloads
    detected_ns: int | None
    isolated_ns: int | None
    replaced_ns: int | None
    restored_ns: int | None  # None: not recovered by the end
    slo_back_ns: int | None = None
    unrecoverable: bool = False

    @property
    def affected(self) -> bool:
        return bool(self.incidents or self.workloads)

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


def _incidents_of(injection: Injection, obs: Observations, until_ns: int) -> list[IncidentRecord]:
    out = []
    for inc in obs.incidents:
        seen = inc.fault_ns or inc.detected_ns
        if _covers(injection, inc.device) and injection.at_ns <= seen + 1 and seen < until_ns:
            out.append(inc)
    return out


def _events_of(injection: Injection, obs: Observations, until_ns: int) -> list[WorkloadEvent]:
    return [
        e
        for e in obs.events
        if e.what == "isolated"
        and injection.at_ns <= e.at_ns < until_ns
        and (not e.npus or any(_covers(injection, n) for n in e.npus))
    ]


def _restored_after(workload: str, after_ns: int, events: Sequence[WorkloadEvent]) -> int | None:
    times = [e.at_ns for e in events if e.workload == workload and e.what == RESTORED]
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


def recoveries(obs: Observations, slo: Slo | None = None) -> list[Recovery]:
    """A Recovery for every injection that went in."""
    done = [i for i in obs.injections if not i.error]
    out = []
    for injection in done:
        # what a later injection on the same devices triggers is that one's
        until = min(
            (
                j.at_ns
                for j in done
                if j.at_ns > injection.at_ns and set(j.devices) & set(injection.devices)
            ),
            default=obs.end_ns + 1,
        )
        incidents = _incidents_of(injection, obs, until)
        isolated = _events_of(injection, obs, until)
        workloads = sorted({e.workload for e in isolated} | {j for i in incidents for j in i.jobs})
        # a workload's recovery is the recovery; a device's own (its incident without jobs)
        # counts only where no workload was affected: a node left powered off is recovered
        # once its jobs run again elsewhere
        judged = [i for i in incidents if i.jobs] if workloads else incidents
        restored: list[int | None] = [
            i.restored_ns if i.state == RESTORED or i.restored_ns > 0 else None for i in judged
        ]
        workload_jobs = {e.workload for e in obs.events}
        restored += [
            _restored_after(w, injection.at_ns, obs.events) for w in workloads if w in workload_jobs
        ]
        unrecoverable = any(i.state == UNRECOVERABLE for i in judged)
        if unrecoverable or any(r is None for r in restored):
            restored_ns = None
        else:
            restored_ns = max((r for r in restored if r is not None), default=injection.at_ns)
        out.append(
            Recovery(
                injection=injection,
                incidents=tuple(incidents),
                workloads=tuple(workloads),
                detected_ns=_first([i.detected_ns for i in incidents]),
                isolated_ns=_first(
                    [i.isolated_ns for i in incidents] + [e.at_ns for e in isolated]
                ),
                replaced_ns=_first([i.replaced_ns for i in incidents]),
                restored_ns=restored_ns,
                slo_back_ns=(
                    slo_back(obs.requests, restored_ns, slo) if restored_ns is not None else None
                ),
                unrecoverable=unrecoverable,
            )
        )
    return out
