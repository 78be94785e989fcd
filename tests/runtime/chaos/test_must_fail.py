"""Scenarios built to fail, each beside its twin that passes (issue 20): run end to end against an
in-process cm-mini (the cmemu plugin's `supernode`, its own emulator at this time scale), each
asserting the failing check's name AND its reason. A verdict that cannot fail proves nothing.

The runs are short in emulated time (faults at a few seconds, bounds of a minute or two) and at a
high time scale, so each takes seconds of wall time on an idle machine."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from pathlib import Path

import pytest

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.client import faults
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.clock import held_time
from cmemu.emulator.model.chaos.recovery import CLEARED_UNDETECTED, NEVER_DETECTED
from cmemu.emulator.model.chaos.timeline import Entry
from cmemu.emulator.model.chaos.verdict import STEADY_BEFORE, Check, judge
from cmemu.emulator.model.errors import DeadlineExceededError, InvalidArgumentError
from cmemu.emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor
from cmemu.emulator.runtime.chaos import files, kinds
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.v1 import manager_pb2, scheduler_pb2
from tests.runtime.chaos.fresh import judged

pytestmark = pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=50)

EMS = "  ems: {objects: 4, size: 1KiB, prefix: test/must-fail/}"
# each test its own job: one left recovering by a test refuses Stop (and its name) for a while
TRAINING = "  training: [{name: %s, npus: 2, checkpoint_every: 5}]"


def _scenario(name: str, workloads: str, step: str, expect: str, *, top: str = "") -> str:
    return (
        f"version: 1\nname: {name}\nseed: 1\n{top}workloads:\n{workloads}\n"
        f"steps:\n  - {step}\nexpect:\n{expect}\n"
    )


def _run(chaos: Chaos, tmp_path: Path, text: str) -> RunResult:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    # deployments from EMS: the set-up is not what is judged
    return judged(lambda: chaos.run(path, warm=True))


def _failed(result: RunResult) -> dict[str, Check]:
    return {c.name: c for c in result.verdict.checks if not c.ok}


def _open_incidents(supernode: RunningSupernode) -> list[str]:
    async def listed(c: Clients) -> list[str]:
        reply = await c.manager().ListIncidents(manager_pb2.ListIncidentsRequest(since_ns=0))
        return [f"{i.id} {i.device} {i.state}" for i in reply.incidents if i.state != "restored"]

    return supernode.call(listed)


def _detection(result: RunResult, within_s: float) -> Check:
    """The run's own observations judged again with `detected_within` added."""
    expect = dataclasses.replace(result.scenario.expect, detected_within_s=within_s)
    checks = judge(expect, result.observations, result.recoveries).checks
    return next(c for c in checks if c.name == "detected_within")


def _settled(supernode: RunningSupernode, wait_for: WaitFor) -> None:
    """Every incident of earlier tests restored: the steady state this module's twins assume."""
    wait_for(lambda: not _open_incidents(supernode), within_emulated_s=300)


# --- a fault nothing detected ---------------------------------------------------------------------

# n01-npu3 takes part in no collective here (an EMS workload only): no arrival shows it late, so
# the manager's straggler detection cannot find it (a slow NPU in a job: the straggler pair below)
SLOW = "{id: slow, at: 5s, fault: slow, target: {npu: n01-npu3}, params: {compute: 0.05}%s}"


def test_a_gray_failure_never_detected_nor_cleared_is_not_recovered(
    chaos: Chaos, tmp_path: Path
) -> None:
    text = _scenario("gray-never-detected", EMS, SLOW % "", "  recovered_within: 1m")
    result = _run(chaos, tmp_path, text)
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["recovered_within"]
    assert check.detail == f"slow (slow n01-npu3): {NEVER_DETECTED}"
    (rec,) = result.recoveries
    assert (rec.detected_ns, rec.isolated_ns, rec.restored_ns) == (None, None, None)
    with pytest.raises(AssertionError) as err:  # the one-line per-fault bound says why
        result.fault("slow").recovered_within("1m")
    assert f"slow (slow n01-npu3): not recovered ({NEVER_DETECTED})" in str(err.value)


def test_its_twin_cleared_by_the_scenario_passes_and_says_it_was_never_detected(
    chaos: Chaos, tmp_path: Path
) -> None:
    text = _scenario("gray-cleared", EMS, SLOW % ", duration: 10s", "  recovered_within: 1m")
    result = _run(chaos, tmp_path, text)
    assert result.ok, "\n".join(summary_lines(result))
    (rec,) = result.recoveries
    assert rec.status == CLEARED_UNDETECTED and rec.detected_ns is None
    assert rec.recovery_s is not None and 10 <= rec.recovery_s < 60
    assert result.fault("slow").recovered_within(60) == rec.recovery_s
    # but the control plane never saw it: `detected_within` fails it (its twin: the straggler)
    detection = _detection(result, 180)
    assert not detection.ok and detection.detail == f"slow (slow n01-npu3): {CLEARED_UNDETECTED}"


# --- a gray failure the manager finds: a slow NPU in a training job, never cleared ---------------

# compute 0.2: the job's 13 s step takes about 53 s; the manager finds the NPU late in 2 of its
# job's last 3 collectives (one a step: detected about a minute in), isolates and replaces it, and
# the job restarts on a spare (restart_s 60 s): back in about two minutes, so bounded at 3
STRAGGLER = ("{id: slow, at: 10s, fault: slow, target: {npu: random in job %s}, "
             "params: {compute: 0.2}}")  # fmt: skip


def _set_mode(supernode: RunningSupernode, mode: manager_pb2.ManagerMode.ValueType) -> None:
    async def set_mode(c: Clients) -> None:
        await c.manager().SetMode(manager_pb2.SetModeRequest(mode=mode))

    supernode.call(set_mode)


def test_a_slow_npu_in_a_job_found_as_a_straggler_is_isolated_and_recovers(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    text = _scenario("straggler", TRAINING % "straggled", STRAGGLER % "straggled",
                     "  recovered_within: 3m", top="duration: 4m\n")  # fmt: skip
    result = _run(chaos, tmp_path, text)
    assert result.ok, "\n".join(summary_lines(result))
    (rec,) = result.recoveries
    (incident,) = rec.incidents
    assert incident.detected_by == "straggler" and incident.device in rec.injection.devices
    assert rec.detected_ns is not None and rec.isolated_ns is not None
    assert rec.workloads == ("straggled",) and rec.status == "recovered"
    assert result.fault("slow").recovered_within("3m") == rec.recovery_s
    assert _detection(result, 180).ok, _detection(result, 180)  # detected as a straggler in time
    _settled(supernode, wait_for)


def test_its_twin_with_the_manager_passive_is_detected_never_isolated_and_fails(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    text = _scenario("straggler-passive", TRAINING % "straggled-passive",
                     STRAGGLER % "straggled-passive", "  recovered_within: 3m",
                     top="duration: 4m\n")  # fmt: skip
    _set_mode(supernode, manager_pb2.MANAGER_MODE_PASSIVE)
    try:
        result = _run(chaos, tmp_path, text)
    finally:
        _set_mode(supernode, manager_pb2.MANAGER_MODE_ACTIVE)
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["recovered_within"]
    (rec,) = result.recoveries
    assert rec.detected_ns is not None and rec.isolated_ns is None
    (victim,) = rec.injection.devices
    reason = f"slow (slow {victim}): detected, never isolated ("
    assert check.detail.startswith(reason), check.detail
    _settled(supernode, wait_for)


# --- a gray failure on the data path: a slow decode NPU breaks the TPOT SLO -----------------------

SMALL = Path(__file__).resolve().parents[3] / "examples" / "deployments" / "small.yaml"
SERVING = (
    f"  serving:\n    - name: chat\n      deployment: {SMALL}\n"
    "      load: {rate_per_s: 1, input_tokens: 512, output_tokens: 16}"
)
# compute 0.15: TPOT about 230 ms by the simulation (35 ms at full speed, the step model of issue
# 23 item 1); 0.9: about 39 ms. The SLO sits between with a wide margin on both sides
SLOW_DECODE = (
    "{id: slow, at: 20s, fault: slow, target: {npu: random in deployment chat decode}, "
    "params: {compute: %s}%s}"
)
TPOT_SLO = "  slo: {tpot_ms: 100}"
# each on an emulator of its own (the plugin's fresh="test"): a serving run after many runs on
# one emulator has been seen to hold its load generator on a busy host (the runner's followed
# clock stopped moving), so these heavier runs do not queue behind the module's others. The
# emulator runs at x50 and the deployment starts warm, so its 80 emulated s of weights loading
# from EMS (640 cold) take a few wall s;
# the scenario's steps and traffic at x5 (its `time_scale`): a live decode step's own wall-clock
# work (its gRPC collectives, a few ms) counts x the scale in emulated TPOT, and at x50 on a
# loaded CI host the healthy TPOT was 195-230 ms instead of 75 (the slow NPU's 230 ms stays
# far above the SLO at any scale). A minute is enough: each check here is over before it (the
# fault goes in at 10 or 20 s, a request a second; a fault never recovered is late whenever the
# run ends), and a minute at x5 is 12 wall s
PACED = "duration: 1m\ntime_scale: 5\n"
OWN = pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=50, fresh="test")


# The manager finds a slow decode NPU (it arrives last at its instance's collectives, every step)
# and, active, replaces it: these two run it passive so that the slowdown stays, as their premise
# (a gray failure nobody acts on) asks; the straggler pair above has the active manager.
@OWN
def test_a_slow_decode_npu_breaking_the_tpot_slo_not_isolated_is_not_recovered(
    chaos: Chaos, supernode: RunningSupernode, tmp_path: Path
) -> None:
    text = _scenario("gray-decode", SERVING, SLOW_DECODE % ("0.15", ""),
                     f"  recovered_within: 1m\n{TPOT_SLO}", top=PACED)  # fmt: skip
    _set_mode(supernode, manager_pb2.MANAGER_MODE_PASSIVE)
    result = _run(chaos, tmp_path, text)
    assert not result.ok, "\n".join(summary_lines(result))
    failed = _failed(result)
    assert "detected, never isolated" in failed["recovered_within"].detail
    (rec,) = result.recoveries
    assert [i.detected_by for i in rec.incidents] == ["straggler"]
    assert failed["slo"].measured == "not recovered"
    # the slow NPU is what broke the SLO: TPOT before it and once its steps run at its pace
    obs = result.observations
    (at,) = [i.at_ns for i in obs.injections]
    before = [r.tpot_ms for r in obs.requests if r.ok and r.done_ns < at]
    during = [r.tpot_ms for r in obs.requests if r.ok and r.done_ns > at + 5 * 10**9]
    assert before and during
    assert statistics.median(before) < 100, before
    assert statistics.median(during) > 100, during


@OWN
def test_a_tolerated_slowdown_that_breaks_the_tpot_slo_fails(
    chaos: Chaos, supernode: RunningSupernode, tmp_path: Path
) -> None:
    text = _scenario("gray-decode-tolerated", SERVING, SLOW_DECODE % ("0.15", ", tolerated: true"),
                     f"  recovered_within: 1m\n{TPOT_SLO}", top=PACED)  # fmt: skip
    _set_mode(supernode, manager_pb2.MANAGER_MODE_PASSIVE)
    result = _run(chaos, tmp_path, text)
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["tolerated"]
    assert "missed the SLO" in check.detail, check.detail


@OWN
def test_its_twin_a_mild_tolerated_slowdown_within_the_slo_passes(
    chaos: Chaos, tmp_path: Path
) -> None:
    text = _scenario("gray-decode-mild", SERVING, SLOW_DECODE % ("0.9", ", tolerated: true"),
                     f"  recovered_within: 1m\n{TPOT_SLO}", top=PACED)  # fmt: skip
    result = _run(chaos, tmp_path, text)
    assert result.ok, "\n".join(summary_lines(result))
    # the steps ran at the scenario's pace, not the emulator's x50 (which the set-up had)
    assert result.time_scale == 5 and result.pace is not None
    assert result.pace.asked_scale == 5 and result.pace.achieved_scale <= 5 * 1.001


# --- tolerated ------------------------------------------------------------------------------------


def test_a_tolerated_fault_that_fails_the_job_fails(chaos: Chaos, tmp_path: Path) -> None:
    step = (
        "{id: crash, at: 10s, fault: crash, target: {npu: random in job crashed}, tolerated: true}"
    )
    text = _scenario("tolerated-crash", TRAINING % "crashed", step, "  recovered_within: 2m",
                     top="duration: 2m\n")  # fmt: skip
    result = _run(chaos, tmp_path, text)
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["tolerated"]
    assert "training job crashed failed during the fault" in check.detail


def test_its_twin_a_tolerated_slowdown_the_job_rides_out_passes(
    chaos: Chaos, supernode: RunningSupernode, tmp_path: Path
) -> None:
    step = ("{id: slow, at: 10s, fault: slow, target: {npu: random in job slowed}, "
            "params: {compute: 0.5}, duration: 20s, tolerated: true}")  # fmt: skip
    text = _scenario("tolerated-slow", TRAINING % "slowed", step, "  recovered_within: 2m",
                     top="duration: 1m\n")  # fmt: skip
    # the manager passive: the job rides the slowdown out itself. An active one may find the
    # slow NPU within the 20 s (each step's three collectives are three samples; whether a
    # slowed step lands two in the window depends on the step's length) and restart the job
    # on a spare, which is its own, tested elsewhere (the straggler pair above)
    _set_mode(supernode, manager_pb2.MANAGER_MODE_PASSIVE)
    try:
        result = _run(chaos, tmp_path, text)
    finally:
        _set_mode(supernode, manager_pb2.MANAGER_MODE_ACTIVE)
    assert result.ok, "\n".join(summary_lines(result))
    assert [c.name for c in result.verdict.checks] == [
        "faults_injected", "recovered_within", "tolerated"]  # fmt: skip


# --- the duration is a hard limit (a load error: nothing runs) ------------------------------------


def test_a_step_past_the_scenario_duration_is_a_load_error_naming_it() -> None:
    step = "{id: late, at: 3m, fault: slow, target: {npu: n01-npu3}, duration: 2m}"
    text = _scenario("too-long", EMS, step, "  lost_objects: 0", top="duration: 4m\n")
    with pytest.raises(InvalidArgumentError, match=r"steps\[0\]: step 'late' ends as late as 5m"):
        files.parse_text(text)
    assert files.parse_text(text.replace("duration: 2m", "duration: 1m")).duration_s == 240


# --- blast radius ---------------------------------------------------------------------------------

DOWN = "{id: down, at: 5s, fault: device-down, target: {npu: n00-npu1}, duration: 10s}"
RADIUS = _scenario("blast-radius", EMS, DOWN, "  recovered_within: 2m\n  blast_radius: targeted")


def _with_outside_fault(supernode: RunningSupernode, text: str, outside: str | None) -> RunResult:
    """The scenario, with (when `outside` names a device) a device no step targets going down
    for a while as soon as the scenario's own fault is in: an effect the scenario did not ask."""
    scenario = files.parse_text(text)
    typed = kinds.checkers()["device-down"]({"reason": "outside the blast radius"})

    async def go(c: Clients) -> RunResult:
        tasks: list[asyncio.Task[object]] = []

        def on_entry(entry: Entry) -> None:
            if outside and entry.phase == "fault" and not tasks:
                fault = kinds.inject(c, "device-down", outside, typed, 10.0)
                tasks.append(asyncio.get_running_loop().create_task(fault))

        result = await run_scenario(c, scenario, RunOptions(), on_entry=on_entry)
        await asyncio.gather(*tasks)
        return result

    return supernode.call(go)


def test_an_incident_outside_the_targets_fails_the_blast_radius(
    supernode: RunningSupernode, wait_for: WaitFor
) -> None:
    _settled(supernode, wait_for)
    result = _with_outside_fault(supernode, RADIUS, "n01-npu2")
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["blast_radius"]
    assert "on n01-npu2" in check.detail and "no step targeted it" in check.detail
    assert "n00-npu1" not in check.detail
    _settled(supernode, wait_for)


def test_its_twin_with_incidents_only_on_the_targets_passes(
    supernode: RunningSupernode, wait_for: WaitFor
) -> None:
    _settled(supernode, wait_for)
    result = _with_outside_fault(supernode, RADIUS, None)
    assert result.ok, "\n".join(summary_lines(result))
    (rec,) = result.recoveries
    assert rec.detected_ns is not None and [i.device for i in rec.incidents] == ["n00-npu1"]


# --- steady state ---------------------------------------------------------------------------------

STEADY = _scenario(
    "steady", EMS, DOWN, "  recovered_within: 2m\n  steady_state: {open_incidents: 0}"
)


def test_a_steady_state_not_met_before_the_first_fault_fails_early(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    fault = chaos.inject("device-down", "n01-npu2", {"reason": "unhealthy before the run"})
    wait_for(lambda: _open_incidents(supernode), within_emulated_s=60)
    result = _run(chaos, tmp_path, STEADY)
    chaos.clear(fault.id)
    assert not result.ok, "\n".join(summary_lines(result))
    (check,) = result.verdict.checks
    assert check.name == "steady_state_before"
    assert check.detail.startswith(f"{STEADY_BEFORE}: open incidents: ")
    assert "n01-npu2" in check.detail
    assert result.observations.injections == []  # nothing was put to the test
    _settled(supernode, wait_for)


def test_its_twin_on_a_healthy_cluster_passes_before_and_after(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    result = _run(chaos, tmp_path, STEADY)
    assert result.ok, "\n".join(summary_lines(result))
    names = [c.name for c in result.verdict.checks]
    assert names[0] == "steady_state_before" and "steady_state_after" in names


# --- a run whose emulated time stops ends with an error saying where, never hangs ----------------

STALL = _scenario("stall", EMS, "{id: down, at: 0s, fault: device-down, target: {npu: n00-npu3}, "
                  "duration: 30s}", "  lost_objects: 0", top="duration: 1m\n")  # fmt: skip


def _run_limited(supernode: RunningSupernode, limit_s: float, *, hold: bool) -> RunResult:
    scenario = files.parse_text(STALL)

    async def go(c: Clients) -> RunResult:
        options = RunOptions(wall_limit_s=limit_s)
        if not hold:
            return await run_scenario(c, scenario, options)
        async with held_time(c.topology, name="test-stall") as held:
            assert held
            return await run_scenario(c, scenario, options)

    return supernode.call(go)


def test_a_stalled_run_is_deadline_exceeded_naming_what_it_waited_in(
    supernode: RunningSupernode,
) -> None:
    # emulated time held at min_rate (0.01): the fault goes in at once, and its clearance at
    # 30 s would come after 50 wall minutes
    with pytest.raises(DeadlineExceededError) as raised:
        _run_limited(supernode, 8.0, hold=True)
    assert raised.value.reason == "CHAOS_RUN_STALLED"
    assert "did not end within 8 wall s" in str(raised.value)
    assert "_sleep_until" in str(raised.value), str(raised.value)
    # what it injected is not left behind: the stopped run cleared it
    assert not supernode.call(faults.list_all)


def test_its_twin_the_same_run_with_time_moving_ends_with_its_verdict(
    supernode: RunningSupernode,
) -> None:
    result = _run_limited(supernode, 300.0, hold=False)
    assert result.ok, "\n".join(summary_lines(result))


# --- a bound too short, no spares, both replicas, every plane -----------------------------------

CRASH = "{id: crash, at: 5s, fault: crash, target: {npu: random in job %s}}"


@pytest.mark.parametrize(("bound", "passes"), [("5s", False), ("10m", True)])
def test_a_recovery_bound_shorter_than_the_recovery_fails_and_its_twin_passes(
    chaos: Chaos, tmp_path: Path, bound: str, passes: bool
) -> None:
    """The same crash and restore judged against 5 s and against 10 minutes: a restore from a
    checkpoint on a spare takes tens of emulated seconds, so only the bound decides (the run
    watches no longer than its bound allows: past 5 s the crash is not restored yet)."""
    name = f"bound-{bound}"
    text = _scenario(name, TRAINING % name, CRASH % name, f"  recovered_within: {bound}")
    result = _run(chaos, tmp_path, text)
    assert result.ok is passes, "\n".join(summary_lines(result))
    (crash,) = result.recoveries
    assert crash.detected
    if passes:
        assert crash.status == "recovered" and crash.recovery_s is not None
        assert crash.recovery_s > 5.0  # so the 5 s bound cannot hold
    else:
        assert crash.recovery_s is None or crash.recovery_s > 5.0, crash
        check = _failed(result)["recovered_within"]
        assert f"crash (crash {crash.injection.target}): " in check.detail, check.detail


def _spares(supernode: RunningSupernode, count: int | None) -> int:
    """The scheduler's spare target, set to `count` (None: only read); the one before."""

    async def go(c: Clients) -> int:
        before = await c.scheduler().GetSpares(scheduler_pb2.GetSparesRequest())
        if count is not None:
            await c.scheduler().SetSpares(scheduler_pb2.SetSparesRequest(count=count))
        return int(before.target)

    return supernode.call(go)


@OWN  # its unrecoverable incident stays open: the module's other runs assume none
def test_a_crash_with_no_spare_left_is_unrecoverable_and_fails(
    supernode: RunningSupernode, chaos: Chaos, tmp_path: Path
) -> None:
    """No spare to replace the crashed NPU of a job: the manager's Replace is refused, the
    incident is unrecoverable, and the verdict says so (its twin with spares: the pair above)."""
    kept = _spares(supernode, 0)
    try:
        name = "no-spares"
        # observed 2 minutes, not the bound's 10 (its horizon otherwise): the Replace the
        # manager asks once it has found the crash (three missed heartbeats, 15 s) is refused at
        # once, and an unrecoverable fault is late whenever the run ends
        text = _scenario(name, TRAINING % name, CRASH % name, "  recovered_within: 10m",
                         top="duration: 2m\n")  # fmt: skip
        result = _run(chaos, tmp_path, text)
    finally:
        _spares(supernode, kept)
    assert not result.ok, "\n".join(summary_lines(result))
    (crash,) = result.recoveries
    assert crash.unrecoverable and crash.recovery_s is None, crash
    check = _failed(result)["recovered_within"]
    assert "unrecoverable" in check.detail, check.detail


POOLS = "{id: %s, at: 5s, fault: pool-loss, target: {mempool: %s}, duration: 20s}"


@pytest.mark.parametrize(
    ("pools", "passes"),
    [pytest.param(("n00-mem", "n01-mem"), False, marks=OWN), (("n00-mem",), True)],
)
def test_both_replicas_lost_loses_objects_and_fails_and_one_pool_loses_none(
    chaos: Chaos, tmp_path: Path, pools: tuple[str, ...], passes: bool
) -> None:
    """EMS keeps two copies, one per pool: losing one pool loses nothing (the other copy serves
    and the sweep copies it again); losing both at once loses what they held."""
    name = f"pools-{len(pools)}"
    steps = "\n  - ".join(POOLS % (f"loss{i}", p) for i, p in enumerate(pools))
    ems = EMS.replace("test/must-fail/", f"test/must-fail/{name}/")
    result = _run(chaos, tmp_path, _scenario(name, ems, steps, "  lost_objects: 0"))
    assert result.ok is passes, "\n".join(summary_lines(result))
    lost = result.observations.lost_objects
    if passes:
        assert lost == 0
    else:
        assert lost is not None and lost > 0
        check = _failed(result)["lost_objects"]
        assert check.measured == f"{lost} of 4", check


@OWN
def test_every_l2_plane_down_and_never_cleared_fails_requests_and_recovery(
    chaos: Chaos, tmp_path: Path
) -> None:
    """All seven L2 sub-planes down for good: requests that cross nodes fail, and nothing
    detects or clears it, so recovery fails too (the shipped l2-plane-loss, one plane for 3
    minutes, is its twin: tests/runtime/chaos/test_shipped.py)."""
    step = "{id: planes, at: 10s, fault: switch-down, target: {plane: random 7}}"
    expect = "  recovered_within: 10m\n  failed_requests: 0"
    result = _run(chaos, tmp_path, _scenario("planes", SERVING, step, expect, top=PACED))
    assert not result.ok, "\n".join(summary_lines(result))
    failed = _failed(result)
    assert "failed_requests" in failed and "recovered_within" in failed, failed
    assert NEVER_DETECTED in failed["recovered_within"].detail
