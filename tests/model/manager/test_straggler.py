"""The straggler judge on hand-made arrivals: a consistent straggler is flagged; jitter under the
margin, a one-off late arrival and too few collectives are not; and the fabric's arrival log read
by sequence number."""

from __future__ import annotations

import random
from collections.abc import Sequence

from cmemu.emulator.model.arrivals import Arrival, ArrivalLog
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.manager.detector import DEGRADED, FAILED, OK, STRAGGLER, Detector
from cmemu.emulator.model.manager.straggler import StragglerJudge, StragglerSettings

SETTINGS = StragglerSettings.of(DEFAULT_PROFILE.manager)
RANKS = ("n00-npu0.d0", "n00-npu0.d1", "n00-npu1.d0", "n00-npu1.d1", "n00-npu2.d0", "n00-npu2.d1")
S = 1_000_000_000


def _arrival(seq: int, ready_us: list[float] | None = None) -> Arrival:
    ready = tuple(round(r * 1000) for r in ready_us) if ready_us else ()
    return Arrival(seq=seq, op="all-reduce", issue_ns=seq * S, ranks=RANKS, ready_ns=ready)


def _judge(ready: Sequence[list[float] | None]) -> list[str]:
    judge = StragglerJudge(SETTINGS)
    for seq, r in enumerate(ready, start=1):
        judge.observe(_arrival(seq, r))
    return [s.npu for s in judge.stragglers(len(ready) * S)]


SLOW_NPU1 = [10.0, 10.0, 50.0, 50.0, 10.0, 10.0]  # npu1's dies at a fifth of the others' pace


def test_a_consistent_straggler_is_flagged_with_its_lag() -> None:
    judge = StragglerJudge(SETTINGS)
    for seq in range(1, 4):
        judge.observe(_arrival(seq, SLOW_NPU1))
    (found,) = judge.stragglers(3 * S)
    assert found.npu == "n00-npu1" and (found.samples, found.late) == (3, 3)
    assert found.ratio == 5.0 and "5.0x" in found.detail and found.since_ns == 1 * S
    # its twin: the same collectives with every rank at once flag nothing
    assert _judge([None, None, None]) == []


def test_late_in_two_of_its_last_three_is_enough_one_of_three_is_not() -> None:
    assert _judge([None, SLOW_NPU1, SLOW_NPU1]) == ["n00-npu1"]
    assert _judge([SLOW_NPU1, None, None]) == []  # a one-off late arrival
    assert _judge([None, None, SLOW_NPU1]) == []
    # a long healthy history does not hide a slowdown: the last collectives are judged
    assert _judge([None] * 20 + [SLOW_NPU1] * 2) == ["n00-npu1"]


def test_too_few_collectives_flag_nothing() -> None:
    assert _judge([SLOW_NPU1, SLOW_NPU1]) == []
    assert _judge([SLOW_NPU1, SLOW_NPU1, SLOW_NPU1]) == ["n00-npu1"]


def test_jitter_under_the_margin_flags_nothing() -> None:
    rng = random.Random(7)
    noisy = [[10.0 * rng.uniform(0.8, 1.4) for _ in RANKS] for _ in range(50)]
    assert _judge(noisy) == []  # its twin with one rank past the margin every time:
    assert _judge([[*r[:2], 25.0, *r[3:]] for r in noisy]) == ["n00-npu1"]


def test_a_slowdown_under_the_ratio_is_not_a_straggler() -> None:
    mild = [10.0, 10.0, 14.0, 14.0, 10.0, 10.0]  # 1.4x: under the 1.5 margin
    assert _judge([mild] * 10) == []


def test_arrivals_older_than_the_window_are_forgotten() -> None:
    judge = StragglerJudge(SETTINGS)
    for seq in range(1, 4):
        judge.observe(_arrival(seq, SLOW_NPU1))
    later = 3 * S + round(SETTINGS.window_s * 1e9) + 2 * S
    assert judge.stragglers(later) == [] and judge.samples("n00-npu1") == 0


def test_a_collective_of_two_ranks_compares_to_the_faster() -> None:
    judge = StragglerJudge(SETTINGS)
    for seq in range(1, 4):
        judge.observe(
            Arrival(seq=seq, op="all-reduce", issue_ns=seq * S,
                    ranks=("n00-npu0.d0", "n01-npu0.d0"), ready_ns=(10_000, 20_000))
        )  # fmt: skip
    assert [s.npu for s in judge.stragglers(3 * S)] == ["n01-npu0"]


def test_forget_judges_a_repaired_npu_anew() -> None:
    judge = StragglerJudge(SETTINGS)
    for seq in range(1, 4):
        judge.observe(_arrival(seq, SLOW_NPU1))
    judge.forget("n00-npu1")
    assert judge.stragglers(3 * S) == []


def test_a_degraded_npu_stays_degraded_while_it_answers() -> None:
    d = Detector()
    d.watch(["n00-npu1"])
    incident = d.degraded("n00-npu1", 5, "straggler: ...")
    assert incident is not None and incident.detected_by == STRAGGLER
    assert d.degraded("n00-npu1", 6, "again") is None  # one incident per degradation
    assert not d.answered("n00-npu1") and d.devices["n00-npu1"] == DEGRADED
    assert d.recovered("n00-npu1") and d.devices["n00-npu1"] == OK
    assert not d.recovered("n00-npu1")
    # a failed one is no straggler: its failure's incident covers it
    d.unhealthy("n00-npu1", "health", 7, "down")
    assert d.devices["n00-npu1"] == FAILED and d.degraded("n00-npu1", 8, "x") is None


def test_the_arrival_log_reads_by_sequence_and_says_what_it_dropped() -> None:
    log = ArrivalLog(keep=3)
    assert log.since(0).arrivals == () and log.since(0).last_seq == 0
    for i in range(5):
        log.add(op="all-reduce", issue_ns=i, ranks=RANKS, ready_ns=())
    batch = log.since(0)
    assert [a.seq for a in batch.arrivals] == [3, 4, 5] and batch.dropped == 2
    assert batch.last_seq == 5
    assert [a.seq for a in log.since(3).arrivals] == [4, 5] and log.since(3).dropped == 0
    assert log.since(5).arrivals == () and log.since(5).last_seq == 5
    limited = log.since(2, limit=1)
    assert [a.seq for a in limited.arrivals] == [3] and limited.last_seq == 3
    # a reader that knew a fabric since restarted reads the new one from its start
    assert [a.seq for a in log.since(99).arrivals] == [3, 4, 5]
