"""The live-flow clock (emulator/engines/flows.py) at its edges: a flow in flight when the clock
closes fails UNAVAILABLE and goes with it, and a flow that arrives after the close is refused
the same way; neither leaves a flow that would later finish with nobody waiting (once a KeyError
in another caller's transfer). The twin: flows on an open clock finish, each at its time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.flows import FlowClock
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import UnavailableError

GB = 1e9


def _clock() -> FlowClock:
    return FlowClock(
        clock=Timeline(Clock(time_scale=1000.0)), res_cap=np.array([GB]), cut_message="cut"
    )


async def test_flows_share_the_link_and_finish_in_order() -> None:
    flows = _clock()
    runner = asyncio.create_task(flows.run())
    try:
        start = flows.now_s()
        small = asyncio.create_task(flows.run_flow(((0, 1.0),), GB, 0.0, int(0.5 * GB), start))
        big = asyncio.create_task(flows.run_flow(((0, 1.0),), GB, 0.0, int(1.5 * GB), start))
        done_small, done_big = await asyncio.gather(small, big)
        # shared max-min: 0.5 GB each for 1 s, then the big one alone for its last 0.5 GB
        assert done_small == pytest.approx(start + 1.0, rel=1e-6)
        assert done_big == pytest.approx(start + 2.0, rel=1e-6)
        assert not flows.live.flows
    finally:
        flows.close("stopping")
        await runner


async def test_a_closed_clock_fails_its_flows_drops_them_and_refuses_new_ones() -> None:
    flows = _clock()
    runner = asyncio.create_task(flows.run())
    start = flows.now_s()
    flying = asyncio.create_task(flows.run_flow(((0, 1.0),), GB, 0.0, int(1e6 * GB), start))
    await asyncio.sleep(0)  # it is in flight
    assert len(flows.live.flows) == 1
    flows.close("the fabric is stopping")
    await runner
    with pytest.raises(UnavailableError, match="the fabric is stopping"):
        await flying
    assert not flows.live.flows  # gone with it: nothing finishes later for nobody
    with pytest.raises(UnavailableError, match="the fabric is stopping"):
        async with asyncio.timeout(30):  # a hang guard only: it is refused at once
            await flows.run_flow(((0, 1.0),), GB, 0.0, 1000, flows.now_s())
    flows.sync()  # nothing left to finish, and no KeyError


async def test_a_flow_that_has_ended_is_answered_without_the_clock_loop() -> None:
    """Settled at the end of the loop round it arrived in (no round of the clock loop, which
    is not even running here): a UB transaction's flow ends within nanoseconds."""
    flows = _clock()
    try:
        start = flows.now_s() - 1.0  # issued a second ago: over by any reading of the clock
        done = await flows.run_flow(((0, 1.0),), GB, 0.0, 64, start)
        assert done == pytest.approx(start + 64 / GB) and not flows.live.flows
    finally:
        flows.close("stopping")


async def test_a_flow_still_in_flight_waits_for_the_clock_loop() -> None:
    """The twin: a flow not over at the settle (a million emulated seconds) is left to the
    clock loop, and none is running, so it is still waiting after many loop rounds."""
    flows = _clock()
    try:
        task = asyncio.create_task(flows.run_flow(((0, 1.0),), GB, 0.0, 10**18, flows.now_s()))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done() and len(flows.live.flows) == 1
    finally:
        flows.close("stopping")
    with pytest.raises(UnavailableError):
        await task


@pytest.mark.parametrize(
    ("resources", "nbytes", "answered_at_once"),
    [
        ((), 1024, True),  # within a device, ended already: answered without a wait
        (((0, 1.0),), 1024, True),  # across a link of a quiet fabric: alone, so at once too
        ((), int(10 * GB), False),  # within a device but 10 s long: it waits for its end
        (((0, 1.0),), int(10 * GB), False),  # across the link, 10 s long: it waits too
    ],
)
async def test_a_flow_alone_that_has_ended_is_answered_without_a_wait(
    resources: tuple[tuple[int, float], ...], nbytes: int, answered_at_once: bool
) -> None:
    """Stepped by hand: a coroutine that returns at its first step never suspended. A flow
    alone (crossing nothing shared, as EMS's copy in its own pool; or the one flow on a quiet
    fabric) at 1 GB/s issued 1 emulated ms ago has ended; its end is the one the settled path
    gives (its start plus its bytes over its ceiling, plus the route's latency)."""
    flows = _clock()
    runner = asyncio.create_task(flows.run())
    try:
        start = flows.now_s() - 0.001
        call = flows.run_flow(resources, GB, 1e-6, nbytes, start)
        try:
            call.send(None)
        except StopIteration as stop:
            assert answered_at_once
            assert stop.value == pytest.approx(start + nbytes / GB + 1e-6, rel=1e-12)
            assert flows.live.completed == 1 and not flows.live.flows
        else:
            assert not answered_at_once
            call.close()
    finally:
        flows.close("stopping")
        await runner


def _first_step(call: Coroutine[Any, Any, float]) -> float | None:
    """The value of a coroutine that returns at its first step (it never suspended), else None
    (closed: it would have waited)."""
    try:
        call.send(None)
    except StopIteration as stop:
        return float(stop.value)
    call.close()
    return None


async def test_a_flow_alone_on_a_link_carries_its_bytes_as_a_settled_one() -> None:
    """Answered at once, a flow across a link is counted as the settled path counts it: one
    flow completed, its bytes on the link (at its share: half its rate on a link it crosses at
    half weight), and nothing left in flight."""
    flows = _clock()
    try:
        start = flows.now_s() - 0.001
        done = _first_step(flows.run_flow(((0, 0.5),), GB, 0.0, 1000, start))
        assert done == pytest.approx(start + 1000 / GB)  # the link at half weight: 2 GB/s
        assert flows.live.completed == 1 and not flows.live.flows
        assert flows.live.res_bytes[0] == pytest.approx(500)
    finally:
        flows.close("stopping")


async def test_a_flow_beside_one_in_flight_or_within_one_just_answered_is_run() -> None:
    """The twins of a flow alone: beside a flow in flight on the link it shares the link, and
    waits for the loop round that settles them; a flow that starts within the fluid span of one
    answered alone would have shared with it, so it is run too, not answered at once."""
    flows = _clock()
    runner = asyncio.create_task(flows.run())
    try:
        start = flows.now_s() - 0.001
        hog = asyncio.create_task(flows.run_flow(((0, 1.0),), GB, 0.0, 10**18, start))
        await asyncio.sleep(0)  # the hog's flow is in flight
        assert _first_step(flows.run_flow(((0, 1.0),), GB, 0.0, 64, start)) is None
        hog.cancel()
    finally:
        flows.close("stopping")
        await runner
    flows = _clock()
    try:
        start = flows.now_s() - 0.001
        first = _first_step(flows.run_flow(((0, 1.0),), GB, 0.0, 10**5, start))
        assert first is not None and first == pytest.approx(start + 10**5 / GB)  # at once
        within = asyncio.create_task(
            flows.run_flow(((0, 1.0),), GB, 0.0, 10**5, start + 10**5 / GB / 2)
        )
        await asyncio.sleep(0)  # its first step ran: it overlapped the first, so it is run
        assert not within.done() and len(flows.live.flows) == 1
        await within  # settled at the end of that round: it has ended too
        assert not flows.live.flows and flows.live.completed == 2
        after = _first_step(flows.run_flow(((0, 1.0),), GB, 0.0, 64, first))
        assert after == pytest.approx(first + 64 / GB)  # from the first's end on: alone again
    finally:
        flows.close("stopping")


async def test_a_flow_alone_after_the_capacities_change_runs_at_the_new_ones() -> None:
    """A flow alone's rate is remembered per route until the capacities change: a link halved
    by a fault halves the next one's rate (not the rate remembered from before)."""
    flows = _clock()
    try:
        link = ((0, 1.0),)  # one route's resources, as a cached route gives them each time
        start = flows.now_s() - 0.001
        before = _first_step(flows.run_flow(link, 2 * GB, 0.0, 1000, start))
        assert before == pytest.approx(start + 1000 / GB)  # the link's 1 GB/s, under its 2
        flows.set_capacities(np.array([GB / 2]))
        later = start + 1e-4
        after = _first_step(flows.run_flow(link, 2 * GB, 0.0, 1000, later))
        assert after == pytest.approx(later + 1000 / (GB / 2))
    finally:
        flows.close("stopping")
