"""The serving cost model reproduces HARDWARE.md's serving points: each within its stated
tolerance (a model property, not a timing), and the fitted parameters in the profile are what
fitting gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, figures
from cmemu.emulator.model.serving import calibrate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.multiturn import turn_gain
from cmemu.emulator.model.serving.workload import read_mooncake

ROOT = Path(__file__).resolve().parents[3]

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


def test_a_balanced_expert_load_makes_prefill_faster_as_the_paper_reports() -> None:
    point = calibrate.eplb_point(DEFAULT_PROFILE, calibrate.fabric_moe())
    assert point.published == pytest.approx(6688 / 5655 - 1)
    assert point.published is not None and not point.fitted
    # predicted, in the published direction, by a non-trivial amount
    assert 0.03 < point.model < point.published


def test_without_a_skewed_expert_load_balancing_gains_nothing() -> None:
    # the twin: the gain comes from the placement's imbalance, nothing else
    serving = dataclasses.replace(DEFAULT_PROFILE.serving, expert_load_zipf=0.0)
    uniform = dataclasses.replace(DEFAULT_PROFILE, serving=serving)
    gain = calibrate.eplb_gain(uniform, calibrate.fabric_moe(uniform))
    assert gain == pytest.approx(0.0, abs=0.005)


def _trace(rows: int) -> list[Request]:
    lines = (ROOT / "workloads/mooncake-synthetic.jsonl").read_text().splitlines()[:rows]
    return read_mooncake(lines, block_tokens=DEFAULT_PROFILE.serving.block_tokens)


def test_ems_shortens_the_later_turns_of_the_mooncake_conversations() -> None:
    moe = calibrate.fabric_moe()
    gain = turn_gain(_trace(1000), get_model("deepseek-r1"), moe, DEFAULT_PROFILE)
    assert gain.later_turns > 10 and gain.cached_share > 0.5
    assert gain.gain > 2  # most of a later turn's prompt is loaded, not prefilled
    point = calibrate.multi_turn_point(DEFAULT_PROFILE, moe, _trace(1000))
    assert point.published is None and point.error is None and point.ok
    assert point.model == pytest.approx(gain.gain)


def test_a_slower_pool_read_shrinks_the_multi_turn_gain() -> None:
    # the twin: the gain is what loading costs against prefilling, so a pool read 100x slower
    # (the UB bandwidth into a die) gives less of it
    slow = dataclasses.replace(
        DEFAULT_PROFILE,
        ub=dataclasses.replace(
            DEFAULT_PROFILE.ub,
            cpu_memory_read_bytes_per_s=DEFAULT_PROFILE.ub.cpu_memory_read_bytes_per_s / 100,
        ),
    )
    model = get_model("deepseek-r1")
    fast = turn_gain(_trace(1000), model, calibrate.fabric_moe(), DEFAULT_PROFILE)
    slower = turn_gain(_trace(1000), model, calibrate.fabric_moe(), slow)
    assert slower.gain < fast.gain * 0.8


def test_a_trace_without_turns_is_refused() -> None:
    one = [r for r in _trace(3)][:1]
    with pytest.raises(InvalidArgumentError, match="not a multi-turn trace"):
        turn_gain(one, get_model("deepseek-r1"), calibrate.fabric_moe(), DEFAULT_PROFILE)
