"""Whether a chaos run kept pace: the asked and achieved time scale, the stalls, the lateness,
and the processes that went silent. A run that did not keep a bounded lag is ABORTED, never
judged PASS or FAIL: its verdict would say how busy the host was, not how the system recovered.

Bounded: with dilation (the default) emulated time slows for everyone when a process lags, so
the worst lateness in emulated time stays near the lag budget (a window's spike before the rate
drops aside); a lateness of a whole heartbeat interval (`lag_bound_s`) could fail a healthy
device or hide a sick one, so past it, or when a process the scenario did not stop goes silent
(a host that stopped a process, not the scenario), the run cannot be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, ABORTED = "PASS", "FAIL", "ABORTED"


@dataclass(frozen=True, kw_only=True)
class Pace:
    asked_scale: float
    achieved_scale: float  # the scenario's emulated span over its wall span
    dilation: bool
    longest_stall_s: float  # wall seconds cut out of emulated time, the longest
    worst_lag_emulated_s: float  # the worst lateness any process reported, in emulated time
    silent: tuple[str, ...] = ()  # processes that stopped reporting, the scenario's not counted
    lag_bound_s: float = 5.0  # emulated: a heartbeat interval (profile.manager)

    @property
    def aborted(self) -> str:
        """Why the run cannot be judged ("" when it can)."""
        bound = self.lag_bound_s
        reasons = []
        if self.silent:
            reasons.append(f"processes stopped answering: {', '.join(self.silent)}")
        if self.worst_lag_emulated_s > bound:
            reasons.append(
                f"a process ran {self.worst_lag_emulated_s:.2f} emulated s late (bound "
                f"{bound:g} s{'' if self.dilation else ', dilation off'})"
            )
        return "; ".join(reasons)

    def line(self) -> str:
        return (
            f"time scale {self.asked_scale:g} asked, {self.achieved_scale:.3g} achieved; "
            f"worst lag {self.worst_lag_emulated_s:.3f} emulated s; longest stall "
            f"{self.longest_stall_s:.2f} s{'' if self.dilation else ' (dilation off)'}"
        )


@dataclass
class PaceWindow:
    """The clock as read at a run's start and end (the fabric's GetClock)."""

    start_emulated_s: float = 0.0
    start_wall_s: float = 0.0
    start_worst_lag_emulated_s: float = 0.0
    start_silent: set[str] = field(default_factory=set)
