"""The typed manager client (emulator/client/manager.py) against a real cm-mini in this
process: its status and mode as the engine's domain values, its incidents as the detector's,
and a bad request refused as an EmulatorError before any call."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client.manager import ManagerClient
from cmemu.emulator.engines.manager.status import Mode
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode


async def test_status_mode_and_incidents(mini: Supernode) -> None:
    manager = ManagerClient(mini.clients)
    status = await manager.status()
    assert status.mode is Mode.ACTIVE and status.devices_watched > 0
    assert status.heartbeat_interval_s > 0 and status.misses_to_fail > 0
    assert (await manager.set_mode(Mode.PASSIVE)).mode is Mode.PASSIVE
    assert (await manager.status()).mode is Mode.PASSIVE
    assert (await manager.set_mode(Mode.ACTIVE)).mode is Mode.ACTIVE
    assert await manager.incidents() == []  # nothing failed


async def test_a_negative_since_is_refused(mini: Supernode) -> None:
    with pytest.raises(InvalidArgumentError):
        await ManagerClient(mini.clients).incidents(-1)
