"""The typed scheduler client (emulator/client/scheduler.py) against a real cm-mini in this
process: allocate, list, replace, spares, policies and release as plain values; refusals
(an unknown job, a bad request) as EmulatorErrors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client.dayplan import day_plan
from cmemu.emulator.client.scheduler import AllocationChange, SchedulerClient
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode


async def test_allocate_replace_and_release(mini: Supernode) -> None:
    sched = SchedulerClient(mini.clients)
    spares = await sched.spares(1)
    assert spares.target == 1 and len(spares.npus) == 1
    made = await sched.allocate("job-a", 2, priority=3)
    assert made.job == "job-a" and len(made.npus) == 2 and made.priority == 3
    assert all(len(n.dies) == 2 and not n.failed for n in made.npus)
    seen = await sched.allocations()
    assert [a.job for a in seen.allocations] == ["job-a"] and seen.allocated_npus == 2
    assert seen.spare_npus == 1 and seen.total_npus >= seen.free_npus + 3
    old = made.npus[0].id
    swaps, after = await sched.replace("job-a", npu=old)
    assert [s.old for s in swaps] == [old] and swaps[0].new in {n.id for n in after.npus}
    released = await sched.release("job-a")
    assert (released.job, released.npus) == ("job-a", 2)
    policies = await sched.policies()
    assert sum(p.default for p in policies) == 1


async def test_refusals_are_emulator_errors(mini: Supernode) -> None:
    sched = SchedulerClient(mini.clients)
    with pytest.raises(NotFoundError):
        await sched.release("no-such-job")
    with pytest.raises(InvalidArgumentError):
        await sched.allocate("job-b", 0)
    with pytest.raises(InvalidArgumentError):
        await sched.replace("job-b", npu="n00-npu0", node="n00")
    with pytest.raises(InvalidArgumentError):
        await sched.allocate("bad name!", 1)  # refused by the scheduler


async def test_an_unknown_day_plan_is_not_found(mini: Supernode) -> None:
    with pytest.raises(NotFoundError) as unknown:
        await day_plan(mini.clients, "no-such-plan")
    assert str(unknown.value).startswith("scheduler: ")  # as `cmemu sched day` always said


async def test_one_allocation_and_its_changes_as_they_happen(mini: Supernode) -> None:
    sched = SchedulerClient(mini.clients)
    changes = sched.watch("job-w")
    seen: list[AllocationChange] = []
    released = asyncio.Event()

    async def follow() -> None:
        async for change in changes:
            seen.append(change)
            if change.change == "released":
                released.set()

    follower = asyncio.get_running_loop().create_task(follow())
    try:
        async with asyncio.timeout(60):  # a bound only: the watch registers when it will
            while not any(c.change == "allocated" for c in seen):
                made = await sched.allocate("job-w", 1)
                assert (await sched.allocation("job-w")).npus == made.npus
                await sched.release("job-w")
                await asyncio.sleep(0.05)
            await released.wait()
    finally:
        changes.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    first = next(c for c in seen if c.change == "allocated")
    assert first.allocation.job == "job-w" and len(first.allocation.npus) == 1
    assert first.at_ns > 0 and all(c.allocation.job == "job-w" for c in seen)
    with pytest.raises(NotFoundError):
        await sched.allocation("job-w")
    bad = sched.watch("bad name!")  # a malformed job: the stream's status, as the error type
    try:
        with pytest.raises(InvalidArgumentError):
            await anext(bad)
    finally:
        bad.cancel()
