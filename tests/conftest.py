from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from emulator.runtime.inprocess import InProcessSupernode
from emulator.runtime.logs import configure_logging
from emulator.testing import Clients, running_supernode

configure_logging("info")


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[InProcessSupernode]:
    """cm-mini in this process, one per test module (devices keep state between its tests)."""
    async with running_supernode("cm-mini") as supernode:
        yield supernode


@pytest.fixture(scope="module")
async def clients(mini: InProcessSupernode) -> AsyncIterator[Clients]:
    c = Clients(mini.topology)
    yield c
    await c.close()
