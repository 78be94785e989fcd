"""Recovery times, the timeline and the verdict, from observations written by hand: each
expectation passes and fails where it should."""

from __future__ import annotations

from cmemu.emulator.model.chaos.observed import (
    IncidentRecord,
    Injection,
    Observations,
    RequestSample,
    TrainingRecord,
    WorkloadEvent,
)
from cmemu.emulator.model.chaos.recovery import CLEARED_UNDETECTED, recoveries
from cmemu.emulator.model.chaos.scenario import Expectations, Slo, TrainingProgress
from cmemu.emulator.model.chaos.timeline import build_timeline
from cmemu.emulator.model.chaos.verdict import judge

S = 1_000_000_000


def _obs() -> Observations:
    crash = Injection(label="crash", kind="crash", target="n00-npu3", devices=("n00-npu3",),
                      at_ns=100 * S)  # fmt: skip
    flap = Injection(label="flap", kind="link-flap", target="a~b", devices=(), at_ns=200 * S,
                     cleared_ns=260 * S)  # fmt: skip
    return Observations(
        start_ns=70 * S,
        end_ns=900 * S,
        injections=[crash, flap],
        incidents=[
            IncidentRecord(
                id="i1",
                device="n00-npu3",
                detected_by="heartbeat",
                state="restored",
                fault_ns=100 * S,
                detected_ns=115 * S,
                isolated_ns=116 * S,
                replaced_ns=117 * S,
                restored_ns=300 * S,
                jobs=("chat",),
                replacements=("n01-npu7",),
            ),
        ],
        events=[
            WorkloadEvent(at_ns=116 * S, workload="chat", what="isolated", npus=("n00-npu3",)),
            WorkloadEvent(at_ns=310 * S, workload="chat", what="restored"),
        ],
        requests=[
            RequestSample(workload="chat", ok=True, done_ns=90 * S, tpot_ms=40, ttft_ms=300),
            RequestSample(workload="chat", ok=False, done_ns=120 * S, error="HTTP 503"),
            RequestSample(workload="chat", ok=True, done_ns=312 * S, tpot_ms=90, ttft_ms=300),
            RequestSample(workload="chat", ok=True, done_ns=330 * S, tpot_ms=45, ttft_ms=300),
            RequestSample(workload="chat", ok=True, done_ns=340 * S, tpot_ms=44, ttft_ms=300),
        ],
        objects=10,
        lost_objects=0,
        training=[
            TrainingRecord(
                name="j",
                state="running",
                step_at_start=5,
                step=90,
                restarts=1,
                steps_lost=12,
                goodput=0.93,
            )
        ],
    )


def test_time_to_recovery_runs_from_the_fault_to_the_last_restore() -> None:
    recs = recoveries(_obs(), Slo(tpot_ms=50))
    crash, flap = recs
    assert crash.incidents[0].id == "i1" and crash.workloads == ("chat",)
    assert crash.detected_ns == 115 * S and crash.isolated_ns == 116 * S
    assert crash.replaced_ns == 117 * S
    assert crash.recovery_s == 210.0  # the deployment's restore, after the incident's
    assert crash.slo_back_s == 230.0  # 312 s missed the TPOT SLO; 330 s met it
    # nothing detected the flap: it is over when the scenario cleared it, and says so
    assert not flap.affected and not flap.detected and flap.recovery_s == 60.0
    assert flap.status == CLEARED_UNDETECTED and flap.detected_ns is None
    assert crash.phases() == "detected +15.0s, isolated +16.0s, restored +3m30s"


def test_an_unrestored_or_unrecoverable_fault_has_no_recovery() -> None:
    obs = _obs()
    obs.events = obs.events[:1]  # the deployment never said restored
    assert recoveries(obs)[0].recovery_s is None
    obs = _obs()
    obs.incidents = [IncidentRecord(id="i1", device="n00-npu3.d1", state="unrecoverable",
                                    fault_ns=101 * S, detected_ns=110 * S)]  # fmt: skip
    obs.events = []
    rec = recoveries(obs)[0]
    assert rec.unrecoverable and rec.recovery_s is None


def test_every_expectation_passes_when_it_holds() -> None:
    expect = Expectations(
        recovered_within_s=600, lost_objects=0, failed_rate=0.25, dropped_requests=0,
        slo=Slo(tpot_ms=50), training_progress=TrainingProgress(min_goodput=0.9, max_restarts=1),
        unrecoverable=0,
    )  # fmt: skip
    obs = _obs()
    verdict = judge(expect, obs, recoveries(obs, expect.slo))
    assert {c.name for c in verdict.checks} == {
        "faults_injected", "recovered_within", "lost_objects", "failed_requests",
        "dropped_requests", "slo", "training_progress", "unrecoverable"}  # fmt: skip
    assert verdict.ok, [c for c in verdict.checks if not c.ok]


def test_each_expectation_fails_when_it_does_not_hold() -> None:
    obs = _obs()
    obs.lost_objects = 2
    obs.dropped_requests = 1
    obs.training = [TrainingRecord(name="j", state="failed", step_at_start=5, step=5)]
    obs.injections.append(
        Injection(
            label="x", kind="crash", target="n09-npu0", devices=(), at_ns=1, error="NOT_FOUND"
        )
    )
    expect = Expectations(
        recovered_within_s=60, lost_objects=0, failed_requests=0, dropped_requests=0,
        slo=Slo(tpot_ms=10), training_progress=TrainingProgress(), unrecoverable=0,
    )  # fmt: skip
    verdict = judge(expect, obs, recoveries(obs, expect.slo))
    failed = {c.name for c in verdict.checks if not c.ok}
    assert failed == {
        "faults_injected", "recovered_within", "lost_objects", "failed_requests",
        "dropped_requests", "slo", "training_progress"}  # fmt: skip
    assert not verdict.ok
    by_name = {c.name: c for c in verdict.checks}
    recovered = by_name["recovered_within"].detail
    assert "crash (crash n00-npu3): took 3m30s (detected +15.0s" in recovered
    assert by_name["failed_requests"].measured == "1 of 5"
    assert "HTTP 503" in by_name["failed_requests"].detail


def test_a_scenario_that_injects_nothing_does_not_pass() -> None:
    obs = Observations(start_ns=0, end_ns=10)
    verdict = judge(Expectations(recovered_within_s=600), obs, recoveries(obs))
    assert not verdict.ok


def test_the_timeline_is_in_emulated_order_with_every_phase() -> None:
    obs = _obs()
    recs = recoveries(obs, Slo(tpot_ms=50))
    entries = build_timeline(obs, recs)
    assert [e.at_ns for e in entries] == sorted(e.at_ns for e in entries)
    phases = [e.phase for e in entries]
    for phase in ("fault", "detected", "isolated", "replaced", "restored", "slo-back", "cleared"):
        assert phase in phases
    assert entries[0].since_start_s == 30.0 and entries[0].phase == "fault"


def test_a_node_left_off_is_recovered_once_its_jobs_run_elsewhere() -> None:
    power_off = Injection(label="off", kind="node-power-off", target="n01", devices=("n01",),
                          at_ns=60 * S)  # fmt: skip
    obs = Observations(
        start_ns=0,
        end_ns=600 * S,
        injections=[power_off],
        incidents=[
            IncidentRecord(id="a", device="n01-npu2", state="restored", detected_ns=62 * S,
                           restored_ns=120 * S, jobs=("pretrain",)),
            IncidentRecord(id="b", device="n01-cpu0", state="detected", detected_ns=70 * S),
        ],  # the CPU stays down with its node: no job of its own to restore
        events=[
            WorkloadEvent(at_ns=61 * S, workload="pretrain", what="isolated", npus=("n01-npu2",)),
            WorkloadEvent(at_ns=119 * S, workload="pretrain", what="restored"),
        ],
    )  # fmt: skip
    (rec,) = recoveries(obs)
    assert rec.recovery_s == 60.0
    # with no workload on it, the device's own incident is what recovers (or not)
    obs.events, obs.incidents = [], obs.incidents[1:]
    assert recoveries(obs)[0].recovery_s is None
