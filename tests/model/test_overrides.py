"""What-if overrides of the hardware profile: a named figure is replaced (in its type), the rest is
untouched, the result lists what changed; unknown names and bad values are refused by name."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.overrides import apply_overrides, changed, parse_override
from cmemu.emulator.model.provenance import GiB
from cmemu.emulator.model.serving.deployment import parse_deployment, profile_of


def test_a_figure_is_replaced_and_only_it() -> None:
    p = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_s_per_die": 3.2e12})
    assert p.npu.hbm_bytes_per_s_per_die == 3.2e12
    assert DEFAULT_PROFILE.npu.hbm_bytes_per_s_per_die == 1.6e12  # the default is not touched
    assert p.npu.hbm_bytes_per_die == DEFAULT_PROFILE.npu.hbm_bytes_per_die
    assert changed(p) == {"npu.hbm_bytes_per_s_per_die": 3.2e12}
    assert changed(DEFAULT_PROFILE) == {}


def test_counts_stay_whole_and_table_entries_are_named() -> None:
    p = apply_overrides(
        DEFAULT_PROFILE,
        [("npu.hbm_bytes_per_die", "16e9"), ("npu.peak_ops_per_s_per_die.INT8", 1.5e15)],
    )
    assert p.npu.hbm_bytes_per_die == 16 * 10**9 and isinstance(p.npu.hbm_bytes_per_die, int)
    assert p.npu.peak_ops_per_s_per_die["INT8"] == 1.5e15
    assert (
        p.npu.peak_ops_per_s_per_die["BF16"] == DEFAULT_PROFILE.npu.peak_ops_per_s_per_die["BF16"]
    )
    assert changed(p) == {
        "npu.hbm_bytes_per_die": 16 * 10**9,
        "npu.peak_ops_per_s_per_die.INT8": 1.5e15,
    }


def test_the_later_override_wins() -> None:
    p = apply_overrides(
        DEFAULT_PROFILE, [("switch.port_bytes_per_s", 1e9), ("switch.port_bytes_per_s", 2e9)]
    )
    assert p.switch.port_bytes_per_s == 2e9


def test_parse_override() -> None:
    assert parse_override("npu.hbm_bytes_per_s_per_die=3.2e12") == (
        "npu.hbm_bytes_per_s_per_die",
        3.2e12,
    )
    assert parse_override(" ub.achieved_bytes_per_s_per_die = 40e9 ") == (
        "ub.achieved_bytes_per_s_per_die",
        40e9,
    )
    with pytest.raises(InvalidArgumentError, match="expected FIGURE=VALUE"):
        parse_override("npu.dies")
    with pytest.raises(InvalidArgumentError, match="expected FIGURE=VALUE"):
        parse_override("=3")


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        ("gpu.hbm", 1.0, UnknownNameError, "unknown hardware section 'gpu'; known: clock, cpu"),
        ("npu.hbm", 1.0, UnknownNameError, "known: cube_cores_per_die, die_to_die_bytes_per_s"),
        ("npu.peak_ops_per_s_per_die.FP8", 1.0, UnknownNameError, "peak_ops_per_s_per_die.INT8"),
        ("npu", 1.0, UnknownNameError, "unknown numeric figure of npu ''"),
        ("clock.dilation", 1.0, UnknownNameError, "numeric figure of clock 'dilation'"),
        ("training.default_model", 1.0, UnknownNameError, "figure of training"),
        ("npu.hbm_bytes_per_s_per_die", "fast", InvalidArgumentError, "'fast' is not a number"),
        ("npu.hbm_bytes_per_s_per_die", True, InvalidArgumentError, "True is not a number"),
        ("npu.hbm_bytes_per_s_per_die", 0, InvalidArgumentError, "finite number > 0, got 0"),
        ("npu.hbm_bytes_per_die", -64, InvalidArgumentError, "finite number > 0, got -64"),
        ("npu.hbm_bytes_per_die", "inf", InvalidArgumentError, "finite number > 0"),
        ("npu.hbm_bytes_per_die", "nan", InvalidArgumentError, "finite number > 0"),
        ("npu.dies", 1.5, InvalidArgumentError, "npu.dies is a whole number, got 1.5"),
        (
            "serving.decode_compute_efficiency",
            1.2,
            InvalidArgumentError,
            "serving.decode_compute_efficiency is dimensionless and at most 1, got 1.2",
        ),
        ("scaleout.efficiency", 2, InvalidArgumentError, "dimensionless and at most 1"),
        ("serving.launch_core_share", 1.5, InvalidArgumentError, "at most 1, got 1.5"),
    ],
)
def test_bad_overrides_are_refused_by_name(
    name: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(".", r"\.")):
        apply_overrides(DEFAULT_PROFILE, {name: value})


def test_a_deployment_file_overrides_flat_or_nested() -> None:
    flat = parse_deployment({"hardware": {"npu.hbm_bytes_per_die": "32e9"}})
    nested = parse_deployment({"hardware": {"npu": {"hbm_bytes_per_die": 32e9}}})
    assert flat.hardware == nested.hardware == {"npu.hbm_bytes_per_die": 32e9}
    assert profile_of(flat).npu.hbm_bytes_per_die == 32 * 10**9
    assert profile_of(parse_deployment({})) is DEFAULT_PROFILE
    with pytest.raises(UnknownNameError, match="unknown hardware section 'gpu'"):
        parse_deployment({"hardware": {"gpu": {"hbm": 1}}})
    with pytest.raises(InvalidArgumentError, match="hardware must be a mapping"):
        parse_deployment({"hardware": [1, 2]})
    # the deployment is checked on the hardware it names: 1 die per NPU makes EP320 too big
    with pytest.raises(InvalidArgumentError, match=r"decode\.ep must be 2\.\.160"):
        parse_deployment({"decode": {"ep": 320}, "hardware": {"npu.dies": 1}})
    assert 64 * GiB == DEFAULT_PROFILE.npu.hbm_bytes_per_die


def test_an_efficiency_of_one_is_a_what_if() -> None:
    # the twin of the refusals above: the bound itself is allowed, and a rate is not bounded
    p = apply_overrides(
        DEFAULT_PROFILE,
        {"serving.decode_compute_efficiency": 1, "ub.cross_node_bandwidth_loss": 0.5},
    )
    assert p.serving.decode_compute_efficiency == 1.0
    assert (
        apply_overrides(DEFAULT_PROFILE, {"serving.kernel_launch_s": 2}).serving.kernel_launch_s
        == 2
    )
