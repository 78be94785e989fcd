"""Expectations that can fail (issue 20), from observations written by hand: a fault nothing
detected is not recovered, recovery is credited by cause, `tolerated` holds the workload to its SLO
throughout, the blast radius and the steady state are judged, and the scenario's `duration` is a
hard limit. Each case beside its twin that passes."""

from __future__ import annotations

from typing import Any

import pytest

from cmemu.emulator.model.chaos.observed import (
    CORRUPT_CHECKPOINT,
    IncidentRecord,
    Injection,
    Observations,
    RequestSample,
    WorkloadEvent,
)
from cmemu.emulator.model.chaos.recovery import LATENT, NEVER_DETECTED, recoveries
from cmemu.emulator.model.chaos.scenario import Expectations, Slo, SteadyState, parse_scenario
from cmemu.emulator.model.chaos.verdict import STEADY_AFTER, STEADY_BEFORE, Check, judge
from cmemu.emulator.model.errors import InvalidArgumentError

S = 1_000_000_000


def _requests(start_s: int, end_s: int, *, tpot_ms: float = 40, ok: bool = True) -> list[Any]:
    return [
        RequestSample(workload="chat", ok=ok, done_ns=t * S, tpot_ms=tpot_ms, ttft_ms=300,
                      error="" if ok else "HTTP 503")
        for t in range(start_s, end_s, 5)
    ]  # fmt: skip


def _slow(*, cleared_s: int | None = None, tolerated: bool = False) -> Injection:
    return Injection(label="slow", kind="slow", target="n00-npu5", devices=("n00-npu5",),
                     at_ns=100 * S, cleared_ns=None if cleared_s is None else cleared_s * S,
                     tolerated=tolerated)  # fmt: skip


def _check(expect: Expectations, obs: Observations, name: str) -> Check:
    verdict = judge(expect, obs, recoveries(obs, expect.slo))
    return next(c for c in verdict.checks if c.name == name)


# --- a fault nothing detected --------------------------------------------------------------------


def test_a_fault_never_detected_nor_cleared_is_not_recovered() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow()],
                       requests=_requests(0, 800, tpot_ms=73.8), loaded=("chat",))  # fmt: skip
    (rec,) = recoveries(obs)
    assert rec.recovery_s is None and rec.status == NEVER_DETECTED
    assert rec.detected_ns is None and rec.isolated_ns is None and rec.restored_ns is None
    check = _check(Expectations(recovered_within_s=600), obs, "recovered_within")
    assert not check.ok
    assert check.detail == "slow (slow n00-npu5): never detected"
    assert "1 not recovered" in check.measured


def test_its_twin_cleared_by_the_scenario_is_over_at_the_clearance_and_says_so() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(cleared_s=160)],
                       requests=_requests(0, 800), loaded=("chat",))  # fmt: skip
    check = _check(Expectations(recovered_within_s=600), obs, "recovered_within")
    assert check.ok, check
    assert "1 never detected (over when cleared)" in check.measured


def test_a_fault_cleared_before_anything_detected_it_fails_detected_within() -> None:
    """recovered_within lets it pass as over when cleared; detected_within does not."""
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(cleared_s=160)],
                       requests=_requests(0, 800), loaded=("chat",))  # fmt: skip
    expect = Expectations(recovered_within_s=600, detected_within_s=30)
    assert _check(expect, obs, "recovered_within").ok
    check = _check(expect, obs, "detected_within")
    assert not check.ok
    assert check.measured == "nothing detected, 1 never detected"
    assert check.detail == "slow (slow n00-npu5): never detected; over when the scenario cleared it"


def _detected_obs(detected_s: int) -> Observations:
    incident = IncidentRecord(id="i1", device="n00-npu5", state="restored", detected_by="tpot",
                              detected_ns=detected_s * S, isolated_ns=detected_s * S,
                              restored_ns=300 * S)  # fmt: skip
    return Observations(start_ns=0, end_ns=800 * S, injections=[_slow(cleared_s=400)],
                        requests=_requests(0, 800), loaded=("chat",),
                        incidents=[incident])  # fmt: skip


def test_its_twin_detected_in_time_passes_and_one_detected_late_fails() -> None:
    expect = Expectations(detected_within_s=30)
    check = _check(expect, _detected_obs(120), "detected_within")
    assert check.ok, check
    assert check.measured == "worst 20.0s"
    late = _check(expect, _detected_obs(140), "detected_within")
    assert not late.ok
    assert late.detail == "slow (slow n00-npu5): detected after 40.0s"


def test_detected_within_with_only_tolerated_faults_has_nothing_to_judge_and_fails() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(tolerated=True)],
                       requests=_requests(0, 800), loaded=("chat",))  # fmt: skip
    check = _check(Expectations(detected_within_s=30), obs, "detected_within")
    assert not check.ok and check.measured == "no fault a detector is for"


def _corrupt() -> Injection:
    return Injection(label="rot", kind="checkpoint-corrupt", target="pretrain", devices=(),
                     at_ns=100 * S)  # fmt: skip


def test_a_corrupt_checkpoint_no_restore_read_is_latent_and_not_recovered() -> None:
    obs = Observations(
        start_ns=0,
        end_ns=800 * S,
        injections=[_corrupt()],
        jobs=("pretrain",),
        events=[WorkloadEvent(at_ns=50 * S, workload="pretrain", what="restored")],
    )
    (rec,) = recoveries(obs)  # a restore before the corruption read an intact one
    assert rec.status == LATENT and rec.detected_ns is None and rec.restored_ns is None
    assert not _check(Expectations(recovered_within_s=600), obs, "recovered_within").ok


def test_its_twin_found_by_the_jobs_restore_is_detected_then_and_recovered_at_the_next() -> None:
    events = [
        WorkloadEvent(at_ns=300 * S, workload="pretrain", what=CORRUPT_CHECKPOINT),
        WorkloadEvent(at_ns=340 * S, workload="pretrain", what="restored"),
    ]
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_corrupt()], jobs=("pretrain",),
                       events=events)  # fmt: skip
    (rec,) = recoveries(obs)
    assert (rec.detected_ns, rec.restored_ns, rec.recovery_s) == (300 * S, 340 * S, 240.0)
    assert _check(Expectations(recovered_within_s=600), obs, "recovered_within").ok
    assert not _check(Expectations(recovered_within_s=200), obs, "recovered_within").ok


def test_a_tolerated_fault_fails_when_the_workload_misses_its_slo_during_it() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(tolerated=True)],
                       requests=_requests(0, 800, tpot_ms=73.8), loaded=("chat",))  # fmt: skip
    expect = Expectations(recovered_within_s=600, slo=Slo(tpot_ms=50))
    verdict = judge(expect, obs, recoveries(obs, expect.slo))
    by_name = {c.name: c for c in verdict.checks}
    assert not by_name["tolerated"].ok
    assert "during the fault failed (0) or missed the SLO (140)" in by_name["tolerated"].detail
    assert by_name["recovered_within"].ok  # tolerated: judged apart, not as never detected
    assert "1 tolerated (judged apart)" in by_name["recovered_within"].measured


def test_its_twin_within_the_slo_throughout_passes() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(tolerated=True)],
                       requests=_requests(0, 800, tpot_ms=45), loaded=("chat",))  # fmt: skip
    expect = Expectations(recovered_within_s=600, slo=Slo(tpot_ms=50))
    verdict = judge(expect, obs, recoveries(obs, expect.slo))
    assert verdict.ok, [c for c in verdict.checks if not c.ok]


def test_a_tolerated_fault_with_no_request_during_it_fails() -> None:
    obs = Observations(start_ns=0, end_ns=800 * S, injections=[_slow(tolerated=True)],
                       requests=_requests(0, 90), loaded=("chat",))  # fmt: skip
    check = _check(Expectations(), obs, "tolerated")
    assert not check.ok and "no request completed during the fault" in check.detail


def test_a_tolerated_fault_that_fails_a_training_job_fails() -> None:
    obs = Observations(
        start_ns=0, end_ns=800 * S, injections=[_slow(tolerated=True)], jobs=("pretrain",),
        events=[WorkloadEvent(at_ns=300 * S, workload="pretrain", what="isolated")],
    )  # fmt: skip
    check = _check(Expectations(), obs, "tolerated")
    assert not check.ok and "training job pretrain failed during the fault" in check.detail
    obs.events = []
    assert _check(Expectations(), obs, "tolerated").ok


# --- recovery by cause ---------------------------------------------------------------------------


def test_recovery_is_credited_to_the_fault_that_caused_the_incident_not_by_overlap() -> None:
    """mixed-storm's artifact: a slow training NPU that nothing detected, then a crash of another
    NPU of the same job. The job's isolation report lists all its NPUs; the crash's incident is
    the crash's alone."""
    crash = Injection(label="crash", kind="crash", target="n01-npu2", devices=("n01-npu2",),
                      at_ns=240 * S)  # fmt: skip
    job_npus = ("n00-npu5", "n01-npu2", "n01-npu3")
    obs = Observations(
        start_ns=0, end_ns=900 * S, injections=[_slow(cleared_s=220), crash],
        incidents=[IncidentRecord(id="i1", device="n01-npu2", state="restored", detected_ns=241 * S,
                                  isolated_ns=242 * S, replaced_ns=243 * S, restored_ns=600 * S,
                                  jobs=("pretrain",))],
        events=[
            WorkloadEvent(at_ns=242 * S, workload="pretrain", what="isolated", npus=job_npus),
            WorkloadEvent(at_ns=610 * S, workload="pretrain", what="restored"),
        ],
    )  # fmt: skip
    slow, crashed = recoveries(obs)
    assert slow.incidents == () and slow.workloads == () and not slow.detected
    assert slow.recovery_s == 120.0  # its own clearance, not the crash's 6 minutes
    assert crashed.workloads == ("pretrain",) and crashed.incidents[0].id == "i1"
    assert (crashed.detected_ns, crashed.isolated_ns, crashed.restored_ns) == (
        241 * S, 242 * S, 610 * S)  # fmt: skip


def test_an_incident_goes_to_the_latest_injection_on_its_device_before_it() -> None:
    first = Injection(label="c#1", kind="crash", target="n00-npu1", devices=("n00-npu1",),
                      at_ns=100 * S, cleared_ns=150 * S)  # fmt: skip
    second = Injection(label="c#2", kind="crash", target="n00-npu1", devices=("n00-npu1",),
                       at_ns=300 * S)  # fmt: skip
    obs = Observations(
        start_ns=0, end_ns=900 * S, injections=[first, second],
        incidents=[
            IncidentRecord(id="a", device="n00-npu1", state="restored", detected_ns=101 * S,
                           isolated_ns=101 * S, restored_ns=160 * S),
            IncidentRecord(id="b", device="n00-npu1", state="isolated", detected_ns=302 * S,
                           isolated_ns=302 * S),
        ],
    )  # fmt: skip
    one, two = recoveries(obs)
    assert [i.id for i in one.incidents] == ["a"] and one.recovery_s == 60.0
    assert [i.id for i in two.incidents] == ["b"] and two.recovery_s is None
    assert two.status == "never restored"
    assert two.phases() == "detected +2.0s, isolated +2.0s, never restored"


# --- blast radius --------------------------------------------------------------------------------


def _radius_obs(device: str, replacements: tuple[str, ...] = ()) -> Observations:
    crash = Injection(label="crash", kind="crash", target="n00-npu1", devices=("n00-npu1",),
                      at_ns=100 * S)  # fmt: skip
    return Observations(
        start_ns=0, end_ns=900 * S, injections=[crash],
        incidents=[
            IncidentRecord(id="a", device="n00-npu1", state="restored", detected_ns=101 * S,
                           restored_ns=200 * S, replacements=replacements),
            IncidentRecord(id="b", device=device, state="isolated", detected_by="heartbeat",
                           detected_ns=130 * S),
        ],
    )  # fmt: skip


def test_an_incident_on_a_device_no_step_targeted_exceeds_the_blast_radius() -> None:
    check = _check(Expectations(blast_radius="targeted"), _radius_obs("n01-npu7"), "blast_radius")
    assert not check.ok
    assert check.detail == "incident b on n01-npu7 (by heartbeat, +2m10s): no step targeted it"


def test_its_twins_a_targeted_device_or_its_replacement_are_inside() -> None:
    assert _check(Expectations(blast_radius="targeted"), _radius_obs("n00-npu1.d1"),
                  "blast_radius").ok  # fmt: skip
    spare = _radius_obs("n01-npu7", replacements=("n01-npu7",))
    assert _check(Expectations(blast_radius="targeted"), spare, "blast_radius").ok


# --- steady state --------------------------------------------------------------------------------


def _steady_obs() -> Observations:
    return Observations(
        start_ns=0, end_ns=900 * S, steady_ns=100 * S, loaded=("chat",),
        injections=[_slow(cleared_s=160)], requests=_requests(0, 900),
    )  # fmt: skip


def test_the_steady_state_holds_before_and_after() -> None:
    expect = Expectations(steady_state=SteadyState(failed_requests=0, open_incidents=0))
    verdict = judge(expect, _steady_obs(), recoveries(_steady_obs()))
    assert verdict.ok and {"steady_state_before", "steady_state_after"} <= {
        c.name for c in verdict.checks}  # fmt: skip


def test_a_steady_state_not_met_before_the_first_fault_fails_the_run_alone() -> None:
    obs = _steady_obs()
    obs.requests = _requests(0, 100, ok=False) + _requests(100, 900)
    obs.open_before = [IncidentRecord(id="old", device="n02-npu0", state="isolated")]
    obs.halted = "steady state not met before the first fault: ..."
    steady = SteadyState(failed_requests=0, open_incidents=0)
    expect = Expectations(recovered_within_s=60, steady_state=steady)
    verdict = judge(expect, obs, [])
    (check,) = verdict.checks
    assert check.name == "steady_state_before" and not check.ok
    assert check.detail.startswith(STEADY_BEFORE + ": 20 failed requests before the first fault")
    assert "open incidents: old on n02-npu0 (isolated)" in check.detail


def test_a_steady_state_not_met_after_the_last_fault_fails() -> None:
    obs = _steady_obs()
    obs.requests = _requests(0, 500) + _requests(500, 900, ok=False)
    obs.incidents = [IncidentRecord(id="x", device="n00-npu5", state="isolated",
                                    detected_ns=120 * S)]  # fmt: skip
    expect = Expectations(steady_state=SteadyState(failed_requests=0, open_incidents=0))
    check = _check(expect, obs, "steady_state_after")
    assert not check.ok and check.detail.startswith(STEADY_AFTER + ": 80 failed requests after")
    assert "open incidents: x on n00-npu5 (isolated)" in check.detail


# --- the document --------------------------------------------------------------------------------

SERVING = {"serving": [{"name": "chat", "spec": {"model": "m"}, "load": {}}]}


def _doc(**extra: Any) -> dict[str, Any]:
    step = {"id": "s", "at": "30s", "fault": "slow", "target": {"npu": "random"},
            "duration": "1m"}  # fmt: skip
    doc: dict[str, Any] = {"version": 1, "name": "x", "workloads": SERVING, "steps": [step]}
    for key, value in extra.items():
        if key in ("tolerated", "duration_step", "repeat"):
            step[{"duration_step": "duration"}.get(key, key)] = value
        else:
            doc[key] = value
    return doc


def test_the_loader_reads_the_new_fields() -> None:
    steady = {"failed_requests": 0, "open_incidents": 1}
    expect = {"blast_radius": "targeted", "steady_state": steady, "detected_within": "30s"}
    s = parse_scenario(_doc(tolerated=True, duration="2m", expect=expect))
    assert s.steps[0].tolerated and s.expect.blast_radius == "targeted"
    assert s.expect.steady_state == SteadyState(failed_requests=0, open_incidents=1)
    assert s.expect.detected_within_s == 30.0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(tolerated="yes"), "steps[0].tolerated: expected true or false, got 'yes'"),
        (_doc(duration="1m"), "steps[0]: step 's' ends as late as 1m30s"),
        (
            _doc(duration="5m", repeat={"count": 5, "every": "1m"}),
            "steps[0]: step 's' ends as late as 5m30s",
        ),
        (
            _doc(expect={"blast_radius": "everywhere"}),
            "expect.blast_radius: expected one of targeted, got 'everywhere'",
        ),
        (_doc(expect={"steady_state": {}}), "expect.steady_state: name failed_requests"),
        (_doc(expect={"detected_within": "0s"}), "expect.detected_within"),
        (
            _doc(expect={"steady_state": {"healthy": True}}),
            "expect.steady_state.healthy: unknown field",
        ),
        (
            _doc(expect={"steady_state": {"open_incidents": -1}}),
            "expect.steady_state.open_incidents: expected an integer >= 0",
        ),
    ],
)
def test_the_loader_rejects_bad_new_fields(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        parse_scenario(doc)
    assert message in str(err.value)


def test_a_tolerated_step_needs_a_workload_to_judge_it_on() -> None:
    doc = _doc(tolerated=True)
    doc["workloads"] = {}
    with pytest.raises(InvalidArgumentError, match=r"steps\[0\].tolerated: a tolerated fault"):
        parse_scenario(doc)


def test_a_steady_state_of_requests_needs_a_load() -> None:
    doc = _doc(expect={"steady_state": {"failed_requests": 0}})
    doc["workloads"] = {"serving": [{"name": "chat", "spec": {"model": "m"}}]}
    with pytest.raises(
        InvalidArgumentError, match=r"steady_state\.failed_requests: needs requests"
    ):
        parse_scenario(doc)
