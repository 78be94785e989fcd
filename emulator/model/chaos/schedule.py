"""The fault schedule: a scenario's steps expanded, with repeats and seeded jitter, into
injections at emulated offsets from the moment the workloads are up.

`after: STEP` waits for that step's first injection; the schedule is fixed before the first fault
(as KWOK computes a stage's delay up front), so a seed replays the same times and the same targets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cmemu.emulator.model.chaos.scenario import Scenario, Step


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One injection of a step: when (emulated seconds after the workloads are up) and until."""

    step: Step
    occurrence: int  # 0 for the first
    at_s: float
    clear_at_s: float | None  # None: stays until the scenario ends

    @property
    def label(self) -> str:
        return self.step.id if self.occurrence == 0 else f"{self.step.id}#{self.occurrence + 1}"


def plan(scenario: Scenario, rng: random.Random) -> list[Planned]:
    """Every injection, in order of time (then of the steps' order)."""
    first: dict[str, float] = {}
    out: list[Planned] = []

    def start_of(step: Step) -> float:
        if step.id in first:
            return first[step.id]
        if step.after is not None:
            base = start_of(scenario.step(step.after)) + step.delay_s
        else:
            assert step.at_s is not None, "the parser gives each step at: or after:"
            base = step.at_s
        first[step.id] = base + _jitter(step, rng)
        return first[step.id]

    for step in scenario.steps:
        start_of(step)
    for step in scenario.steps:
        count = step.repeat.count if step.repeat else 1
        every = step.repeat.every_s if step.repeat else 0.0
        base = first[step.id]
        for n in range(count):
            at = base if n == 0 else base + n * every + _jitter(step, rng)
            clear = at + step.duration_s if step.duration_s is not None else None
            out.append(Planned(step=step, occurrence=n, at_s=at, clear_at_s=clear))
    return sorted(out, key=lambda p: (p.at_s, scenario.steps.index(p.step), p.occurrence))


def _jitter(step: Step, rng: random.Random) -> float:
    return rng.uniform(0.0, step.jitter_s) if step.jitter_s > 0 else 0.0


def horizon_s(scenario: Scenario, planned: list[Planned], default_recovery_s: float) -> float:
    """How long the runner observes after the workloads are up: the scenario's `duration`, else
    the last injection (or clearance) plus the recovery deadline."""
    if scenario.duration_s is not None:
        return scenario.duration_s
    recovery = scenario.expect.recovered_within_s or default_recovery_s
    last = max((max(p.at_s, p.clear_at_s or 0.0) for p in planned), default=0.0)
    return last + recovery
