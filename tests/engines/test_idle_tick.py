"""A follower whose loop idles ticks every `idle_tick_s`, not every `tick_s`: the 100 Hz tick was
most of an idle device process's CPU. It ticks finely again after a window in which it spent
CPU or ran late, and the owner of time always ticks finely (its tick moves the horizon).

No assertion here is on wall-clock time: each test sets apart the rule it does not check (an
unbounded CPU share, or a lag budget no stall reaches, never decides), and the rule it checks
is given far more evidence than it needs (most of a core burnt; a 0.3 s stall at x100 against
a 1 ms budget), which a busy host can only add to."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.governor import Governor, LagWindow
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.emulatorprofile import ClockProfile

FAST = ClockProfile(window_s=0.05)  # windows short enough for a test
NO_LAG_RULE = dataclasses.replace(FAST, lag_budget_s=1e9)  # any lateness keeps the asked rate
NO_CPU_RULE = dataclasses.replace(FAST, idle_cpu_share=math.inf)  # any CPU share is idle
NEITHER = dataclasses.replace(NO_LAG_RULE, idle_cpu_share=math.inf)


async def windows(
    governor: Governor, count: int, during: asyncio.Future[None] | None = None
) -> None:
    """Run `governor` until it has wished `count` times (its windows ended), then stop it."""
    wished = 0
    done = asyncio.Event()
    wish = governor.wish

    def counted(rate: float, lag_s: float) -> None:
        nonlocal wished
        wish(rate, lag_s)
        wished += 1
        if wished >= count:
            done.set()

    governor.wish = counted
    runner = asyncio.ensure_future(governor.run())
    try:
        await done.wait()
    finally:
        runner.cancel()
        if during is not None:
            during.cancel()


def governor(profile: ClockProfile, *, owner: bool, time_scale: float = 1.0) -> Governor:
    clock = Clock(time_scale=time_scale)
    return Governor(clock, Timeline(clock), profile=profile, owner=owner, wish=lambda r, lag: None)


@pytest.mark.parametrize("owner", [False, True])
async def test_an_idle_follower_ticks_slowly_and_the_owner_of_time_finely(owner: bool) -> None:
    """Both rules set apart (no evidence of work, whatever the host does): who owns time
    decides; the two tests below bring the fine tick back by each rule alone."""
    idle = governor(NEITHER, owner=owner)
    assert idle.ticking_s == FAST.tick_s  # the first window is measured finely
    await windows(idle, 2)
    assert idle.ticking_s == (FAST.tick_s if owner else FAST.idle_tick_s)


async def test_a_follower_that_spends_cpu_ticks_finely_again() -> None:
    """The CPU rule alone (the lag rule set apart): a loop burning most of a core, in slices
    of 5 ms, shows far more than idle_cpu_share of it in any window, however busy the host."""
    busy = governor(NO_LAG_RULE, owner=False)
    busy.ticking_s = FAST.idle_tick_s  # it was idle

    async def burn() -> None:
        while True:
            ends = time.process_time() + 0.005
            while time.process_time() < ends:
                pass
            await asyncio.sleep(0)

    await windows(busy, 1, during=asyncio.ensure_future(burn()))
    assert busy.ticking_s == FAST.tick_s


async def test_a_follower_whose_loop_runs_late_ticks_finely_again() -> None:
    """The lag rule alone (the CPU rule set apart): at x100 a loop blocked 0.3 s (a sleep,
    no CPU) is later than the lag budget allows at the asked rate, wherever the stall falls
    among the slow ticks (it outlasts one)."""
    late = governor(NO_CPU_RULE, owner=False, time_scale=100.0)
    late.ticking_s = FAST.idle_tick_s

    async def stall() -> None:
        await asyncio.sleep(0.01)
        time.sleep(0.3)  # noqa: ASYNC251 - the stall under test

    await windows(late, 1, during=asyncio.ensure_future(stall()))
    assert late.ticking_s == FAST.tick_s


@given(st.lists(st.floats(min_value=0.0, max_value=10.0), max_size=60))
def test_a_window_of_fine_ticks_takes_the_quantile_it_always_took(lags: list[float]) -> None:
    """Each fine tick weighs one: the quantile is the plain one over the ticks, as before."""
    window = LagWindow()
    for lag in lags:
        window.add(lag)
    ordered = sorted(lags)
    expected = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if lags else 0.0
    assert window.quantile(0.9) == expected


@pytest.mark.parametrize("weighted", [True, False])
def test_a_lone_spike_after_a_slow_tick_on_time_is_dropped_as_among_fine_ones(
    weighted: bool,
) -> None:
    """A paused container resumed (its tick back 3 s late) after one slow tick on time: ten
    fine ticks on time and one late drop the spike from the 0.9 quantile, and so does the slow
    tick standing for its ten. The twin: unweighted, the two ticks' 0.9 quantile is the spike,
    which aborted the container storm's runs (a process 63 emulated s late)."""
    window = LagWindow()
    window.add(0.0004, round(FAST.idle_tick_s / FAST.tick_s) if weighted else 1)
    window.add(3.0, 1)
    assert (window.quantile(FAST.lag_quantile) < 0.001) is weighted
