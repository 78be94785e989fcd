"""The piecewise clock: scaled wall time, a rate that changes without a jump, a horizon that
holds time while its owner cannot move it, and stalls cut out of emulated time."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.clock import Clock, Segment
from cmemu.emulator.model.errors import InvalidArgumentError


class Wall:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_emulated_time_is_scaled_wall_time() -> None:
    wall = Wall(100.0)
    clock = Clock(time_scale=600.0, epoch_wall_s=100.0, wall=wall)
    assert clock.now_ns() == 0
    wall.t = 101.0  # one wall second is ten emulated minutes
    assert clock.now_ns() == 600 * 10**9
    assert clock.wall_at(1200 * 10**9) == pytest.approx(102.0)  # when emulated time gets there


def test_two_clocks_with_one_epoch_agree() -> None:
    a = Clock(time_scale=2.0, epoch_wall_s=50.0, wall=lambda: 60.0)
    b = Clock(time_scale=2.0, epoch_wall_s=50.0, wall=lambda: 60.0)
    assert a.now_ns() == b.now_ns() == 20 * 10**9


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_time_scale_must_be_positive_and_finite(scale: float) -> None:
    with pytest.raises(InvalidArgumentError):
        Clock(time_scale=scale)


def test_a_new_rate_continues_from_the_present_and_never_exceeds_the_asked_scale() -> None:
    wall = Wall(0.0)
    clock = Clock(time_scale=10.0, epoch_wall_s=0.0, wall=wall)
    wall.t = 2.0
    assert clock.now_ns() == 20 * 10**9
    clock.set_rate(1.0)
    assert clock.now_ns() == 20 * 10**9  # no jump
    wall.t = 3.0
    assert clock.now_ns() == 21 * 10**9
    clock.set_rate(50.0)  # a ceiling: asked 10
    assert clock.rate == 10.0
    assert clock.achieved_scale() == pytest.approx(21 / 3)


def test_a_horizon_holds_time_and_a_stall_beyond_it_is_cut_out() -> None:
    wall = Wall(0.0)
    clock = Clock(time_scale=100.0, epoch_wall_s=0.0, wall=wall)
    clock.hold_until(1.0)
    wall.t = 5.0  # the owner of time stalled for 4 s past its horizon
    assert clock.now_ns() == 100 * 10**9  # time stood at the horizon
    cut = clock.resume(horizon_wall_s=5.1)
    assert cut == pytest.approx(4.0)
    assert clock.now_ns() == 100 * 10**9  # resumed where it stood, no jump
    wall.t = 5.05
    assert clock.now_ns() == 105 * 10**9
    assert clock.longest_stall_wall_s == pytest.approx(4.0)
    assert clock.resume(horizon_wall_s=5.2) == 0.0  # no stall: nothing cut


def test_an_adopted_segment_that_reads_earlier_is_held_never_backwards() -> None:
    wall = Wall(10.0)
    clock = Clock(time_scale=10.0, epoch_wall_s=0.0, wall=wall)
    assert clock.now_ns() == 100 * 10**9
    # the owner cut a stall: its segment reads 90 s at wall 10
    clock.adopt(Segment(wall_s=10.0, emulated_ns=90 * 10**9, rate=10.0), horizon_wall_s=20.0)
    assert clock.now_ns() == 100 * 10**9  # held
    wall.t = 11.5
    assert clock.now_ns() == 105 * 10**9  # caught up, and on
    wall.t = 30.0
    assert clock.now_ns() == 190 * 10**9  # held at the lease's horizon (wall 20)


@pytest.mark.parametrize("wall_s", [5.0, 9.999, 10.0, 10.5, 12.0, 20.0, 25.0])
@pytest.mark.parametrize("floor_ns", [0, 30 * 10**9])
def test_a_reading_is_its_segment_at_the_held_wall_instant_never_below_the_floor(
    wall_s: float, floor_ns: int
) -> None:
    """now_ns inlines Segment.at with comparisons: it reads what the segment says at the wall
    instant (cut at the horizon; before the segment's start, its start), raised to the floor."""
    wall = Wall(wall_s)
    clock = Clock(time_scale=3.0, epoch_wall_s=0.0, wall=wall)
    segment = Segment(wall_s=10.0, emulated_ns=25 * 10**9, rate=2.0)
    clock.segment, clock.horizon_wall_s, clock.floor_ns = segment, 20.0, floor_ns
    expected = max(segment.at(min(wall_s, 20.0)), floor_ns)
    assert clock.now_ns() == expected
    # the twin: without the horizon's cut, a reading past it would run on
    if wall_s > 20.0:
        assert segment.at(wall_s) > expected
