"""The live-flow clock (emulator/engines/flows.py) at its edges: a flow in flight when the clock
closes fails UNAVAILABLE and goes with it, and a flow that arrives after the close is refused
the same way; neither leaves a flow that would later finish with nobody waiting (once a KeyError
in another caller's transfer). The twin: flows on an open clock finish, each at its time."""

from __future__ import annotations

import asyncio

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
        (((0, 1.0),), 1024, False),  # the twin: a shared link waits for the round's settling
        ((), int(10 * GB), False),  # within a device but 10 s long: it waits for its end
    ],
)
async def test_a_flow_within_a_device_that_has_ended_is_answered_without_a_wait(
    resources: tuple[tuple[int, float], ...], nbytes: int, answered_at_once: bool
) -> None:
    """Stepped by hand: a coroutine that returns at its first step never suspended. A flow
    crossing nothing shared (EMS's copy in its own pool) at 1 GB/s issued 1 emulated ms ago
    has ended; its end is the one the settled path gives (its start plus its bytes over its
    ceiling, plus the route's latency)."""
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
