"""The step model from first principles (issue 23 item 1): each roofline term dominates in its
regime, the two-microbatch overlap is what the schedule hides (never a constant), the fitted
figures are dimensionless efficiencies <= 1 or launch costs, listed with their source."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile, figures
from cmemu.emulator.model.overrides import apply_overrides, parse_override
from cmemu.emulator.model.serving import calibrate, cost
from cmemu.emulator.model.serving import kernels as k
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.operating import DecodeCurve

ROOT = Path(__file__).resolve().parents[3]
MODEL = get_model("deepseek-r1")
PEAKS = ("npu.peak_ops_per_s_per_die.INT8=1.504e15", "npu.peak_ops_per_s_per_die.BF16=708e12")


def _what_if(*sets: str) -> HardwareProfile:
    return apply_overrides(DEFAULT_PROFILE, [parse_override(s) for s in sets])


def _decode(batch: int, profile: HardwareProfile = DEFAULT_PROFILE, **kw: float) -> cost.StepTime:
    args: dict[str, object] = {
        "batch_per_die": batch,
        "kv_tokens": 4096,
        "mtp": True,
        "microbatches": 2,
        "imbalance": 1.0,
        "dies": 320,
        "ep": 320,
        "dispatch_s": 120e-6,
        "combine_s": 100e-6,
    }
    args.update(kw)
    return cost.decode_step(MODEL, profile=profile, **args)  # type: ignore[arg-type]


def _change(before: float, after: float) -> float:
    return after / before - 1


# --- each roofline term in its regime ------------------------------------------------------------


def test_a_tiny_batch_is_bound_by_weight_reads_and_launches() -> None:
    base = _decode(1)
    # its kernels move with HBM bandwidth (the weights' bytes) and not with the compute peak
    assert _change(base.compute_s, _decode(1, _what_if(*PEAKS)).compute_s) > -0.02
    fast_hbm = _decode(1, _what_if("npu.hbm_bytes_per_s_per_die=3.2e12"))
    assert _change(base.compute_s, fast_hbm.compute_s) == pytest.approx(-0.5, abs=0.02)
    # launches are a real share of its step, and they grow with the kernels launched
    assert base.fixed_s > 0.25 * base.total_s
    more = _what_if("serving.kernels_attention=12")
    assert _decode(1, more).fixed_s > base.fixed_s * 1.3


def test_a_big_batch_is_compute_bound() -> None:
    base = _decode(256)
    # the attention (128 heads over the compressed KV) and the experts outgrow the weight reads
    assert _change(base.compute_s, _decode(256, _what_if(*PEAKS)).compute_s) < -0.35
    fast_hbm = _decode(256, _what_if("npu.hbm_bytes_per_s_per_die=3.2e12"))
    assert _change(base.compute_s, fast_hbm.compute_s) > -0.15


def test_unused_expert_slots_read_no_weights() -> None:
    assert k.active_slots(10, 0) == 0
    assert k.active_slots(10, 1) == pytest.approx(1.0)
    assert 9.9 < k.active_slots(10, 100) <= 10
    # EP32 (10 slots a die): one request per die reads fewer expert weights than many do
    one = k.active_slots(10, 2 * 9)
    assert one < 9 and k.active_slots(10, 96 * 9) > 9.99


# --- the two-stream schedule ---------------------------------------------------------------------


def _layer(a: float, d: float, e: float, c: float, repeat: int = 1) -> k.Stage:
    return k.Stage(k.Op(a, 0.0), d, k.Op(e, 0.0), c, repeat=repeat)


def test_one_microbatch_runs_in_series() -> None:
    s = k.schedule([_layer(1, 2, 3, 4, repeat=5)], 1, launch_held=0.5)
    assert s.total_s == pytest.approx(5 * 10)
    assert s.kernels_s == 20 and s.comm_s == 30


def test_two_microbatches_hide_what_the_other_computes_and_no_more() -> None:
    # communication much shorter than compute: hidden whole, the compute stream sets the pace
    short = k.schedule([_layer(10, 1, 10, 1, repeat=20)], 2, launch_held=0.5)
    assert short.total_s == pytest.approx(20 * 40, rel=0.02)
    # communication much longer: the communication stream sets the pace, compute is what hides
    long = k.schedule([_layer(1, 10, 1, 10, repeat=20)], 2, launch_held=0.5)
    assert long.total_s == pytest.approx(20 * 40, rel=0.02)
    hidden_long = long.kernels_s + long.comm_s - long.total_s
    hidden_short = short.kernels_s + short.comm_s - short.total_s
    # the share of communication hidden shrinks when it exceeds compute
    assert hidden_short / short.comm_s > 0.95
    assert hidden_long / long.comm_s < 0.2


def test_a_repeated_layer_extrapolates_what_running_every_layer_gives() -> None:
    layer = k.Stage(k.Op(3.0, 1.0), 2.5, k.Op(2.0, 0.7), 1.5)
    many = k.schedule([dataclasses.replace(layer, repeat=40)], 2, launch_held=0.4)
    each = k.schedule([layer] * 40, 2, launch_held=0.4)
    assert many.total_s == pytest.approx(each.total_s, rel=1e-9)


def test_a_launch_held_by_the_cores_hides_less() -> None:
    layer = k.Stage(k.Op(3.0, 2.0), 1.0, k.Op(2.0, 2.0), 1.0, repeat=10)
    issue_only = k.schedule([layer], 2, launch_held=0.0).total_s
    held = k.schedule([layer], 2, launch_held=1.0).total_s
    assert held > issue_only
    assert held == pytest.approx(10 * 2 * (3 + 2 + 2 + 2), rel=0.05)  # the cores never rest


def test_two_microbatches_cost_weights_and_launches_when_there_is_nothing_to_hide() -> None:
    # the twin of the microbatch gain: with (almost) no communication, the second microbatch
    # only re-reads the weights and launches its kernels again
    two = _decode(48, microbatches=2, dispatch_s=1e-9, combine_s=1e-9)
    assert two.total_s > _decode(48, microbatches=1, dispatch_s=1e-9, combine_s=1e-9).total_s
    # with the collectives the fabric gives at the published point, two microbatches win
    moe = calibrate.fabric_moe()
    assert calibrate.decode_gain(DEFAULT_PROFILE, moe) > 0.05


def test_cluster_roce_costs_far_more_than_a_few_percent_at_the_published_batch() -> None:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())

    def curve(platform: str) -> DecodeCurve:
        d = parse_deployment({**doc, "platform": platform})
        return DecodeCurve(d, prompt_tokens=4096, output_tokens=256)

    ub, roce = curve("cm384"), curve("cluster-roce")
    # RDMA collectives outgrow the other microbatch's compute: their excess shows
    assert _change(ub.tpot_s(48), roce.tpot_s(48)) > 0.12
    step = roce.step(48)
    assert step.comm_s - step.hidden_s > 2 * (ub.step(48).comm_s - ub.step(48).hidden_s)


# --- the fitted figures -------------------------------------------------------------------------


def test_efficiencies_are_dimensionless_and_at_most_one() -> None:
    sources = {name: (value, src) for name, value, src in figures()}
    names = [n for n in sources if n.startswith("serving.") and ("efficiency" in n or "share" in n)]
    names += [n for n in sources if n.startswith("serving.") and "utilisation" in n]
    assert "serving.decode_compute_efficiency" in names and "serving.launch_core_share" in names
    for name in names:
        value, _ = sources[name]
        assert 0 < value <= 1, name
    for name in calibrate.FITTED:
        assert sources[f"serving.{name}"][1] == "fit"
    # the old constants are gone: no fitted overlap, no per-layer or per-step overhead
    assert not {"serving.microbatch_overlap", "serving.layer_overhead_s"} & set(sources)


def test_every_given_point_is_within_five_percent_and_the_predictions_are_reported() -> None:
    points = {p.name: p for p in calibrate.points()}
    for name in ("decode TPOT", "decode tokens/s per NPU", "decode layer without MTP"):
        error = points[name].error
        assert error is not None and abs(error) <= calibrate.GIVEN, name
    small = [p for p in points.values() if p.name.startswith("decode TPOT at ")]
    assert len(small) == len(DEFAULT_PROFILE.serving.decode_small_batch_rows) == 2
    assert not any(p.fitted for p in small)
    # a smaller batch: a shorter TPOT, as published (24 per NPU, then 8)
    assert points["decode TPOT"].model > small[0].model > small[1].model
    assert points["decode TPOT"].published > small[0].published > small[1].published  # type: ignore[operator]
