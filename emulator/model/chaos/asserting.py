"""Per-fault bounds in one line, for tests: `result.fault("crash").recovered_within(300)`.

A chaos run's verdict judges the scenario's own expectations; a test often wants more: this
fault recovered within that bound, that one was detected within a few seconds. `FaultRecoveries`
is the recoveries of one step (every repetition of a repeated step), or of one fault kind, and
each check raises an AssertionError that says which fault, what happened to it (its detection,
isolation and restore times, or why it never recovered) and the bound it missed, so that a
failing test needs no boilerplate around `recovery_s` being None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmemu.emulator.model.chaos.recovery import Recovery
from cmemu.emulator.model.chaos.units import duration_s, format_s


@dataclass(frozen=True)
class FaultRecoveries:
    """The recoveries a name picked (never empty)."""

    name: str
    recoveries: tuple[Recovery, ...]

    @property
    def recovery_s(self) -> float | None:
        """The slowest recovery, in emulated seconds; None when one did not recover."""
        times = [r.recovery_s for r in self.recoveries]
        if any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def recovered_within(self, bound: float | str) -> float:
        """Every fault picked recovered within `bound` (emulated seconds, or "5m"): the slowest
        recovery; else AssertionError saying which did not and why."""
        limit = duration_s(bound, "bound", allow_zero=False)
        problems = []
        for r in self.recoveries:
            took = r.recovery_s
            if took is None:
                problems.append(f"{r.name}: not recovered ({r.phases()})")
            elif took > limit:
                problems.append(f"{r.name}: recovered in {format_s(took)} ({r.phases()})")
        if problems:
            within = f"not recovered within {format_s(limit)}"
            raise AssertionError(f"fault {self.name!r} {within}: " + "; ".join(problems))
        worst = self.recovery_s
        assert worst is not None
        return worst

    def detected_within(self, bound: float | str) -> float:
        """Every fault picked was detected within `bound`: the slowest detection, in emulated
        seconds; else AssertionError (a fault nothing detected says so)."""
        limit = duration_s(bound, "bound", allow_zero=False)
        problems, worst = [], 0.0
        for r in self.recoveries:
            if r.detected_ns is None:
                problems.append(f"{r.name}: {r.status or 'never detected'}")
                continue
            took = max(0, r.detected_ns - r.injection.at_ns) / 1e9
            worst = max(worst, took)
            if took > limit:
                problems.append(f"{r.name}: detected after {format_s(took)}")
        if problems:
            within = f"not detected within {format_s(limit)}"
            raise AssertionError(f"fault {self.name!r} {within}: " + "; ".join(problems))
        return worst


def pick(recoveries: Sequence[Recovery], name: str) -> FaultRecoveries:
    """The recoveries of step `name` (its repetitions "name#2"... too), else of every fault of
    kind `name`; LookupError naming the steps and kinds there are when none matches."""
    step = name.split("#", maxsplit=1)[0]
    mine = [r for r in recoveries if r.injection.label.split("#", maxsplit=1)[0] == step]
    if "#" in name:  # one repetition: "crashes#2"; the first is "crashes" or "crashes#1"
        one = step if name == f"{step}#1" else name
        mine = [r for r in mine if r.injection.label == one]
    if not mine:
        mine = [r for r in recoveries if r.injection.kind == name]
    if not mine:
        steps = sorted({r.injection.label for r in recoveries})
        kinds = sorted({r.injection.kind for r in recoveries})
        raise LookupError(
            f"no fault {name!r} in this run; steps: {', '.join(steps) or 'none'}; "
            f"kinds: {', '.join(kinds) or 'none'}"
        )
    return FaultRecoveries(name=name, recoveries=tuple(mine))
