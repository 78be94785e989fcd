"""Emulated time held while wall-clock work of the emulator runs (a container starting again).

The container kinds use it around a (re)start (tests/runtime/test_docker_engine.py runs them
through the real engine); here the hold itself, against a real fabric that owns time."""

from __future__ import annotations

import asyncio
import time

from cmemu.emulator.client.clock import held_time
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import fabric_pb2

MIN_RATE = DEFAULT_PROFILE.clock.min_rate


async def _rate(sn: Supernode) -> float:
    clock = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
    return float(clock.rate)


async def _emulated_ns(sn: Supernode) -> int:
    clock = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
    return int(clock.emulated_ns)


async def _until_rate_above(sn: Supernode, rate: float) -> float:
    for _ in range(600):  # 60 s of wall at most: the authority speeds up by steps
        now = await _rate(sn)
        if now > rate:
            return now
        await asyncio.sleep(0.1)
    return await _rate(sn)


async def test_time_stands_almost_still_while_held_and_runs_again_after() -> None:
    async with running_supernode("cm-mini", time_scale=20.0) as sn:
        assert await _until_rate_above(sn, MIN_RATE) > MIN_RATE  # the twin: not held
        async with held_time(sn.topology, name="starting n00-npu0") as held:
            assert held
            assert await _rate(sn) == MIN_RATE
            wall, before = time.monotonic(), await _emulated_ns(sn)
            await asyncio.sleep(0.5)
            after, wall = await _emulated_ns(sn), time.monotonic() - wall
            # at most min_rate x the wall time that passed (not x20)
            assert after - before <= MIN_RATE * wall * 1e9 * 1.01 + 1e6
        # the stream closed: the fabric forgot the wish, time speeds up again
        assert await _until_rate_above(sn, MIN_RATE) > MIN_RATE


async def test_a_hold_on_a_fabric_that_is_not_there_says_it_did_not_hold() -> None:
    async with running_supernode("cm-mini", time_scale=20.0) as sn:
        topology = sn.topology
    # the supernode stopped: its fabric's address answers nothing
    assert topology.service(ServiceKind.FABRIC).address
    async with held_time(topology, name="starting n00-npu0") as held:
        assert not held
