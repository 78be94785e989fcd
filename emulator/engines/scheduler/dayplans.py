"""The scheduler's day plans (serve by day, train by night): an ask checked into a plan
(emulator/model/daylive.py) and its runner (emulator/engines/dayplan.py) started, found, stopped.
The router and the training jobs are the runner's peers (`DayServing`, `DayTraining`): the
runtime gives their engines where its process hosts them (engines/serving/local.py,
engines/training/local.py), else their gRPC side (emulator/client/dayplan.py), so this module
knows no wire."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.dayplan import DayRunner, DayServing, DayTraining
from cmemu.emulator.engines.tasks import TaskOwner
from cmemu.emulator.model.daylive import PlanStatus, plan_spec
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    quote,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.training.spec import TrainingSpec, shape_of


@dataclass(frozen=True, kw_only=True)
class DayPlanAsk:
    """What a StartDayPlan asks, unchecked (`job` None: the ask named no training job)."""

    name: str
    deployment: str
    job: TrainingSpec | None
    night: str
    hour_s: float
    start_hour: float
    hours: float
    night_decode_npus: int
    drain_s: float


class DayPlans:
    """Every day plan of one scheduler, and the tasks that run them."""

    def __init__(
        self,
        *,
        profile: HardwareProfile,
        clock: Timeline,
        serving: DayServing,
        training: DayTraining,
        publish: Callable[..., None],
    ) -> None:
        self.profile = profile
        self.clock = clock
        self.publish = publish
        self.serving = serving
        self.training = training
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

    async def start(self, ask: DayPlanAsk) -> DayRunner:
        self.tasks.require_running()
        job = ask.job
        if job is None or not job.name:
            raise InvalidArgumentError("a day plan needs a training job", field="training.name")
        shape_of(  # the job's spec, checked before anything moves
            name=job.name,
            npus=job.npus,
            model=job.model,
            checkpoint_every=job.checkpoint_every,
            data_parallel=job.data_parallel,
            expert_parallel=job.expert_parallel,
            micro_batches=job.micro_batches,
            profile=self.profile,
        )
        spec = plan_spec(
            name=ask.name,
            deployment=ask.deployment,
            job=job,
            night=ask.night,
            hour_s=ask.hour_s,
            start_hour=ask.start_hour,
            hours=ask.hours,
            night_decode_npus=ask.night_decode_npus,
            drain_s=ask.drain_s,
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
                     job=spec.job.name, night=ask.night, hour_s=spec.hour_s)  # fmt: skip
        return runner

    async def status(self, name: str) -> DayRunner:
        runner = self.get(name)
        await runner.refresh()
        return runner

    def stop(self, name: str) -> DayRunner:
        runner = self.get(name)
        runner.stopping.set()
        return runner
