"""checkpoint-corrupt through real gRPC against an in-process cm-mini with the cluster manager
active and the embedded MQTT broker: a training job keeps its latest two checkpoints in EMS, each
with a manifest of real bytes; the latest one's copies are corrupted silently, an NPU of the job
crashes, and the restore finds the corruption by EMS's CRC-32 and falls back to the checkpoint
before it, losing one more checkpoint's steps, visibly (`checkpoint-corrupt`, `restored` at the
older step). The twin: a crash without the corruption restores from the latest checkpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.errors import NotFoundError, PreconditionError
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import training_pb2
from tests.runtime.test_mqtt import Listener, listening
from tests.services.test_serving_recovery import PROFILE, TIME_SCALE, _until

EVERY = 2  # steps between two checkpoints


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker() as running:
        yield running


@pytest.fixture
async def sn(broker: Broker) -> AsyncIterator[Supernode]:
    async with running_supernode(
        "cm-mini", time_scale=TIME_SCALE, profile=PROFILE, broker=broker.url
    ) as supernode:
        yield supernode


async def _job(sn: Supernode, name: str) -> training_pb2.TrainingJob:
    return await sn.clients.training().Get(training_pb2.TrainingRequest(name=name))


async def _crash_and_restore(
    sn: Supernode, listener: Listener, name: str, *, corrupt: bool
) -> tuple[int, dict[str, Any]]:
    """Start `name`, let it take two checkpoints, (corrupt the latest,) crash one of its NPUs;
    its latest checkpoint step then, and its `restored` event."""
    spec = training_pb2.TrainingSpec(name=name, npus=2, steps=0, checkpoint_every=EVERY)
    await sn.clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))
    job = await _until(sn, lambda: _job(sn, name), lambda j: j.last_checkpoint_step >= 2 * EVERY)
    if corrupt:
        fault = await faults.inject(sn.clients, "checkpoint-corrupt", name)
        step = int(fault.id.split(":")[2])
        assert fault.kind == "checkpoint-corrupt" and fault.target == name
        assert step >= 2 * EVERY and "/manifest on " in fault.detail
    else:
        step = (await _job(sn, name)).last_checkpoint_step
    crash = await faults.inject(sn.clients, "crash", job.npus[1])
    await listener.wait_for(
        lambda: any(e.get("job") == name for e in listener.events("restored")), within_s=600
    )
    await faults.clear(sn.clients, crash.id)
    if corrupt:
        await faults.clear(sn.clients, fault.id)
    (restored,) = [e for e in listener.events("restored") if e["job"] == name]
    return step, restored


async def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(
    sn: Supernode, broker: Broker
) -> None:
    async with listening(broker.url) as listener:
        step, restored = await _crash_and_restore(sn, listener, "t-ckpt", corrupt=True)
        # the latest checkpoint may have moved on before the crash: the one corrupted is older
        (corrupt,) = [e for e in listener.events("checkpoint-corrupt") if e["job"] == "t-ckpt"]
        assert corrupt["step"] >= step and corrupt["fallback_step"] == corrupt["step"] - EVERY
        assert corrupt["steps_lost"] == EVERY and "CRC-32" in corrupt["error"]
        assert "DATA_LOSS" in corrupt["error"]
        assert restored["step"] == corrupt["fallback_step"]
        job = await _job(sn, "t-ckpt")
        assert job.restarts == 1 and job.steps_lost >= EVERY
        # the detection dated on the wire, for a chaos verdict to credit it (before the restore)
        assert 0 < job.last_corrupt_checkpoint_ns <= job.last_restored_ns


async def test_its_twin_without_the_corruption_restores_the_latest(
    sn: Supernode, broker: Broker
) -> None:
    async with listening(broker.url) as listener:
        step, restored = await _crash_and_restore(sn, listener, "t-plain", corrupt=False)
        assert not listener.events("checkpoint-corrupt")
        assert restored["step"] >= step and restored["step"] % EVERY == 0
        assert (await _job(sn, "t-plain")).last_corrupt_checkpoint_ns == 0


async def test_checkpoint_corrupt_names_a_job_with_a_checkpoint(sn: Supernode) -> None:
    with pytest.raises(NotFoundError):
        await faults.inject(sn.clients, "checkpoint-corrupt", "no-such-job")
    spec = training_pb2.TrainingSpec(name="t-young", npus=2, steps=0, checkpoint_every=1000)
    await sn.clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))
    with pytest.raises(PreconditionError, match="has no checkpoint yet"):
        await faults.inject(sn.clients, "checkpoint-corrupt", "t-young")
    with pytest.raises(NotFoundError):
        await faults.clear(sn.clients, "ckpt:t-young:2:n00-mem")
