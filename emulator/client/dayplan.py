"""Serve by day, train by night over gRPC, both ways round:

- the typed calls a program (or the CLI) makes to the scheduler's day plans: `start_day_plan`,
  `day_plan`, `stop_day_plan`;
- the router and the training jobs as the scheduler's day plan moves NPUs between them: the gRPC
  side of emulator/engines/dayplan.py's DayServing and DayTraining, for a scheduler whose process
  does not host them (services/peers.py gives the engines to one that does).

A failed call raises the EmulatorError its status names, prefixed with the service's name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.training import training_spec
from cmemu.emulator.model.daylive import Switch
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.v1 import (
    router_pb2,
    router_pb2_grpc,
    scheduler_pb2,
    training_pb2,
    training_pb2_grpc,
)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class DayPeriod:
    kind: str  # "day" or "night"
    start_ns: int  # emulated instant it began (its switch's end)
    end_ns: int  # 0 while it lasts
    served_tokens: int  # completion tokens the router's usage counted meanwhile
    training_steps: int  # steps the training job did meanwhile


@dataclass(frozen=True, kw_only=True)
class DayPlan:
    """A day plan as the scheduler reports it (see cmemu.v1.DayPlan for each figure)."""

    name: str
    deployment: str
    training_job: str
    night: str  # the night window in plan hours, START-END
    hour_s: float  # emulated seconds per plan hour
    start_hour: float
    hours: float
    state: str
    plan_hour: float  # the plan clock now
    switches: tuple[Switch, ...]
    periods: tuple[DayPeriod, ...]
    served_tokens_day: int
    served_tokens_night: int
    training_steps: int  # steps done at night, every night together
    training_step: int  # the job's step now
    started_ns: int
    error: str
    night_decode_npus: int
    drain_s: float


def _plan(m: scheduler_pb2.DayPlan) -> DayPlan:
    return DayPlan(
        name=m.name,
        deployment=m.deployment,
        training_job=m.training_job,
        night=m.night,
        hour_s=m.hour_s,
        start_hour=m.start_hour,
        hours=m.hours,
        state=m.state,
        plan_hour=m.plan_hour,
        switches=tuple(
            Switch(
                at_ns=s.at_ns,
                plan_hour=s.plan_hour,
                to=s.to,
                duration_ns=s.duration_ns,
                npus=s.npus,
            )
            for s in m.switches
        ),
        periods=tuple(
            DayPeriod(
                kind=p.kind,
                start_ns=p.start_ns,
                end_ns=p.end_ns,
                served_tokens=p.served_tokens,
                training_steps=p.training_steps,
            )
            for p in m.periods
        ),
        served_tokens_day=m.served_tokens_day,
        served_tokens_night=m.served_tokens_night,
        training_steps=m.training_steps,
        training_step=m.training_step,
        started_ns=m.started_ns,
        error=m.error,
        night_decode_npus=m.night_decode_npus,
        drain_s=m.drain_s,
    )


async def start_day_plan(
    clients: Clients,
    *,
    deployment: str,
    job: TrainingSpec,
    night: str = "22-7",
    hour_s: float = 60.0,
    start_hour: float = 0.0,
    hours: float = 0.0,
    night_decode_npus: int = 0,
    drain_s: float = 0.0,
    name: str = "",
) -> DayPlan:
    """Start a day plan on `deployment` (see cmemu.v1.Scheduler/StartDayPlan): `hour_s`
    emulated seconds per plan hour, `hours` plan hours (0: until stopped)."""
    request = scheduler_pb2.StartDayPlanRequest(
        name=name,
        deployment=deployment,
        night_decode_npus=night_decode_npus,
        training=training_spec(job),
        night=night,
        hour_s=hour_s,
        start_hour=start_hour,
        hours=hours,
        drain_s=drain_s,
    )
    return _plan(await reply_of("scheduler", clients.scheduler().StartDayPlan(request)))


async def day_plan(clients: Clients, name: str) -> DayPlan:
    """A plan's state, switches and periods (the open one's figures as of now)."""
    request = scheduler_pb2.DayPlanRequest(name=name)
    return _plan(await reply_of("scheduler", clients.scheduler().GetDayPlan(request)))


async def stop_day_plan(clients: Clients, name: str) -> DayPlan:
    """End a plan (at night, serving comes back first: follow `day_plan` until it is stopped)."""
    request = scheduler_pb2.DayPlanRequest(name=name)
    return _plan(await reply_of("scheduler", clients.scheduler().StopDayPlan(request)))


class RemoteDayServing:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = router_pb2_grpc.RouterStub(channel)

    async def spec(self, deployment: str) -> tuple[str, int]:
        request = router_pb2.GetDeploymentRequest(name=deployment)
        reply = await reply_of("router", self._stub.GetDeployment(request))
        return reply.spec_yaml, int(reply.npus)

    async def deploy(self, deployment: str, spec_yaml: str) -> int:
        request = router_pb2.DeployRequest(
            name=deployment, spec_yaml=spec_yaml, wait=True, warm=True
        )
        return int((await reply_of("router", self._stub.Deploy(request))).npus)

    async def undeploy(self, deployment: str) -> None:
        await reply_of("router", self._stub.Undeploy(router_pb2.UndeployRequest(name=deployment)))

    async def in_flight(self, deployment: str) -> int:
        request = router_pb2.GetStatsRequest(name=deployment)
        return int((await reply_of("router", self._stub.GetStats(request))).requests_in_flight)

    async def served_tokens(self) -> int:
        reply = await reply_of("router", self._stub.GetUsage(router_pb2.GetUsageRequest()))
        return sum(int(t.completion_tokens) for t in reply.tenants)


class RemoteDayTraining:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = training_pb2_grpc.TrainingStub(channel)

    async def start(self, job: TrainingSpec, *, resume: bool) -> int:
        spec = training_spec(job)
        spec.resume = resume
        reply = await reply_of(
            "training", self._stub.Start(training_pb2.StartTrainingRequest(spec=spec))
        )
        return int(reply.step)

    async def stop(self, job: str, *, checkpoint: bool) -> None:
        request = training_pb2.TrainingRequest(name=job, checkpoint=checkpoint)
        await reply_of("training", self._stub.Stop(request))

    async def progress(self, job: str) -> tuple[str, int]:
        try:
            reply = await reply_of(
                "training", self._stub.Get(training_pb2.TrainingRequest(name=job))
            )
        except NotFoundError:
            return "", 0
        return reply.state, int(reply.step)
