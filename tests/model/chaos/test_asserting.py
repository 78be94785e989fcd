"""Per-fault bounds in one line (issue 20, item 8): `result.fault(name).recovered_within(bound)`
returns the slowest recovery when every fault the name picks recovered in time, and otherwise
fails with an AssertionError naming the fault and what happened to it."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.chaos.asserting import pick
from cmemu.emulator.model.chaos.observed import Injection
from cmemu.emulator.model.chaos.recovery import NEVER_DETECTED, Recovery
from cmemu.emulator.model.errors import InvalidArgumentError

S = 1_000_000_000


def _rec(label: str, kind: str, at_s: float, restored_s: float | None, **kw: object) -> Recovery:
    injection = Injection(
        label=label, kind=kind, target="n00-npu3", devices=("n00-npu3",), at_ns=int(at_s * S)
    )
    detected = kw.pop("detected_s", None if restored_s is None else at_s + 5)
    return Recovery(
        injection=injection,
        incidents=(),
        workloads=(),
        detected_ns=None if detected is None else int(float(str(detected)) * S),
        isolated_ns=None if detected is None else int((float(str(detected)) + 1) * S),
        replaced_ns=None,
        restored_ns=None if restored_s is None else int(restored_s * S),
        status=str(kw.pop("status", "recovered" if restored_s is not None else NEVER_DETECTED)),
    )


RUN = [
    _rec("crash", "crash", 30, 90),
    _rec("crashes", "crash", 100, 200),
    _rec("crashes#2", "crash", 300, 660),
    _rec("slow", "slow", 10, None),
]


def test_a_fault_recovered_in_time_passes_with_its_recovery() -> None:
    assert pick(RUN, "crash").recovered_within(60) == 60.0
    assert pick(RUN, "crash").recovered_within("1m") == 60.0
    assert pick(RUN, "crashes#1").recovery_s == 100.0  # "#1" is the first: label "crashes"


def test_a_slow_recovery_fails_naming_the_fault_and_its_phases() -> None:
    with pytest.raises(AssertionError) as err:
        pick(RUN, "crash").recovered_within(59)
    assert str(err.value) == (
        "fault 'crash' not recovered within 59.0s: crash (crash n00-npu3): recovered in "
        "1m00s (detected +5.0s, isolated +6.0s, restored +1m00s)"
    )


def test_every_repetition_of_a_step_is_held_to_the_bound() -> None:
    both = pick(RUN, "crashes")
    assert len(both.recoveries) == 2 and both.recovery_s == 360.0
    with pytest.raises(AssertionError, match=r"crashes#2 \(crash n00-npu3\): recovered in 6m00s"):
        both.recovered_within("5m")
    assert both.recovered_within("6m") == 360.0
    assert pick(RUN, "crashes#2").recovery_s == 360.0


def test_a_fault_never_detected_fails_and_says_so() -> None:
    gray = pick(RUN, "slow")
    assert gray.recovery_s is None
    with pytest.raises(AssertionError) as err:
        gray.recovered_within(600)
    assert f"slow (slow n00-npu3): not recovered ({NEVER_DETECTED})" in str(err.value)
    with pytest.raises(AssertionError, match=NEVER_DETECTED):
        gray.detected_within(60)


def test_detection_bounds() -> None:
    assert pick(RUN, "crash").detected_within(5) == 5.0
    with pytest.raises(AssertionError, match=r"detected after 5\.0s"):
        pick(RUN, "crash").detected_within(4)


def test_a_kind_picks_every_fault_of_it_when_no_step_has_the_name() -> None:
    assert len(pick(RUN, "crash").recoveries) == 1  # the step named "crash" first
    assert pick([r for r in RUN if r.injection.label != "crash"], "crash").recovery_s == 360.0


def test_bad_names_and_bounds_are_refused() -> None:
    with pytest.raises(LookupError) as err:
        pick(RUN, "meteor")
    assert str(err.value) == (
        "no fault 'meteor' in this run; steps: crash, crashes, crashes#2, slow; kinds: crash, slow"
    )
    with pytest.raises(InvalidArgumentError, match="bound"):
        pick(RUN, "crash").recovered_within("soon")
    with pytest.raises(InvalidArgumentError, match="bound"):
        pick(RUN, "crash").recovered_within(0)
