"""Serve by day, train by night on the live supernode: the scheduler's day plan carried out
(emulator/model/daylive.py decides when; this moves the NPUs, on the emulated clock).

Nightfall: the deployment finishes its requests in flight (within the plan's `drain_s`), is
undeployed (what is still in flight ends, its KV blocks stay in EMS) and, with a night
footprint, deployed again smaller (weights from EMS); the training job starts on the freed NPUs
(resumed from its last checkpoint in EMS after the first night: restart and reload). The switch
lasts until the job steps. Morning: the job is stopped with a checkpoint of its last step
written to EMS, the night footprint drained and undeployed, and the day one deployed again, its
weights warm from EMS; the switch lasts until it serves. Every switch is an event (`day-switch`,
its direction, plan hour and emulated duration).

The router and the training jobs are reached through the two protocols below: their engines in
one process (engines/serving/local.py LocalDayServing, engines/training/local.py
LocalDayTraining, through their services' outages), their gRPC side across processes
(emulator/client/dayplan.py), services/peers.py choosing. The engine sees only domain values
and EmulatorErrors, the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.daylive import (
    DAY,
    DONE,
    FAILED,
    NIGHT,
    STOPPED,
    SWITCHING,
    TO_SERVING,
    TO_TRAINING,
    Period,
    PlanStatus,
    Switch,
    night_spec,
)
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, UnavailableError
from cmemu.emulator.model.training.spec import TrainingSpec

POLL_S = 1.0  # emulated seconds between two looks at a job that is starting or stopping
JOB_STARTED = "running"
JOB_ENDED = frozenset({"finished", "failed", "stopped"})


class DayServing(Protocol):
    """The router, as the day plan moves a deployment."""

    async def spec(self, deployment: str) -> tuple[str, int]:
        """The deployment's YAML document and its NPUs (NotFoundError: none such)."""
        ...

    async def deploy(self, deployment: str, spec_yaml: str) -> int:
        """Deploy it warm (weights from EMS) and return once it serves: its NPUs."""
        ...

    async def undeploy(self, deployment: str) -> None: ...

    async def in_flight(self, deployment: str) -> int:
        """Its requests in flight now."""
        ...

    async def served_tokens(self) -> int:
        """Completion tokens the router's usage has counted so far (every tenant)."""
        ...


class DayTraining(Protocol):
    """The training jobs, as the day plan starts and stops its job."""

    async def start(self, job: TrainingSpec, *, resume: bool) -> int:
        """Start (or resume from its last checkpoint) the job: its step then."""
        ...

    async def stop(self, job: str, *, checkpoint: bool) -> None: ...

    async def progress(self, job: str) -> tuple[str, int]:
        """(state, step) of the job; ("", 0) when there is none."""
        ...


class DayRunner:
    """One plan, from its start until its hours ran, it was stopped or a step of it failed."""

    def __init__(
        self,
        status: PlanStatus,
        *,
        day_yaml: str,
        day_npus: int,
        clock: Timeline,
        serving: DayServing,
        training: DayTraining,
        publish: Callable[..., None],
    ) -> None:
        self.status = status
        self.spec = status.spec
        self.day_yaml = day_yaml
        self.night_yaml = (
            night_spec(day_yaml, self.spec.night_decode_npus) if self.spec.night_decode_npus else ""
        )
        self.day_npus = day_npus
        self.night_npus = 0
        self.clock = clock
        self.serving = serving
        self.training = training
        self.publish = publish
        self.stopping = asyncio.Event()
        self.night = False

    def hour_now(self) -> float:
        """The plan clock now (when the plan ended, once it has)."""
        now = self.status.ended_ns or self.clock.now_ns()
        return self.spec.hour_at((now - self.status.started_ns) / 1e9)

    async def run(self) -> None:
        status = self.status
        try:
            status.periods.append(await self._period(DAY, self.clock.now_ns()))
            await self._days()
            if self.night:
                await self._morning()
            await self._close_period()
            status.state = STOPPED if self.stopping.is_set() else DONE
            status.ended_ns = self.clock.now_ns()
        except EmulatorError as exc:
            status.error = str(exc)
            await self._fallback()  # the plan has failed once serving is back
            with contextlib.suppress(EmulatorError):
                await self._close_period()
            status.state, status.ended_ns = FAILED, self.clock.now_ns()
            self.publish("day-plan-failed", plan=self.spec.name, error=status.error)
            return
        self.publish(
            "day-plan-ended",
            plan=self.spec.name,
            state=status.state,
            served_tokens_day=status.served(DAY),
            training_steps=status.training_steps,
        )

    async def _days(self) -> None:
        spec = self.spec
        while not self.stopping.is_set():
            hour = self.hour_now()
            if spec.over(hour):
                return
            if spec.is_night(hour) != self.night:
                await (self._morning() if self.night else self._nightfall())
                continue
            until = self.status.started_ns + spec.elapsed_ns(spec.next_change(hour))
            await self.clock.wait(self.stopping, until)

    async def refresh(self) -> None:
        """The open period's figures so far (a status asks)."""
        periods = self.status.periods
        if periods and not periods[-1].end_ns:
            tokens, step = await self._figures()
            if not periods[-1].end_ns:  # still open after the awaits
                periods[-1].update(tokens, step)

    async def _figures(self) -> tuple[int, int]:
        tokens = await self.serving.served_tokens()
        _, step = await self.training.progress(self.spec.job.name)
        self.status.step = step
        return tokens, step

    async def _period(self, kind: str, start_ns: int) -> Period:
        tokens, step = await self._figures()
        return Period(kind=kind, start_ns=start_ns, tokens_at_start=tokens, step_at_start=step)

    async def _close_period(self, at_ns: int | None = None) -> None:
        """The period ends at `at_ns` (default now), its figures as they are now."""
        tokens, step = await self._figures()
        self.status.periods[-1].close(at_ns or self.clock.now_ns(), tokens, step)

    async def _nightfall(self) -> None:
        spec, status = self.spec, self.status
        began, hour = self.clock.now_ns(), self.hour_now()
        await self._close_period(at_ns=began)
        status.state = SWITCHING
        period = await self._period(NIGHT, began)
        status.periods.append(period)
        await self._drain()
        await self.serving.undeploy(spec.deployment)
        self.night = True  # from here a failure redeploys the day footprint
        if self.night_yaml:
            self.night_npus = await self.serving.deploy(spec.deployment, self.night_yaml)
        period.step_at_start = await self.training.start(spec.job, resume=True)
        await self._until_job(lambda state: state == JOB_STARTED, "start")
        self._switched(began, hour, TO_TRAINING, NIGHT)

    async def _morning(self) -> None:
        spec, status = self.spec, self.status
        began, hour = self.clock.now_ns(), self.hour_now()
        status.state = SWITCHING
        await self.training.stop(spec.job.name, checkpoint=True)
        await self._until_job(lambda state: state in JOB_ENDED, "stop")
        await self._close_period(at_ns=began)  # the night's steps, its last one written
        status.periods.append(await self._period(DAY, began))
        if self.night_yaml:
            await self._drain()
            await self.serving.undeploy(spec.deployment)
        self.day_npus = await self.serving.deploy(spec.deployment, self.day_yaml)
        self.night = False
        self._switched(began, hour, TO_SERVING, DAY)

    async def _drain(self) -> None:
        """Let the footprint about to go finish its requests in flight, within `drain_s`
        (requests keep arriving: it goes once none is in flight, or at the bound)."""
        until = self.clock.now_ns() + round(self.spec.drain_s * 1e9)
        while self.clock.now_ns() < until and await self.serving.in_flight(self.spec.deployment):
            await self.clock.sleep(min(POLL_S, (until - self.clock.now_ns()) / 1e9))

    async def _fallback(self) -> None:
        """A failed plan leaves the supernode serving: the job stopped (with a checkpoint) and
        the day footprint deployed, as far as either still answers."""
        try:
            state, _ = await self.training.progress(self.spec.job.name)
            if state and state not in JOB_ENDED:
                await self.training.stop(self.spec.job.name, checkpoint=True)
                await self._until_job(lambda state: state in JOB_ENDED, "stop")  # its NPUs back
            if self.night:
                with contextlib.suppress(NotFoundError):  # the night footprint, if it came up
                    await self.serving.undeploy(self.spec.deployment)
                await self.serving.deploy(self.spec.deployment, self.day_yaml)
                self.night = False
        except EmulatorError as exc:
            self.status.error += f"; serving not restored: {exc}"

    def _switched(self, began: int, hour: float, to: str, state: str) -> None:
        now = self.clock.now_ns()
        switch = Switch(
            at_ns=began,
            plan_hour=hour,
            to=to,
            duration_ns=now - began,
            npus=self.day_npus - self.night_npus,
        )
        self.status.switches.append(switch)
        self.status.state = state
        self.publish(
            "day-switch",
            plan=self.spec.name,
            to=to,
            plan_hour=round(hour, 3),
            at_ns=began,
            duration_ns=switch.duration_ns,
            npus=switch.npus,
        )

    async def _until_job(self, reached: Callable[[str], bool], what: str) -> None:
        """Poll the job (emulated time) until its state is reached; a job that failed instead
        fails the plan."""
        name = self.spec.job.name
        while True:
            state, step = await self.training.progress(name)
            self.status.step = step
            if reached(state):
                return
            if not state or state in JOB_ENDED:
                raise UnavailableError(
                    f"training job {name!r} is {state or 'gone'} (waiting for its {what})",
                    subject=name,
                )
            await self.clock.sleep(POLL_S)
