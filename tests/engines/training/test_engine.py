"""The training engine (emulator/engines/training/) driven directly, no cmemu.v1.Training in
between: a TrainingEngine of the test's own beside an in-process cm-mini, its jobs stepping on
the supernode's clock, timing their collectives on its fabric engine (LocalFabric: a direct
call), and holding NPUs and checkpoints with the real scheduler and EMS through the typed
clients (the JobScheduler and ObjectStore peers: neither has an engine to call directly yet).
What a caller gets back is domain values and EmulatorErrors with their reasons; what the job did
is its events (an EventRecorder) and what the scheduler and EMS hold after it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.client.manager import ManagerClient
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.engines.manager.status import Mode
from cmemu.emulator.engines.peers import LocalFabric
from cmemu.emulator.engines.training.engine import TrainingEngine
from cmemu.emulator.engines.training.live import Endpoints, LiveJob
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.training import checkpoint
from cmemu.emulator.model.training.job import FINISHED, RUNNING, STOPPED
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.testing import EventRecorder, Supernode, running_supernode

SCALE = 50.0  # emulated seconds per wall second: a training step of ~20 s takes 0.4 s
WALL_BOUND_S = 300.0  # only stops a hung test: a busy host slows emulated time too


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=SCALE) as supernode:
        yield supernode


@contextlib.asynccontextmanager
async def engine_of(sn: Supernode) -> AsyncIterator[tuple[TrainingEngine, EventRecorder]]:
    """A training engine of its own on `sn`'s clock and peers, running until the block ends."""
    local = sn.local
    assert local.fabric is not None and local.time is not None
    fabric = LocalFabric(local.fabric)
    events = EventRecorder()
    engine = TrainingEngine(
        profile=local.profile,
        clock=local.time.timeline,
        endpoints=Endpoints(
            scheduler=SchedulerClient(sn.clients), ems=EmsClient(sn.clients), fabric=lambda: fabric
        ),
        events=events,
        topic="training",
    )
    runner = asyncio.create_task(engine.run())
    try:
        await until(lambda: engine.tasks.running)
        yield engine, events
    finally:
        await engine.close()
        await runner


async def until(ok: Callable[[], bool | Awaitable[bool]]) -> None:
    """Wait for a condition (polled; the bound only stops a hung test)."""
    async with asyncio.timeout(WALL_BOUND_S):
        while True:
            done = ok()
            if done if isinstance(done, bool) else await done:
                return
            await asyncio.sleep(0.02)


async def released(sn: Supernode, job: str) -> bool:
    """The scheduler holds no NPU for `job`."""
    occupancy = await SchedulerClient(sn.clients).allocations()
    return all(a.job != job for a in occupancy.allocations)


async def test_a_job_steps_checkpoints_into_ems_finishes_and_gives_its_npus_back(
    mini: Supernode,
) -> None:
    async with engine_of(mini) as (engine, events):
        job = await engine.start(TrainingSpec(name="e-run", npus=2, steps=4, checkpoint_every=2))
        assert isinstance(job, LiveJob) and len(job.allocation.npus) == 2
        await until(lambda: job.progress.state == FINISHED)
        assert job.progress.npus == [n.id for n in job.allocation.npus]
        assert (job.progress.step, job.progress.last_checkpoint_step) == (4, 4)
        assert job.progress.step_s > 0 and job.progress.failed_steps == 0
        names = [e for _, e, _ in events.events]
        assert names == ["training-started", "checkpoint", "checkpoint", "training-finished"]
        assert [c["step"] for c in events.named("checkpoint")] == [2, 4]
        assert {device for device, _, _ in events.events} == {"training"}
        # the latest checkpoint is whole in EMS: its manifest lists the shards it keeps
        step, keys = job.checkpoints[-1]
        manifest = await EmsClient(mini.clients).load(checkpoint.manifest_key("e-run", step))
        assert checkpoint.manifest_keys(manifest.data, "e-run", step) == keys[:-1]
        assert all(await EmsClient(mini.clients).exist(keys))
        # and its runner gives its NPUs back to the scheduler as it ends
        await until(lambda: released(mini, "e-run"))


async def test_refusals_are_emulator_errors_with_their_reasons(mini: Supernode) -> None:
    async with engine_of(mini) as (engine, _):
        with pytest.raises(NotFoundError) as missing:
            engine.get("no-such-job")
        assert missing.value.reason == "JOB_NOT_FOUND" and "no-such-job" in str(missing.value)
        with pytest.raises(InvalidArgumentError) as bad:
            await engine.start(TrainingSpec(name="Not A Name", npus=1))
        assert bad.value.field == "name"
        # the scheduler's refusal, relayed: its class and reason, prefixed with who said it
        with pytest.raises(EmulatorError) as direct:
            await SchedulerClient(mini.clients).allocate("e-huge", 10_000)
        with pytest.raises(type(direct.value)) as refused:
            await engine.start(TrainingSpec(name="e-huge", npus=10_000))
        assert refused.value.reason == direct.value.reason
        assert str(refused.value) == f"scheduler: {direct.value}"
        assert "e-huge" not in engine.jobs and await released(mini, "e-huge")
        job = await engine.start(TrainingSpec(name="e-twice", npus=1))
        with pytest.raises(PreconditionError) as twice:
            await engine.start(TrainingSpec(name="e-twice", npus=1))
        assert twice.value.reason == "JOB_EXISTS"
        await engine.stop("e-twice")
        await until(lambda: job.progress.state == STOPPED)
    with pytest.raises(UnavailableError):  # closed: nothing owns a runner any more
        await engine.start(TrainingSpec(name="e-late", npus=1))


async def test_a_stop_with_a_checkpoint_and_a_resume_go_on_from_it(mini: Supernode) -> None:
    spec = TrainingSpec(name="e-res", npus=2, steps=0, checkpoint_every=1000)
    async with engine_of(mini) as (engine, events):
        job = await engine.start(spec)
        await until(lambda: job.progress.step >= 2)
        await engine.stop("e-res", checkpoint=True)
        await until(lambda: job.progress.state == STOPPED)
        stopped_at = job.progress.step
        assert job.progress.last_checkpoint_step == stopped_at >= 2
        assert [c["step"] for c in events.named("checkpoint")] == [stopped_at]
        with pytest.raises(PreconditionError) as mismatch:
            await engine.start(TrainingSpec(name="e-res", npus=1), resume=True)
        assert mismatch.value.reason == "RESUME_MISMATCH" and mismatch.value.field == "npus"
        again = await engine.start(spec, resume=True)
        assert again is not job and again.progress.step == stopped_at
        await until(lambda: bool(events.named("training-resumed")))
        assert events.named("training-resumed") == [{"job": "e-res", "step": stopped_at}]
        await until(lambda: again.progress.state == RUNNING and again.progress.step > stopped_at)
        await engine.stop("e-res")
        await until(lambda: again.progress.state == STOPPED)


async def _passive(sn: Supernode) -> None:
    """The cluster manager records and does not act: nothing isolates a failed NPU."""
    await ManagerClient(sn.clients).set_mode(Mode.PASSIVE)


async def test_a_crashed_rank_fails_each_step_until_it_is_back() -> None:
    """With no controller acting, a crashed rank fails every step's collectives (counted, a
    `step-failed` event whose error is the fabric's code and message) and the job waits; once
    the rank is back the steps go on, on the same NPUs."""
    async with running_supernode("cm-mini", time_scale=SCALE) as sn, engine_of(sn) as (engine, ev):
        await _passive(sn)
        job = await engine.start(TrainingSpec(name="e-crash", npus=2, checkpoint_every=1000))
        await until(lambda: job.progress.step >= 1)
        npus = list(job.progress.npus)
        crash = await faults.inject(sn.clients, "crash", npus[1])
        await until(lambda: job.progress.failed_steps >= 2)
        failed = ev.named("step-failed")
        assert all(e["error"].startswith(("UNAVAILABLE: ", "DEADLINE_EXCEEDED: ")) for e in failed)
        stuck = job.progress.step
        assert all(e["step"] == stuck + 1 for e in failed)  # the same step, rerun
        await faults.clear(sn.clients, crash.id)
        await until(lambda: job.progress.step > stuck + 1)
        assert job.progress.npus == npus and job.progress.restarts == 0
        assert not ev.named("isolated")
        await engine.stop("e-crash")
        await until(lambda: job.progress.state == STOPPED)


async def test_a_crashed_rank_isolated_by_the_manager_is_recovered_on_a_spare() -> None:
    """The manager (ACTIVE) isolates the crashed NPU and the scheduler replaces it in the job's
    allocation: the job, watching its allocation, stops (`isolated`), reloads its checkpoint
    from EMS onto the new NPUs and goes on (`restored`), never told by the manager."""
    async with running_supernode("cm-mini", time_scale=SCALE) as sn, engine_of(sn) as (engine, ev):
        job = await engine.start(TrainingSpec(name="e-spare", npus=2, checkpoint_every=2))
        await until(lambda: job.progress.last_checkpoint_step >= 2)
        before = list(job.progress.npus)
        victim = before[1]
        await faults.inject(sn.clients, "crash", victim)
        await until(lambda: job.progress.restarts == 1 and job.progress.state == RUNNING)
        (isolated,) = ev.named("isolated")
        assert victim in isolated["npus"]
        (restored,) = ev.named("restored")
        assert victim not in job.progress.npus and len(job.progress.npus) == 2
        assert restored["npus"] == [n for n in job.progress.npus if n not in before]
        assert restored["step"] % 2 == 0 and job.progress.steps_lost >= 0
        assert job.progress.last_restored_ns > job.progress.last_failure_ns > 0
        await engine.stop("e-spare")
        await until(lambda: job.progress.state == STOPPED)
