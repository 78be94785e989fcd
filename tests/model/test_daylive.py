"""The live day plan's decisions (emulator/model/daylive.py): when night begins and ends on the
compressed plan clock, the night footprint, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from cmemu.emulator.model.daylive import Period, night_spec, plan_spec
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.training.spec import TrainingSpec

JOB = TrainingSpec(name="nightly", npus=2)


def _plan(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "",
        "deployment": "chat",
        "job": JOB,
        "night": "22-7",
        "hour_s": 60.0,
        "start_hour": 20.0,
        "hours": 0.0,
        "night_decode_npus": 0,
        **changes,
    }
    return plan_spec(**fields)


def test_the_plan_clock_runs_hour_s_emulated_seconds_an_hour_across_midnight() -> None:
    plan = _plan()
    assert plan.name == "chat"  # the deployment's
    assert plan.hour_at(0) == 20 and plan.hour_at(120) == 22
    assert not plan.is_night(21.9) and plan.is_night(22) and plan.is_night(24 + 6.9)
    assert not plan.is_night(24 + 7)
    assert plan.next_change(20) == 22 and plan.next_change(22) == 24 + 7
    assert plan.next_change(24 + 7) == 24 + 22
    assert plan.elapsed_ns(22) == 120 * 10**9


def test_a_plan_of_some_hours_ends_then() -> None:
    plan = _plan(hours=3)
    assert plan.next_change(22) == 23 and not plan.over(22.9) and plan.over(23)
    assert not _plan().over(10_000)  # 0: until stopped


def test_the_night_footprint_shrinks_the_decode_npus_only() -> None:
    day = yaml.safe_dump({"model": "deepseek-r1", "decode": {"npus": 4, "max_batch_per_die": 8},
                          "prefill": {"instances": 1, "npus": 2}})  # fmt: skip
    night = yaml.safe_load(night_spec(day, 2))
    assert night["decode"] == {"npus": 2, "max_batch_per_die": 8}
    assert night["prefill"] == {"instances": 1, "npus": 2}
    for npus in (4, 5):
        with pytest.raises(InvalidArgumentError) as err:
            night_spec(day, npus)
        assert err.value.field == "night_decode_npus"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"night": "25-7"}, "night"),
        ({"night": "7-7"}, "night"),
        ({"night": "dusk"}, "night"),
        ({"hour_s": 0.0}, "hour_s"),
        ({"hour_s": float("inf")}, "hour_s"),
        ({"start_hour": -1.0}, "start_hour"),
        ({"hours": -1.0}, "hours"),
        ({"deployment": "Chat!"}, "deployment"),
        ({"name": "x" * 60}, "name"),
        ({"job": TrainingSpec(name="chat", npus=2)}, "training.name"),
    ],
)
def test_bad_plans_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        _plan(**changes)
    assert err.value.field == field


def test_a_period_counts_from_its_start() -> None:
    period = Period(kind="night", start_ns=5, tokens_at_start=100, step_at_start=9)
    period.update(150, 12)
    assert (period.served_tokens, period.training_steps, period.end_ns) == (50, 3, 0)
    period.close(9, 160, 14)
    assert (period.served_tokens, period.training_steps, period.end_ns) == (60, 5, 9)
