"""Detection per device and the heartbeat plan that bounds its cost."""

from __future__ import annotations

import pytest

from emulator.model.errors import NotFoundError
from emulator.model.manager.detector import (
    FAILED,
    OK,
    SUSPECT,
    Detector,
    heartbeat_plan,
)


def test_misses_in_a_row_fail_a_device_and_an_answer_clears_them() -> None:
    d = Detector(misses_to_fail=3)
    d.watch(["a", "b"])
    assert d.missed("a", 1, "DEADLINE_EXCEEDED") is None
    assert d.devices["a"] == SUSPECT and d.count(SUSPECT) == 1
    assert d.answered("a") is False and d.devices["a"] == OK  # the run of misses restarts
    assert d.missed("a", 2, "x") is None and d.missed("a", 3, "x") is None
    incident = d.missed("a", 4, "x")
    assert incident is not None and incident.detected_by == "heartbeat"
    assert incident.detected_ns == 4 and "3 heartbeats missed" in incident.detail
    assert d.missed("a", 5, "x") is None  # already failed: one incident
    assert d.count(FAILED) == 1 and d.open_for("a") == [incident]
    assert d.answered("a") is True  # back


def test_not_serving_fails_at_once() -> None:
    d = Detector(misses_to_fail=3)
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


def test_the_heartbeat_plan_spreads_and_caps_the_rate() -> None:
    # cm-mini at scale 1: 26 devices over 5 s, in 26 batches of 1
    small = heartbeat_plan(26, interval_wall_s=5.0, max_per_s=400)
    assert (small.batches, small.batch, small.stretched) == (26, 1, False)
    assert small.rate_per_s == pytest.approx(26 / 5)
    # cm384 at scale 50: 624 devices in 0.1 s would be 6,240/s: stretched to the cap
    big = heartbeat_plan(624, interval_wall_s=0.1, max_per_s=400)
    assert big.stretched and big.round_wall_s == pytest.approx(624 / 400)
    assert big.batches * big.batch >= 624 and big.rate_per_s <= 400 * 1.05
    assert big.round_wall_s / big.batches >= 0.02  # never a busier loop than 50 batches/s
    assert heartbeat_plan(0, interval_wall_s=1.0, max_per_s=1).batch == 0
