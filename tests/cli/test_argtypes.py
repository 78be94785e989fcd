"""The CLI's durations read as a scenario's do (emulator/model/durations.py), plus a bare number
of seconds; a bad one is a usage error naming it."""

from __future__ import annotations

import argparse

import pytest

from cmemu.emulator.cli.argtypes import non_negative_seconds, seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30", 30.0),
        ("1e3", 1000.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("800us", 800e-6),
        ("5m", 300.0),
        ("2 min", 120.0),
        ("1m30s", 90.0),
        ("1h 30m", 5400.0),
        ("1D", 86400.0),
    ],
)
def test_a_duration_as_people_type_it(text: str, expected: float) -> None:
    assert seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("30x", "not a duration: '30x'"),
        ("1m30", "not a duration"),  # the last part has no unit
        ("", "not a duration"),
        ("nan", "not a duration"),
        ("inf", "not a duration"),
        ("-3", "must be a duration >= 0"),
        ("0s", "must be a duration > 0"),
    ],
)
def test_a_bad_duration_says_why(text: str, words: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        seconds(text)


def test_zero_is_a_duration_where_it_may_be() -> None:
    assert non_negative_seconds("0") == 0.0 and non_negative_seconds("0s") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        non_negative_seconds("-1")
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        non_negative_seconds("-1s")
