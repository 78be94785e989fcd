"""Serve by day, train by night, live (issue 24 item 5, the live half): the plan a scheduler
runs on the live supernode, as pure data and decisions. emulator/engines/dayplan.py carries it
out against the router and the training jobs; this module says when and what.

The plan keeps its own clock of plan hours, compressed: `hour_s` emulated seconds make one plan
hour, so a day runs in 24 x `hour_s` emulated seconds (minutes at a high time scale). Night is
the calendar policy's window of model mode (daywindow.py's `in_window`, the one calendar): inside
it the deployment runs its night footprint (`night_decode_npus` decode NPUs, or none) and the
training job the NPUs it freed; outside it the day footprint serves and the job is stopped with
its checkpoint in EMS. Each switch and each period (a day or a night, from its switch's start)
is recorded with the tokens served and the steps done in it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.daywindow import in_window, parse_window
from cmemu.emulator.model.errors import InvalidArgumentError, quote
from cmemu.emulator.model.training.spec import TrainingSpec

NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,46}[a-z0-9])?$")
DAY, NIGHT, SWITCHING, DONE, STOPPED, FAILED = (
    "day",
    "night",
    "switching",
    "done",
    "stopped",
    "failed",
)
ENDED = frozenset({DONE, STOPPED, FAILED})
TO_TRAINING, TO_SERVING = "training", "serving"


@dataclass(frozen=True, kw_only=True)
class PlanSpec:
    """A day plan: a deployment served by day and a training job run at night on its NPUs."""

    name: str
    deployment: str
    job: TrainingSpec
    night: tuple[float, float]
    hour_s: float  # emulated seconds per plan hour
    start_hour: float = 0.0  # the plan clock's hour at the start
    hours: float = 0.0  # plan hours to run; 0: until stopped
    night_decode_npus: int = 0  # 0: undeployed at night
    drain_s: float = 0.0  # a footprint's requests in flight may finish this long before it goes

    def hour_at(self, elapsed_s: float) -> float:
        """The plan clock (hours since day 0's midnight) `elapsed_s` emulated seconds in."""
        return self.start_hour + elapsed_s / self.hour_s

    def elapsed_ns(self, hour: float) -> int:
        """Emulated nanoseconds from the start until plan hour `hour` (rounded up, so that the
        clock is at or past that hour when it is reached)."""
        return math.ceil((hour - self.start_hour) * self.hour_s * 1e9)

    def is_night(self, hour: float) -> bool:
        return in_window(hour * 3600.0, self.night)

    def over(self, hour: float) -> bool:
        return self.hours > 0 and hour >= self.start_hour + self.hours - 1e-9

    def next_change(self, hour: float) -> float:
        """The next plan hour after `hour` at which night begins or ends, or the plan ends."""
        of_day = hour % 24
        ahead = min(((b - of_day) % 24) or 24.0 for b in self.night)
        change = hour + ahead
        return min(change, self.start_hour + self.hours) if self.hours > 0 else change


def plan_spec(
    *,
    name: str,
    deployment: str,
    job: TrainingSpec,
    night: str,
    hour_s: float,
    start_hour: float,
    hours: float,
    night_decode_npus: int,
    drain_s: float = 0.0,
) -> PlanSpec:
    """A checked plan: every bad field an InvalidArgumentError naming it."""
    name = name or deployment
    if not NAME.match(deployment):
        raise InvalidArgumentError(f"deployment name {quote(deployment)}", field="deployment")
    if not NAME.match(name):
        raise InvalidArgumentError(
            f"plan name {quote(name)}: lower-case letters, digits, '.' and '-', at most 48",
            field="name",
        )
    if not (math.isfinite(hour_s) and hour_s > 0):
        raise InvalidArgumentError(
            f"hour_s (emulated seconds per plan hour) must be > 0, got {hour_s}", field="hour_s"
        )
    if not (math.isfinite(start_hour) and 0 <= start_hour < 24):
        raise InvalidArgumentError(
            f"start_hour must be within 0..24, got {start_hour}", field="start_hour"
        )
    if not (math.isfinite(hours) and hours >= 0):
        raise InvalidArgumentError(
            f"hours must be >= 0 (0: until stopped), got {hours}", field="hours"
        )
    if not (math.isfinite(drain_s) and drain_s >= 0):
        raise InvalidArgumentError(f"drain_s must be >= 0, got {drain_s}", field="drain_s")
    if job.name == deployment:
        raise InvalidArgumentError(
            "the training job needs a name of its own (the deployment's holds its NPUs)",
            field="training.name",
        )
    return PlanSpec(
        name=name,
        deployment=deployment,
        job=job,
        night=parse_window(night),
        hour_s=hour_s,
        start_hour=start_hour,
        hours=hours,
        night_decode_npus=night_decode_npus,
        drain_s=drain_s,
    )


def night_spec(day_yaml: str, decode_npus: int) -> str:
    """The deployment's night footprint: its day document with `decode_npus` decode NPUs (a
    shrink: fewer than by day)."""
    import yaml  # imported when used: a boot that never parses YAML loads none

    doc: Any = yaml.safe_load(day_yaml)
    decode = doc.get("decode") if isinstance(doc, dict) else None
    day_npus = decode.get("npus") if isinstance(decode, dict) else None
    if not isinstance(decode, dict) or not isinstance(day_npus, int):
        raise InvalidArgumentError(
            "the deployment's document has no decode NPUs to shrink", field="night_decode_npus"
        )
    if decode_npus >= day_npus:
        raise InvalidArgumentError(
            f"night_decode_npus {decode_npus} must be fewer than the deployment's {day_npus} "
            "decode NPUs by day (0: undeployed at night)",
            field="night_decode_npus",
        )
    doc["decode"] = {**dict(decode), "npus": decode_npus}
    return str(yaml.safe_dump(doc, sort_keys=False))


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One switch of a day plan, serving to training or back, and how long it took."""

    at_ns: int
    plan_hour: float
    to: str  # TO_TRAINING (nightfall) or TO_SERVING (morning)
    duration_ns: int
    npus: int


@dataclass(kw_only=True)
class Period:
    """A day or a night, from the start of the switch that began it."""

    kind: str
    start_ns: int
    tokens_at_start: int
    step_at_start: int
    end_ns: int = 0
    served_tokens: int = 0
    training_steps: int = 0

    def update(self, tokens: int, step: int) -> None:
        """Its figures so far (while it lasts)."""
        self.served_tokens = max(0, tokens - self.tokens_at_start)
        self.training_steps = max(0, step - self.step_at_start)

    def close(self, now_ns: int, tokens: int, step: int) -> None:
        self.end_ns = now_ns
        self.update(tokens, step)


@dataclass(kw_only=True)
class PlanStatus:
    """A running day plan's state: its switches so far, its periods and its job's step."""

    spec: PlanSpec
    started_ns: int
    state: str = DAY
    switches: list[Switch] = field(default_factory=list)
    periods: list[Period] = field(default_factory=list)
    step: int = 0  # the training job's step, as last seen
    error: str = ""
    ended_ns: int = 0  # 0 while it runs

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def served(self, kind: str) -> int:
        return sum(p.served_tokens for p in self.periods if p.kind == kind)

    @property
    def training_steps(self) -> int:
        return sum(p.training_steps for p in self.periods if p.kind == NIGHT)
