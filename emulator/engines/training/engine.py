"""The training jobs of a supernode: start, get and stop them, each driven by its runner
(runner.py) until it finishes, fails or is stopped. Their state is their own: the cluster
manager hosts this on its server (services/manager.py) and asks it only when a job last
restored (TrainingPeer), never telling a job anything."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import EmulatedDeadline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.outage import Outage
from cmemu.emulator.engines.tasks import TaskOwner
from cmemu.emulator.model.errors import (
    EmulatorError,
    NotFoundError,
    PreconditionError,
    quote,
    relayed,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.training.spec import TrainingSpec, shape_of

if TYPE_CHECKING:
    # a job's run and its step model (the training cost models under it: 25 ms of imports) come
    # with the first job started (`start`), not at every boot that makes the engine
    from cmemu.emulator.engines.training.live import Endpoints, LiveJob

REASON_DOWN = "MANAGER_DOWN"  # a killed manager, as the day plans of this process meet it


class TrainingEngine:
    """The jobs by name (an ended one kept until a start of its name replaces it, so that a
    resume finds its checkpoints), and the tasks of their runners."""

    def __init__(
        self,
        *,
        profile: HardwareProfile,
        clock: Timeline,
        endpoints: Endpoints,
        events: EventSink | None,
        topic: str,
    ) -> None:
        self.profile = profile
        self.clock = clock
        self.endpoints = endpoints
        self.events = events
        self.topic = topic
        self.jobs: dict[str, LiveJob] = {}
        self.tasks = TaskOwner("the training service is not running")
        self._runner_of: dict[str, asyncio.Task[None]] = {}  # each job name's latest runner
        # the manager's service down (its server hosts the jobs' API), as the callers of this
        # process meet it (engines/outage.py): the jobs run on, only their callers are cut off
        self.outage = Outage("manager", REASON_DOWN)

    async def run(self) -> None:
        """Own the jobs' runners until close(): then they end where they are (their NPUs stay
        allocated, the scheduler stopping with them)."""
        await self.tasks.run()

    async def close(self) -> None:
        await self.tasks.close()

    def get(self, name: str) -> LiveJob:
        job = self.jobs.get(name)
        if job is None:
            raise NotFoundError(
                f"no training job {quote(name)}",
                field="name",
                subject=name,
                reason="JOB_NOT_FOUND",
            )
        return job

    async def start(self, spec: TrainingSpec, *, resume: bool = False) -> LiveJob:
        """Allocate `spec`'s NPUs and start its runner; `resume`: from the checkpoints of the
        ended job of its name (on as many NPUs). A refusal of the scheduler's comes back
        prefixed "scheduler: ", as a status relayed from it reads."""
        from cmemu.emulator.engines.training.live import LiveJob
        from cmemu.emulator.engines.training.runner import JobRunner
        from cmemu.emulator.model.training.job import ENDED, JobProgress

        self.tasks.require_running()
        shape = shape_of(
            name=spec.name,
            npus=spec.npus,
            model=spec.model,
            steps=spec.steps,
            checkpoint_every=spec.checkpoint_every,
            data_parallel=spec.data_parallel,
            expert_parallel=spec.expert_parallel,
            micro_batches=spec.micro_batches,
            profile=self.profile,
        )
        old = self.jobs.get(shape.name)
        if old is not None and old.progress.state not in ENDED:
            raise PreconditionError(
                f"training job {shape.name!r} is {old.progress.state} (stop it first)",
                field="name",
                subject=shape.name,
                reason="JOB_EXISTS",
            )
        earlier = old.checkpoints if resume and old is not None else []
        if earlier and old is not None and old.shape.npus != shape.npus:
            raise PreconditionError(
                f"training job {shape.name!r} checkpointed on {old.shape.npus} NPUs; resume it "
                f"on as many (asked {shape.npus})",
                field="npus",
                subject=shape.name,
                reason="RESUME_MISMATCH",
            )
        if old is not None:
            await self._given_back(shape.name)
        try:
            allocation = await self.endpoints.scheduler.allocate(shape.name, shape.npus)
        except EmulatorError as exc:
            raise relayed(exc, "scheduler") from exc
        job = LiveJob(
            shape=shape,
            progress=JobProgress(
                name=shape.name,
                steps=shape.steps,
                checkpoint_every=shape.checkpoint_every,
                started_ns=self.clock.now_ns(),
            ),
            allocation=allocation,
            checkpoints=list(earlier),
            resuming=bool(earlier),
        )
        if earlier:  # it goes on from its last checkpoint (reload() rewinds further if need be)
            step = earlier[-1][0]
            job.progress.step = job.progress.last_checkpoint_step = step
        self.jobs[shape.name] = job
        runner = JobRunner(
            job,
            profile=self.profile,
            clock=self.clock,
            endpoints=self.endpoints,
            events=self.events,
            topic=self.topic,
        )
        self._runner_of[shape.name] = self.tasks.spawn(runner.run(), name=f"training-{shape.name}")
        return job

    async def _given_back(self, name: str) -> None:
        """An ended job's NPUs, back with the scheduler before its name starts again: its
        runner releases them as it ends, after its state already says so (a start right after
        a stop found them still held: FAILED_PRECONDITION), and a release the scheduler did not
        answer (a partition) left them held for good. So: its runner's end is awaited (bounded),
        then whatever the scheduler still holds under that name is released (NOT_FOUND: none).
        Each wait is `training.release_wait_s` of emulated time: a hung scheduler is a fault of
        the emulated machine (a chaos service-hang lasts emulated seconds), and a wall bound runs
        out on a starved host while a healthy scheduler is still answering."""
        runner = self._runner_of.get(name)
        if runner is not None and not runner.done():
            with contextlib.suppress(TimeoutError):
                async with self._release_deadline():
                    await asyncio.wait({runner})  # never cancels the runner
        with contextlib.suppress(EmulatorError, TimeoutError):
            async with self._release_deadline():
                await self.endpoints.scheduler.release(name)

    def _release_deadline(self) -> EmulatedDeadline:
        t = self.profile.training
        return EmulatedDeadline(
            self.clock.clock, t.release_wait_s, min_wall_s=t.deadline_min_wall_s
        )

    async def last_restored_ns(self, job: str) -> int | None:
        """The cluster manager's TrainingPeer (emulator/engines/peers.py), answered directly:
        the jobs live on its server."""
        live = self.jobs.get(job)
        return None if live is None else live.progress.last_restored_ns

    async def stop(self, name: str, *, checkpoint: bool = False) -> LiveJob:
        """Ask the job's runner to end (after a last checkpoint, `checkpoint`); the job as it
        is now (its state changes once the runner sees the stop)."""
        job = self.get(name)
        job.final_checkpoint = job.final_checkpoint or checkpoint
        job.stopping.set()
        job.changed.set()
        return job
