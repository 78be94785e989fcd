"""A host's own clock (engines/skewclock.py LocalClock, model/clock.py Skew): it reads the true
emulated time plus a step and a drift, and its sleepers wake when the SKEWED reading reaches
their instant, re-planned when the skew changes. Emulated time only, never wall time."""

from __future__ import annotations

import asyncio

import pytest

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.skewclock import LocalClock
from cmemu.emulator.model.clock import Clock, Skew

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


async def _race(drift_ppm: float | None) -> tuple[list[str], int]:
    """A 110 s sleep on a LocalClock beside a 105 s one on the true timeline, both begun
    together: the order they wake in (the timeline wakes its sleepers in emulated order, so a
    busy host that wakes both late cannot swap them), and how long the first took, true."""
    timeline = Timeline(Clock(time_scale=50.0))
    local = LocalClock(timeline)
    start = timeline.now_ns()
    if drift_ppm is not None:
        local.set_skew(Skew(offset_ns=0, drift_ppm=drift_ppm, since_ns=start))
    woke: list[str] = []
    took: list[int] = []

    async def skewed() -> None:
        await local.sleep_until(local.now_ns() + 110 * S)
        woke.append("local 110 s")
        took.append(timeline.now_ns() - start)

    async def true() -> None:
        await timeline.sleep_until(start + 105 * S)
        woke.append("true 105 s")

    await asyncio.gather(skewed(), true())
    return woke, took[0]


async def test_a_drifting_clock_wakes_its_sleepers_by_its_own_rate() -> None:
    """10% fast: 110 of its seconds are 100 true ones, so it wakes before a true 105 s sleep."""
    woke, true = await _race(100_000.0)
    assert woke == ["local 110 s", "true 105 s"]
    assert true >= 100 * S - 1, true / S


async def test_its_twin_an_exact_clock_sleeps_its_110_true_seconds() -> None:
    woke, true = await _race(None)
    assert woke == ["true 105 s", "local 110 s"]
    assert true >= 110 * S, true / S
