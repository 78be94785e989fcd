"""The typed scheduler client (emulator/client/scheduler.py) against a real cm-mini in this
process: allocate, list, replace, spares, policies and release as plain values; refusals
(an unknown job, a bad request) as EmulatorErrors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.dayplan import day_plan
from cmemu.emulator.client.scheduler import AllocationChange, SchedulerClient
from cmemu.emulator.model.errors import DeadlineExceededError, InvalidArgumentError, NotFoundError
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


async def test_a_wall_deadline_ends_a_call_the_scheduler_does_not_answer(mini: Supernode) -> None:
    """`timeout_s` bounds every unary call (issue 18: one timeout rule for the typed clients):
    a hung scheduler (service-hang) is DeadlineExceededError after it; the client without one
    is still waiting when the same call is cut from outside."""
    bounded = SchedulerClient(mini.clients, timeout_s=1.0)
    assert await bounded.policies()  # answered while healthy
    hang = await faults.inject(mini.clients, "service-hang", "scheduler")
    try:
        with pytest.raises(DeadlineExceededError):
            await bounded.allocations()
        unbounded = asyncio.ensure_future(SchedulerClient(mini.clients).allocations())
        await asyncio.sleep(3.0)  # three times the other's deadline: it would have ended by now
        assert not unbounded.done()  # the must-fail twin: no timeout, no deadline error
        unbounded.cancel()
    finally:
        await faults.clear(mini.clients, hang.id)
    async with asyncio.timeout(60):  # a bound only: the scheduler answers again once cleared
        while True:
            try:
                await bounded.allocations()
                break
            except DeadlineExceededError:
                await asyncio.sleep(0.1)
