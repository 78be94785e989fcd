"""How a launch in one process knows its servers serve (issue 18): every server by its own
health, the status its Health/Check answers, and one server of each kind over gRPC, as a client
asks. Each half has its failing twin: a server whose health is NOT_SERVING, and every server of
one kind that its own health calls SERVING but whose wire refuses (so each kind is really asked
over the wire)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.testing import free_port_block

TIMEOUT_S = 0.5  # how long a verification waits for a laggard here (none ever comes)
KINDS = (
    8  # cm-mini's: NPU, CPU and memory pool servers, the fabric, EMS, scheduler, router, manager
)


@pytest.fixture(scope="module")
async def sn() -> AsyncIterator[InProcessSupernode]:
    base = free_port_block(server_count(build("cm-mini")))
    topology = build("cm-mini", plan=PortPlan(base_port=base))
    async with InProcessSupernode(topology, broker="", drain_s=0.0) as supernode:
        supernode.ready_timeout_s = TIMEOUT_S
        yield supernode


def _kinds(sn: InProcessSupernode) -> list[tuple[object, ...]]:
    return sorted({h.kind for h in sn._hosts}, key=repr)


async def test_a_started_supernode_verifies_asking_one_server_of_each_kind_over_grpc(
    sn: InProcessSupernode,
) -> None:
    await sn.verify_serving()
    assert len(_kinds(sn)) == KINDS
    assert len(sn._hosts) == 31


async def test_a_server_whose_own_health_is_not_serving_fails_the_verification(
    sn: InProcessSupernode,
) -> None:
    laggard = sn._hosts[3]
    await laggard.set_serving(False)
    try:
        with pytest.raises(UnavailableError, match=f"1 servers not SERVING: {laggard.address} NOT"):
            await sn.verify_serving()
    finally:
        await laggard.set_serving(True)
    await sn.verify_serving()


@pytest.mark.parametrize("index", range(KINDS))
async def test_every_kind_is_asked_over_grpc(sn: InProcessSupernode, index: int) -> None:
    """Every server of one kind refuses on the wire while its health says SERVING: only the
    call over gRPC can see it, so the verification fails for each kind in turn."""
    kind = _kinds(sn)[index]
    refusing = [h for h in sn._hosts if h.kind == kind]
    for host in refusing:
        host.gate.refusing = "refused by the test"
    try:
        assert all(h.served is not None for h in refusing)  # its own health: SERVING
        with pytest.raises(UnavailableError, match=r"1 servers not SERVING: \S+ FAILED"):
            await sn.verify_serving()
    finally:
        for host in refusing:
            host.gate.refusing = ""
    await sn.verify_serving()
