"""The verdict: each expectation of a scenario judged against what was observed.

One Check per expectation (a JUnit test case each); the run passes only when every check holds.
Checks are registered by expectation name in one table, each a small function.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from cmemu.emulator.model.chaos.observed import IncidentRecord, Observations, RequestSample
from cmemu.emulator.model.chaos.recovery import (
    CONTROL_PLANE_KINDS,
    NEVER_DETECTED,
    Recovery,
    cause_of,
    misses,
)
from cmemu.emulator.model.chaos.scenario import Expectations
from cmemu.emulator.model.chaos.units import format_s


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str  # the expectation, as the scenario spells it
    ok: bool
    expected: str
    measured: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    checks: tuple[Check, ...]
    recoveries: tuple[Recovery, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


_Judge = Callable[[Expectations, Observations, list[Recovery]], Check | None]


def _injected(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    failed = [i for i in obs.injections if i.error]
    return Check(
        name="faults_injected",
        ok=not failed and bool(obs.injections),
        expected="every step's fault goes in",
        measured=f"{len(obs.injections) - len(failed)}/{len(obs.injections)}",
        detail="; ".join(f"{i.label} {i.kind} {i.target}: {i.error}" for i in failed)
        or ("" if obs.injections else "the scenario injected nothing"),
    )


def _recovered(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """Every fault not tolerated recovered in time; one nothing detected and nothing cleared did
    not ("never detected"), whatever the workloads did."""
    if e.recovered_within_s is None:
        return None
    limit = e.recovered_within_s
    judged = [r for r in recs if not r.tolerated]
    late = [r for r in judged if r.recovery_s is None or r.recovery_s > limit]
    times = [r.recovery_s for r in judged if r.recovery_s is not None]
    measured = f"worst {format_s(max(times))}" if times else "nothing recovered"
    if not judged and recs:
        measured = "no fault to recover"
    if any(r.recovery_s is None for r in judged):
        measured += f", {sum(r.recovery_s is None for r in judged)} not recovered"
    undetected = sum(
        1
        for r in judged
        if r.recovery_s is not None
        and not r.detected
        and r.injection.kind not in CONTROL_PLANE_KINDS  # back when cleared: nothing detects it
    )
    if undetected:
        measured += f", {undetected} never detected (over when cleared)"
    if len(judged) < len(recs):
        measured += f", {len(recs) - len(judged)} tolerated (judged apart)"
    return Check(
        name="recovered_within",
        ok=not late and bool(recs),
        expected=f"<= {format_s(limit)} emulated, every fault",
        measured=measured,
        detail="; ".join(
            f"{r.injection.label} ({r.injection.kind} {r.injection.target}): "
            + (r.status if r.recovery_s is None else f"took {format_s(r.recovery_s)}")
            + (f" ({r.phases()})" if r.detected else "")
            for r in late
        ),
    )


def _detected(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """Every fault a detector is for was detected within the bound (time to detect, from its
    injection). A fault the scenario cleared before anything noticed it is over for
    recovered_within ("never detected (over when cleared)"); here it fails: the control plane
    under test never saw it. A killed or hung service is judged apart (nothing detects it: it
    is back when cleared), and so is a tolerated fault (its SLO throughout instead)."""
    if e.detected_within_s is None:
        return None
    limit = e.detected_within_s
    judged = [r for r in recs if not r.tolerated and r.injection.kind not in CONTROL_PLANE_KINDS]
    times = [
        (r, max(0, r.detected_ns - r.injection.at_ns) / 1e9)
        for r in judged
        if r.detected_ns is not None
    ]
    never = [r for r in judged if r.detected_ns is None]
    late = [(r, t) for r, t in times if t > limit]
    measured = f"worst {format_s(max(t for _, t in times))}" if times else "nothing detected"
    if not judged:
        measured = "no fault a detector is for"
    if never:
        measured += f", {len(never)} never detected"
    return Check(
        name="detected_within",
        ok=bool(judged) and not never and not late,
        expected=f"<= {format_s(limit)} emulated, every fault not tolerated",
        measured=measured,
        detail="; ".join(
            [f"{r.name}: {r.status or NEVER_DETECTED}" for r in never]
            + [f"{r.name}: detected after {format_s(t)}" for r, t in late]
        ),
    )


def _tolerated(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """A fault its step says is tolerated: the workloads meet their SLO all through it (every
    request ending while it lasts succeeds within the SLO; no training job fails)."""
    tolerated = [r for r in recs if r.tolerated]
    if not tolerated:
        return None
    problems, measured = [], []
    loaded = bool(obs.loaded)
    for r in tolerated:
        i = r.injection
        until = i.cleared_ns if i.cleared_ns is not None else obs.end_ns
        during = [q for q in obs.requests if i.at_ns <= q.done_ns <= until]
        bad = [q for q in during if misses(q, e.slo)]
        failed_jobs = sorted(
            {
                ev.workload
                for ev in obs.events
                if ev.what in ("isolated", "failed")
                and ev.workload in obs.jobs
                and i.at_ns <= ev.at_ns <= until
            }
        )
        what = f"{i.label} ({i.kind} {i.target})"
        measured.append(f"{what}: {len(during) - len(bad)}/{len(during)} requests within SLO")
        if bad:
            failed = sum(1 for q in bad if not q.ok)
            problems.append(
                f"{what}: {len(bad)} of {len(during)} requests during the fault "
                f"failed ({failed}) or missed the SLO ({len(bad) - failed})"
            )
        elif loaded and not during:
            problems.append(f"{what}: no request completed during the fault")
        problems += [f"{what}: training job {j} failed during the fault" for j in failed_jobs]
    return Check(
        name="tolerated",
        ok=not problems,
        expected="the workloads meet their SLO throughout each tolerated fault"
        + (f" ({_slo_text(e, 'throughout')})" if e.slo is not None else " (no failed request)"),
        measured="; ".join(measured),
        detail="; ".join(problems),
    )


def _lost(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    if e.lost_objects is None:
        return None
    lost = obs.lost_objects
    return Check(
        name="lost_objects",
        ok=lost is not None and lost <= e.lost_objects,
        expected=f"<= {e.lost_objects}",
        measured="not measured" if lost is None else f"{lost} of {obs.objects}",
    )


def _failed(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    if e.failed_requests is None and e.failed_rate is None:
        return None
    total = len(obs.requests)
    failed = [r for r in obs.requests if not r.ok]
    if e.failed_rate is not None:
        rate = len(failed) / total if total else 0.0
        ok, expected = rate <= e.failed_rate, f"<= {e.failed_rate:.2%}"
    else:
        ok, expected = len(failed) <= (e.failed_requests or 0), f"<= {e.failed_requests}"
    errors = sorted({r.error for r in failed if r.error})
    return Check(
        name="failed_requests",
        ok=ok and total > 0,
        expected=expected,
        measured=f"{len(failed)} of {total}",
        detail="; ".join(errors[:3]) if total else "no request of the load completed or failed",
    )


def _dropped(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    if e.dropped_requests is None:
        return None
    return Check(
        name="dropped_requests",
        ok=obs.dropped_requests <= e.dropped_requests,
        expected=f"<= {e.dropped_requests}",
        measured=str(obs.dropped_requests),
    )


def _slo(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    if e.slo is None:
        return None
    restored = [r.restored_ns for r in recs if not r.tolerated]
    if any(t is None for t in restored):
        return Check(name="slo", ok=False, expected=_slo_text(e), measured="not recovered")
    after = max((t for t in restored if t is not None), default=obs.start_ns)
    later = [r for r in obs.requests if r.ok and r.done_ns >= after]
    if not later:
        return Check(
            name="slo",
            ok=False,
            expected=_slo_text(e),
            measured="no request completed after the recovery",
        )
    tpot = statistics.median(r.tpot_ms for r in later)
    ttft = statistics.median(r.ttft_ms for r in later)
    ok = (e.slo.tpot_ms is None or tpot <= e.slo.tpot_ms) and (
        e.slo.ttft_ms is None or ttft <= e.slo.ttft_ms
    )
    return Check(
        name="slo",
        ok=ok,
        expected=_slo_text(e),
        measured=f"median TPOT {tpot:.1f} ms, TTFT {ttft:.1f} ms over {len(later)} requests "
        "after the recovery",
    )


def _slo_text(e: Expectations, when: str = "after recovery (median)") -> str:
    assert e.slo is not None
    parts = [f"TPOT <= {e.slo.tpot_ms:g} ms"] if e.slo.tpot_ms is not None else []
    parts += [f"TTFT <= {e.slo.ttft_ms:g} ms"] if e.slo.ttft_ms is not None else []
    return " and ".join(parts) + f" {when}"


def _training(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    tp = e.training_progress
    if tp is None:
        return None
    problems = []
    for t in obs.training:
        if t.state in ("failed", "stopped"):
            problems.append(f"{t.name} {t.state}")
        if tp.progressing and t.step <= t.step_at_start:
            problems.append(f"{t.name} made no progress (step {t.step})")
        if tp.min_goodput is not None and t.goodput < tp.min_goodput:
            problems.append(f"{t.name} goodput {t.goodput:.3f} < {tp.min_goodput:g}")
        if tp.max_steps_lost is not None and t.steps_lost > tp.max_steps_lost:
            problems.append(f"{t.name} lost {t.steps_lost} steps > {tp.max_steps_lost}")
        if tp.max_restarts is not None and t.restarts > tp.max_restarts:
            problems.append(f"{t.name} restarted {t.restarts} times > {tp.max_restarts}")
    return Check(
        name="training_progress",
        ok=bool(obs.training) and not problems,
        expected="every job progresses"
        + (f", goodput >= {tp.min_goodput:g}" if tp.min_goodput is not None else ""),
        measured=", ".join(
            f"{t.name}: step {t.step_at_start}->{t.step}, {t.restarts} restarts, "
            f"{t.steps_lost} steps lost, goodput {t.goodput:.3f}"
            for t in obs.training
        )
        or "no training job observed",
        detail="; ".join(problems),
    )


def _unrecoverable(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    if e.unrecoverable is None:
        return None
    n = sum(1 for i in obs.incidents if i.state == "unrecoverable")
    return Check(
        name="unrecoverable", ok=n <= e.unrecoverable, expected=f"<= {e.unrecoverable}",
        measured=str(n),
    )  # fmt: skip


OPEN = ("restored",)  # an incident in any other state is open (the device is not back)
STEADY_BEFORE = "steady state not met before the first fault"
STEADY_AFTER = "steady state not met after the last fault"


def _steady(
    e: Expectations,
    requests: list[RequestSample],
    open_incidents: list[IncidentRecord],
    *,
    name: str,
    window: str,
    reason: str,
) -> Check:
    spec = e.steady_state
    assert spec is not None
    problems, measured, expected = [], [], []
    if spec.failed_requests is not None:
        failed = [r for r in requests if not r.ok]
        expected.append(f"<= {spec.failed_requests} failed requests {window}")
        measured.append(f"{len(failed)} of {len(requests)} requests failed")
        if not requests:
            problems.append(f"no request completed {window}")
        elif len(failed) > spec.failed_requests:
            errors = sorted({r.error for r in failed if r.error})[:3]
            why = f" ({'; '.join(errors)})" if errors else ""
            problems.append(f"{len(failed)} failed requests {window}{why}")
    if spec.open_incidents is not None:
        expected.append(f"<= {spec.open_incidents} open incidents")
        measured.append(f"{len(open_incidents)} open incidents")
        if len(open_incidents) > spec.open_incidents:
            problems.append(
                "open incidents: " + ", ".join(f"{i.id} on {i.device} ({i.state})"
                                               for i in open_incidents[:5])
            )  # fmt: skip
    return Check(
        name=name,
        ok=not problems,
        expected=", ".join(expected),
        measured=", ".join(measured),
        detail=f"{reason}: {'; '.join(problems)}" if problems else "",
    )


def steady_before(e: Expectations, obs: Observations) -> Check | None:
    """The steady-state hypothesis at the first fault's instant: requests since the workloads
    were up, and the incidents open then (of any age). The runner injects nothing when it fails."""
    if e.steady_state is None:
        return None
    if obs.steady_ns is None:
        return Check(
            name="steady_state_before",
            ok=False,
            expected="checked before the first fault",
            measured="not checked",
            detail=f"{STEADY_BEFORE}: never checked",
        )
    until = obs.steady_ns
    requests = [r for r in obs.requests if obs.start_ns <= r.done_ns < until]
    open_now = [i for i in obs.open_before if i.state not in OPEN]
    return _steady(e, requests, open_now, name="steady_state_before",
                   window="before the first fault", reason=STEADY_BEFORE)  # fmt: skip


def _steady_after(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """The hypothesis again once the last fault is over (cleared, or recovered): requests
    ending after that, and the incidents still open at the end."""
    if e.steady_state is None or obs.halted:
        return None
    ends = [i.cleared_ns if i.cleared_ns is not None else i.at_ns for i in obs.injections]
    ends += [r.restored_ns for r in recs if r.restored_ns is not None]
    after = max(ends, default=obs.start_ns)
    requests = [r for r in obs.requests if r.done_ns >= after]
    open_now = [i for i in obs.incidents if i.state not in OPEN]
    return _steady(e, requests, open_now, name="steady_state_after",
                   window="after the last fault", reason=STEADY_AFTER)  # fmt: skip


def _blast_radius(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """No incident on a device that no step targeted: a fault's effects stayed where it was put
    (a spare that replaced a targeted device and then failed is inside)."""
    if e.blast_radius is None:
        return None
    went_in = [i for i in obs.injections if not i.error]
    inside = [inc for inc in obs.incidents if cause_of(inc, went_in) is not None]
    spares = {d for inc in inside for d in inc.replacements}
    outside = [
        inc for inc in obs.incidents
        if cause_of(inc, went_in) is None
        and not any(inc.device == s or inc.device.startswith(f"{s}.") for s in spares)
    ]  # fmt: skip
    return Check(
        name="blast_radius",
        ok=not outside,
        expected="no incident on a device no step targeted",
        measured=f"{len(outside)} of {len(obs.incidents)} incidents outside the targets",
        detail="; ".join(
            f"incident {i.id} on {i.device} (by {i.detected_by or '?'}, "
            f"+{format_s(max(0, i.detected_ns - obs.start_ns) / 1e9)}): no step targeted it"
            for i in outside
        ),
    )


def _aborted(e: Expectations, obs: Observations, recs: list[Recovery]) -> Check | None:
    """A crossed abort condition fails the run: the attack was halted, its schedule unfinished."""
    if not obs.aborted:
        return None
    at = format_s(max(0, (obs.aborted_ns or obs.start_ns) - obs.start_ns) / 1e9)
    return Check(
        name="abort",
        ok=False,
        expected="no abort condition crossed",
        measured=obs.aborted,
        detail=f"halted at +{at}: {obs.aborted}; every fault cleared, nothing more injected",
    )


JUDGES: dict[str, _Judge] = {
    "faults_injected": _injected,
    "recovered_within": _recovered,
    "detected_within": _detected,
    "tolerated": _tolerated,
    "lost_objects": _lost,
    "failed_requests": _failed,
    "dropped_requests": _dropped,
    "slo": _slo,
    "training_progress": _training,
    "unrecoverable": _unrecoverable,
    "blast_radius": _blast_radius,
    "steady_state_after": _steady_after,
    "abort": _aborted,
}


def judge(expect: Expectations, obs: Observations, recs: list[Recovery]) -> Verdict:
    """Every expectation's check; a run halted before its first fault (the steady state did not
    hold) is judged on that alone: nothing else was put to the test."""
    before = steady_before(expect, obs)
    if obs.halted:
        assert before is not None, "only the steady state halts a run"
        return Verdict(checks=(before,), recoveries=tuple(recs))
    checks = [c for j in JUDGES.values() if (c := j(expect, obs, recs)) is not None]
    return Verdict(checks=tuple(([before] if before else []) + checks), recoveries=tuple(recs))
