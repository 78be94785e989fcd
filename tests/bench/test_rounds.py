"""bench/rounds.py's ratios to the ping (bench/ems.py's Put and Get, bench/fabric.py's UB
Submit): each round's op against the ping timed beside it, the median over the rounds, so that a
load that comes and goes on a shared host moves both sides of a ratio alike. Its twin, the ratio
of the medians, is shown to be moved by the same load."""

from __future__ import annotations

import statistics

import pytest

from bench.rounds import summary as rounds_summary

# the host's load swings from round to round: ping and ops swing with it (put = ping / 2,
# get = ping * 0.8), but in the last round a burst of load hit the ping's window alone
ROUNDS = [
    {"ping": 1000.0, "put": 500.0, "get": 800.0},
    {"ping": 200.0, "put": 100.0, "get": 160.0},
    {"ping": 600.0, "put": 300.0, "get": 480.0},
    {"ping": 100.0, "put": 250.0, "get": 400.0},
]


@pytest.mark.parametrize("op,ratio", [("put", 0.5), ("get", 0.8)])
def test_each_ratio_is_the_median_of_its_rounds(op: str, ratio: float) -> None:
    summary = rounds_summary(ROUNDS)
    assert summary[f"{op}_to_ping"] == pytest.approx(ratio)
    assert summary["ping"] == statistics.median(r["ping"] for r in ROUNDS)
    # the twin: medians taken first set a ping of one round against an op of another
    of_medians = summary[op] / summary["ping"]
    assert of_medians != pytest.approx(ratio, rel=0.05)


def test_one_round_is_its_own_ratio() -> None:
    summary = rounds_summary([{"ping": 400.0, "put": 100.0, "get": 300.0}])
    assert (summary["put_to_ping"], summary["get_to_ping"]) == (0.25, 0.75)
