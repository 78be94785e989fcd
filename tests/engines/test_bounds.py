"""The engines' bounds on a hung device or service count emulated time (engines/deadline.py): a
KV region's allocation and release on an NPU (serving.kv_region_timeout_s), a training step's
collectives (training.step_deadline_s), an ended job's release by the scheduler
(training.release_wait_s), the manager's diagnosis of a straggler
(manager.heartbeat_deadline_s) and an RDMA gateway's landing of an op on an NPU
(scaleout.peer_timeout_s). Each is asked of a real hung device or service of an in-process
cm-mini (cm-minix1 for the gateway), by a component of the test's own on a clock of the test's
own, at 1,000 emulated seconds per wall second and with no wall floor: the hang is ended within
wall milliseconds. The twin holds that clock (a stalled owner of time: no emulated second
passes), and the same call is still waiting seconds later, then completes once the hang is
cleared (nothing given up on early)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.gateway.engine import GatewayEngine
from cmemu.emulator.engines.gateway.types import Landing, RdmaOp
from cmemu.emulator.engines.manager.engine import ManagerEngine
from cmemu.emulator.engines.peers import LocalFabric
from cmemu.emulator.engines.serving.deploy import Provisioner
from cmemu.emulator.engines.training.engine import TrainingEngine
from cmemu.emulator.engines.training.live import Endpoints, LiveJob
from cmemu.emulator.engines.training.runner import JobRunner
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import DeadlineExceededError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.topology import Device, DeviceKind, ServiceKind
from cmemu.emulator.model.training.job import JobProgress
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.testing import Supernode, running_supernode
from cmemu.services.peers import Peers

T = TypeVar("T")
SCALE = 1000.0  # the test's clock: every bound here (5-30 emulated s) is 5-30 wall ms
HANG_S = 120.0  # wall: only stops a hung test
STILL_WAITING_S = 2.0  # wall: 2,000 emulated seconds unheld, far past every bound here
# no wall floors: at this scale only the emulated bound can end a call
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, step_deadline_min_wall_s=0.0),
    training=replace(DEFAULT_PROFILE.training, deadline_min_wall_s=0.0),
    manager=replace(DEFAULT_PROFILE.manager, heartbeat_deadline_min_wall_s=0.0),
    scaleout=replace(DEFAULT_PROFILE.scaleout, peer_timeout_min_wall_s=0.0),
)


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=50.0) as supernode:
        yield supernode


def clock_of(held: bool) -> Timeline:
    clock = Clock(time_scale=SCALE)
    if held:
        clock.hold_until(clock.wall())  # no reading passes now: no emulated second goes by
    return Timeline(clock)


def npus(sn: Supernode, count: int) -> list[Device]:
    return [d for d in sn.topology.devices if d.kind is DeviceKind.NPU][:count]


async def hung(
    sn: Supernode, target: str, kind: str, call: Callable[[], Awaitable[T]], *, held: bool
) -> T | None:
    """`call` made while `target` hangs: given up on with DeadlineExceededError naming its
    peer (None), or, `held`, still waiting STILL_WAITING_S later and answered once the hang is
    cleared (its answer)."""
    fault = await faults.inject(sn.clients, kind, target)
    pending = asyncio.ensure_future(call())
    cleared = False
    try:
        if not held:
            async with asyncio.timeout(HANG_S):
                with pytest.raises(DeadlineExceededError, match="emulated s"):
                    await pending
            return None
        done, _ = await asyncio.wait({pending}, timeout=STILL_WAITING_S)
        assert not done, "given up on while no emulated second passed"
        await faults.clear(sn.clients, fault.id)
        cleared = True
        async with asyncio.timeout(HANG_S):
            return await pending
    finally:
        pending.cancel()
        if not cleared:  # the next case finds the target well, whatever this one found
            await faults.clear(sn.clients, fault.id)


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("op", ["allocate", "free"])
async def test_a_kv_region_call_on_a_hung_npu_ends_after_its_emulated_seconds(
    mini: Supernode, op: str, held: bool
) -> None:
    peers = Peers(mini.topology)
    provisioner = Provisioner(
        topology=mini.topology, profile=PROFILE, clock=clock_of(held), peers=peers,
        scheduler=SchedulerClient(mini.clients), ems=EmsClient(mini.clients),
    )  # fmt: skip
    (npu,) = npus(mini, 1)
    device = peers.device(npu)  # unbounded: a healthy call takes wall ms that this scale
    # makes emulated seconds, so only the calls under test go through the provisioner
    try:
        if op == "allocate":
            region = await hung(
                mini, npu.id, "hang", lambda: provisioner.allocate_region(npu, 4096, "b/kv"),
                held=held,
            )  # fmt: skip
            if region is not None:
                await device.free(region.region_id, deadline_s=None)
        else:
            kept = await device.allocate(4096, "b/kv", deadline_s=None)
            freed = await hung(
                mini, npu.id, "hang", lambda: provisioner.free_region(npu, kept.region_id),
                held=held,
            )  # fmt: skip
            if freed is None:
                await device.free(kept.region_id, deadline_s=None)
            else:
                assert freed >= 4096
    finally:
        await peers.close()


@pytest.mark.parametrize("held", [False, True])
async def test_a_step_collective_with_a_hung_rank_ends_after_its_emulated_seconds(
    mini: Supernode, held: bool
) -> None:
    local = mini.local
    assert local.fabric is not None
    fabric = LocalFabric(local.fabric)
    two = npus(mini, 2)
    shape = shape_of(name="b-step", npus=2, profile=PROFILE)
    job = LiveJob(
        shape=shape,
        progress=JobProgress(name="b-step", steps=0, checkpoint_every=1000, started_ns=0),
    )
    runner = JobRunner(
        job, profile=PROFILE, clock=clock_of(held), events=None, topic="training",
        endpoints=Endpoints(
            scheduler=SchedulerClient(mini.clients), ems=EmsClient(mini.clients),
            fabric=lambda: fabric,
        ),
    )  # fmt: skip
    ranks = tuple(die_id(n.id, d) for n in two for d in range(PROFILE.npu.dies))
    done = await hung(
        mini, two[1].id, "hang", lambda: runner.collective("all-reduce", ranks, size=2**20),
        held=held,
    )  # fmt: skip
    if held:
        assert done is not None and done[0] > 0


@pytest.mark.parametrize("held", [False, True])
async def test_an_ended_jobs_release_by_a_hung_scheduler_ends_after_its_emulated_seconds(
    mini: Supernode, held: bool
) -> None:
    """The release is given up on quietly (a start then meets the NPUs still held): the job's
    NPUs are still the scheduler's once it returned, and released when it waited the hang
    out."""
    local = mini.local
    assert local.fabric is not None
    fabric = LocalFabric(local.fabric)
    scheduler = SchedulerClient(mini.clients)
    engine = TrainingEngine(
        profile=PROFILE, clock=clock_of(held), events=None, topic="training",
        endpoints=Endpoints(
            scheduler=scheduler, ems=EmsClient(mini.clients), fabric=lambda: fabric
        ),
    )  # fmt: skip
    await scheduler.allocate("b-ended", 1)
    fault = await faults.inject(mini.clients, "service-hang", "scheduler")
    pending = asyncio.ensure_future(engine._given_back("b-ended"))
    try:
        if held:
            done, _ = await asyncio.wait({pending}, timeout=STILL_WAITING_S)
            assert not done, "given up on while no emulated second passed"
        else:
            async with asyncio.timeout(HANG_S):
                await pending
    finally:
        await faults.clear(mini.clients, fault.id)
    async with asyncio.timeout(HANG_S):
        await pending
    jobs = {a.job for a in (await scheduler.allocations()).allocations}
    assert ("b-ended" in jobs) is not held
    if not held:
        await scheduler.release("b-ended")


@pytest.mark.parametrize("held", [False, True])
async def test_a_straggler_diagnosis_on_a_hung_npu_ends_after_its_emulated_seconds(
    mini: Supernode, held: bool
) -> None:
    peers = Peers(mini.topology)
    manager = ManagerEngine(
        topology=mini.topology, profile=PROFILE, clock=clock_of(held), peers=peers,
        events=None, address=mini.topology.service(ServiceKind.MANAGER).address,
    )  # fmt: skip
    (npu,) = npus(mini, 1)
    try:
        ratio = await hung(mini, npu.id, "hang", lambda: manager._diagnosis(npu.id), held=held)
        if held:
            assert ratio is not None and ratio > 0
    finally:
        await peers.close()


@pytest.fixture(scope="module")
async def minix() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-minix1", time_scale=50.0) as supernode:
        yield supernode


@pytest.mark.parametrize("held", [False, True])
async def test_a_gateways_landing_on_a_hung_npu_ends_after_its_emulated_seconds(
    minix: Supernode, held: bool
) -> None:
    """The gateway's data path (an op's check and landing on the NPU it addresses); a peer
    gateway's agreement and landing go through the same bound (GatewayState.answer)."""
    peers = Peers(minix.topology)
    gateway = GatewayEngine(
        topology=minix.topology, profile=PROFILE, clock=clock_of(held), peers=peers
    )
    (npu,) = npus(minix, 1)
    region = await peers.device(npu).allocate(4096, "b/rdma", deadline_s=None)
    landing = Landing(
        op=RdmaOp.WRITE, npu=npu.id, offset=region.offset, data=b"", size=64, size_only=True,
        check_only=True, src=die_id(npus(minix, 2)[1].id, 0), id="b-land", issue_ns=0,
    )  # fmt: skip
    try:
        landed = await hung(minix, npu.id, "hang", lambda: gateway.land(landing), held=held)
        assert landed == (b"" if held else None)
    finally:
        await peers.device(npu).free(region.region_id, deadline_s=None)
        await peers.close()


def test_the_profile_here_has_no_wall_floors() -> None:
    """Else a floor, not the emulated bound, could be what ends the calls above."""
    p: HardwareProfile = PROFILE
    floors = (
        p.serving.step_deadline_min_wall_s,
        p.training.deadline_min_wall_s,
        p.manager.heartbeat_deadline_min_wall_s,
        p.scaleout.peer_timeout_min_wall_s,
    )
    assert floors == (0.0, 0.0, 0.0, 0.0)
