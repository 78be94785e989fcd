"""The control plane as a chaos target (issue 20 item 4): the `service` selector and its bad
inputs, service-kill and service-hang against a live in-process cm-mini (a real call fails
while the service is down and succeeds once it is back), their way into the procs and other
launchers, and the verdict: a training job whose NPU crashes while the cluster manager is down
for good FAILS, saying the fault was never detected because the controller was down; its twin,
the manager down for 20 s and back before the crash, PASSES.

One emulator for the module (`fresh="module"`: a killed manager must not leak into other
modules' runs), at a high time scale: each test takes seconds."""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.client import faults
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.errors import decode
from cmemu.emulator.client.faultkinds import process
from cmemu.emulator.client.faultkinds.process import Process, ProcessTable
from cmemu.emulator.model.chaos.observed import Injection, Observations
from cmemu.emulator.model.chaos.recovery import (
    CAUSE_SLACK_NS,
    CONTROLLER_DOWN,
    NEVER_DETECTED,
    SERVICE_BACK,
    recoveries,
)
from cmemu.emulator.model.chaos.selectors import NO_PLACEMENT, parse_selector, resolve
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor
from cmemu.emulator.runtime.chaos import files, kinds
from cmemu.v1 import (
    device_pb2,
    fabric_pb2,
    faultparams_pb2,
    manager_pb2,
    router_pb2,
    scheduler_pb2,
    ub_pb2,
)
from tests.runtime.chaos.fresh import judged

pytestmark = pytest.mark.supernode(
    preset="cm-mini", mode="inprocess", time_scale=50, fresh="module"
)

CALL_WALL_S = 3.0  # a call's deadline: a hung service answers none of them


async def _answers(call: Awaitable[object]) -> str:
    """A real call to a service: "ok", or the status code it failed with."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "ok"


async def _scheduler_up(c: Clients) -> str:
    request = scheduler_pb2.ListAllocationsRequest()
    return await _answers(c.scheduler().ListAllocations(request, timeout=CALL_WALL_S))


async def _manager_up(c: Clients) -> str:
    request = manager_pb2.ListIncidentsRequest()
    return await _answers(c.manager().ListIncidents(request, timeout=CALL_WALL_S))


async def _router_up(c: Clients) -> str:
    request = router_pb2.ListDeploymentsRequest()
    return await _answers(c.router().ListDeployments(request, timeout=CALL_WALL_S))


# --- the selector ---------------------------------------------------------------------------------


def test_a_service_selector_names_a_service_and_a_misspelt_one_lists_them() -> None:
    assert parse_selector({"service": "manager"}, "steps[0].target").literal == "manager"
    with pytest.raises(InvalidArgumentError) as bad:
        parse_selector({"service": "manger"}, "steps[0].target")
    assert str(bad.value) == (
        "steps[0].target.service: unknown service 'manger'; "
        "known: fabric, ems, scheduler, router, manager, gateway"
    )
    with pytest.raises(InvalidArgumentError, match="a service is named, or 'random'"):
        parse_selector({"service": "random in job pretrain"}, "steps[0].target")


def test_a_scenario_file_with_a_bad_service_is_a_load_error_with_its_path() -> None:
    text = (
        "version: 1\nname: x\nworkloads: {}\nsteps:\n"
        "  - {id: k, at: 1s, fault: service-kill, target: {service: %s}}\n"
        "expect:\n  recovered_within: 1m\n"
    )
    assert files.parse_text(text % "scheduler").steps[0].target.literal == "scheduler"
    with pytest.raises(InvalidArgumentError, match=r"steps\[0\]\.target\.service: unknown service"):
        files.parse_text(text % "sched")


def test_a_service_the_supernode_does_not_run_is_not_found_naming_its_services(
    supernode: RunningSupernode,
) -> None:
    topology = supernode.topology  # cm-mini: one supernode, no scale-out gateway
    rng = random.Random(1)
    assert resolve(parse_selector({"service": "ems"}, "t"), topology, NO_PLACEMENT, rng) == ["ems"]
    with pytest.raises(NotFoundError) as missing:
        resolve(parse_selector({"service": "gateway"}, "t"), topology, NO_PLACEMENT, rng)
    assert "no service 'gateway' in cm-mini; its services: fabric, ems" in str(missing.value)
    assert missing.value.reason == "SERVICE_NOT_FOUND"


def test_service_kill_of_a_device_or_a_missing_service_is_not_found(chaos: Chaos) -> None:
    for target in ("n00-npu0", "gateway"):
        with pytest.raises(NotFoundError, match="its services: fabric, ems") as missing:
            chaos.inject("service-kill", target)
        assert missing.value.reason == "SERVICE_NOT_FOUND"
    with pytest.raises(InvalidArgumentError, match="needs a target"):
        chaos.inject("service-hang", "")


async def _transfer(c: Clients) -> str:
    """A real UB write from n00-npu0 into n00-npu1's HBM through the bus: the fabric times it
    (in process the device reaches the fabric's engine directly, not through its server)."""
    region = await c.device("n00-npu1").AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 20, label="fabric down"), timeout=CALL_WALL_S
    )
    try:
        dst = next(d for d in c.topology.devices if d.id == "n00-npu1")
        tx = ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            size=1 << 20,
            size_only=True,
            dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
        )
        return await _answers(c.bus("n00-npu0").Submit(tx, timeout=CALL_WALL_S))  # fmt: skip
    finally:
        await c.device("n00-npu1").FreeRegion(
            device_pb2.FreeRegionRequest(region_id=region.region_id), timeout=CALL_WALL_S
        )


async def _fabric_up(c: Clients) -> str:
    return await _answers(
        c.fabric().ListFaults(fabric_pb2.ListFaultsRequest(), timeout=CALL_WALL_S)
    )


async def _clock_told(c: Clients) -> str:
    return await _answers(c.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=CALL_WALL_S))


@pytest.mark.parametrize(
    ("kind", "refused"), [("service-kill", "UNAVAILABLE"), ("service-hang", "DEADLINE_EXCEEDED")]
)
def test_the_fabric_down_in_process_cuts_the_data_path_and_keeps_telling_the_time(
    supernode: RunningSupernode, chaos: Chaos, kind: str, refused: str
) -> None:
    """In one process the devices reach the fabric's engine directly: a fabric down must cut
    them off too (a transfer fails), its server refuses or ignores its callers, and the
    emulator's time (its clock calls) goes on; cleared, the same transfer succeeds."""
    assert supernode.call(_transfer) == "ok"
    fault = chaos.inject(kind, "fabric")
    assert supernode.call(_transfer) == refused
    assert supernode.call(_fabric_up) == refused
    assert supernode.call(_clock_told) == "ok"
    chaos.clear(fault.id)
    assert supernode.call(_transfer) == "ok"
    assert supernode.call(_fabric_up) == "ok"


@pytest.mark.parametrize(
    ("service", "code", "reason"),
    [
        ("nope", "INVALID_ARGUMENT", "INVALID_FAULT_PARAM"),
        ("gateway", "FAILED_PRECONDITION", "SERVICE_NOT_IN_PROCESS"),  # one supernode: none
    ],
)
def test_the_device_path_refuses_a_bad_service_with_its_reason(
    supernode: RunningSupernode, service: str, code: str, reason: str
) -> None:
    """What `cmemu fault` or any gRPC client may send to a device directly: the kind the
    service faults travel as, with a service the process cannot act on."""

    async def inject(c: Clients) -> tuple[str, str]:
        request = device_pb2.FaultState(
            kind="service-down", service_down=faultparams_pb2.ServiceDownParams(service=service)
        )
        try:
            await c.device("n00-npu0").InjectFault(request, timeout=CALL_WALL_S)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name, decode(exc).reason or ""
        return "OK", ""

    assert supernode.call(inject) == (code, reason)


# --- kill and hang, in process --------------------------------------------------------------------


def test_a_killed_scheduler_refuses_calls_until_cleared_then_serves_its_state_again(
    supernode: RunningSupernode, chaos: Chaos
) -> None:
    assert supernode.call(_scheduler_up) == "ok"
    fault = chaos.inject("service-kill", "scheduler")
    assert (fault.kind, fault.target) == ("service-kill", "scheduler")
    # listed as it was added (once as `service-down` of the device that carries it in process)
    (listed,) = [f for f in supernode.call(faults.list_all) if f.id == fault.id]
    assert (listed.kind, listed.target) == ("service-kill", "scheduler"), listed
    assert listed.detail.startswith("through ")
    assert supernode.call(_scheduler_up) == "UNAVAILABLE"
    assert supernode.call(_manager_up) == "ok"  # only the target is down
    with pytest.raises(PreconditionError, match="down already") as twice:
        chaos.inject("service-hang", "scheduler")
    assert twice.value.reason == "FAULT_ALREADY_ACTIVE"
    chaos.clear(fault.id)
    assert supernode.call(_scheduler_up) == "ok"


def test_a_hung_router_accepts_and_answers_nothing_until_cleared(
    supernode: RunningSupernode, chaos: Chaos
) -> None:
    assert supernode.call(_router_up) == "ok"
    fault = chaos.inject("service-hang", "router")
    assert supernode.call(_router_up) == "DEADLINE_EXCEEDED"
    chaos.clear(fault.id)
    assert supernode.call(_router_up) == "ok"


def test_a_kill_with_a_duration_comes_back_by_itself_in_emulated_time(
    supernode: RunningSupernode, chaos: Chaos, wait_for: WaitFor
) -> None:
    chaos.inject("service-kill", "manager", duration_s=60.0)  # 1.2 wall s
    assert supernode.call(_manager_up) == "UNAVAILABLE"
    wait_for(lambda: supernode.call(_manager_up) == "ok", within_emulated_s=300)


def _scheduler_call_emulated_s(supernode: RunningSupernode) -> float:
    """How long one scheduler call takes in emulated time (the fabric's clock either side)."""

    async def timed(c: Clients) -> float:
        clock = c.fabric()
        before = (await clock.GetClock(fabric_pb2.GetClockRequest(), timeout=30)).emulated_ns
        await c.scheduler().ListAllocations(scheduler_pb2.ListAllocationsRequest(), timeout=60)
        after = (await clock.GetClock(fabric_pb2.GetClockRequest(), timeout=30)).emulated_ns
        return (after - before) / 1e9

    return supernode.call(timed)


def test_a_slow_scheduler_answers_latency_ms_of_emulated_time_late_until_cleared(
    supernode: RunningSupernode, chaos: Chaos
) -> None:
    fault = chaos.inject("service-slow", "scheduler", {"latency_ms": 60_000})
    assert _scheduler_call_emulated_s(supernode) >= 60.0
    chaos.clear(fault.id)
    assert _scheduler_call_emulated_s(supernode) < 60.0


@pytest.mark.parametrize(
    ("params", "message"),
    [({}, "latency_ms"), ({"latency_ms": 0}, "latency_ms"), ({"delay": 5}, "delay")],
)
def test_service_slow_params_are_checked_before_anything_is_sent(
    chaos: Chaos, params: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        chaos.inject("service-slow", "scheduler", params)


# --- the other launchers --------------------------------------------------------------------------


def _with_table(supernode: RunningSupernode, table: ProcessTable, kind: str) -> object:
    params = kinds.checkers()[kind]({"latency_ms": 5} if kind == "service-slow" else {})

    async def go(c: Clients) -> object:
        process.attach_processes(c, table)
        try:
            return await kinds.inject(c, kind, "manager", params, None)
        except PreconditionError as exc:
            return exc

    return supernode.call(go)


def test_in_procs_mode_a_service_kill_is_the_kill_of_its_process(
    supernode: RunningSupernode,
) -> None:
    """A real process stands for the manager's: the kind SIGKILLs the process the launcher's
    table says hosts `manager`, and nothing else."""
    with subprocess.Popen(["sleep", "60"]) as manager, subprocess.Popen(["sleep", "60"]) as other:
        table = ProcessTable(
            mode="procs",
            processes={
                "svc-manager": Process(name="svc-manager", pid=manager.pid, servers=("manager",)),
                "svc-router": Process(name="svc-router", pid=other.pid, servers=("router",)),
            },
        )
        fault = _with_table(supernode, table, "service-kill")
        assert getattr(fault, "id", None) == "proc:svc-manager:process-kill", fault
        assert manager.wait(timeout=10) == -9
        assert other.poll() is None
        other.kill()


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("k8s", "service-hang"), ("procs", "service-slow"), ("procs", "service-partition")],
)
def test_a_launcher_it_has_no_way_into_is_refused_naming_the_mode(
    supernode: RunningSupernode, mode: str, kind: str
) -> None:
    refused = _with_table(supernode, ProcessTable(mode=mode), kind)
    assert isinstance(refused, PreconditionError), refused
    assert refused.reason == "LAUNCHER_UNSUPPORTED"
    assert f"a {mode} launch" in str(refused)


# --- the verdict: what a lost controller means ----------------------------------------------------


def _scenario(
    name: str, kill: str, crash_at: str, duration: str, kind: str = "service-kill"
) -> str:
    return (
        f"version: 1\nname: {name}\nseed: 1\nduration: {duration}\n"
        f"workloads:\n  training: [{{name: {name}, npus: 2, checkpoint_every: 5}}]\n"
        "steps:\n"
        f"  - {{id: ctl, at: 1s, fault: {kind}, target: {{service: manager}}{kill}}}\n"
        f"  - {{id: crash, at: {crash_at}, fault: crash, target: {{npu: random in job {name}}}}}\n"
        "expect:\n  recovered_within: 2m\n"
    )


def _inj(label: str, kind: str, target: str, at_s: float, cleared_s: float | None) -> Injection:
    return Injection(
        label=label, kind=kind, target=target, devices=(), at_ns=int(at_s * 1e9),
        cleared_ns=None if cleared_s is None else int(cleared_s * 1e9),
        fault_id=f"id-{label}",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("down", "crash_at_s", "status"),
    [
        (("manager", 5.0, 20.0), 10.0, f"{CONTROLLER_DOWN} (ctl service-kill from 5.0s to 20.0s)"),
        (
            ("manager", 5.0, None),
            10.0,
            f"{CONTROLLER_DOWN} (ctl service-kill from 5.0s to the end)",
        ),
        (("manager", 5.0, 20.0), 30.0, NEVER_DETECTED),  # back before: its own failure to detect
        (("router", 5.0, None), 10.0, NEVER_DETECTED),  # the router detects nothing
    ],
)
def test_an_undetected_fault_blames_the_manager_only_while_it_was_down(
    down: tuple[str, float, float | None], crash_at_s: float, status: str
) -> None:
    service, at_s, back_s = down
    obs = Observations(start_ns=0, end_ns=int(60e9))
    obs.injections = [
        _inj("ctl", "service-kill", service, at_s, back_s),
        _inj("crash", "crash", "n00-npu1", crash_at_s, None),
    ]
    ctl, crash = recoveries(obs)
    assert crash.status == status
    assert ctl.status == (SERVICE_BACK if back_s is not None else "never back: down to the end")


def test_the_manager_back_before_the_crash_lets_the_job_recover_and_passes(
    chaos: Chaos, tmp_path: Path
) -> None:
    result = judged(
        lambda: chaos.run(_load(tmp_path, _scenario("ctl-back", ", duration: 20s", "30s", "4m")))
    )
    assert result.ok, "\n".join(summary_lines(result))
    ctl, crash = result.recoveries
    assert ctl.status == SERVICE_BACK and ctl.recovery_s is not None
    assert 19.0 <= ctl.recovery_s <= 25.0
    assert crash.detected and crash.status == "recovered", crash


@pytest.mark.parametrize("kind", ["service-kill", "service-partition"])
def test_a_crash_while_the_manager_is_down_is_detected_once_it_is_back_and_recovers(
    chaos: Chaos, tmp_path: Path, kind: str
) -> None:
    """A killed manager detects nothing while it is down (its liveness watch stopped with it),
    and judges the crashed NPU on the first beats of its new streams; a partitioned one gets no
    beat across the partition, and judges it on the first after it heals."""
    down_s = 30
    scenario = _scenario("ctl-late", f", duration: {down_s}s", "10s", "4m", kind)
    result = judged(lambda: chaos.run(_load(tmp_path, scenario)))
    assert result.ok, "\n".join(summary_lines(result))
    ctl, crash = result.recoveries
    assert ctl.injection.cleared_ns is not None and crash.detected_ns is not None
    # The fault's own process ends it `down_s` after it took it, and it took it no earlier
    # than the runner's reading just before asking (`at_ns`): the manager is back no earlier
    # than that (the two clocks: CAUSE_SLACK_NS). The runner's recorded clearance is no bound:
    # on a busy host it is read late, after a manager already back has detected the crash.
    back_ns = ctl.injection.at_ns + down_s * 1_000_000_000 - CAUSE_SLACK_NS
    assert crash.detected_ns >= back_ns, "\n".join(summary_lines(result))
    assert crash.status == "recovered"


@pytest.mark.parametrize("kind", ["service-kill", "service-partition"])
def test_the_manager_down_for_the_whole_run_leaves_the_crash_undetected_and_fails(
    chaos: Chaos, tmp_path: Path, kind: str
) -> None:
    """Killed, or cut off the network while it runs on: either way it sees no crash."""
    result = judged(
        lambda: chaos.run(_load(tmp_path, _scenario("ctl-lost", "", "10s", "1m", kind)))
    )
    assert not result.ok, "\n".join(summary_lines(result))
    check = {c.name: c for c in result.verdict.checks if not c.ok}["recovered_within"]
    crashed = result.recoveries[1].injection.target
    why = rf"{CONTROLLER_DOWN} \(ctl {kind} from [0-9.]+s to the end\)"
    assert re.search(rf"crash \(crash {crashed}\): {why}", check.detail), check.detail
    assert f"ctl ({kind} manager): never back: down to the end" in check.detail
    assert not any(r.detected for r in result.recoveries)
    # the run brought the manager back before reading the job's records: they were read
    assert [t.name for t in result.observations.training] == ["ctl-lost"]


def _load(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path
