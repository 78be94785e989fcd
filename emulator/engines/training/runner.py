"""One live training job: allocate, step on the emulated clock, checkpoint into EMS, and recover
by watching its scheduler allocation (never told by the manager).

Steps are timed by the cost model (emulator/model/training/step.py) with the collectives asked
of the live fabric (Fabric/Collective: the gradient all-reduce bucket, the MoE dispatch and
combine) at every step's end, which is the data path (issue 20): a dead rank fails them at once
and a hung one past the step deadline, so the step in flight fails (counted, `step-failed`, rerun
after `step_retry_s`: the job waits, whatever a controller does); a slowed rank's compute share
comes back with them and the next step computes at its pace. When the allocation shows one of
its NPUs failed the job stops ("recovering", an `isolated` event), rewinds to its last
checkpoint, waits until the scheduler has replaced every failed NPU, reloads the checkpoint from
EMS (its Get timing) after the profile's restart time, and resumes (a `restored` event).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import answer_within
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.training.checkpoints import Checkpoints
from cmemu.emulator.engines.training.live import Endpoints, LiveJob
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.errors import (
    DeadlineExceededError,
    EmulatorError,
    UnavailableError,
    error_line,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.training.job import FAILED, FINISHED, RECOVERING, STOPPED
from cmemu.emulator.model.training.step import (
    gradient_buckets,
    groups,
    moe_tokens_per_rank,
    step_time,
)

log = structlog.get_logger("cmemu.training")
NS = 1_000_000_000
STEP_FAILURES = (UnavailableError, DeadlineExceededError)
"""What a dead (UNAVAILABLE) or hung (DEADLINE_EXCEEDED) rank does to a step's collectives."""


class JobRunner:
    """Drives one LiveJob until it finishes, fails or is stopped."""

    def __init__(
        self,
        job: LiveJob,
        *,
        profile: HardwareProfile,
        clock: Timeline,
        endpoints: Endpoints,
        events: EventSink | None,
        topic: str,
    ) -> None:
        self.job = job
        self.profile = profile
        self.clock = clock
        self.ep = endpoints
        self.events = events
        self.topic = topic
        self.checkpoints = Checkpoints(
            job, ems=endpoints.ems, clock=clock, profile=profile,
            publish=self.publish, sleep=self.sleep,
        )  # fmt: skip

    def publish(self, event: str, **detail: object) -> None:
        if self.events is not None:
            self.events.event(
                self.topic, event, self.clock.now_ns(), job=self.job.progress.name, **detail
            )

    async def sleep(self, emulated_s: float) -> bool:
        """Sleep emulated seconds; False when a change of the allocation (or a stop) cut it."""
        job = self.job
        if job.needs_recovery or job.stopping.is_set():
            return False
        job.changed.clear()
        until = self.clock.now_ns() + round(emulated_s * 1e9)
        if not await self.clock.wait(job.changed, until):
            return True
        return not (job.needs_recovery or job.stopping.is_set())

    async def run(self) -> None:
        """Until finished, failed or stopped; then the NPUs go back to the scheduler (not when
        the service closes: the scheduler stops with it)."""
        job, p = self.job, self.job.progress
        try:
            async with asyncio.TaskGroup() as tasks:
                watcher = tasks.create_task(self.watch())
                await self.refresh()
                if job.resuming and job.checkpoints:
                    await self.resume()
                p.running(await self.first_step_s())
                self.publish("training-started", npus=[n.id for n in job.allocation.npus])
                await self.loop()
                watcher.cancel()
        except* EmulatorError as group:
            error = str(group.exceptions[0])
            log.warning("training job failed", job=p.name, error=error)
            p.end(FAILED, self.clock.now_ns(), error)
            self.publish("training-failed", error=error)
        with contextlib.suppress(EmulatorError):
            await self.ep.scheduler.release(p.name)

    async def loop(self) -> None:
        job, p = self.job, self.job.progress
        while True:
            if job.stopping.is_set():
                if job.final_checkpoint and p.step > p.last_checkpoint_step:
                    await self.checkpoints.write(final=True)
                p.end(STOPPED, self.clock.now_ns())
                self.publish("training-stopped", step=p.step)
                return
            if p.done:
                p.end(FINISHED, self.clock.now_ns())
                self.publish("training-finished", step=p.step)
                return
            if job.needs_recovery:
                await self.recover()
                continue
            if not await self.sleep(p.step_s):
                continue
            if not await self.step_ended():
                continue
            if p.step_done():
                await self.checkpoints.write()

    async def resume(self) -> None:
        """A resumed job (a night of serve-by-day, train-by-night): the profile's restart time,
        then its last checkpoint reloaded from EMS onto its NPUs, as a recovery does."""
        job, p = self.job, self.job.progress
        await self.clock.sleep(self.profile.training.restart_s)
        await self.checkpoints.reload()
        p.last_restored_ns = self.clock.now_ns()
        self.publish("training-resumed", step=p.step)
        job.resuming = False

    async def recover(self) -> None:
        job, p = self.job, self.job.progress
        now = {n.id for n in job.allocation.npus}
        lost_npus = sorted(set(job.failed_npus) | (set(p.npus) - now))
        if p.state != RECOVERING:  # not already recovering from an earlier failure
            steps = p.failed(self.clock.now_ns())
            self.publish("isolated", npus=lost_npus, steps_lost=steps, step=p.step)
        while job.failed_npus and not job.stopping.is_set():
            job.changed.clear()
            await job.changed.wait()
        job.interrupted = False
        if job.stopping.is_set():
            return
        await self.sleep(self.profile.training.restart_s)
        await self.checkpoints.reload()
        if job.needs_recovery:
            return  # failed again while restarting: recover again
        replacements = [n.id for n in job.allocation.npus if n.id not in set(p.npus)]
        step_s = await self.first_step_s()
        if job.needs_recovery:
            return  # a rank died while restarting: recover again
        p.restored(self.clock.now_ns(), step_s)
        p.npus = [n.id for n in job.allocation.npus]
        self.publish("restored", npus=replacements, step=p.step, restarts=p.restarts)

    async def refresh(self) -> None:
        job = self.job
        job.allocation = await self.ep.scheduler.allocation(job.progress.name)
        job.progress.npus = [n.id for n in job.allocation.npus]
        job.changed.set()

    async def watch(self) -> None:
        """Follow the allocation: the scheduler is the single source of truth."""
        job = self.job
        changes = self.ep.scheduler.watch(job.progress.name)
        try:
            async for event in changes:
                if event.change == "released":
                    continue
                job.allocation = event.allocation
                if event.change in ("failed", "replaced"):
                    job.interrupted = True
                job.changed.set()
        finally:
            changes.cancel()

    async def first_step_s(self) -> float:
        """The first step's duration on the current NPUs; while a rank is dead or hung, each
        try is a failed step and the job waits `step_retry_s` before the next."""
        while True:
            try:
                return await self.step_s()
            except STEP_FAILURES as exc:
                self.step_failed(exc)
            if not await self.sleep(self.profile.training.step_retry_s):
                return self.job.progress.step_s  # recovering or stopping: the loop decides

    async def step_ended(self) -> bool:
        """The step in flight reaches its collectives: True when they complete (the next step's
        duration is set from them); False when a dead or hung rank failed it (rerun after
        `step_retry_s`, or recovery once the allocation shows the failure)."""
        try:
            step_s = await self.step_s()
        except STEP_FAILURES as exc:
            self.step_failed(exc)
            await self.sleep(self.profile.training.step_retry_s)
            return False
        self.job.progress.step_s = step_s
        return True

    def step_failed(self, exc: EmulatorError) -> None:
        p = self.job.progress
        p.failed_steps += 1
        error = error_line(exc)
        log.warning("training step failed", job=p.name, step=p.step + 1, error=error)
        self.publish("step-failed", step=p.step + 1, error=error)

    async def step_s(self) -> float:
        """The step on the current NPUs, its collectives asked of the live fabric (memoized
        there): the slowest rank's compute share sets the compute's pace."""
        dies = self.job.dies
        shape = self.job.shape
        g = groups(dies, shape)
        tokens = moe_tokens_per_rank(self.profile)
        bucket = gradient_buckets(shape, self.profile).bytes
        dispatch_s, a = await self.collective("moe-dispatch", g.expert_parallel, tokens=tokens)
        combine_s, b = await self.collective("moe-combine", g.expert_parallel, tokens=tokens)
        bucket_s, c = await self.collective("all-reduce", g.data_parallel, size=bucket)
        return step_time(
            shape,
            dispatch_s=dispatch_s,
            combine_s=combine_s,
            allreduce_bucket_s=bucket_s,
            profile=self.profile,
            compute_share=min(a, b, c),
        ).total_s

    async def collective(
        self, op: str, ranks: tuple[str, ...], *, size: int = 0, tokens: int = 0
    ) -> tuple[float, float]:
        """(seconds, the slowest rank's compute share) of one collective."""
        if len(ranks) < 2 or not (size or tokens):
            return 0.0, 1.0
        spec = CollectiveSpec(op=op, bytes=size, tokens_per_rank=tokens)
        t = self.profile.training
        call = self.ep.fabric().collective(list(ranks), spec, deadline_s=None)
        # a hung rank holds it past `step_deadline_s` of emulated time (engines/deadline.py: in
        # wall seconds, fixed at the step's start, it failed healthy steps on a starved host)
        result = await answer_within(
            self.clock.clock, t.step_deadline_s, call,
            peer="fabric", min_wall_s=t.deadline_min_wall_s,
        )  # fmt: skip
        return float(result.duration_ns) / NS, result.compute_share or 1.0
