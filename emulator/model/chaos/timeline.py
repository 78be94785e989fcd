"""The timeline a run prints: every fault, detection, isolation, replacement, restore and the
SLO's return, in emulated time from the moment the workloads were up."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.chaos.observed import Observations
from cmemu.emulator.model.chaos.recovery import Recovery

PHASES = ("fault", "cleared", "detected", "isolated", "replaced", "restored", "slo-back",
          "unrecoverable", "failed")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Entry:
    at_ns: int  # emulated, since the supernode's start
    since_start_s: float  # emulated seconds since the workloads were up
    phase: str
    subject: str
    detail: str = ""


def build_timeline(obs: Observations, recs: list[Recovery]) -> list[Entry]:
    raw: list[tuple[int, str, str, str]] = []
    for i in obs.injections:
        raw.append(
            (
                i.at_ns,
                "fault" if not i.error else "failed",
                i.target or "-",
                f"{i.label}: {i.kind}" + (f" ({i.error})" if i.error else ""),
            )
        )
        if i.cleared_ns is not None:
            raw.append((i.cleared_ns, "cleared", i.target or "-", i.label))
    for inc in obs.incidents:
        jobs = f" jobs {','.join(inc.jobs)}" if inc.jobs else ""
        stages = (
            ("detected", inc.detected_ns, f"by {inc.detected_by}" if inc.detected_by else ""),
            ("isolated", inc.isolated_ns, jobs.strip()),
            ("replaced", inc.replaced_ns, "by " + ",".join(inc.replacements)
             if inc.replacements else ""),
            ("restored", inc.restored_ns, jobs.strip()),
        )  # fmt: skip
        for phase, at, detail in stages:
            if at > 0:
                raw.append((at, phase, inc.device, f"incident {inc.id} {detail}".rstrip()))
        if inc.state == "unrecoverable":
            raw.append((max(inc.detected_ns, inc.fault_ns), "unrecoverable", inc.device,
                        inc.detail))  # fmt: skip
    for e in obs.events:
        npus = f" {','.join(e.npus)}" if e.npus else ""
        raw.append((e.at_ns, e.what, e.workload, f"{e.detail}{npus}".strip()))
    for r in recs:
        if r.slo_back_ns is not None and r.affected:
            raw.append((r.slo_back_ns, "slo-back", r.injection.label, "first request within SLO"))
    raw.sort(key=lambda x: (x[0], PHASES.index(x[1]) if x[1] in PHASES else len(PHASES)))
    return [
        Entry(at_ns=at, since_start_s=(at - obs.start_ns) / 1e9, phase=p, subject=s, detail=d)
        for at, p, s, d in raw
    ]
