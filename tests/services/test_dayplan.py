"""Serve by day, train by night, live (issue 24 item 5): the scheduler's day plan on a real
in-process cm-mini at a high time scale, through real gRPC and the OpenAI endpoint. A compressed
day (8 emulated seconds per plan hour) with two nights: the deployment shrinks at nightfall and
comes back in the morning; the training job steps only at night and resumes from its EMS
checkpoint on the second night; the tokens served by day are the responses' usage. The twin: a
night that never comes moves nothing and trains nothing. Every assertion is in emulated time."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import grpc
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2, scheduler_pb2, training_pb2
from tests.runtime.test_mqtt import listening
from tests.services.test_serving_recovery import _complete as _complete_streamed

PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
    training=replace(DEFAULT_PROFILE.training, restart_s=5.0),
)
TIME_SCALE = 50.0
DAY_SPEC = {"model": "deepseek-r1", "decode": {"npus": 4}, "prefill": {"instances": 1, "npus": 2}}
HOUR_S = 8.0  # emulated seconds per plan hour
WAIT_EMULATED_S = 1200.0  # the whole plan is 36 plan hours of 8 s
JOB = training_pb2.TrainingSpec(name="night-job", npus=2, checkpoint_every=2)


def plan(**changes: Any) -> scheduler_pb2.StartDayPlanRequest:
    """Day 17-18 and 10-18, nights 18-10: from plan hour 17 to 53 two nights, the second cut
    short at the end (its job stopped with a checkpoint, serving back)."""
    fields: dict[str, Any] = {
        "deployment": "chat",
        "night_decode_npus": 2,
        "training": JOB,
        "night": "18-10",
        "hour_s": HOUR_S,
        "start_hour": 17,
        "hours": 36,
        **changes,
    }
    return scheduler_pb2.StartDayPlanRequest(**fields)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker() as running:
        yield running


@pytest.fixture
async def sn(broker: Broker) -> AsyncIterator[Supernode]:
    async with running_supernode(
        "cm-mini", time_scale=TIME_SCALE, profile=PROFILE, broker=broker.url
    ) as supernode:
        await supernode.clients.router().Deploy(
            router_pb2.DeployRequest(name="chat", spec_yaml=json.dumps(DAY_SPEC), wait=True)
        )
        yield supernode


@pytest.fixture(scope="module")
async def shared() -> AsyncIterator[Supernode]:
    """One supernode for the refusals: nothing they send starts a plan."""
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as supernode:
        await supernode.clients.router().Deploy(
            router_pb2.DeployRequest(name="chat", spec_yaml=json.dumps(DAY_SPEC), wait=True)
        )
        yield supernode


async def _complete(sn: Supernode, max_tokens: int) -> int:
    """One completion through the OpenAI endpoint: its usage's completion tokens."""
    http = sn.topology.service(ServiceKind.ROUTER).http_address
    body = {"model": "chat", "prompt": "good morning", "max_tokens": max_tokens,
            "ignore_eos": True}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{http}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        return int((await response.json())["usage"]["completion_tokens"])


async def _status(sn: Supernode, name: str = "chat") -> scheduler_pb2.DayPlan:
    return await sn.clients.scheduler().GetDayPlan(scheduler_pb2.DayPlanRequest(name=name))


async def _until(
    sn: Supernode, check: Callable[[scheduler_pb2.DayPlan], bool], *, name: str = "chat"
) -> scheduler_pb2.DayPlan:
    """Poll the plan until `check` holds, within an emulated deadline (the supernode's own
    clock, which a busy host slows as much as it slows this test)."""
    assert sn.time is not None
    clock = sn.time.clock
    deadline = clock.now_ns() + WAIT_EMULATED_S * 1e9
    while True:
        status = await _status(sn, name)
        if check(status):
            return status
        assert clock.now_ns() < deadline, f"not within {WAIT_EMULATED_S} emulated s: {status}"
        await asyncio.sleep(0.02)


async def _until_ended(sn: Supernode, seen: list[tuple[str, int]]) -> scheduler_pb2.DayPlan:
    """Poll the plan until it ends, noting the deployment's NPUs in each state it was in."""
    router = sn.clients.router()
    assert sn.time is not None
    deadline = sn.time.clock.now_ns() + WAIT_EMULATED_S * 1e9
    while True:
        status = await _status(sn)
        if status.state in ("done", "stopped", "failed"):
            return status
        if status.state in ("day", "night"):
            d = await router.GetDeployment(router_pb2.GetDeploymentRequest(name="chat"))
            if d.state == router_pb2.DEPLOYMENT_STATE_SERVING:
                seen.append((status.state, d.npus))
        assert sn.time.clock.now_ns() < deadline, status
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_a_compressed_day_shrinks_serving_at_night_and_trains_on_the_npus(
    sn: Supernode, broker: Broker
) -> None:
    seen: list[tuple[str, int]] = []
    async with listening(broker.url) as listener:
        await sn.clients.scheduler().StartDayPlan(plan())
        # the second day (plan hours 34-42): requests served while it lasts
        await _until(sn, lambda s: len(s.switches) >= 2)
        served = sum(await asyncio.gather(*(_complete(sn, 8) for _ in range(4))))
        now = await _status(sn)  # still the same day (5 plan hours at least: 40 emulated s)
        assert now.state == "day" and len(now.switches) == 2
        status = await _until_ended(sn, seen)
        await listener.wait_for(lambda: len(listener.events("day-switch")) == 4, within_s=30)
        switches = listener.events("day-switch")

    assert status.state == "done", status.error
    # nightfall 18, morning 34 (10 the next day), nightfall 42, the end at 53
    assert [s.to for s in status.switches] == ["training", "serving", "training", "serving"]
    assert [round(s.plan_hour) for s in status.switches] == [18, 34, 42, 53]
    assert all(s.npus == 2 and s.duration_ns > 0 for s in status.switches)
    assert [e["to"] for e in switches] == [s.to for s in status.switches]
    assert [e["at_ns"] for e in switches] == [s.at_ns for s in status.switches]
    # a switch to serving waits for the checkpoint and the weights from EMS (4 s)
    assert all(s.duration_ns >= 4e9 for s in status.switches if s.to == "serving")
    # the footprint: 6 NPUs by day, 4 at night
    assert {npus for state, npus in seen if state == "day"} == {6}
    assert {npus for state, npus in seen if state == "night"} == {4}

    kinds = [p.kind for p in status.periods]
    assert kinds == ["day", "night", "day", "night", "day"]
    periods = status.periods  # they tile the plan, each from its switch's start
    assert [p.start_ns for p in periods[1:]] == [s.at_ns for s in status.switches]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(periods))
    night1, night2 = status.periods[1], status.periods[3]
    assert night1.training_steps > 0 and night2.training_steps > 0
    assert all(p.training_steps == 0 for p in status.periods if p.kind == "day")
    # the second night resumed from the first's checkpoint (stopped with one in the morning)
    job = await sn.clients.training().Get(training_pb2.TrainingRequest(name="night-job"))
    assert job.state == "stopped" and job.step == status.training_step
    assert job.step == night1.training_steps + night2.training_steps == status.training_steps
    assert job.last_checkpoint_step == job.step
    assert job.last_restored_ns >= status.switches[2].at_ns
    # the tokens: the router's usage, by day; nothing was asked at night
    assert status.served_tokens_day == served == 32
    assert status.periods[2].served_tokens == served and status.served_tokens_night == 0


async def test_its_twin_a_night_that_never_comes_moves_nothing(sn: Supernode) -> None:
    await sn.clients.scheduler().StartDayPlan(
        plan(night="22-6", start_hour=8, hours=10, hour_s=1.0)
    )
    status = await _until(sn, lambda s: s.state in ("done", "failed"))
    assert status.state == "done", status.error
    assert not status.switches and status.training_steps == 0
    assert [p.kind for p in status.periods] == ["day"]
    jobs = await sn.clients.training().List(training_pb2.ListTrainingRequest())
    assert not jobs.jobs
    d = await sn.clients.router().GetDeployment(router_pb2.GetDeploymentRequest(name="chat"))
    assert d.npus == 6 and d.state == router_pb2.DEPLOYMENT_STATE_SERVING


@pytest.mark.parametrize(
    ("changes", "code", "field"),
    [
        ({"deployment": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
        ({"night": "25-7"}, grpc.StatusCode.INVALID_ARGUMENT, "night"),
        ({"night": "7-7"}, grpc.StatusCode.INVALID_ARGUMENT, "night"),
        ({"hour_s": 0.0}, grpc.StatusCode.INVALID_ARGUMENT, "hour_s"),
        ({"start_hour": 24.0}, grpc.StatusCode.INVALID_ARGUMENT, "start_hour"),
        ({"night_decode_npus": 4}, grpc.StatusCode.INVALID_ARGUMENT, "night_decode_npus"),
        ({"training": training_pb2.TrainingSpec()}, grpc.StatusCode.INVALID_ARGUMENT, "training"),
        (
            {"training": training_pb2.TrainingSpec(name="Bad!", npus=2)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "name",
        ),
    ],
)
async def test_bad_plans_are_refused_naming_what(
    shared: Supernode, changes: dict[str, Any], code: grpc.StatusCode, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await shared.clients.scheduler().StartDayPlan(plan(**changes))
    assert err.value.code() == code and field in (err.value.details() or "")


async def test_an_overlapping_plan_is_refused_and_an_unknown_one_not_found(
    sn: Supernode,
) -> None:
    scheduler = sn.clients.scheduler()
    await scheduler.StartDayPlan(plan(hours=0, start_hour=8, night="22-6"))  # until stopped
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scheduler.StartDayPlan(plan(name="other"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "PLAN_OVERLAPS" in str(err.value.trailing_metadata())
    for call in (scheduler.GetDayPlan, scheduler.StopDayPlan):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(scheduler_pb2.DayPlanRequest(name="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await scheduler.StopDayPlan(scheduler_pb2.DayPlanRequest(name="chat"))
    await _until(sn, lambda s: s.state == "stopped")


async def test_a_job_resumes_only_on_as_many_npus_as_it_checkpointed_on(sn: Supernode) -> None:
    training = sn.clients.training()
    spec = training_pb2.TrainingSpec(name="resumable", npus=2, checkpoint_every=100)
    await training.Start(training_pb2.StartTrainingRequest(spec=spec))
    get = training_pb2.TrainingRequest(name="resumable")
    job = await _until_job(sn, lambda j: j.step >= 1)
    await training.Stop(training_pb2.TrainingRequest(name="resumable", checkpoint=True))
    job = await _until_job(sn, lambda j: j.state == "stopped")
    assert job.last_checkpoint_step == job.step >= 1  # written at the stop, not at step 100
    bigger = training_pb2.TrainingSpec(name="resumable", npus=4, resume=True)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await training.Start(training_pb2.StartTrainingRequest(spec=bigger))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "RESUME_MISMATCH" in str(err.value.trailing_metadata())
    spec.resume = True
    resumed = await training.Start(training_pb2.StartTrainingRequest(spec=spec))
    assert resumed.step == job.step  # from its checkpoint, not from 0
    await training.Stop(get)


async def _billed(sn: Supernode) -> int:
    """Completion tokens the router has billed so far, every tenant's."""
    usage = await sn.clients.router().GetUsage(router_pb2.GetUsageRequest())
    return sum(t.completion_tokens for t in usage.tenants)


async def _until_job(sn: Supernode, check: Callable[[Any], bool]) -> Any:
    assert sn.time is not None
    deadline = sn.time.clock.now_ns() + WAIT_EMULATED_S * 1e9
    while True:
        job = await sn.clients.training().Get(training_pb2.TrainingRequest(name="resumable"))
        if check(job):
            return job
        assert sn.time.clock.now_ns() < deadline, job
        await asyncio.sleep(0.02)


async def test_a_night_whose_job_cannot_start_fails_the_plan_and_serves_again(
    sn: Supernode,
) -> None:
    # 16 NPUs: 1 spare, 4 serving at night: 11 free, so a 12-NPU job never fits
    too_big = training_pb2.TrainingSpec(name="night-job", npus=12)
    await sn.clients.scheduler().StartDayPlan(plan(training=too_big, start_hour=17.5, hour_s=2))
    status = await _until(sn, lambda s: s.state in ("done", "failed"))
    assert status.state == "failed" and "11 NPUs free" in status.error, status.error
    assert "not restored" not in status.error
    assert not status.switches  # the nightfall never completed
    assert [p.kind for p in status.periods] == ["day", "night"]
    assert all(p.end_ns for p in status.periods)  # closed with the plan
    d = await sn.clients.router().GetDeployment(router_pb2.GetDeploymentRequest(name="chat"))
    assert d.npus == 6 and d.state == router_pb2.DEPLOYMENT_STATE_SERVING


@pytest.mark.parametrize("drain_s", [120.0, 0.0])
async def test_a_request_in_flight_at_nightfall_finishes_only_with_a_drain(
    sn: Supernode, drain_s: float
) -> None:
    """With a drain the nightfall waits for the request in flight (it finishes whole); without
    one the request ends with the footprint, visibly: the twin. Its 1,000 tokens take tens of
    emulated seconds; the nightfall comes 1 emulated second after the plan starts.

    The router bills a response once it has gone out (its handler's end, on the wall clock), so
    the plan is stopped only after the bill shows: a plan that ended first would rightly not
    count it, and a busy host must not decide which."""
    tokens = 1000
    billed_before = await _billed(sn)
    http = sn.topology.service(ServiceKind.ROUTER).http_address
    request = asyncio.ensure_future(_complete_streamed(f"http://{http}", "chat", "long", tokens))
    stats = router_pb2.GetStatsRequest(name="chat")
    async with asyncio.timeout(60):  # bounds a hung test
        while True:
            if (await sn.clients.router().GetStats(stats)).requests_in_flight:
                break
            await asyncio.sleep(0.02)
    # nightfall 1 emulated s in; the plan would run on into the night for 100 emulated s
    await sn.clients.scheduler().StartDayPlan(
        plan(start_hour=17.9, hour_s=10, hours=10, drain_s=drain_s)
    )
    outcome = await request
    await _until(sn, lambda s: s.state == "night" or bool(s.error))  # polled mid-switch too
    assert sn.time is not None
    deadline = sn.time.clock.now_ns() + WAIT_EMULATED_S * 1e9
    while await _billed(sn) < billed_before + outcome.tokens:
        assert sn.time.clock.now_ns() < deadline, "the response was never billed"
        await asyncio.sleep(0.02)
    await sn.clients.scheduler().StopDayPlan(scheduler_pb2.DayPlanRequest(name="chat"))
    status = await _until(sn, lambda s: s.state in ("stopped", "done", "failed"))
    assert status.state == "stopped", status.error
    # the request's tokens counted once (the router bills an aborted one's too)
    assert status.served_tokens_day + status.served_tokens_night == outcome.tokens
    if drain_s:
        assert (outcome.tokens, outcome.finish, outcome.error) == (tokens, "length", "")
        assert status.switches[0].duration_ns > 1e9  # it waited for the request
    else:
        assert outcome.finish == "abort" and outcome.tokens < tokens, outcome
