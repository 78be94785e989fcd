"""The verdict: each expectation of a scenario judged against what was observed.

One Check per expectation (a JUnit test case each); the run passes only when every check holds.
Checks are registered by expectation name in one table, each a small function.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from emulator.model.chaos.observed import Observations
from emulator.model.chaos.recovery import Recovery
from emulator.model.chaos.scenario import Expectations
from emulator.model.chaos.units import format_s


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
    if e.recovered_within_s is None:
        return None
    limit = e.recovered_within_s
    late = [r for r in recs if r.recovery_s is None or r.recovery_s > limit]
    times = [r.recovery_s for r in recs if r.recovery_s is not None]
    worst = max(times, default=0.0)
    measured = f"worst {format_s(worst)}" if times else "nothing recovered"
    if any(r.recovery_s is None for r in recs):
        measured += f", {sum(r.recovery_s is None for r in recs)} not recovered"
    return Check(
        name="recovered_within",
        ok=not late and bool(recs),
        expected=f"<= {format_s(limit)} emulated, every fault",
        measured=measured,
        detail="; ".join(
            f"{r.injection.label} ({r.injection.kind} {r.injection.target}): "
            + ("not recovered" if r.recovery_s is None else format_s(r.recovery_s))
            + (" unrecoverable" if r.unrecoverable else "")
            for r in late
        ),
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
    restored = [r.restored_ns for r in recs]
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


def _slo_text(e: Expectations) -> str:
    assert e.slo is not None
    parts = [f"TPOT <= {e.slo.tpot_ms:g} ms"] if e.slo.tpot_ms is not None else []
    parts += [f"TTFT <= {e.slo.ttft_ms:g} ms"] if e.slo.ttft_ms is not None else []
    return " and ".join(parts) + " after recovery (median)"


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


JUDGES: dict[str, _Judge] = {
    "faults_injected": _injected,
    "recovered_within": _recovered,
    "lost_objects": _lost,
    "failed_requests": _failed,
    "dropped_requests": _dropped,
    "slo": _slo,
    "training_progress": _training,
    "unrecoverable": _unrecoverable,
}


def judge(expect: Expectations, obs: Observations, recs: list[Recovery]) -> Verdict:
    checks = [c for j in JUDGES.values() if (c := j(expect, obs, recs)) is not None]
    return Verdict(checks=tuple(checks), recoveries=tuple(recs))
