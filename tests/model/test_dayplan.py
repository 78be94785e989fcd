"""Serve by day, train by night, in model mode (emulator/model/dayplan.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from cmemu.emulator.model.dayplan import DAY_S, DayParams, demand, simulate_day
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.overrides import apply_overrides, parse_override
from cmemu.emulator.testing import run_cmemu

# cm-mini: 16 NPUs in units of 8; 1,202 tokens/s per NPU is deepseek-r1's operating point at
# 50 ms spread over its decode and prefill NPUs
DAY = DayParams(peak_tokens_per_s=15_000, tokens_per_s_per_npu=1202, drain_s=12.8, unit_npus=8)


def test_demand_peaks_at_its_hour_and_bottoms_twelve_hours_away() -> None:
    assert demand(14 * 3600, DAY) == pytest.approx(15_000)
    assert demand(2 * 3600, DAY) == pytest.approx(3_000)
    assert demand(0, DAY) == pytest.approx(demand(DAY_S, DAY))


def test_serving_all_day_trains_nothing_and_serves_everything_it_can() -> None:
    day = simulate_day(dataclasses.replace(DAY, policy="serve-only"), preset="cm-mini")
    assert day.training_steps == 0 and not day.switches
    assert day.served_fraction == pytest.approx(1.0)


@pytest.mark.parametrize("policy", ["load", "calendar"])
def test_a_policy_trains_in_the_trough_and_serves_the_peak(policy: str) -> None:
    day = simulate_day(dataclasses.replace(DAY, policy=policy), preset="cm-mini")
    assert day.training_steps > 100 and day.training_tokens > 0
    assert {s.to for s in day.switches} == {"training", "serving"}
    # the weights' load from EMS is paid before the peak: nothing the demand wanted is lost
    assert day.served_fraction > 0.999
    peak = day.hours[14]
    assert peak.serving_npus == pytest.approx(16) and peak.training_npus == 0
    if policy == "calendar":  # training only inside the night window (22-7)
        assert all(h.training_npus == 0 for h in day.hours[8:21])


def test_demand_beyond_the_machine_is_unserved_whatever_the_policy() -> None:
    for policy in ("serve-only", "load"):
        day = simulate_day(
            dataclasses.replace(DAY, policy=policy, peak_tokens_per_s=40_000), preset="cm-mini"
        )
        assert day.served_fraction < 0.9  # 16 x 1,202 = 19,232 tokens/s at most


def test_a_slower_weight_load_keeps_more_npus_serving() -> None:
    slow = apply_overrides(DEFAULT_PROFILE, [parse_override("serving.cache_from_ems_s=3200")])
    fast = simulate_day(DAY, preset="cm-mini")
    slowed = simulate_day(DAY, preset="cm-mini", profile=slow)
    assert slowed.training_npu_hours < fast.training_npu_hours
    assert max(s.duration_s for s in slowed.switches) > max(s.duration_s for s in fast.switches)


def test_a_faster_npu_at_the_slo_frees_more_npus_to_train() -> None:
    fast = simulate_day(dataclasses.replace(DAY, tokens_per_s_per_npu=2 * 1202), preset="cm-mini")
    assert fast.training_npu_hours > simulate_day(DAY, preset="cm-mini").training_npu_hours


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"policy": "night-shift"}, "policy"),
        ({"unit_npus": 5}, "unit_npus"),
        ({"trough_fraction": 1.5}, "trough_fraction"),
        ({"peak_tokens_per_s": 0.0}, "peak_tokens_per_s"),
    ],
)
def test_bad_parameters_are_refused_naming_them(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        simulate_day(dataclasses.replace(DAY, **changes), preset="cm-mini")  # type: ignore[arg-type]
    assert err.value.field == field


def _cmemu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cmemu("simulate", "day", *args)


FILES = (
    "--deployment", "examples/deployments/deepseek-r1.yaml",
    "--workload", "examples/workloads/decode-4096-256.yaml",
)  # fmt: skip


def test_the_cli_prints_the_day_beside_serving_all_day() -> None:
    done = _cmemu(*FILES, "--peak", "300000", "--policy", "calendar", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["day"]["policy"] == "calendar" and doc["day"]["npus"] == 384
    assert doc["day"]["training_steps"] > 0 and doc["serve_only"]["training_steps"] == 0
    assert doc["day"]["served_fraction"] == pytest.approx(1.0)
    text = _cmemu(*FILES, "--peak", "300000", "--policy", "calendar")
    assert "policy calendar:" in text.stdout and "serving all day:" in text.stdout


@pytest.mark.parametrize("bad", [["--night", "25-7"], ["--night", "tonight"], ["--peak", "x"]])
def test_the_cli_refuses_bad_input_with_a_message(bad: list[str]) -> None:
    args = [*FILES, "--peak", "300000", *bad] if bad[0] != "--peak" else [*FILES, *bad]
    done = _cmemu(*args)
    assert done.returncode == 2 and bad[0] in done.stderr
