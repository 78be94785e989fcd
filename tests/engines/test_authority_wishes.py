"""The clock authority's bookkeeping of wishes, kept in constant time per report (the slowest
remembered, the stale found as a prefix of the oldest reports), decides exactly what a walk
over every wish decides: the slowest fresh wish sets the rate, and a process silent for
stale_s is forgotten, whatever the order of reports, rises, forgets and silences.

Time is the test's own (the authority's monotonic clock replaced), so no assertion depends on
how busy the host is."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmemu.emulator.engines import clock as clock_module
from cmemu.emulator.engines.clock import ClockAuthority, Timeline
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.emulatorprofile import ClockProfile

ASKED = 50.0
PROFILE = ClockProfile(stale_s=3.0)
PROCESSES = [f"n{i:02d}" for i in range(5)]

# (process, rate or None to forget it, wall seconds passed before)
steps = st.lists(
    st.tuples(
        st.sampled_from(PROCESSES),
        st.one_of(st.none(), st.sampled_from([0.5, 5.0, 20.0, ASKED, 80.0])),
        st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 4.0]),
    ),
    max_size=40,
)


def reference(reports: dict[str, tuple[float, float]], now: float) -> tuple[str, float] | None:
    """The walk: the fresh reports' slowest (process, rate), or None."""
    fresh = {p: r for p, (r, at) in reports.items() if at >= now - PROFILE.stale_s}
    if not fresh:
        return None
    slowest = min(fresh.values())
    return next((p, r) for p, r in fresh.items() if r == slowest)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_the_slowest_fresh_wish_and_the_silent_are_those_a_walk_finds(
    script: list[tuple[str, float | None, float]],
) -> None:
    now = [1000.0]
    patched = pytest.MonkeyPatch()
    patched.setattr(clock_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    try:

        async def run() -> None:
            clock = Clock(time_scale=ASKED)
            authority = ClockAuthority(clock, Timeline(clock), profile=PROFILE)
            reports: dict[str, tuple[float, float]] = {}
            for process, rate, passed in script:
                now[0] += passed
                if rate is None:
                    authority.forget(process)
                    reports.pop(process, None)
                else:
                    authority.wish(process, rate, 0.0)
                    reports[process] = (rate, now[0])
                before = clock.rate
                expected = reference(reports, now[0])
                assert set(authority.wishes()) == {
                    p for p, (_, at) in reports.items() if at >= now[0] - PROFILE.stale_s
                }
                if expected is None or expected[1] >= ASKED:
                    assert authority.slowest == ""
                else:  # named: a process whose fresh wish is the slowest (ties: any of them)
                    assert reports[authority.slowest][0] == expected[1]
                    assert clock.rate <= expected[1]  # never faster than the slowest keeps
                    if expected[1] < before:
                        assert clock.rate == expected[1]  # and it falls to it at once

        asyncio.run(run())
    finally:
        patched.undo()
