from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import pytest

from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, exclusive, running_supernode

configure_logging("info")

# Running in parallel (pytest-xdist, `-n` in pyproject.toml): each worker searches ports in a
# slice of its own (emulator/testing.py free_port_block), and the cmemu up processes a test
# starts keep their temporary files in its tmp_path. What cannot be moved is the fixed loopback
# addresses of `cmemu up --mode procs` (127.10.x.y, port 50051 and the metrics and HTTP ports),
# of compose files run as processes (127.60.x.y) and of k8s manifests (127.70.x.y): a test that
# binds them carries `@pytest.mark.xdist_group("loopback-procs")` ("loopback-compose",
# "loopback-k8s"), and `_one_at_a_time` below runs the tests of a group one after another on
# this machine, whichever worker (or other test session) runs them. (xdist's own
# `--dist loadgroup` reads the same mark, but its grouping does not work with pytest >= 9.2.)
# A LaunchOptions procs test takes a `first_octet` no other test uses instead.


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it too; this is for a run without it (`-p no:xdist -o addopts=`)
    config.addinivalue_line("markers", "xdist_group(name): run one at a time (see conftest)")


@pytest.fixture(autouse=True)
def _one_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """The machine-wide lock of each xdist_group of the test, held while it runs."""
    groups = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in request.node.iter_markers("xdist_group")
    }
    with ExitStack() as held:
        for group in sorted(groups):  # always in one order: no deadlock
            held.enter_context(exclusive(group))
        yield


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
