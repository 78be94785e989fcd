"""The scheduler's engine (emulator/engines/scheduler/) driven directly, no cmemu.v1.Scheduler in
between: a job placed, watched, failed, replaced and released, with the grants' values out and
the events it announces; every refusal its own EmulatorError class and reason, changing nothing
(the must-fail twins); and the engine as callers of its process reach it (LocalScheduler),
through its outage: killed it refuses and ends an open watch, hung it answers nothing until
it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.scheduler.dayplans import DayPlanAsk
from cmemu.emulator.engines.scheduler.engine import REASON_DOWN, SchedulerEngine
from cmemu.emulator.engines.scheduler.local import LocalScheduler
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import (
    CapacityError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import build
from cmemu.emulator.testing import EventRecorder

WALL_BOUND_S = 10.0  # only stops a hung test
TOPOLOGY = build("cm-mini")  # a description only: 2 nodes of 8 NPUs, one spare kept


def engine_of() -> tuple[SchedulerEngine, EventRecorder]:
    events = EventRecorder()
    engine = SchedulerEngine(
        topology=TOPOLOGY, profile=DEFAULT_PROFILE, clock=Timeline(Clock()), events=events
    )
    return engine, events


async def test_a_job_is_placed_watched_failed_replaced_and_released() -> None:
    engine, events = engine_of()
    mine, every = engine.watch("train"), engine.watch()
    placed = await engine.allocate("train", 4, same_rack=True, priority=2)
    assert len(placed.npus) == 4 and placed.policy == "topology-aware" and placed.priority == 2
    first = placed.npus[0]
    assert first.dies == (f"{first.id}.d0", f"{first.id}.d1") and first.node == first.id[:3]
    assert not {n.id for n in placed.npus} & set((await engine.spares()).npus)
    assert await engine.allocation("train") == placed
    held = await engine.allocations()
    assert (held.total_npus, held.allocated_npus, held.spare_npus, held.free_npus) == (16, 4, 1, 11)

    victim = placed.npus[1].id
    marked = await engine.mark_failed(npu=victim)
    assert marked.npus == (victim,) and marked.affected_jobs == ("train",)
    swaps, after = await engine.replace("train", npu=victim)
    (swap,) = swaps
    assert swap.old == victim and victim not in {n.id for n in after.npus}
    assert (await engine.mark_healthy(npu=victim)).npus == (victim,)
    released = await engine.release("train")
    assert (released.job, released.npus) == ("train", 4)
    assert (await engine.allocations()).allocated_npus == 0

    async with asyncio.timeout(WALL_BOUND_S):  # each change is queued already: a missing one
        seen = [await anext(mine) for _ in range(4)]  # fails the test rather than hang it
    assert [c.change for c in seen] == ["allocated", "failed", "replaced", "released"]
    assert seen[1].npus == (victim,) and seen[2].npus == (swap.new,)
    assert seen[0].allocation == placed and seen[2].allocation == after
    async with asyncio.timeout(WALL_BOUND_S):
        assert (await anext(every)).change == "allocated"
    mine.cancel()
    every.cancel()
    assert not engine.watchers  # a cancelled watch is gone
    assert [name for _, name, _ in events.events] == [
        "allocated", "failed", "replaced", "healthy", "released"
    ]  # fmt: skip
    assert events.named("replaced")[0]["replaced"] == {victim: swap.new}


async def test_spares_and_policies() -> None:
    engine, events = engine_of()
    assert (await engine.spares()).target == 1
    spares = await engine.spares(3)
    assert spares.target == 3 and len(spares.npus) == 3
    assert events.named("spares") == [{"target": 3, "npus": list(spares.npus)}]
    policies = await engine.policies()
    assert {p.name for p in policies} == {"first-fit", "best-fit", "topology-aware"}
    assert [p.name for p in policies if p.default] == ["topology-aware"]


Call = Callable[[SchedulerEngine], Awaitable[Any]]


async def _fill(engine: SchedulerEngine) -> None:
    await engine.allocate("held", 8)


REFUSALS: list[tuple[str, Call, type[EmulatorError], str | None]] = [
    ("malformed job", lambda e: e.allocate("a/b", 1), InvalidArgumentError, "MALFORMED_JOB"),
    ("no NPU asked", lambda e: e.allocate("j", 0), InvalidArgumentError, None),
    ("more than exist", lambda e: e.allocate("j", 17), OutOfRangeError, "TOO_MANY_NPUS"),
    ("no room", lambda e: e.allocate("j", 9), CapacityError, "NO_ROOM"),
    ("already held", lambda e: e.allocate("held", 1), PreconditionError, "JOB_EXISTS"),
    ("unknown policy", lambda e: e.allocate("j", 1, policy="rnd"), NotFoundError, "UNKNOWN_POLICY"),
    ("unknown job", lambda e: e.allocation("ghost"), NotFoundError, "JOB_NOT_FOUND"),
    ("release unknown", lambda e: e.release("ghost"), NotFoundError, "JOB_NOT_FOUND"),
    (
        "npu not in job",
        lambda e: e.replace("held", npu="n01-npu0"),
        PreconditionError,
        "NOT_IN_JOB",
    ),
    (
        "npu and node",
        lambda e: e.mark_failed(npu="n00-npu0", node="n00"),
        InvalidArgumentError,
        None,
    ),
    ("unknown node", lambda e: e.mark_failed(node="n99"), NotFoundError, "NODE_NOT_FOUND"),
    ("negative spares", lambda e: e.spares(-1), InvalidArgumentError, None),
    ("spares beyond free", lambda e: e.spares(9), CapacityError, "NO_ROOM"),
    ("no day plans", lambda e: e.day_plan("night"), UnavailableError, None),
]


@pytest.mark.parametrize(
    ("call", "error", "reason"),
    [pytest.param(c, e, r, id=name) for name, c, e, r in REFUSALS],
)
async def test_every_refusal_is_its_own_error_and_changes_nothing(
    call: Call, error: type[EmulatorError], reason: str | None
) -> None:
    engine, _ = engine_of()
    await _fill(engine)
    before = await engine.allocations()
    with pytest.raises(error) as refused:
        await call(engine)
    assert reason is None or refused.value.reason == reason, refused.value
    assert await engine.allocations() == before


async def test_a_replace_without_spares_refuses_no_spares() -> None:
    engine, _ = engine_of()
    placed = await engine.allocate("j", 2)
    await engine.spares(0)
    with pytest.raises(CapacityError) as refused:
        await engine.replace("j", npu=placed.npus[0].id)
    assert refused.value.reason == "NO_SPARES"
    assert await engine.allocation("j") == placed
    with pytest.raises(InvalidArgumentError):
        engine.watch("not a job")
    elsewhere = "n01-npu6" if placed.npus[0].node == "n00" else "n00-npu6"
    with pytest.raises(PreconditionError) as not_in_job:
        await engine.replace("j", npu=elsewhere)
    assert not_in_job.value.reason == "NOT_IN_JOB"


async def test_a_day_plan_needs_a_job_before_anything_moves() -> None:
    """A scheduler with no peers runs no day plans; the ask is checked (its twin: the
    services' day plan tests run one end to end)."""
    engine, _ = engine_of()
    ask = DayPlanAsk(name="p", deployment="d", job=None, night="22-6", hour_s=1.0,
                     start_hour=0.0, hours=0.0, night_decode_npus=0, drain_s=0.0)  # fmt: skip
    with pytest.raises(UnavailableError):
        await engine.start_day_plan(ask)


async def _pending(call: asyncio.Future[Any]) -> bool:
    for _ in range(20):  # the loop turns; an admitted call would be done long before
        await asyncio.sleep(0)
    return not call.done()


async def test_the_local_peer_meets_the_outage_as_a_remote_caller_meets_the_server() -> None:
    engine, _ = engine_of()
    local = LocalScheduler(engine)
    placed = await local.allocate("j", 2)
    assert placed == await engine.allocation("j")  # the engine's own answer
    watch = local.watch("j")

    engine.outage.down("kill")  # refused at once, UNAVAILABLE, and the open watch ends
    with pytest.raises(UnavailableError) as refused:
        await local.allocation("j")
    assert refused.value.reason == REASON_DOWN
    with pytest.raises(UnavailableError):
        async with asyncio.timeout(WALL_BOUND_S):  # a watch the kill did not end hangs
            await anext(watch)
    assert not engine.watchers
    with pytest.raises(UnavailableError) as relayed:
        await local.mark_failed(placed.npus[0].id)  # the manager's peer: prefixed as relayed
    assert str(relayed.value).startswith("scheduler: ")
    engine.outage.up()

    engine.outage.down("hang")  # answered nothing until it is back
    call = asyncio.ensure_future(local.allocation("j"))
    assert await _pending(call)
    engine.outage.up()
    assert await call == placed

    with pytest.raises(NotFoundError) as missing:  # the twin: up, a refusal is the engine's
        await local.allocation("ghost")
    assert missing.value.reason == "JOB_NOT_FOUND" and not str(missing.value).startswith("sched")
