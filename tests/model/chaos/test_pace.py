"""A run that did not keep pace is ABORTED, never judged; one that kept it is judged."""

from __future__ import annotations

from cmemu.emulator.model.chaos.pace import Pace

KEPT = Pace(
    asked_scale=20.0,
    achieved_scale=11.5,  # slower than asked: dilation did its job, the run is fine
    dilation=True,
    longest_stall_s=3.2,  # cut out of emulated time: no one saw it
    worst_lag_emulated_s=0.4,
)


def test_a_slowed_run_with_a_bounded_lag_is_judged() -> None:
    assert KEPT.aborted == ""
    assert "20 asked, 11.5 achieved" in KEPT.line()


def test_a_process_that_went_silent_aborts_the_run() -> None:
    pace = Pace(**{**KEPT.__dict__, "silent": ("n03",)})
    assert "processes stopped answering: n03" in pace.aborted


def test_an_unbounded_lag_aborts_the_run_and_says_dilation_was_off() -> None:
    pace = Pace(**{**KEPT.__dict__, "worst_lag_emulated_s": 42.0, "dilation": False})
    assert "42.00 emulated s late" in pace.aborted and "dilation off" in pace.aborted
    assert Pace(**{**KEPT.__dict__, "worst_lag_emulated_s": 4.9}).aborted == ""  # under 5 s
