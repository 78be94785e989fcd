"""Sleeping in emulated time, and time that never outruns the emulator.

No assertion here is on wall-clock time: each compares emulated time with itself, or with a
stall the test forces, so a busy host can only make the inequalities hold more easily."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import structlog

from cmemu.emulator.engines.clock import ClockAuthority, ClockState, TimeKeeper, Timeline
from cmemu.emulator.engines.governor import Governor, fastest_rate
from cmemu.emulator.model.clock import Clock, Segment
from cmemu.emulator.model.emulatorprofile import ClockProfile

PROFILE = ClockProfile()


async def test_a_sleep_lasts_its_emulated_time_whatever_the_rate_does() -> None:
    clock = Clock(time_scale=1000.0)
    timeline = Timeline(clock)
    start = clock.now_ns()
    sleeper = asyncio.ensure_future(timeline.sleep(20.0))  # 20 ms of wall at x1000
    await asyncio.sleep(0.005)
    clock.set_rate(100.0)  # ten times slower from here
    timeline.changed()
    await sleeper
    assert clock.now_ns() - start >= 20 * 10**9  # never early


async def test_sleepers_wake_in_emulated_order_and_a_cancelled_one_is_dropped() -> None:
    """Each sleeper's instant is fixed before any starts: a sleep(n) taken from its own start
    would let a busy host (a task started milliseconds later, at x2000) reorder them."""
    timeline = Timeline(Clock(time_scale=2000.0))
    start_ns = timeline.now_ns()
    woke: list[int] = []

    async def sleeper(n: int) -> None:
        await timeline.sleep_until(start_ns + n * 10**9)
        woke.append(n)

    tasks = [asyncio.ensure_future(sleeper(n)) for n in (30, 10, 20)]
    gone = asyncio.ensure_future(timeline.sleep_until(start_ns + 15 * 10**9))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(*tasks)
    assert woke == [10, 20, 30]


async def test_a_wait_ends_on_its_event_or_at_its_emulated_instant() -> None:
    timeline = Timeline(Clock(time_scale=1000.0))
    event = asyncio.Event()
    assert not await timeline.wait(event, timeline.now_ns() + 5 * 10**9)
    event.set()
    assert await timeline.wait(event, timeline.now_ns() + 10**15)
    with pytest.raises(TimeoutError):
        await timeline.timeout(asyncio.Event().wait(), 5.0)


async def test_a_stall_of_the_loop_is_cut_out_of_emulated_time() -> None:
    """The owner's loop blocked for 0.3 s: emulated time advances by at most the horizon's
    worth, not the stall's (a busy host is not read as a silent device)."""
    clock = Clock(time_scale=100.0)
    keeper = TimeKeeper(clock, profile=PROFILE, process="test", owner=True)
    runner = asyncio.ensure_future(keeper.run())
    try:
        await asyncio.sleep(0.05)  # the governor holds the horizon
        before = clock.now_ns()
        time.sleep(0.3)  # noqa: ASYNC251 - the stall under test
        await asyncio.sleep(0.05)
        advanced_s = (clock.now_ns() - before) / 1e9
        assert clock.stalled_wall_s > 0
        # at most the horizon, two ticks and the 0.05 s sleeps (a loaded host adds stalls,
        # which are cut too): far below the stall's 30 emulated seconds
        limit = (PROFILE.horizon_s + 2 * PROFILE.tick_s + 0.1) * 100.0
        assert advanced_s <= limit < 0.3 * 100.0
    finally:
        runner.cancel()
        keeper.close()


async def first_wish_after_a_stall(time_scale: float) -> tuple[float, float]:
    """The owner's governor's first wish (rate, lag) made after its loop blocked for 0.4 s."""
    clock = Clock(time_scale=time_scale)
    wishes: list[tuple[float, float]] = []
    wished = asyncio.Event()

    def wish(rate: float, lag: float) -> None:
        wishes.append((rate, lag))
        wished.set()

    governor = Governor(clock, Timeline(clock), profile=PROFILE, owner=True, wish=wish)
    runner = asyncio.ensure_future(governor.run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.4)  # noqa: ASYNC251 - the stall under test
        seen = len(wishes)
        wished.clear()
        await wished.wait()  # the window holding the stall ends with a wish
        assert clock.stalled_wall_s > 0.2  # cut out of emulated time
        return wishes[seen]
    finally:
        runner.cancel()


async def test_a_stall_cut_out_of_emulated_time_does_not_slow_it_too() -> None:
    """The boot's second of blocked loop used to slow cm384's time to a seventh for the 5 s the
    rate took to climb back: emulated time never saw the cut part, so only the part before the
    horizon held time counts (under the budget at x1: the asked rate, however busy the host)."""
    rate, lag = await first_wish_after_a_stall(1.0)
    assert lag <= PROFILE.horizon_s < 0.4
    assert rate == 1.0


async def test_what_ran_of_a_stall_before_the_horizon_still_slows_a_fast_clock() -> None:
    """The twin: at x100 the horizon's 0.1 wall s ran at full rate (10 emulated s late), more
    than the lag budget, so the rate still falls for it."""
    rate, _ = await first_wish_after_a_stall(100.0)
    assert rate < 100.0 / 10


def test_the_rate_a_lagging_loop_can_keep() -> None:
    assert fastest_rate(PROFILE, 0.0, 100.0) == 100.0  # timer noise: the asked scale
    assert fastest_rate(PROFILE, 0.01, 100.0) == pytest.approx(PROFILE.lag_budget_s / 0.01)
    assert fastest_rate(PROFILE, 1e9, 100.0) == PROFILE.min_rate
    assert fastest_rate(PROFILE, 0.01, 2.0) == 2.0  # never above asked


async def test_the_slowest_fresh_wish_sets_the_rate_and_a_silent_process_is_forgotten() -> None:
    clock = Clock(time_scale=50.0)
    timeline = Timeline(clock)
    profile = ClockProfile(stale_s=0.2)
    authority = ClockAuthority(clock, timeline, profile=profile)
    authority.wish("n00", 50.0, 0.0)
    authority.wish("n01", 5.0, 0.02)
    assert clock.rate == 5.0 and authority.slowest == "n01"
    authority.wish("n01", 50.0, 0.0)  # keeps up again: the rate rises by steps
    assert 5.0 < clock.rate <= 5.0 * profile.raise_factor
    authority.wish("n01", 2.0, 0.05)
    await asyncio.sleep(0.3)  # n01 stops reporting (SIGSTOP): a fault, not a slow host
    authority.wish("n00", 50.0, 0.0)
    assert "n01" not in authority.wishes() and clock.rate > 2.0


class Direct:
    """The authority's stream in this process, as the fabric's SyncClock serves it."""

    def __init__(self, authority: ClockAuthority) -> None:
        self.authority = authority

    async def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]:
        async def read() -> None:
            async for rate, lag in wishes:
                self.authority.wish(process, rate, lag)

        reader = asyncio.ensure_future(read())
        try:
            async for state in self.authority.watch():
                yield state
        finally:
            reader.cancel()


async def test_a_follower_adopts_the_authority_segments_and_its_lag_slows_everyone() -> None:
    owner_clock = Clock(time_scale=20.0)
    owner = TimeKeeper(owner_clock, profile=PROFILE, process="fabric", owner=True)
    assert owner.authority is not None
    authority = owner.authority

    follower = TimeKeeper(
        Clock(time_scale=20.0, epoch_wall_s=owner_clock.epoch_wall_s - 100.0),  # a wrong epoch
        profile=PROFILE,
        process="n03",
        owner=False,
    )
    assert follower.follower is not None
    task = asyncio.ensure_future(follower.follower.run(Direct(authority)))
    try:
        await asyncio.wait_for(follower.follower.synced.wait(), 5.0)
        assert follower.clock.segment == owner_clock.segment
        follower.follower.wish(4.0, 0.025)  # this process lags
        for _ in range(100):
            await asyncio.sleep(0.01)
            if follower.clock.rate == 4.0:
                break
        assert owner_clock.rate == 4.0 and follower.clock.rate == 4.0
    finally:
        task.cancel()
        owner.close()
        follower.close()


async def test_a_follower_started_after_dilation_reads_the_owners_time_not_its_guess() -> None:
    """A process started late (a restarted container) knows the epoch and the time scale, and
    the owner's time is far behind their product (dilation cut 90 of 100 wall s at x20): once
    synced it reads the owner's time and sleeps on it, instead of standing still at its guess
    (2,000 emulated s) until the owner catches up."""
    epoch = time.time() - 100.0
    owner_clock = Clock(time_scale=20.0, epoch_wall_s=epoch)
    owner_clock.segment = Segment(wall_s=time.time(), emulated_ns=10 * 10**9, rate=20.0)
    owner = TimeKeeper(owner_clock, profile=PROFILE, process="fabric", owner=True)
    assert owner.authority is not None
    authority = owner.authority

    follower = TimeKeeper(
        Clock(time_scale=20.0, epoch_wall_s=epoch), profile=PROFILE, process="n03", owner=False
    )
    assert follower.follower is not None
    assert follower.clock.now_ns() == 0  # not synced: held, no guess given out
    task = asyncio.ensure_future(follower.follower.run(Direct(authority)))
    try:
        await asyncio.wait_for(follower.follower.synced.wait(), 30.0)
        read = follower.clock.now_ns()
        assert 10 * 10**9 <= read <= owner_clock.now_ns() < 1000 * 10**9
        await asyncio.wait_for(follower.timeline.sleep(0.5), 30.0)  # a bound: 25 ms at x20
    finally:
        task.cancel()
        owner.close()
        follower.close()


@pytest.mark.parametrize("stalls", [True, False])
async def test_a_follower_drops_a_silent_stream_and_follows_a_new_one(stalls: bool) -> None:
    """A partition can leave a stream open and dead: after follower_silence_s of silence the
    follower opens another (and the clock moves again), and says when the new one speaks (a
    follower that came back is not read as one that hung); a stream that speaks is kept."""
    profile = ClockProfile(lease_s=0.1, follower_silence_s=0.5 if stalls else 5.0)
    owner_clock = Clock(time_scale=20.0)
    owner = TimeKeeper(owner_clock, profile=profile, process="fabric", owner=True)
    assert owner.authority is not None
    authority = owner.authority
    opened: list[int] = []

    class Source:
        async def follow(
            self, process: str, wishes: AsyncIterator[tuple[float, float]]
        ) -> AsyncIterator[ClockState]:
            opened.append(len(opened))
            async for state in authority.watch():
                yield state
                if stalls and len(opened) == 1:
                    await asyncio.Event().wait()  # the first stream goes silent, never ends

    follower = TimeKeeper(Clock(time_scale=20.0), profile=profile, process="n03", owner=False)
    assert follower.follower is not None
    task = asyncio.ensure_future(follower.follower.run(Source()))
    try:
        with structlog.testing.capture_logs() as logs:
            await asyncio.wait_for(follower.follower.synced.wait(), 5.0)
            # a 0.5 s silence is long past after 10 s; a 5 s one cannot have been seen after 3 s
            for _ in range(1000 if stalls else 300):
                if any(e["event"] == "clock stream back" for e in logs):
                    break
                await asyncio.sleep(0.01)
        assert len(opened) == (2 if stalls else 1)
        said = [e["event"] for e in logs if e["event"].startswith("clock stream")]
        assert said == (
            ["clock stream silent; reconnecting", "clock stream back"] if stalls else []
        )
    finally:
        task.cancel()
        owner.close()
        follower.close()


async def test_without_dilation_time_is_wall_time_times_the_scale() -> None:
    clock = Clock(time_scale=10.0)
    keeper = TimeKeeper(clock, profile=ClockProfile(dilation=False), process="test", owner=True)
    runner = asyncio.ensure_future(keeper.run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # noqa: ASYNC251 - a stall no one cuts
        await asyncio.sleep(0.05)
        assert clock.stalled_wall_s == 0.0 and clock.rate == 10.0
    finally:
        runner.cancel()
        keeper.close()


def test_governor_is_owned_by_its_keeper() -> None:
    keeper = TimeKeeper(Clock(), profile=PROFILE, process="p", owner=False)
    assert isinstance(keeper.governor, Governor) and not keeper.governor.owner
