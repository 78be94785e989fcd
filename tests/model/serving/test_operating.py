"""SLO-driven operating points: the largest decode batch per die within the HBM bound whose TPOT
meets a target; the published row comes out at 50 ms; a target no batch meets is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.overrides import apply_overrides
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.operating import (
    DecodeCurve,
    OperatingPoint,
    operating_point,
    point_on,
)

ROOT = Path(__file__).resolve().parents[3]


def _point(
    d: Deployment, target_s: float, profile: HardwareProfile = DEFAULT_PROFILE
) -> OperatingPoint:
    return operating_point(d, target_s, prompt_tokens=4096, output_tokens=256, profile=profile)


def _published() -> Deployment:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    return parse_deployment(doc)


def test_the_published_row_at_50_ms() -> None:
    point = _point(_published(), 0.050)
    assert point.tpot_s <= 0.050
    # 96 per NPU (48 per die) published; the step model predicts the TPOT within 5% (calibrate)
    assert abs(point.batch_per_die - 48) <= 2
    # 1,943 tokens/s per NPU at 49.4 ms published (the row's context is 4,096; ours 4,224 mean)
    assert point.tokens_per_s_per_npu == pytest.approx(1943, rel=0.05)
    curve = DecodeCurve(_published(), prompt_tokens=4096, output_tokens=256)
    assert curve.tpot_s(point.batch_per_die + 1) > 0.050  # the next batch misses it


def test_a_tighter_target_takes_a_smaller_batch() -> None:
    at50 = _point(_published(), 0.050)
    at30 = _point(_published(), 0.030)
    assert at30.batch_per_die < at50.batch_per_die / 2
    assert at30.tpot_s <= 0.030
    assert at30.tokens_per_s_per_npu < at50.tokens_per_s_per_npu * 0.7


def test_the_target_picks_the_microbatches_too() -> None:
    """Two microbatches hide the collectives at 50 ms; at 30 ms the batch is small and one is
    faster (a second re-reads every weight): the point takes the faster, the twin of each
    forced to the other count carries fewer tokens at the same target."""
    for target, best in ((0.050, 2), (0.030, 1)):
        point = _point(_published(), target)
        assert point.microbatches == best and point.tpot_s <= target
        d = _published()
        forced = dataclasses.replace(d, decode=dataclasses.replace(d.decode, microbatches=3 - best))
        curve = DecodeCurve(forced, prompt_tokens=4096, output_tokens=256)
        other = point_on(curve, target)
        assert other.microbatches == 3 - best
        assert other.tokens_per_s_per_npu < point.tokens_per_s_per_npu * 0.97


def test_a_target_no_batch_meets_is_refused_with_the_lowest_tpot() -> None:
    with pytest.raises(PreconditionError, match=r"no batch meets TPOT 15 ms: the lowest, at 1 "):
        _point(_published(), 0.015)


def test_the_hbm_bound_caps_a_loose_target() -> None:
    loose = _point(_published(), 10.0)
    assert loose.batch_per_die == loose.hbm_batch_per_die > 48
    smaller = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_die": 51.5e9})
    capped = _point(_published(), 10.0, smaller)
    assert capped.batch_per_die == capped.hbm_batch_per_die < loose.batch_per_die * 0.75


def test_a_layout_whose_weights_overflow_has_no_operating_point() -> None:
    doc = yaml.safe_load((ROOT / "examples/deployments/small.yaml").read_text())
    with pytest.raises(InvalidArgumentError, match="a decode die's weights"):
        _point(parse_deployment(doc), 0.050)
