from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from emulator.runtime.logs import configure_logging
from emulator.runtime.supernode import Supernode
from emulator.testing import Clients, running_supernode

configure_logging("info")


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    """cm-mini in this process, one per test module (devices keep state between its tests)."""
    async with running_supernode("cm-mini") as supernode:
        yield supernode


@pytest.fixture(scope="module")
async def clients(mini: Supernode) -> AsyncIterator[Clients]:
    c = Clients(mini.topology)
    yield c
    await c.close()
