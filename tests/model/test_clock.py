from __future__ import annotations

import pytest

from emulator.model.clock import Clock
from emulator.model.errors import InvalidArgumentError


def test_emulated_time_is_scaled_wall_time() -> None:
    wall = [100.0]
    clock = Clock(time_scale=600.0, epoch_wall_s=100.0, wall=lambda: wall[0])
    assert clock.now_ns() == 0
    wall[0] = 101.0  # one wall second is ten emulated minutes
    assert clock.now_ns() == 600 * 10**9
    assert clock.wall_at(600 * 10**9) == pytest.approx(101.0)  # when emulated time gets there


def test_two_clocks_with_one_epoch_agree() -> None:
    a = Clock(time_scale=2.0, epoch_wall_s=50.0, wall=lambda: 60.0)
    b = Clock(time_scale=2.0, epoch_wall_s=50.0, wall=lambda: 60.0)
    assert a.now_ns() == b.now_ns() == 20 * 10**9


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_time_scale_must_be_positive(scale: float) -> None:
    with pytest.raises(InvalidArgumentError):
        Clock(time_scale=scale)
