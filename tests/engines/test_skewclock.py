"""A host's own clock (engines/skewclock.py LocalClock, model/clock.py Skew): it reads the true
emulated time plus a step and a drift, and its sleepers wake when the SKEWED reading reaches
their instant, re-planned when the skew changes. Emulated time only, never wall time."""

from __future__ import annotations

import asyncio

import pytest

from emulator.engines.clock import Timeline
from emulator.engines.skewclock import LocalClock
from emulator.model.clock import Clock, Skew

S = 1_000_000_000


@pytest.mark.parametrize(
    ("offset_s", "drift_ppm"), [(30.0, 0.0), (-30.0, 0.0), (0.0, 100_000.0), (-5.0, -99_999.0)]
)
def test_a_skew_reads_and_inverts(offset_s: float, drift_ppm: float) -> None:
    skew = Skew(offset_ns=round(offset_s * S), drift_ppm=drift_ppm, since_ns=7 * S)
    assert skew.read(7 * S) == 7 * S + round(offset_s * S)  # the step, at once
    later = skew.read(17 * S) - skew.read(7 * S)
    assert later == round(10 * S * (1 + drift_ppm / 1e6))  # the drift, from there on
    for skewed in (0, 3 * S + 1, 40 * S + 123, 10**15 + 7):
        true = skew.true_of(skewed)
        assert skew.read(true) >= skewed > skew.read(true - 1)  # the first such instant


async def test_a_local_clock_reads_the_true_time_until_skewed() -> None:
    timeline = Timeline(Clock(time_scale=1000.0))
    local = LocalClock(timeline)
    before = timeline.now_ns()
    assert before <= local.now_ns() <= timeline.now_ns()
    local.set_skew(Skew(offset_ns=-30 * S, drift_ppm=0.0, since_ns=timeline.now_ns()))
    before = timeline.now_ns()
    assert before - 30 * S <= local.now_ns() <= timeline.now_ns() - 30 * S
    local.set_skew(None)
    before = timeline.now_ns()
    assert before <= local.now_ns() <= timeline.now_ns()


async def test_a_step_ahead_ends_a_sleep_early_and_a_step_behind_late() -> None:
    """A deadline kept as an instant (a fault's until) meets the step: ahead, it comes early by
    the step; behind, late by it. A sleep begun after the step lasts its length."""
    timeline = Timeline(Clock(time_scale=100.0))
    local = LocalClock(timeline)
    start = timeline.now_ns()
    early = asyncio.ensure_future(local.sleep_until(local.now_ns() + 100 * S))  # 1 s wall
    await asyncio.sleep(0)
    local.set_skew(Skew(offset_ns=90 * S, drift_ppm=0.0, since_ns=timeline.now_ns()))
    await early
    # woke when the skewed reading got there: about 10 s in (unskewed, it would be 100)
    assert timeline.now_ns() - start < 100 * S
    assert local.now_ns() - start >= 100 * S
    local.set_skew(None)

    start = timeline.now_ns()
    late = asyncio.ensure_future(local.sleep_until(local.now_ns() + 1 * S))
    await asyncio.sleep(0)
    local.set_skew(Skew(offset_ns=-2 * S, drift_ppm=0.0, since_ns=timeline.now_ns()))
    await late
    assert timeline.now_ns() - start >= 3 * S  # a second to go, and two more stepped back

    start_local, start = local.now_ns(), timeline.now_ns()
    await local.sleep(5.0)  # begun after the step: its length, on the skewed clock
    assert local.now_ns() - start_local >= 5 * S
    assert timeline.now_ns() - start >= 5 * S


async def test_a_drifting_clock_wakes_its_sleepers_by_its_own_rate() -> None:
    timeline = Timeline(Clock(time_scale=50.0))
    local = LocalClock(timeline)
    skew = Skew(offset_ns=0, drift_ppm=100_000.0, since_ns=timeline.now_ns())
    local.set_skew(skew)
    start = timeline.now_ns()
    await local.sleep(110.0)  # 10% fast: 110 skewed seconds are 100 true ones (2 s wall)
    true = timeline.now_ns() - start
    assert local.now_ns() - skew.read(start) >= 110 * S
    # unskewed it would be 110: the bound leaves 100 ms of wall lateness to a busy loop
    assert 100 * S - 1 <= true < 105 * S, true / S
