"""The typed training client (emulator/client/training.py) against a real cm-mini in this
process: a job started, listed, read and stopped as plain values; an unknown job is a
NotFoundError, a job of no NPUs refused before any call."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client.training import TrainingClient
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=10.0) as supernode:
        yield supernode


async def test_start_list_get_stop(mini: Supernode) -> None:
    training = TrainingClient(mini.clients)
    started = await training.start(TrainingSpec(name="t1", npus=4))
    assert started.name == "t1" and len(started.npus) == 4 and started.state
    assert [j.name for j in await training.list()] == ["t1"]
    assert (await training.get("t1")).npus == started.npus
    stopped = await training.stop("t1")  # its state then: what it was as the stop was asked
    assert stopped.name == "t1" and stopped.npus == started.npus


async def test_refusals_are_emulator_errors(mini: Supernode) -> None:
    training = TrainingClient(mini.clients)
    with pytest.raises(NotFoundError) as unknown:
        await training.get("no-such-job")
    assert "no-such-job" in str(unknown.value)
    with pytest.raises(InvalidArgumentError):
        await training.start(TrainingSpec(name="t0", npus=0))
