"""The serving engine (emulator/engines/serving/) driven directly, no cmemu.v1.Router and no
HTTP in between: a ServingEngine of the test's own beside an in-process cm-mini, on its clock,
holding NPUs with the real scheduler and weights in the real EMS through the typed clients (the
JobScheduler and KvStore peers), timing its steps on the supernode's fabric engine (a direct
call) and its NPUs over gRPC (a Peers of its own: the ServingDirectory). What a caller gets back
is domain values and EmulatorErrors with their reasons."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest

from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.engines.serving.engine import ServingEngine
from cmemu.emulator.engines.serving.spec import DeployAsk
from cmemu.emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.engine import FinishEvent, FinishReason, TokenEvent
from cmemu.emulator.model.serving.live import DeploymentState
from cmemu.emulator.testing import EventRecorder, Supernode, running_supernode
from cmemu.services.peers import Peers

SCALE = 20.0  # emulated seconds per wall second: the weights' 4-8 s load in well under one
WALL_BOUND_S = 300.0  # only stops a hung test: a busy host slows emulated time too
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
)
# two instances of 2 NPUs; answers run to max_tokens (a natural length beyond any asked)
SMALL = DeployAsk(
    model="deepseek-r1",
    decode_npus=2,
    prefill_instances=1,
    prefill_npus=2,
    options={"output": "1000000"},
)


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=SCALE, profile=PROFILE) as supernode:
        yield supernode


@contextlib.asynccontextmanager
async def engine_of(sn: Supernode) -> AsyncIterator[tuple[ServingEngine, EventRecorder]]:
    """A serving engine of its own on `sn`'s clock, running until the block ends."""
    local = sn.local
    assert local.fabric is not None and local.time is not None
    peers = Peers(sn.topology)
    peers.host_fabric(local.fabric)
    events = EventRecorder()
    engine = ServingEngine(
        topology=sn.topology,
        profile=local.profile,
        clock=local.time.timeline,
        peers=peers,
        scheduler=SchedulerClient(sn.clients),
        ems=EmsClient(sn.clients),
        events=events,
    )
    runner = asyncio.create_task(engine.run())
    try:
        yield engine, events
    finally:
        for name in list(engine.deployments):
            await engine.undeploy(name)
        await engine.close()
        await runner
        await peers.close()


async def until(ok: Callable[[], bool | Awaitable[bool]]) -> None:
    """Wait for a condition (polled; the bound only stops a hung test)."""
    async with asyncio.timeout(WALL_BOUND_S):
        while True:
            done = ok()
            if done if isinstance(done, bool) else await done:
                return
            await asyncio.sleep(0.02)


async def jobs(sn: Supernode) -> set[str]:
    """The scheduler's allocations, by job."""
    return {a.job for a in (await SchedulerClient(sn.clients).allocations()).allocations}


async def test_a_deployment_serves_a_request_to_its_length_and_gives_its_npus_back(
    mini: Supernode,
) -> None:
    async with engine_of(mini) as (engine, events):
        await until(lambda: engine.running)
        live = await engine.deploy(replace(SMALL, name="e-one", wait=True))
        assert live.state is DeploymentState.SERVING and live.npus == 4
        assert await jobs(mini) >= {"e-one.decode-0", "e-one.prefill-0"}
        stream = engine.serving("e-one").submit([11, 12, 13, 14], 3)
        seen = [event async for event in stream]
        assert [type(e) for e in seen][-1] is FinishEvent
        finish = seen[-1]
        assert isinstance(finish, FinishEvent) and finish.reason is FinishReason.LENGTH
        assert sum(e.count for e in seen if isinstance(e, TokenEvent)) == 3
        summary = engine.stats("e-one")
        assert (summary.requests_completed, summary.completion_tokens) == (1, 3)
        assert summary.ttft.count == 1 and summary.ttft.p50_ns > 0
        gone = await engine.undeploy("e-one")
        assert gone.state is DeploymentState.STOPPED and not gone.allocations
        assert not {"e-one.decode-0", "e-one.prefill-0"} & await jobs(mini)
        names = [e for _, e, _ in events.events if e != "request"]
        assert names == ["deploying", "deployed", "undeployed"]


async def test_its_twin_what_it_refuses_leaves_nothing_held(mini: Supernode) -> None:
    """A name taken, a request that does not parse, a deployment that is not there or not
    serving: each is its EmulatorError with its reason, and no NPU stays allocated for it."""
    async with engine_of(mini) as (engine, events):
        with pytest.raises(UnavailableError):  # not running yet: nothing to own its tasks
            await ServingEngine(
                topology=engine.topology,
                profile=engine.profile,
                clock=engine.clock,
                peers=engine.peers,
                scheduler=engine.provisioner.scheduler,
                ems=engine.ems,
                events=None,
            ).deploy(replace(SMALL, name="e-never"))
        await until(lambda: engine.running)
        before = await jobs(mini)
        with pytest.raises(InvalidArgumentError) as bad:
            await engine.deploy(replace(SMALL, name="e-bad", spec_yaml="model: deepseek-r1"))
        assert bad.value.field == "spec_yaml"
        with pytest.raises(InvalidArgumentError) as bad:
            await engine.deploy(replace(SMALL, name="Not A Name"))
        assert bad.value.field == "name"
        with pytest.raises(CapacityError) as full:  # its decode NPUs fit, its prefill's do not
            await engine.deploy(replace(SMALL, name="e-huge", decode_npus=12, prefill_npus=4))
        assert full.value.reason == "NO_ROOM"  # the scheduler's refusal, relayed: who said it
        assert str(full.value).startswith("scheduler (prefill-0: 4 NPUs): no room")
        assert await jobs(mini) == before  # and the decode NPUs it had are given back
        live = await engine.deploy(replace(SMALL, name="e-two"))
        assert live.state is DeploymentState.LOADING
        with pytest.raises(UnavailableError):  # loading: no driver yet
            engine.serving("e-two")
        with pytest.raises(PreconditionError) as taken:
            await engine.deploy(replace(SMALL, name="e-two"))
        assert taken.value.reason == "DEPLOYMENT_EXISTS"
        with pytest.raises(NotFoundError) as missing:
            engine.serving("e-none")
        assert missing.value.reason == "DEPLOYMENT_NOT_FOUND"
        assert await jobs(mini) - before == {"e-two.decode-0", "e-two.prefill-0"}
        await engine.undeploy("e-two")
        assert await jobs(mini) == before
        assert [e for _, e, _ in events.events] == ["deploying", "undeployed"]
