"""The typed fabric client (emulator/client/fabric.py) against a real cm-mini in this process:
the xfer operation (allocate, submit, free) returns domain types, leaves no region behind
whatever happened, and every refusal is an EmulatorError of the class its status names."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.fabric import FabricClient, RouteInfo
from cmemu.emulator.client.remote import RemoteDevice
from cmemu.emulator.model.errors import (
    CapacityError,
    DeadlineExceededError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
)
from cmemu.emulator.model.ub import Op
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode


async def _regions(mini: Supernode, device_id: str) -> int:
    device = RemoteDevice(mini.clients.channel(device_id), mini.clients.find(device_id))
    return (await device.list_regions("", deadline_s=None)).region_count


async def test_an_xfer_returns_the_fabrics_completion_and_frees_its_region(
    mini: Supernode,
) -> None:
    fabric = FabricClient(mini.clients)
    before = await _regions(mini, "n00-npu1")
    done = await fabric.xfer("n00-npu0", "n00-npu1", 512, op=Op.READ)
    assert (done.src, done.dst, done.op, done.size) == ("n00-npu0", "n00-npu1", Op.READ, 512)
    assert done.emulated_s == pytest.approx(1.2e-6, rel=0.001)  # the calibration point
    assert done.completion.path == ("n00-npu1.d0", "n00-l1s0", "n00-npu0.d0")  # a READ's data
    assert done.bandwidth_gb_s == pytest.approx(512 / done.emulated_s / 1e9)
    assert await _regions(mini, "n00-npu1") == before


async def test_pacing_sees_the_route_and_is_left_before_the_result(mini: Supernode) -> None:
    seen: list[tuple[RouteInfo, float]] = []
    left: list[bool] = []

    @contextlib.contextmanager
    def pacing(route: RouteInfo, time_scale: float) -> Iterator[None]:
        seen.append((route, time_scale))
        yield
        left.append(True)

    fabric = FabricClient(mini.clients)
    await fabric.xfer("n00-npu0", "n01-mem", 1 << 20, pacing=pacing)
    route = await fabric.route("n00-npu0", "n01-mem")
    assert seen == [(route, mini.clients.topology.time_scale)] and left == [True]
    assert route.path[0].startswith("n00-npu0") and route.max_gb_s > 0 and route.latency_ns > 0


async def test_link_stats_show_the_bytes_moved(mini: Supernode) -> None:
    fabric = FabricClient(mini.clients)
    await fabric.xfer("n00-npu0", "n01-mem", 10**8)
    stats = await fabric.link_stats(3)
    assert len(stats.links) == 3 and stats.links[0].bytes > 0
    assert all(s.capacity_bytes_per_s > 0 for s in stats.links)
    watch = fabric.watch_link_stats(2, 0.01)
    try:
        frame = await anext(watch)
    finally:
        await watch.aclose()
    assert len(frame.links) == 2 and frame.completed_flows >= stats.completed_flows


REFUSED = [
    ("n00-npu0", "n99-npu0", 8, Op.WRITE, 0, NotFoundError, "'n99-npu0'"),
    ("n00-npu0", "n00-npu1", 1 << 40, Op.WRITE, 0, CapacityError, ""),
    ("n00-cpu0", "n00-npu1", 8, Op.WRITE, 1, InvalidArgumentError, ""),
    ("n00-npu0", "n00-npu1", 8, Op.CAS, 0, InvalidArgumentError, ""),
    ("n00-npu0", "n00-npu1", 0, Op.WRITE, 0, InvalidArgumentError, ""),
]


@pytest.mark.parametrize("case", REFUSED)
async def test_a_refused_xfer_is_an_emulator_error_and_leaves_no_region(
    mini: Supernode, case: tuple[str, str, int, Op, int, type[EmulatorError], str]
) -> None:
    src, dst, size, op, src_die, error, words = case
    before = await _regions(mini, "n00-npu1")
    with pytest.raises(error) as refused:
        await FabricClient(mini.clients).xfer(src, dst, size, op=op, src_die=src_die)
    assert words in str(refused.value)
    assert await _regions(mini, "n00-npu1") == before


async def test_a_bad_link_query_is_refused_before_any_call(mini: Supernode) -> None:
    fabric = FabricClient(mini.clients)
    with pytest.raises(InvalidArgumentError):
        await fabric.link_stats(-1)
    with pytest.raises(NotFoundError):
        await fabric.route("n00-npu0", "n99-npu0")


async def test_the_clock_as_the_fabric_reports_it(mini: Supernode) -> None:
    clock = await FabricClient(mini.clients).clock(deadline_s=30.0)  # a bound only
    assert clock.time_scale == mini.clients.topology.time_scale
    assert clock.emulated_ns > 0 and clock.epoch_wall_s > 0 and clock.rate > 0


async def test_a_wall_deadline_ends_a_call_the_fabric_does_not_answer(mini: Supernode) -> None:
    """`timeout_s` bounds every call of the client; a method's own `deadline_s` wins over it
    (issue 18: one timeout rule). Against a hung fabric (service-hang): the client's deadline
    ends `route`, a per-call deadline ends `link_stats` of a client that has none, and a call
    with neither is still waiting when it is cut from outside (the must-fail twin). (The clock
    is not asked: a hung fabric still keeps time for the processes that follow it.)"""
    bounded = FabricClient(mini.clients, timeout_s=1.0)
    assert (await bounded.route("n00-npu0", "n00-npu1")).path
    hang = await faults.inject(mini.clients, "service-hang", "fabric")
    try:
        with pytest.raises(DeadlineExceededError):
            await bounded.route("n00-npu0", "n00-npu1")
        with pytest.raises(DeadlineExceededError):
            await FabricClient(mini.clients).link_stats(5, deadline_s=1.0)
        unbounded = asyncio.ensure_future(FabricClient(mini.clients).link_stats(5))
        await asyncio.sleep(3.0)  # three times the others' deadline: it would have ended by now
        assert not unbounded.done()
        unbounded.cancel()
    finally:
        await faults.clear(mini.clients, hang.id)
    async with asyncio.timeout(60):  # a bound only: the fabric answers again once cleared
        while True:
            try:
                await bounded.route("n00-npu0", "n00-npu1")
                break
            except DeadlineExceededError:
                await asyncio.sleep(0.1)
