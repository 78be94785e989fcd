"""Detection per device: its states and its incidents."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.manager.detector import (
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


def test_the_parts_of_a_failed_device_answer_with_it_but_one_down_on_its_own_stays_down() -> None:
    d = Detector()
    d.watch(["npu", "npu.d0", "npu.d1"])
    assert d.unhealthy("npu.d1", "health", 1, "die down") is not None  # its own incident
    assert d.unhealthy("npu", "health", 2, "unreachable") is not None
    d.fold("npu", ["npu.d0", "npu.d1"])
    assert d.devices["npu.d0"] == FAILED and len(d.incidents) == 2  # no incident of its own
    assert d.answered("npu") is True
    assert d.devices["npu.d0"] == OK  # it never answers apart from its NPU: back with it
    assert d.devices["npu.d1"] == FAILED  # down before the NPU failed: until it answers itself
    assert d.answered("npu.d1") is True and d.devices["npu.d1"] == OK
