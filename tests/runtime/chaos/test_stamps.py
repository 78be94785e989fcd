"""An injection is stamped on the clock its judge compares it with: the authority's (sn0's fabric,
GetClock), on which the manager stamps its incidents in one process, not the runner's follower,
which may read ahead of it by up to a lease once the authority cuts a stall out or slows (CI, x50,
a loaded host: a pool-loss detected 5 emulated s "before" its injection, judged never detected)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.chaos.observed import IncidentRecord, Injection
from cmemu.emulator.model.chaos.recovery import cause_of
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.runner import Runner
from tests.runtime.chaos.fresh import run_fresh, why

AHEAD_NS = 5_000_000_000  # what CI's failed run read between the runner's clock and the manager's
SCENARIO = """
version: 1
name: stamped
description: an NPU crashes for 20 s while the runner's clock reads 5 emulated s ahead
preset: cm-mini
seed: 1
steps:
  - {id: crash, at: 5s, fault: crash, target: {npu: n00-npu1}, duration: 20s}
expect: {detected_within: 1m, recovered_within: 10m}
"""


class _Ahead:
    """A timeline read AHEAD_NS ahead of the one it wraps, as a follower reads after the
    authority cut a stall it did not see."""

    def __init__(self, timeline: Timeline) -> None:
        self._timeline = timeline

    def now_ns(self) -> int:
        return self._timeline.now_ns() + AHEAD_NS

    def __getattr__(self, name: str) -> Any:
        return getattr(self._timeline, name)


@pytest.mark.slow
def test_a_runner_reading_ahead_still_credits_the_detection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ahead(self: Runner) -> Any:
        assert self.keeper is not None
        return _Ahead(self.keeper.timeline)

    monkeypatch.setattr(Runner, "_clock", property(ahead))
    result = run_fresh(files.parse_text(SCENARIO), tmp_path, time_scale=50.0)
    (injection,) = result.observations.injections
    incident = next(i for i in result.observations.incidents if i.device == "n00-npu1")
    assert injection.at_ns <= incident.detected_ns  # both on the authority's clock
    assert result.ok, why(result)


def test_its_twin_an_injection_stamped_after_its_detection_is_not_its_cause() -> None:
    """What the runner's own reading did: the incident has no cause, so it is never detected."""
    detected_ns = 20_000_000_000
    incident = IncidentRecord(
        id="inc-1", device="n00-npu1", detected_by="health", state="restored",
        fault_ns=0, detected_ns=detected_ns,
    )  # fmt: skip
    stamped = Injection(
        label="crash", kind="crash", target="n00-npu1", devices=("n00-npu1",),
        at_ns=detected_ns + AHEAD_NS, fault_id="dev:n00-npu1:crash",
    )  # fmt: skip
    assert cause_of(incident, [stamped]) is None
    on_time = Injection(**{**stamped.__dict__, "at_ns": detected_ns - 1_000_000})
    assert cause_of(incident, [on_time]) is on_time
