"""The serving cost model reproduces HARDWARE.md's serving points: each within its stated
tolerance (a model property, not a timing), and the fitted parameters in the profile are what
fitting gives."""

from __future__ import annotations

import pytest

from emulator.model.hardware import DEFAULT_PROFILE, figures
from emulator.model.serving import calibrate

FITTED = calibrate.FITTED


def test_every_serving_point_is_within_its_tolerance() -> None:
    points = calibrate.points()
    names = {p.name for p in points}
    assert {"decode TPOT", "decode tokens/s per NPU", "prefill tokens/s per NPU"} <= names
    bad = [(p.name, f"{p.error:+.1%}", p.tolerance) for p in points if not p.ok]
    assert not bad
    # the predicted points (not fitted) are checked too, with wider tolerances
    assert any(not p.fitted for p in points)


def test_the_published_decode_point() -> None:
    step = calibrate.decode_step(DEFAULT_PROFILE, calibrate.fabric_moe())
    tpot = calibrate.tpot_s(step, DEFAULT_PROFILE)
    # predicted by the structure, not fitted: within 5%
    assert tpot == pytest.approx(49.4e-3, rel=calibrate.GIVEN)
    assert 96 / tpot == pytest.approx(1943, rel=calibrate.GIVEN)


def test_refitting_gives_the_profile_values() -> None:
    fitted = calibrate.fit()
    for name in FITTED:
        assert getattr(fitted, name) == pytest.approx(
            getattr(DEFAULT_PROFILE.serving, name), rel=0.01
        ), name


def test_fitted_parameters_are_listed_with_their_source() -> None:
    sources = {name: src for name, _, src in figures()}
    for name in FITTED:
        assert sources[f"serving.{name}"] == "fit"
    assert sources["serving.decode_tpot_s"] == "pub"
