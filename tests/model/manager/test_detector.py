"""Detection per device: its states and its incidents."""

from __future__ import annotations

import pytest

from emulator.model.errors import NotFoundError
from emulator.model.manager.detector import (
    FAILED,
    OK,
    SUSPECT,
    Detector,
)


def test_a_failure_opens_one_incident_and_an_answer_brings_the_device_back() -> None:
    d = Detector()
    d.watch(["a", "b"])
    d.suspect("a")
    assert d.devices["a"] == SUSPECT and d.count(SUSPECT) == 1
    assert d.answered("a") is False and d.devices["a"] == OK  # it answered: not back, never gone
    incident = d.unhealthy("a", "heartbeat", 4, "3 heartbeats missed: not answering")
    assert incident is not None and incident.detected_by == "heartbeat"
    assert incident.detected_ns == 4 and "3 heartbeats missed" in incident.detail
    assert d.unhealthy("a", "health", 5, "x") is None  # already failed: one incident
    d.suspect("a")
    assert d.devices["a"] == FAILED  # a failed device is not merely suspect
    assert d.count(FAILED) == 1 and d.open_for("a") == [incident]
    assert d.answered("a") is True  # back


def test_not_serving_fails_at_once() -> None:
    d = Detector()
    d.watch(["a"])
    first = d.unhealthy("a", "health", 7, "NOT_SERVING")
    assert first is not None and first.id == "inc-00001" and first.state == "detected"
    assert d.unhealthy("a", "health", 8, "again") is None
    d.answered("a")
    second = d.unhealthy("a", "event", 9, "fault")
    assert second is not None and second.id == "inc-00002"
    assert d.since(9) == [second] and d.get("inc-00001") is first
    with pytest.raises(NotFoundError):
        d.get("inc-99999")
