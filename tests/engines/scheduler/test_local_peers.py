"""In one process the router's serving engine, the training jobs and the cluster manager reach
the scheduler's and EMS's engines directly (services/peers.py: LocalScheduler, LocalEms), and
the manager the router's (LocalRouter), not through a client, and a refusal comes back as the
same EmulatorError class, reason and message as over gRPC (the typed client's); a killed
scheduler or router refuses both ways alike, UNAVAILABLE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.control import RemoteRouter
from cmemu.emulator.client.ems import WIRE_KIND, EmsClient
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.engines.ems import EmsState
from cmemu.emulator.engines.ems.local import KIND_NUMBER, LocalEms
from cmemu.emulator.engines.manager.link import SeveredRouter, SeveredScheduler
from cmemu.emulator.engines.peers import JobScheduler
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.engines.scheduler.local import LocalScheduler
from cmemu.emulator.engines.serving.local import LocalRouter
from cmemu.emulator.engines.serving.peers import KvStore
from cmemu.emulator.model.errors import EmulatorError, UnavailableError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import Supernode, running_supernode
from cmemu.services.manager import ManagerService
from cmemu.services.router import RouterState


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=20.0) as supernode:
        yield supernode


def _hosted(sn: Supernode) -> tuple[SchedulerEngine, EmsState, RouterState, ManagerService]:
    scheduler = sn.local.service_state(ServiceKind.SCHEDULER)
    ems = sn.local.service_state(ServiceKind.EMS)
    router = sn.local.service_state(ServiceKind.ROUTER)
    manager = sn.local.service_state(ServiceKind.MANAGER)
    assert isinstance(scheduler, SchedulerEngine) and isinstance(ems, EmsState)
    assert isinstance(router, RouterState) and isinstance(manager, ManagerService)
    return scheduler, ems, router, manager


async def test_in_one_process_the_peers_are_the_engines(mini: Supernode) -> None:
    scheduler, ems, router, manager = _hosted(mini)
    serving = router.engine.provisioner
    training = manager.training.endpoints
    severed = manager.engine.peers.scheduler()  # the manager's, behind its partition switch
    assert isinstance(severed, SeveredScheduler)
    for peer in (serving.scheduler, training.scheduler, severed.inner):
        assert isinstance(peer, LocalScheduler) and peer.engine is scheduler
    for store in (router.engine.ems, training.ems):
        assert isinstance(store, LocalEms) and store.store is ems
    severed_router = manager.engine.peers.router()
    assert isinstance(severed_router, SeveredRouter)
    assert isinstance(severed_router.inner, LocalRouter)
    assert severed_router.inner.engine is router.engine


async def _refusal(call: Awaitable[Any]) -> EmulatorError:
    with pytest.raises(EmulatorError) as refused:
        await call
    return refused.value


def _same(local: EmulatorError, remote: EmulatorError) -> None:
    assert type(local) is type(remote)
    assert (local.reason, str(local)) == (remote.reason, str(remote))


async def test_a_refusal_is_the_same_error_directly_as_over_grpc(mini: Supernode) -> None:
    scheduler, ems, _, _ = _hosted(mini)
    local, remote = LocalScheduler(scheduler), SchedulerClient(mini.clients)
    asks: list[Callable[[JobScheduler], Awaitable[object]]] = [
        lambda s: s.allocate("huge", 10_000),
        lambda s: s.allocation("ghost"),
    ]
    for ask in asks:
        _same(await _refusal(ask(local)), await _refusal(ask(remote)))
    store, client = LocalEms(ems), EmsClient(mini.clients)
    reads: list[Callable[[KvStore], Awaitable[object]]] = [
        lambda s: s.load("no-such-key"),
        lambda s: s.put("", b"x"),
    ]
    for read in reads:
        _same(await _refusal(read(store)), await _refusal(read(client)))
    # the twin: what each grants, each reads back the same
    put = await store.put("ok-key", b"bytes")
    got = await client.load("ok-key")
    assert (got.key, got.data, got.size) == (put.key, b"bytes", put.size)
    assert [n for _, n in sorted(KIND_NUMBER.items())] == [
        int(w) for _, w in sorted(WIRE_KIND.items())
    ]  # the store's kinds are the wire's numbers


async def _killed_refuses_both_ways(
    sn: Supernode, service: str, asks: tuple[Callable[[], Awaitable[Any]], ...], reason: str
) -> None:
    """Killed, `service` refuses each ask (its local and its remote peer's, made anew by
    `asks`) UNAVAILABLE; back, each gets `reason` again (the client's channel reconnects)."""
    down = await faults.inject(sn.clients, "service-kill", service)
    try:
        for ask in asks:
            refused = await _refusal(ask())
            assert isinstance(refused, UnavailableError), refused
    finally:
        await faults.clear(sn.clients, down.id)
    for ask in asks:  # the twin: back, it answers again
        async with asyncio.timeout(60):  # a bound on a hung test
            while True:
                refused = await _refusal(ask())
                if not isinstance(refused, UnavailableError):
                    break
                await asyncio.sleep(0.2)
        assert refused.reason == reason  # and the module's other tests find it back


async def test_a_killed_scheduler_refuses_directly_as_over_grpc(mini: Supernode) -> None:
    scheduler, _, _, _ = _hosted(mini)
    local, remote = LocalScheduler(scheduler), SchedulerClient(mini.clients)
    asks = (lambda: local.allocation("ghost"), lambda: remote.allocation("ghost"))
    await _killed_refuses_both_ways(mini, "scheduler", asks, "JOB_NOT_FOUND")


def _routers(sn: Supernode) -> tuple[LocalRouter, RemoteRouter]:
    _, _, router, _ = _hosted(sn)
    address = sn.topology.service(ServiceKind.ROUTER).address
    return LocalRouter(router.engine), RemoteRouter(sn.clients.channel_to(address))


async def test_the_router_refuses_directly_as_over_grpc_killed_or_not(mini: Supernode) -> None:
    local, remote = _routers(mini)
    for peer in (local, remote):  # no deployment in this module: restored never, or unknown
        refused = await _refusal(peer.last_restored_ns("ghost"))
        assert refused.reason == "DEPLOYMENT_NOT_FOUND" and str(refused).startswith("router: ")
    _same(
        await _refusal(local.last_restored_ns("ghost")),
        await _refusal(remote.last_restored_ns("ghost")),
    )
    asks = (lambda: local.last_restored_ns("ghost"), lambda: remote.last_restored_ns("ghost"))
    await _killed_refuses_both_ways(mini, "router", asks, "DEPLOYMENT_NOT_FOUND")
