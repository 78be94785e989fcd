"""In one process the scheduler's day plans reach the router's serving engine and the training
engine directly (services/peers.py `day_serving`, `day_training`: LocalDayServing,
LocalDayTraining), never through their gRPC servers: a whole day, night and morning runs while
both servers refuse every call, which the plan's gRPC peers meet at once (the twin). A refusal
is the same error class, reason and message both ways; a killed router or manager refuses both
ways UNAVAILABLE (through their outages), and answers again once back. The tokens a plan counts
are the count GetUsage reports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from cmemu.emulator.client.dayplan import RemoteDayServing, RemoteDayTraining
from cmemu.emulator.engines.dayplan import DayServing, DayTraining
from cmemu.emulator.engines.scheduler.dayplans import DayPlanAsk
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.engines.serving.local import LocalDayServing
from cmemu.emulator.engines.training.local import LocalDayTraining
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.testing import Supernode, running_supernode
from cmemu.services.daypeers import DayServingOf, DayTrainingOf
from cmemu.services.manager import ManagerService
from cmemu.services.router import RouterState
from cmemu.v1 import router_pb2
from tests.engines.scheduler.test_local_peers import _killed_refuses_both_ways, _refusal, _same
from tests.services.test_dayplan import _complete

PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
    training=replace(DEFAULT_PROFILE.training, restart_s=5.0),
)
DAY_SPEC = {"model": "deepseek-r1", "decode": {"npus": 4}, "prefill": {"instances": 1, "npus": 2}}
JOB = TrainingSpec(name="night-job", npus=2, checkpoint_every=2)
ASK = DayPlanAsk(name="local", deployment="chat", job=JOB, night="1-4", hour_s=30.0,
                 start_hour=0.0, hours=5.0, night_decode_npus=2, drain_s=0.0)  # fmt: skip
WAIT_EMULATED_S = 600.0  # the plan is 5 plan hours of 30 emulated s


@pytest.fixture(scope="module")
async def sn() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=50.0, profile=PROFILE) as supernode:
        await supernode.clients.router().Deploy(
            router_pb2.DeployRequest(name="chat", spec_yaml=json.dumps(DAY_SPEC), wait=True)
        )
        yield supernode


def _hosted(sn: Supernode) -> tuple[SchedulerEngine, RouterState, ManagerService]:
    scheduler = sn.local.service_state(ServiceKind.SCHEDULER)
    router = sn.local.service_state(ServiceKind.ROUTER)
    manager = sn.local.service_state(ServiceKind.MANAGER)
    assert isinstance(scheduler, SchedulerEngine) and isinstance(router, RouterState)
    assert isinstance(manager, ManagerService)
    return scheduler, router, manager


def _peers(sn: Supernode) -> tuple[DayServing, DayTraining, RemoteDayServing, RemoteDayTraining]:
    """The day plans' peers as the scheduler of this process resolves them, and the gRPC ones."""
    scheduler, _, _ = _hosted(sn)
    assert scheduler.days is not None
    serving, training = scheduler.days.serving, scheduler.days.training
    assert isinstance(serving, DayServingOf) and isinstance(training, DayTrainingOf)
    channel = sn.clients.channel_to
    return (
        serving.resolve(),
        training.resolve(),
        RemoteDayServing(channel(sn.topology.service(ServiceKind.ROUTER).address)),
        RemoteDayTraining(channel(sn.topology.service(ServiceKind.MANAGER).address)),
    )


@contextmanager
def _servers_refusing(sn: Supernode) -> Iterator[None]:
    """The router's and the manager's gRPC servers refuse every call (UNAVAILABLE at once, as a
    closed port), their engines running on and their outages untouched."""
    hosts = [sn.local.services[kind][1] for kind in (ServiceKind.ROUTER, ServiceKind.MANAGER)]
    for host in hosts:
        host.gate.refusing = "refused by the test: no day plan call may come through here"
    try:
        yield
    finally:
        for host in hosts:
            host.gate.refusing = ""


async def test_in_one_process_the_day_plans_peers_are_the_engines(sn: Supernode) -> None:
    _, router, manager = _hosted(sn)
    serving, training, _, _ = _peers(sn)
    assert isinstance(serving, LocalDayServing) and serving.engine is router.engine
    assert isinstance(training, LocalDayTraining) and training.engine is manager.training
    assert manager.outage is manager.training.outage  # what a service fault sets


async def test_a_day_and_a_night_run_with_the_routers_and_managers_servers_refusing(
    sn: Supernode,
) -> None:
    scheduler, _, _ = _hosted(sn)
    _, _, remote_serving, remote_training = _peers(sn)
    assert sn.time is not None
    clock = sn.time.clock
    with _servers_refusing(sn):
        # the twin: what a plan over gRPC would meet now, at its first call
        for refused in (
            await _refusal(remote_serving.spec("chat")),
            await _refusal(remote_training.progress(JOB.name)),
        ):
            assert isinstance(refused, UnavailableError), refused
        runner = await scheduler.start_day_plan(ASK)
        deadline = clock.now_ns() + WAIT_EMULATED_S * 1e9
        while not runner.status.ended:
            await scheduler.day_plan("local")  # its figures refreshed: the peers asked again
            assert clock.now_ns() < deadline, runner.status
            await asyncio.sleep(0.02)
        status = runner.status
        assert status.state == "done", status.error
        assert [s.to for s in status.switches] == ["training", "serving"]
        assert [p.kind for p in status.periods] == ["day", "night", "day"]
        assert status.periods[1].training_steps > 0 and status.training_steps > 0, status.periods
    # back on the wire: the deployment serves on its day footprint, the job stopped
    assert await remote_serving.spec("chat") == (runner.day_yaml, 6)
    assert (await remote_training.progress(JOB.name))[0] == "stopped"


async def test_the_tokens_a_plan_counts_are_the_count_getusage_reports(sn: Supernode) -> None:
    local, _, remote, _ = _peers(sn)
    before = await local.served_tokens()
    assert await remote.served_tokens() == before
    served = await _complete(sn, 8)
    assert served == 8
    # the twin: the count moved, by the response's usage, and both read it moved
    assert await local.served_tokens() == before + served == await remote.served_tokens()


async def test_a_refusal_is_the_same_error_both_ways_and_a_kill_refuses_both(
    sn: Supernode,
) -> None:
    serving, training, remote_serving, remote_training = _peers(sn)
    _same(await _refusal(serving.spec("ghost")), await _refusal(remote_serving.spec("ghost")))
    _same(
        await _refusal(training.stop("ghost", checkpoint=True)),
        await _refusal(remote_training.stop("ghost", checkpoint=True)),
    )
    assert await training.progress("ghost") == await remote_training.progress("ghost") == ("", 0)
    scheduler, _, _ = _hosted(sn)
    ghost_plan = replace(ASK, name="ghost", deployment="ghost")  # its first call: spec("ghost")
    asks = (
        lambda: serving.spec("ghost"),
        lambda: remote_serving.spec("ghost"),
        lambda: scheduler.start_day_plan(ghost_plan),  # the plan's own refusal, killed or not
    )
    await _killed_refuses_both_ways(sn, "router", asks, "DEPLOYMENT_NOT_FOUND")
    stops = (
        lambda: training.stop("ghost", checkpoint=False),
        lambda: remote_training.stop("ghost", checkpoint=False),
    )
    await _killed_refuses_both_ways(sn, "manager", stops, "JOB_NOT_FOUND")
