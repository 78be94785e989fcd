"""The scheduler's day plans (serve by day, train by night): protobuf in, the plan
(emulator/model/daylive.py) and its runner (emulator/engines/dayplan.py) in between, protobuf
out. The scheduler hosts them; the router and the training jobs are reached over gRPC through
the peers' channels (which carry the token), in one process as in many."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.client.dayplan import RemoteDayServing, RemoteDayTraining
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.dayplan import DayRunner
from cmemu.emulator.engines.tasks import TaskOwner
from cmemu.emulator.model.daylive import DAY, NIGHT, PlanStatus, plan_spec
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    quote,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.model.training.spec import TrainingSpec, shape_of
from cmemu.services.peers import Peers
from cmemu.v1 import scheduler_pb2


class DayPlans:
    """Every day plan of one scheduler, and the tasks that run them."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Peers,
        publish: Any,
    ) -> None:
        self.profile = profile
        self.clock = clock
        self.publish = publish
        self.serving = RemoteDayServing(peers.channel(topology.service(ServiceKind.ROUTER).address))
        self.training = RemoteDayTraining(  # training jobs live on the manager's server
            peers.channel(topology.service(ServiceKind.MANAGER).address)
        )
        self.runners: dict[str, DayRunner] = {}
        self.tasks = TaskOwner("the scheduler's day plans are not running")

    async def run(self) -> None:
        """Own the runners until close(): then they end where they are (the supernode stops
        with them; a night is not turned back into a day on the way out)."""
        await self.tasks.run()

    async def close(self) -> None:
        await self.tasks.close()

    def get(self, name: str) -> DayRunner:
        runner = self.runners.get(name)
        if runner is None:
            raise NotFoundError(
                f"no day plan {quote(name)}", field="name", subject=name, reason="PLAN_NOT_FOUND"
            )
        return runner

    async def start(self, request: scheduler_pb2.StartDayPlanRequest) -> DayRunner:
        self.tasks.require_running()
        t = request.training
        if not request.HasField("training") or not t.name:
            raise InvalidArgumentError("a day plan needs a training job", field="training.name")
        shape_of(  # the job's spec, checked before anything moves
            name=t.name,
            npus=t.npus,
            model=t.model,
            checkpoint_every=t.checkpoint_every,
            data_parallel=t.data_parallel,
            expert_parallel=t.expert_parallel,
            micro_batches=t.micro_batches,
            profile=self.profile,
        )
        spec = plan_spec(
            name=request.name,
            deployment=request.deployment,
            job=TrainingSpec(
                name=t.name,
                npus=t.npus,
                model=t.model,
                checkpoint_every=t.checkpoint_every,
                data_parallel=t.data_parallel,
                expert_parallel=t.expert_parallel,
                micro_batches=t.micro_batches,
            ),
            night=request.night,
            hour_s=request.hour_s,
            start_hour=request.start_hour,
            hours=request.hours,
            night_decode_npus=request.night_decode_npus,
            drain_s=request.drain_s,
        )
        for other in self.runners.values():
            o = other.spec
            if not other.status.ended and (
                o.name == spec.name
                or o.deployment == spec.deployment
                or o.job.name == spec.job.name
            ):
                raise PreconditionError(
                    f"day plan {o.name!r} runs on deployment {o.deployment!r} with job "
                    f"{o.job.name!r} (stop it first)",
                    field="name",
                    subject=o.name,
                    reason="PLAN_OVERLAPS",
                )
        day_yaml, day_npus = await self.serving.spec(spec.deployment)
        runner = DayRunner(
            PlanStatus(spec=spec, started_ns=self.clock.now_ns()),
            day_yaml=day_yaml,
            day_npus=day_npus,
            clock=self.clock,
            serving=self.serving,
            training=self.training,
            publish=self.publish,
        )
        self.runners[spec.name] = runner
        self.tasks.spawn(runner.run(), name=f"day-plan-{spec.name}")
        self.publish("day-plan-started", plan=spec.name, deployment=spec.deployment,
                     job=spec.job.name, night=request.night, hour_s=spec.hour_s)  # fmt: skip
        return runner

    async def status(self, name: str) -> scheduler_pb2.DayPlan:
        runner = self.get(name)
        await runner.refresh()
        return message(runner)

    async def stop(self, name: str) -> scheduler_pb2.DayPlan:
        runner = self.get(name)
        runner.stopping.set()
        return message(runner)


def message(runner: DayRunner) -> scheduler_pb2.DayPlan:
    status, spec = runner.status, runner.spec
    start, end = spec.night
    return scheduler_pb2.DayPlan(
        name=spec.name,
        deployment=spec.deployment,
        training_job=spec.job.name,
        night=f"{start:g}-{end:g}",
        hour_s=spec.hour_s,
        start_hour=spec.start_hour,
        hours=spec.hours,
        state=status.state,
        plan_hour=runner.hour_now(),
        switches=[
            scheduler_pb2.DaySwitch(
                at_ns=s.at_ns,
                plan_hour=s.plan_hour,
                to=s.to,
                duration_ns=s.duration_ns,
                npus=s.npus,
            )
            for s in status.switches
        ],
        periods=[
            scheduler_pb2.DayPeriod(
                kind=p.kind,
                start_ns=p.start_ns,
                end_ns=p.end_ns,
                served_tokens=p.served_tokens,
                training_steps=p.training_steps,
            )
            for p in status.periods
        ],
        served_tokens_day=status.served(DAY),
        served_tokens_night=status.served(NIGHT),
        training_steps=status.training_steps,
        training_step=status.step,
        started_ns=status.started_ns,
        error=status.error,
        night_decode_npus=spec.night_decode_npus,
        drain_s=spec.drain_s,
    )
